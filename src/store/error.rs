//! Store errors, classified so the resilience layer can choose a fallback.

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the decision budget. The call may have been applied,
    /// so it is never retried.
    #[error("store timed out")]
    Timeout,
    /// The connection failed or was refused.
    #[error("store unreachable: {0}")]
    Unavailable(String),
    /// The store answered with an error (script error, cluster down, ...).
    #[error("store error: {0}")]
    Command(String),
    /// The answer did not have the expected shape.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// One shard of several failed (a cluster request spanning slots).
    #[error("{source} (on {shard})")]
    OnShard {
        /// The shard that failed.
        shard: std::sync::Arc<str>,
        /// What went wrong there.
        source: Box<StoreError>,
    },
}

#[cfg(feature = "redis-store")]
impl From<crate::redis_client::ClientError> for StoreError {
    /// A client that could not be made: the store is unavailable, with why.
    fn from(e: crate::redis_client::ClientError) -> Self {
        StoreError::Unavailable(e.0)
    }
}

impl StoreError {
    /// Whether the same call may succeed later (everything but a protocol bug).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::OnShard { source, .. } => source.is_transient(),
            e => !matches!(e, StoreError::Protocol(_)),
        }
    }

    /// Whether the error is a timeout.
    pub fn is_timeout(&self) -> bool {
        match self {
            StoreError::OnShard { source, .. } => source.is_timeout(),
            e => matches!(e, StoreError::Timeout),
        }
    }

    /// The shard that failed, when the store knows it.
    pub fn shard(&self) -> Option<&std::sync::Arc<str>> {
        match self {
            StoreError::OnShard { shard, .. } => Some(shard),
            _ => None,
        }
    }

    /// The same error, attributed to `shard`.
    pub fn on_shard(self, shard: std::sync::Arc<str>) -> Self {
        match self {
            e @ StoreError::OnShard { .. } => e,
            e => StoreError::OnShard {
                shard,
                source: Box::new(e),
            },
        }
    }

    /// The `reason` label: `timeout` or `error`.
    pub fn reason(&self) -> &'static str {
        if self.is_timeout() {
            "timeout"
        } else {
            "error"
        }
    }
}

/// What kind of store failure an error is, as an operator reads it: the
/// `last_error` of the breaker's log lines starts with it.
///
/// Classified from the error and the client library's message (the
/// library has no finer type for most of these), so it is a best effort:
/// anything not recognised is [`ErrorClass::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Nothing listens on the port (`ECONNREFUSED`): the node is down.
    Refused,
    /// No answer within the budget: the node is frozen, overloaded or
    /// unreachable without a reset.
    Timeout,
    /// The TLS handshake failed: an unknown issuer, a name mismatch, an
    /// expired certificate, or TLS spoken to a plain port (or the reverse).
    Tls,
    /// Redis wants a password (`NOAUTH`), refused it (`WRONGPASS`), or the
    /// ACL user may not run the command (`NOPERM`).
    Auth,
    /// Redis is at `maxmemory` with `noeviction` (`OOM`).
    OutOfMemory,
    /// The node is a read-only replica (`READONLY`).
    ReadOnly,
    /// The host name did not resolve.
    Dns,
    /// An established connection broke (reset, closed, broken pipe).
    ConnectionLost,
    /// Anything else (a script error, a cluster that is down, ...).
    Other,
}

impl ErrorClass {
    /// `refused`, `timeout`, `tls`, `auth`, `oom`, `readonly`, `dns`,
    /// `connection_lost` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Refused => "refused",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Tls => "tls",
            ErrorClass::Auth => "auth",
            ErrorClass::OutOfMemory => "oom",
            ErrorClass::ReadOnly => "readonly",
            ErrorClass::Dns => "dns",
            ErrorClass::ConnectionLost => "connection_lost",
            ErrorClass::Other => "error",
        }
    }

    /// The class of a client library's error message. Redis error replies
    /// start with their code (`OOM command not allowed ...`), which the
    /// library may prefix with its own kind, so codes are looked for as
    /// words anywhere in the message; order matters where two could match
    /// (a TLS error mentions the connection too).
    pub fn of_message(message: &str) -> Self {
        let lower = message.to_ascii_lowercase();
        let word = |code: &str| {
            message
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == code)
        };
        let has = |needle: &str| lower.contains(needle);
        // Redis refuses a long command from a client that has not
        // authenticated ("Protocol error: unauthenticated multibulk length")
        // before it would answer NOAUTH.
        if word("NOAUTH")
            || word("WRONGPASS")
            || word("NOPERM")
            || has("authentication")
            || has("unauthenticated")
        {
            ErrorClass::Auth
        } else if word("OOM") || has("maxmemory") {
            ErrorClass::OutOfMemory
        } else if word("READONLY") || has("read only replica") {
            ErrorClass::ReadOnly
        } else if has("certificate")
            || has("tls")
            || has("ssl")
            || has("handshake")
            || has("unknownissuer")
            || has("corrupt message")
        {
            ErrorClass::Tls
        } else if has("failed to lookup address")
            || has("name or service not known")
            || has("no address associated")
            || has("nodename nor servname")
            || has("temporary failure in name resolution")
            || has("dns")
        {
            ErrorClass::Dns
        } else if has("connection refused") {
            ErrorClass::Refused
        } else if has("timed out") || has("timeout") {
            ErrorClass::Timeout
        } else if has("connection reset")
            || has("broken pipe")
            || has("connection closed")
            || has("connection dropped")
            || has("unexpected end")
            || has("eof")
            || has("not connected")
        {
            ErrorClass::ConnectionLost
        } else {
            ErrorClass::Other
        }
    }
}

impl ErrorClass {
    /// Whether this class says where to look (a certificate, a password,
    /// memory, a replica, a name, a port) rather than only that a
    /// connection broke or something failed: a dropped connection often
    /// follows the telling error (Redis closes the connection after
    /// refusing an unauthenticated command), so the telling one is kept.
    pub fn is_telling(self) -> bool {
        !matches!(self, ErrorClass::ConnectionLost | ErrorClass::Other)
    }
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest message a [`StoreError::summary`] keeps: enough for any client
/// library message, short enough that a log line stays one line.
const SUMMARY_MAX: usize = 240;

impl StoreError {
    /// What kind of failure this is.
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::OnShard { source, .. } => source.class(),
            StoreError::Timeout => ErrorClass::Timeout,
            StoreError::Unavailable(m) | StoreError::Command(m) | StoreError::Protocol(m) => {
                ErrorClass::of_message(m)
            }
        }
    }

    /// `<class>: <message>` on one line, for the `last_error` field of
    /// log lines, e.g. `tls: invalid peer certificate: UnknownIssuer`.
    /// Key names never appear in store errors ratewatch makes, and the
    /// client library's messages name nodes, not keys; the message is
    /// still cut short and kept on one line.
    pub fn summary(&self) -> String {
        let message = match self {
            StoreError::OnShard { source, .. } => return source.summary(),
            StoreError::Timeout => "no answer within the decision budget",
            StoreError::Unavailable(m) | StoreError::Command(m) | StoreError::Protocol(m) => m,
        };
        let mut one_line: String = message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if one_line.len() > SUMMARY_MAX {
            let mut cut = SUMMARY_MAX;
            while !one_line.is_char_boundary(cut) {
                cut -= 1;
            }
            one_line.truncate(cut);
            one_line.push('…');
        }
        format!("{}: {}", self.class(), one_line.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_library_messages_are_classified_as_an_operator_reads_them() {
        let cases = [
            ("Connection refused (os error 111)", ErrorClass::Refused),
            ("invalid peer certificate: UnknownIssuer", ErrorClass::Tls),
            ("NOAUTH: Authentication required.", ErrorClass::Auth),
            (
                "WRONGPASS: invalid username-password pair or user is disabled.",
                ErrorClass::Auth,
            ),
            (
                "ResponseError: Protocol error: unauthenticated multibulk length",
                ErrorClass::Auth,
            ),
            (
                "OOM: command not allowed when used memory > 'maxmemory'.",
                ErrorClass::OutOfMemory,
            ),
            (
                "READONLY: You can't write against a read only replica.",
                ErrorClass::ReadOnly,
            ),
            (
                "failed to lookup address information: Name or service not known",
                ErrorClass::Dns,
            ),
            (
                "Connection reset by peer (os error 104)",
                ErrorClass::ConnectionLost,
            ),
            ("ERR Error running script", ErrorClass::Other),
        ];
        for (message, class) in cases {
            assert_eq!(ErrorClass::of_message(message), class, "{message}");
        }
        // A key-like word containing a code is not that code.
        assert_eq!(ErrorClass::of_message("ERR BOOMER"), ErrorClass::Other);
    }

    #[test]
    fn a_summary_is_one_short_line_led_by_its_class() {
        let e = StoreError::Unavailable("invalid peer certificate: UnknownIssuer".into())
            .on_shard("127.0.0.1:6380".into());
        assert_eq!(e.summary(), "tls: invalid peer certificate: UnknownIssuer");
        assert_eq!(
            StoreError::Timeout.summary(),
            "timeout: no answer within the decision budget"
        );
        let long = StoreError::Command(format!("ERR a\nb {}", "x".repeat(1000)));
        let s = long.summary();
        assert!(!s.contains('\n'));
        assert!(s.chars().count() < SUMMARY_MAX + 20, "{s}");
    }
}
