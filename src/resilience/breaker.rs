//! A circuit breaker as a pure state machine.
//!
//! ```text
//!            `failures` consecutive failures, or a failure ratio
//!            >= `failure_ratio` over the last `window` calls
//!   Closed ───────────────────────────────────────────────────▶ Open
//!     ▲                                                          │ `open` has passed:
//!     │ probe succeeds                  probe fails              │ one probe goes
//!     └──────────────────── HalfOpen ───────────────────────────▶┘
//!                              ▲ ◀───────────────────────────────┘
//! ```
//!
//! - Closed: every call is let through and its outcome counted.
//! - Open: every call is refused until `open` has passed since the trip.
//! - HalfOpen: exactly one probe call is in flight; every other call is
//!   refused. A probe that never reports (its future was dropped, say) is
//!   given up after another `open` interval and a new probe may go; the
//!   lost one's late report, if any, is ignored.
//!
//! Every [`Permit`] remembers the period of the breaker it was granted in
//! (each transition starts a new period). A report from an earlier period,
//! such as a call that was in flight when the breaker tripped, changes
//! nothing. The breaker never reads a clock: the state moves from Open to
//! HalfOpen when [`Breaker::acquire`] is called after the cooldown, so
//! [`Breaker::state`] reads Open until the next call is attempted.
//!
//! A breaker made [`Breaker::health_checked`] never lets a request probe:
//! the half-open probe is a health check run outside any request
//! ([`Breaker::acquire_probe`]), so no client's request is spent finding
//! out that the shard is back. Should no health check come (no runtime to
//! run it), a request may probe once the check is a whole cooldown late.
//!
//! With `failure_ratio = 1.0` the ratio rule is off: a window of nothing but
//! failures is a run of consecutive failures, which the `failures` rule
//! already covers.

use std::collections::VecDeque;

use crate::clock::Micros;
use crate::policy::BreakerSettings;

/// What the breaker lets through: the `ratewatch_breaker_state` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Every call goes through.
    Closed,
    /// One probe call is in flight; the others are refused.
    HalfOpen,
    /// Every call is refused.
    Open,
}

impl BreakerState {
    /// The gauge value: 0 closed, 1 half-open, 2 open.
    pub fn as_gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }

    /// `closed`, `half_open` or `open`, for logs and the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

/// Leave to make one call. Report its outcome with [`Breaker::on_success`]
/// or [`Breaker::on_failure`]; dropping it unreported is allowed.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "report the call's outcome to the breaker"]
pub struct Permit {
    probe: bool,
    period: u64,
}

impl Permit {
    /// Whether this call is the half-open probe that decides whether the
    /// breaker closes.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

/// A call the breaker did not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker {}; a probe may go in {retry_after_us} µs", state.as_str())]
pub struct Refused {
    /// Open, or half-open with its probe in flight.
    pub state: BreakerState,
    /// Time until a probe may go (sooner if the one in flight reports).
    pub retry_after_us: u64,
}

/// A change of state caused by a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
}

/// Why the breaker opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TripReason {
    /// This many failures in a row.
    ConsecutiveFailures(u32),
    /// Too many of the last calls failed.
    FailureRatio {
        /// Failures among the last `calls`.
        failures: u32,
        /// The calls the ratio was taken over (the configured window).
        calls: u32,
    },
    /// The half-open probe failed.
    ProbeFailed,
}

/// The breaker opened: why, from which state, and until when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trip {
    /// Why it opened.
    pub reason: TripReason,
    /// Closed or HalfOpen.
    pub from: BreakerState,
    /// No call is let through before this time.
    pub open_until: Micros,
}

#[derive(Debug, Clone, Copy)]
enum Inner {
    Closed,
    Open { until: Micros },
    HalfOpen { probe_since: Micros },
}

/// A circuit breaker for one shard. Not thread-safe by itself: keep it
/// behind a short lock.
#[derive(Debug, Clone)]
pub struct Breaker {
    failures: u32,
    ratio: Option<f64>,
    window: usize,
    open_us: u64,
    inner: Inner,
    period: u64,
    consecutive: u32,
    /// Outcomes of the last `window` calls while closed, `true` = failed.
    recent: VecDeque<bool>,
    recent_failures: u32,
    /// Probes are health checks; requests probe only when one is overdue.
    health_checked: bool,
}

impl Breaker {
    /// A closed breaker. `failures` of 0 is treated as 1.
    pub fn new(settings: BreakerSettings) -> Self {
        let window = settings.window as usize;
        let ratio = (settings.failure_ratio < 1.0 && window > 0).then_some(settings.failure_ratio);
        Self {
            failures: settings.failures.max(1),
            ratio,
            window,
            open_us: u64::try_from(settings.open.as_micros()).unwrap_or(u64::MAX),
            inner: Inner::Closed,
            period: 0,
            consecutive: 0,
            recent: VecDeque::with_capacity(if ratio.is_some() { window } else { 0 }),
            recent_failures: 0,
            health_checked: false,
        }
    }

    /// The same breaker whose probes are health checks taken with
    /// [`Breaker::acquire_probe`]: a request is refused until a health
    /// check closed the breaker, unless that check is a cooldown late.
    pub fn health_checked(mut self) -> Self {
        self.health_checked = true;
        self
    }

    /// When the next probe is due: `None` while closed.
    pub fn next_probe_at(&self) -> Option<Micros> {
        match self.inner {
            Inner::Closed => None,
            Inner::Open { until } => Some(until),
            Inner::HalfOpen { probe_since } => Some(probe_since.saturating_add(self.open_us)),
        }
    }

    /// Leave to run the half-open probe at `now` as a health check: `Some`
    /// once the cooldown has passed (or the probe in flight is a cooldown
    /// old), `None` while closed or not yet due.
    pub fn acquire_probe(&mut self, now: Micros) -> Option<Permit> {
        match self.next_probe_at() {
            Some(at) if now >= at => {
                self.enter(Inner::HalfOpen { probe_since: now });
                Some(self.permit(true))
            }
            _ => None,
        }
    }

    /// The current state (Open until a call is attempted after the cooldown).
    pub fn state(&self) -> BreakerState {
        match self.inner {
            Inner::Closed => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Asks to make a call at `now`.
    pub fn acquire(&mut self, now: Micros) -> Result<Permit, Refused> {
        match self.inner {
            Inner::Closed => Ok(self.permit(false)),
            Inner::Open { until } if now < until => Err(Refused {
                state: BreakerState::Open,
                retry_after_us: until - now,
            }),
            // The health check is due or running: requests wait for it,
            // unless it is a whole cooldown late.
            Inner::Open { until }
                if self.health_checked && now < until.saturating_add(self.open_us) =>
            {
                Err(Refused {
                    state: BreakerState::Open,
                    retry_after_us: until.saturating_add(self.open_us) - now,
                })
            }
            Inner::HalfOpen { probe_since } if now < probe_since.saturating_add(self.open_us) => {
                Err(Refused {
                    state: BreakerState::HalfOpen,
                    retry_after_us: probe_since.saturating_add(self.open_us) - now,
                })
            }
            // The cooldown has passed, or the probe in flight is given up
            // as lost: a new probe goes, and the old one's report is stale.
            Inner::Open { .. } | Inner::HalfOpen { .. } => {
                self.enter(Inner::HalfOpen { probe_since: now });
                Ok(self.permit(true))
            }
        }
    }

    /// Reports that the call of `permit` succeeded. Returns the transition
    /// if the probe's success closed the breaker.
    pub fn on_success(&mut self, permit: Permit, _now: Micros) -> Option<Transition> {
        if permit.period != self.period {
            return None;
        }
        match self.inner {
            Inner::Closed => {
                self.consecutive = 0;
                self.record(false);
                None
            }
            Inner::HalfOpen { .. } => {
                self.enter(Inner::Closed);
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Closed,
                })
            }
            Inner::Open { .. } => None,
        }
    }

    /// Reports that the call of `permit` failed. Returns why the breaker
    /// opened, if it did.
    pub fn on_failure(&mut self, permit: Permit, now: Micros) -> Option<Trip> {
        if permit.period != self.period {
            return None;
        }
        let (reason, from) = match self.inner {
            Inner::Closed => {
                self.consecutive += 1;
                self.record(true);
                if self.consecutive >= self.failures {
                    (
                        TripReason::ConsecutiveFailures(self.consecutive),
                        BreakerState::Closed,
                    )
                } else if self.ratio_reached() {
                    (
                        TripReason::FailureRatio {
                            failures: self.recent_failures,
                            calls: self.recent.len() as u32,
                        },
                        BreakerState::Closed,
                    )
                } else {
                    return None;
                }
            }
            Inner::HalfOpen { .. } => (TripReason::ProbeFailed, BreakerState::HalfOpen),
            Inner::Open { .. } => return None,
        };
        let open_until = now.saturating_add(self.open_us);
        self.enter(Inner::Open { until: open_until });
        Some(Trip {
            reason,
            from,
            open_until,
        })
    }

    /// Gives a permit back unused (the call was not made). A probe given
    /// back lets the next call probe at once instead of waiting for the lost
    /// probe to time out; any other permit changes nothing.
    pub fn release(&mut self, permit: Permit, now: Micros) {
        if permit.probe && permit.period == self.period {
            if let Inner::HalfOpen { .. } = self.inner {
                self.enter(Inner::Open { until: now });
            }
        }
    }

    fn permit(&self, probe: bool) -> Permit {
        Permit {
            probe,
            period: self.period,
        }
    }

    /// Moves to `inner`, starting a new period with fresh counters.
    fn enter(&mut self, inner: Inner) {
        self.inner = inner;
        self.period += 1;
        self.consecutive = 0;
        self.recent.clear();
        self.recent_failures = 0;
    }

    fn record(&mut self, failed: bool) {
        if self.ratio.is_none() {
            return;
        }
        if self.recent.len() == self.window && self.recent.pop_front() == Some(true) {
            self.recent_failures -= 1;
        }
        self.recent.push_back(failed);
        self.recent_failures += u32::from(failed);
    }

    fn ratio_reached(&self) -> bool {
        match self.ratio {
            Some(ratio) if self.recent.len() == self.window => {
                f64::from(self.recent_failures) >= ratio * self.window as f64
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    const OPEN: u64 = 2_000_000;
    const T0: Micros = 1_700_000_000_000_000;

    #[test]
    fn a_probe_given_back_unused_lets_the_next_call_probe_at_once() {
        let mut b = Breaker::new(BreakerSettings {
            failures: 1,
            open: Duration::from_secs(1),
            ..Default::default()
        });
        let p = b.acquire(0).unwrap();
        assert!(b.on_failure(p, 0).is_some());
        let probe = b.acquire(1_000_000).unwrap();
        assert!(probe.is_probe());
        assert!(b.acquire(1_000_001).is_err(), "one probe at a time");
        b.release(probe, 1_000_002);
        let again = b.acquire(1_000_003).expect("a new probe may go at once");
        assert!(again.is_probe());
    }

    #[test]
    fn a_health_checked_breaker_lets_no_request_probe_while_the_check_is_due() {
        let mut b = Breaker::new(settings(1, 1.0, 20)).health_checked();
        assert!(
            b.acquire_probe(T0).is_none(),
            "nothing to probe while closed"
        );
        fail(&mut b, T0);
        assert_eq!(b.next_probe_at(), Some(T0 + OPEN));
        assert!(b.acquire_probe(T0 + OPEN - 1).is_none(), "not yet due");
        assert!(
            b.acquire(T0 + OPEN).is_err(),
            "a request never takes the probe"
        );
        let check = b.acquire_probe(T0 + OPEN).expect("the check is due");
        assert!(check.is_probe());
        assert!(b.acquire(T0 + OPEN + 1).is_err());
        assert!(
            b.acquire_probe(T0 + OPEN + 1).is_none(),
            "one check at a time"
        );
        assert!(b.on_success(check, T0 + OPEN + 2).is_some());
        assert!(b.acquire(T0 + OPEN + 3).is_ok_and(|p| !p.is_probe()));
    }

    #[test]
    fn a_health_check_given_back_is_due_again_at_once() {
        let mut b = Breaker::new(settings(1, 1.0, 20)).health_checked();
        fail(&mut b, T0);
        let check = b.acquire_probe(T0 + OPEN).expect("due");
        b.release(check, T0 + OPEN + 5);
        assert_eq!(b.next_probe_at(), Some(T0 + OPEN + 5));
        assert!(b.acquire_probe(T0 + OPEN + 5).is_some());
    }

    #[test]
    fn a_request_probes_when_the_health_check_is_a_cooldown_late() {
        let mut b = Breaker::new(settings(1, 1.0, 20)).health_checked();
        fail(&mut b, T0);
        assert!(b.acquire(T0 + 2 * OPEN - 1).is_err());
        let p = b
            .acquire(T0 + 2 * OPEN)
            .expect("no check came: a request probes");
        assert!(p.is_probe());
    }

    fn settings(failures: u32, failure_ratio: f64, window: u32) -> BreakerSettings {
        BreakerSettings {
            failures,
            failure_ratio,
            window,
            open: Duration::from_micros(OPEN),
        }
    }

    fn fail(b: &mut Breaker, now: Micros) -> Option<Trip> {
        let p = b.acquire(now).expect("a call is let through");
        b.on_failure(p, now)
    }

    fn succeed(b: &mut Breaker, now: Micros) -> Option<Transition> {
        let p = b.acquire(now).expect("a call is let through");
        b.on_success(p, now)
    }

    fn tripped(failures: u32) -> Breaker {
        let mut b = Breaker::new(settings(failures, 1.0, 20));
        for _ in 0..failures {
            fail(&mut b, T0);
        }
        assert_eq!(b.state(), BreakerState::Open);
        b
    }

    #[test]
    fn a_closed_breaker_lets_every_call_through() {
        let mut b = Breaker::new(settings(3, 1.0, 20));
        for i in 0..100 {
            assert_eq!(succeed(&mut b, T0 + i), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.state().as_gauge(), 0);
    }

    #[test]
    fn consecutive_failures_open_it_and_it_refuses_until_the_cooldown_passed() {
        let mut b = Breaker::new(settings(3, 1.0, 20));
        assert_eq!(fail(&mut b, T0), None);
        assert_eq!(fail(&mut b, T0), None);
        let trip = fail(&mut b, T0 + 10).expect("the third failure trips");
        assert_eq!(trip.reason, TripReason::ConsecutiveFailures(3));
        assert_eq!(trip.from, BreakerState::Closed);
        assert_eq!(trip.open_until, T0 + 10 + OPEN);
        assert_eq!(b.state().as_gauge(), 2);
        let refused = b.acquire(T0 + 10 + OPEN - 1).expect_err("still open");
        assert_eq!(refused.state, BreakerState::Open);
        assert_eq!(refused.retry_after_us, 1);
        assert!(b.acquire(T0 + 10 + OPEN).is_ok_and(|p| p.is_probe()));
    }

    #[test]
    fn a_success_resets_the_run_of_failures() {
        let mut b = Breaker::new(settings(3, 1.0, 20));
        for _ in 0..10 {
            assert_eq!(fail(&mut b, T0), None);
            assert_eq!(fail(&mut b, T0), None);
            assert_eq!(succeed(&mut b, T0), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn the_failure_ratio_trips_only_once_a_full_window_was_seen() {
        let mut b = Breaker::new(settings(100, 0.5, 10));
        // Five failures and four successes: half failed, but only nine seen.
        for _ in 0..4 {
            assert_eq!(fail(&mut b, T0), None);
            assert_eq!(succeed(&mut b, T0), None);
        }
        assert_eq!(fail(&mut b, T0), None);
        assert_eq!(succeed(&mut b, T0), None); // 10 seen, 5 failed; a success trips nothing
        let trip = fail(&mut b, T0).expect("the last 10 calls hold 5 failures");
        assert_eq!(
            trip.reason,
            TripReason::FailureRatio {
                failures: 5,
                calls: 10
            }
        );
    }

    #[test]
    fn a_failure_ratio_of_one_adds_nothing_to_the_consecutive_rule() {
        // A window of 2 all-failed calls would trip at 2; only 5 in a row do.
        let mut b = Breaker::new(settings(5, 1.0, 2));
        for _ in 0..4 {
            assert_eq!(fail(&mut b, T0), None);
        }
        assert_eq!(
            fail(&mut b, T0).map(|t| t.reason),
            Some(TripReason::ConsecutiveFailures(5))
        );
    }

    #[test]
    fn half_open_lets_exactly_one_probe_through() {
        let mut b = tripped(2);
        let probe = b.acquire(T0 + OPEN).expect("the cooldown passed");
        assert!(probe.is_probe());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.state().as_gauge(), 1);
        for dt in [0, 1, OPEN / 2, OPEN - 1] {
            let refused = b
                .acquire(T0 + OPEN + dt)
                .expect_err("the probe is in flight");
            assert_eq!(refused.state, BreakerState::HalfOpen);
        }
        let closed = b
            .on_success(probe, T0 + OPEN + 5)
            .expect("the probe closes it");
        assert_eq!(closed.to, BreakerState::Closed);
        assert!(b.acquire(T0 + OPEN + 6).is_ok_and(|p| !p.is_probe()));
    }

    #[test]
    fn a_failed_probe_opens_it_for_another_cooldown() {
        let mut b = tripped(2);
        let at = T0 + OPEN + 100;
        let probe = b.acquire(at).expect("the cooldown passed");
        let trip = b.on_failure(probe, at + 50).expect("the probe failed");
        assert_eq!(trip.reason, TripReason::ProbeFailed);
        assert_eq!(trip.from, BreakerState::HalfOpen);
        assert!(b.acquire(at + 50 + OPEN - 1).is_err());
        assert!(b.acquire(at + 50 + OPEN).is_ok_and(|p| p.is_probe()));
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced_after_another_cooldown() {
        let mut b = tripped(2);
        let lost = b.acquire(T0 + OPEN).expect("the cooldown passed");
        assert!(b.acquire(T0 + 2 * OPEN - 1).is_err());
        let probe = b
            .acquire(T0 + 2 * OPEN)
            .expect("the lost probe is given up");
        assert!(probe.is_probe());
        // The lost probe reporting late decides nothing.
        assert_eq!(b.on_failure(lost, T0 + 2 * OPEN + 1), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.on_success(probe, T0 + 2 * OPEN + 2).is_some());
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn calls_in_flight_when_it_tripped_report_without_effect() {
        let mut b = Breaker::new(settings(2, 1.0, 20));
        let late: Vec<Permit> = (0..3).map(|_| b.acquire(T0).expect("closed")).collect();
        fail(&mut b, T0);
        fail(&mut b, T0);
        assert_eq!(b.state(), BreakerState::Open);
        let probe = b.acquire(T0 + OPEN).expect("the cooldown passed");
        for p in late {
            assert_eq!(b.on_success(p, T0 + OPEN), None);
        }
        assert_eq!(b.state(), BreakerState::HalfOpen, "only the probe decides");
        assert!(b.on_success(probe, T0 + OPEN).is_some());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire,
        Succeed(usize),
        Fail(usize),
        Lose(usize),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Acquire),
            2 => any::<usize>().prop_map(Op::Succeed),
            3 => any::<usize>().prop_map(Op::Fail),
            1 => any::<usize>().prop_map(Op::Lose),
            3 => prop_oneof![0..10u64, 0..OPEN, 0..3 * OPEN].prop_map(Op::Advance),
        ]
    }

    proptest! {
        #[test]
        fn no_call_goes_while_open_and_at_most_one_probe_is_in_flight(
            failures in 1..6u32,
            ratio in prop_oneof![Just(1.0), 0.1..1.0f64],
            window in 0..12u32,
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut b = Breaker::new(settings(failures, ratio, window));
            let mut now = T0;
            // Permits held, with when they were granted and in which period
            // of the model (a trip or a probe starts a new one).
            let mut held: Vec<(Permit, Micros, u64)> = Vec::new();
            let mut period = 0u64;
            let mut open_until: Option<Micros> = None;
            let mut consecutive = 0u32;
            for op in ops {
                match op {
                    Op::Advance(us) => now += us,
                    Op::Acquire => match b.acquire(now) {
                        Ok(p) => {
                            if let Some(until) = open_until {
                                prop_assert!(now >= until, "a call went at {} before {}", now, until);
                            }
                            if p.is_probe() {
                                open_until = None;
                                period += 1;
                                // Any other probe still out must be older than a cooldown.
                                for (q, since, _) in &held {
                                    prop_assert!(!q.is_probe() || *since + OPEN <= now);
                                }
                            } else {
                                prop_assert_eq!(b.state(), BreakerState::Closed);
                            }
                            held.push((p, now, period));
                        }
                        Err(refused) => {
                            prop_assert_ne!(b.state(), BreakerState::Closed);
                            prop_assert!(refused.retry_after_us >= 1);
                        }
                    },
                    Op::Succeed(_) | Op::Fail(_) | Op::Lose(_) if held.is_empty() => {}
                    Op::Succeed(i) => {
                        let (p, _, granted_in) = held.swap_remove(i % held.len());
                        let current = granted_in == period;
                        if b.on_success(p, now).is_some() {
                            prop_assert!(current, "a stale probe closed the breaker");
                            period += 1;
                        }
                        if current {
                            consecutive = 0;
                        }
                    }
                    Op::Fail(i) => {
                        let (p, _, granted_in) = held.swap_remove(i % held.len());
                        let current = granted_in == period;
                        let closed_call = current && !p.is_probe() && b.state() == BreakerState::Closed;
                        let probe = p.is_probe();
                        match b.on_failure(p, now) {
                            Some(trip) => {
                                prop_assert!(current, "a stale report tripped the breaker");
                                prop_assert_eq!(trip.open_until, now + OPEN);
                                if let TripReason::ConsecutiveFailures(n) = trip.reason {
                                    prop_assert_eq!(n, failures);
                                    prop_assert_eq!(consecutive + 1, failures);
                                }
                                prop_assert_eq!(probe, trip.reason == TripReason::ProbeFailed);
                                open_until = Some(trip.open_until);
                                period += 1;
                                consecutive = 0;
                            }
                            None => {
                                if closed_call {
                                    consecutive += 1;
                                }
                                // Never `failures` failures in a row without a trip.
                                prop_assert!(consecutive < failures);
                            }
                        }
                    }
                    Op::Lose(i) => {
                        drop(held.swap_remove(i % held.len()));
                    }
                }
            }
        }
    }
}
