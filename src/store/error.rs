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
