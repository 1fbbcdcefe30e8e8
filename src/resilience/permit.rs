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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::BreakerSettings;
    use crate::resilience::BreakerState;
    use crate::store::MemoryStore;

    const OPEN: Duration = Duration::from_secs(1);

    /// Request-probed breakers (the memory store does not probe) on a
    /// manual clock, with `shard`'s breaker tripped and its cooldown over.
    fn half_open_due(shard: &Arc<str>) -> (ShardBreakers, ManualClock) {
        let clock = ManualClock::new(1_000_000);
        let settings = BreakerSettings {
            failures: 1,
            open: OPEN,
            ..Default::default()
        };
        let breakers = ShardBreakers::with_probes(
            settings,
            Arc::new(clock.clone()),
            Arc::new(MemoryStore::new()),
            Duration::from_millis(50),
        );
        let first = breakers.enter(shard).expect("closed");
        assert!(matches!(first.report(false), Change::Tripped(_)));
        clock.advance(OPEN);
        (breakers, clock)
    }

    #[test]
    fn a_probe_dropped_unreported_lets_the_next_call_probe_at_once() {
        let shard: Arc<str> = "127.0.0.1:1".into();
        let (breakers, clock) = half_open_due(&shard);
        let probe = breakers.enter(&shard).expect("the cooldown passed");
        assert!(probe.is_probe());
        assert!(breakers.enter(&shard).is_err(), "one probe at a time");
        drop(probe);
        clock.advance_us(1);
        let again = breakers.enter(&shard).expect("the dropped probe came back");
        assert!(again.is_probe());
        assert!(matches!(again.report(true), Change::Closed));
        assert_eq!(breakers.states(), vec![(shard, BreakerState::Closed)]);
    }

    #[test]
    fn a_panic_while_holding_the_probe_gives_it_back() {
        let shard: Arc<str> = "127.0.0.1:2".into();
        let (breakers, clock) = half_open_due(&shard);
        let held = breakers.clone();
        let s = shard.clone();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _probe = held.enter(&s).expect("the cooldown passed");
            panic!("the handler panicked");
        }));
        assert!(panicked.is_err());
        clock.advance_us(1);
        assert!(breakers.enter(&shard).is_ok_and(|p| p.is_probe()));
    }

    #[tokio::test]
    async fn a_request_future_dropped_mid_flight_gives_its_probe_back() {
        let shard: Arc<str> = "127.0.0.1:3".into();
        let (breakers, clock) = half_open_due(&shard);
        let held = breakers.clone();
        let s = shard.clone();
        // The call never answers; the caller stops waiting and drops it.
        let call = async move {
            let probe = held.enter(&s).expect("the cooldown passed");
            std::future::pending::<()>().await;
            probe.report(true)
        };
        assert!(
            tokio::time::timeout(Duration::from_millis(10), call)
                .await
                .is_err()
        );
        clock.advance_us(1);
        assert!(breakers.enter(&shard).is_ok_and(|p| p.is_probe()));
    }
}
