//! One line per Redis node per interval from the Redis client library.
//!
//! While a cluster node is gone, the client library logs a warning for
//! every reconnect attempt and slot refresh (hundreds in ten seconds),
//! burying ratewatch's own lines (`circuit breaker opened ... last_error`).
//! [`ClientLogGate`] lets one WARN or ERROR line of the library's
//! (`redis::*` targets, through the `log` crate) go per node per interval
//! and holds back the rest; the next line it lets go for that node is
//! preceded by one saying how many were held back. Lines naming no node
//! share one allowance.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::layer::{Context, Filter};

/// The allowance of the library's warnings: one line per node this often.
pub const CLIENT_LOG_EVERY: Duration = Duration::from_secs(10);

/// A per-layer filter for the log output: everything passes but the Redis
/// client library's warnings beyond one per node per interval.
#[derive(Debug)]
pub struct ClientLogGate {
    every: Duration,
    json: bool,
    held: Mutex<HashMap<String, (Instant, u64)>>,
}

impl ClientLogGate {
    /// A gate letting one line per node go every `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            json: false,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// With `json`, the line counting what was held back is a JSON object
    /// like every other line of `RATEWATCH_LOG_FORMAT=json`.
    pub fn json(mut self, json: bool) -> Self {
        self.json = json;
        self
    }

    /// Whether a line about `node` may go at `now`; `Some(n)` when it may,
    /// with `n` lines held back since the last one.
    fn admit(&self, node: &str, now: Instant) -> Option<u64> {
        let mut held = self.held.lock();
        match held.get_mut(node) {
            Some((since, n)) if now.duration_since(*since) < self.every => {
                *n += 1;
                None
            }
            Some((since, n)) => {
                let out = *n;
                *since = now;
                *n = 0;
                Some(out)
            }
            None => {
                held.insert(node.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

impl Default for ClientLogGate {
    fn default() -> Self {
        Self::new(CLIENT_LOG_EVERY)
    }
}

/// The `host:port` a client library message names, if any.
fn node_of(message: &str) -> Option<&str> {
    message
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '`' | '"' | '(' | ')' | '\''))
        .find(|token| {
            token.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty()
                    && !port.is_empty()
                    && port.bytes().all(|b| b.is_ascii_digit())
                    && host.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                    })
            })
        })
}

/// The message of an event, and the target of a `log` record (a record
/// arrives as an event of the `log` target whose `log.target` field names
/// the crate that logged it).
#[derive(Default)]
struct Message {
    text: String,
    log_target: Option<String>,
}

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "log.target" => self.log_target = Some(value.to_owned()),
            "message" => self.text.push_str(value),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, "{value:?}");
        }
    }
}

fn may_be_client_warning(meta: &Metadata<'_>) -> bool {
    *meta.level() <= Level::WARN && (meta.target() == "log" || meta.target().starts_with("redis"))
}

impl<S> Filter<S> for ClientLogGate {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        if !may_be_client_warning(meta) {
            return true;
        }
        let mut message = Message::default();
        event.record(&mut message);
        let target = message.log_target.as_deref().unwrap_or(meta.target());
        if !target.starts_with("redis") {
            return true;
        }
        let node = node_of(&message.text).unwrap_or("the cluster");
        match self.admit(node, Instant::now()) {
            None => false,
            Some(0) => true,
            Some(held_back) => {
                // The filter cannot add a field to the library's line, and
                // an event emitted from inside the dispatcher is dropped:
                // the count goes straight to the log output (stderr).
                let mut time = String::new();
                let _ = SystemTime.format_time(&mut Writer::new(&mut time));
                let message = format!(
                    "held back {held_back} Redis client library warnings about {node} in the last {:?}",
                    self.every
                );
                if self.json {
                    eprintln!(
                        "{}",
                        serde_json::json!({
                            "timestamp": time,
                            "level": "WARN",
                            "target": "ratewatch::store",
                            "message": message,
                            "node": node,
                            "suppressed": held_back,
                        })
                    );
                } else {
                    eprintln!(
                        "{time}  WARN ratewatch::store: {message} node={node} suppressed={held_back}"
                    );
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_a_client_library_line_names_is_found() {
        assert_eq!(
            node_of("Failed to connect to node: 127.0.0.1:36683, due to: Connection refused"),
            Some("127.0.0.1:36683")
        );
        assert_eq!(
            node_of("ClusterConnInner: connection to \"redis-0.svc:6379\" lost"),
            Some("redis-0.svc:6379")
        );
        assert_eq!(
            node_of("async cluster client recovery: beginning slot refresh"),
            None
        );
    }

    #[test]
    fn one_line_per_node_per_interval_and_the_count_of_the_rest() {
        let gate = ClientLogGate::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(gate.admit("a:1", t0), Some(0));
        assert_eq!(gate.admit("a:1", t0 + Duration::from_secs(1)), None);
        assert_eq!(gate.admit("b:1", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(gate.admit("a:1", t0 + Duration::from_secs(9)), None);
        assert_eq!(gate.admit("a:1", t0 + Duration::from_secs(10)), Some(2));
    }
}
