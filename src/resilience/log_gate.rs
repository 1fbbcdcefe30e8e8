//! At most one log line per shard per interval.
//!
//! While a shard stays down its health probe fails once per cooldown, and
//! a cooldown of a few seconds would write a line every few seconds per
//! shard for as long as the outage lasts, burying the one line that says
//! why the breaker opened. The gate lets one line go per shard per
//! interval and counts the ones it held back, so the next line can say how
//! many there were.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Micros;

/// The per-shard gate. Its clock is the caller's `now`.
#[derive(Debug)]
pub(super) struct LogGate {
    every_us: u64,
    shards: Mutex<HashMap<Arc<str>, Held>>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// When the last line went.
    last: Micros,
    /// Lines held back since.
    suppressed: u64,
}

impl LogGate {
    /// A gate that lets one line per shard go every `every_us`.
    pub(super) fn new(every_us: u64) -> Self {
        Self {
            every_us,
            shards: Mutex::new(HashMap::new()),
        }
    }

    /// A line about `shard` went at `now` by another way (the breaker
    /// opened): the interval starts again from it.
    pub(super) fn wrote(&self, shard: &Arc<str>, now: Micros) {
        self.shards.lock().insert(
            shard.clone(),
            Held {
                last: now,
                suppressed: 0,
            },
        );
    }

    /// Whether a line about `shard` may go at `now`: `Some(n)` with the
    /// number of lines held back since the last one, or `None` (counted).
    pub(super) fn admit(&self, shard: &Arc<str>, now: Micros) -> Option<u64> {
        let mut shards = self.shards.lock();
        match shards.get_mut(shard) {
            Some(held) if now < held.last.saturating_add(self.every_us) => {
                held.suppressed += 1;
                None
            }
            Some(held) => {
                let n = held.suppressed;
                *held = Held {
                    last: now,
                    suppressed: 0,
                };
                Some(n)
            }
            None => {
                shards.insert(
                    shard.clone(),
                    Held {
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }

    /// `shard` is healthy again: its next line goes at once.
    pub(super) fn forget(&self, shard: &Arc<str>) {
        self.shards.lock().remove(shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_shard_per_interval_and_the_next_says_how_many_were_held_back() {
        let gate = LogGate::new(10);
        let a: Arc<str> = "a:1".into();
        let b: Arc<str> = "b:1".into();
        assert_eq!(gate.admit(&a, 0), Some(0));
        assert_eq!(gate.admit(&a, 3), None);
        assert_eq!(gate.admit(&a, 9), None);
        assert_eq!(gate.admit(&b, 9), Some(0), "shards are gated apart");
        assert_eq!(gate.admit(&a, 10), Some(2));
        gate.wrote(&a, 15);
        assert_eq!(gate.admit(&a, 20), None);
        gate.forget(&a);
        assert_eq!(gate.admit(&a, 21), Some(0));
    }
}
