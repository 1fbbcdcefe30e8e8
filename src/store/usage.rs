//! What a store holds: keys and memory per shard, so an operator (and an
//! alert) sees invented identities pile up before Redis runs out of memory.
//!
//! Redis answers `DBSIZE` and `INFO memory` (`used_memory`, `maxmemory`);
//! the memory store counts its live entries. Sampled off the request path
//! every few seconds by the limiter.

use std::sync::Arc;

/// One shard's holdings at the time it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardUsage {
    /// `memory` or the Redis `host:port`.
    pub shard: Arc<str>,
    /// Keys (Redis `DBSIZE`, every key of the database, not only
    /// ratewatch's) or live memory-store entries.
    pub keys: u64,
    /// Redis `used_memory` in bytes; 0 for the memory store.
    pub used_bytes: u64,
    /// Redis `maxmemory` in bytes; 0 when Redis has no limit (and for the
    /// memory store, which is capped by `max_entries` instead).
    pub max_bytes: u64,
}

/// `used_memory` and `maxmemory` from an `INFO memory` reply.
#[cfg(feature = "redis-store")]
pub(crate) fn parse_info_memory(info: &str) -> (u64, u64) {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("used_memory"), field("maxmemory"))
}

#[cfg(all(test, feature = "redis-store"))]
mod tests {
    #[test]
    fn info_memory_gives_used_and_max_bytes() {
        let info = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\n\
                    maxmemory:2097152\r\nmaxmemory_human:2.00M\r\n";
        assert_eq!(super::parse_info_memory(info), (1_048_576, 2_097_152));
        assert_eq!(super::parse_info_memory(""), (0, 0));
    }
}
