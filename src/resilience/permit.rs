//! A breaker permit that cannot be lost.
//!
//! A request holding a permit may never finish: its client goes away and
//! the server drops the request's future, a timeout around the handler
//! drops it, or it panics. A permit dropped with it would leave a half-open
//! breaker waiting a whole cooldown for a report that never comes, with
//! every fail-open route unprotected meanwhile. [`PermitGuard`] reports or
//! gives back its permit whatever happens: [`PermitGuard::report`] consumes
//! it, and dropping it unreported gives it back, which lets the next probe
//! go at once.

use std::sync::Arc;

use super::shards::ShardBreakers;
use super::{Change, Permit};

/// A permit of one shard's breaker, given back on drop unless reported.
#[must_use = "report the call's outcome; dropping the guard gives the permit back"]
pub struct PermitGuard {
    breakers: ShardBreakers,
    shard: Arc<str>,
    permit: Option<Permit>,
}

impl std::fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermitGuard")
            .field("shard", &self.shard)
            .field("permit", &self.permit)
            .finish()
    }
}

impl PermitGuard {
    pub(super) fn new(breakers: ShardBreakers, shard: Arc<str>, permit: Permit) -> Self {
        Self {
            breakers,
            shard,
            permit: Some(permit),
        }
    }

    /// The shard the permit is for.
    pub fn shard(&self) -> &Arc<str> {
        &self.shard
    }

    /// Whether this is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.permit.as_ref().is_some_and(Permit::is_probe)
    }

    /// Reports the call's outcome.
    pub fn report(mut self, ok: bool) -> Change {
        match self.permit.take() {
            Some(p) => self
                .breakers
                .report(&self.shard, p, ok, self.breakers.now()),
            None => Change::None,
        }
    }
}

impl Drop for PermitGuard {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.breakers.release(&self.shard, p, self.breakers.now());
        }
    }
}
