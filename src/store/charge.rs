//! What a decision charged, kept so that the unspent part of a lease can go
//! back to the store (see [`crate::lease`]).

use std::any::Any;
use std::sync::Arc;

/// The receipt of an admitted decision: which state each limit's charge
/// went to (a window start, for window counters). Only the store that
/// issued it can read it; [`Store::give_back`](super::Store::give_back)
/// takes it back with the same items.
#[derive(Clone)]
pub struct Charge {
    // Only the Redis stores issue and read receipts.
    #[cfg_attr(not(feature = "redis-store"), allow(dead_code))]
    pub(crate) inner: Arc<dyn Any + Send + Sync>,
}

impl Charge {
    #[cfg_attr(not(feature = "redis-store"), allow(dead_code))]
    pub(crate) fn new(inner: impl Any + Send + Sync) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Charge")
    }
}
