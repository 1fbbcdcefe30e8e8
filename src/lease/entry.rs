//! One key's lease state and the step each request takes on it.
//!
//! All of it is pure: the time is an argument, the store is not touched
//! here. [`Entry::step`] answers a request locally (from the lease or from
//! a remembered refusal) or says which store call to make; the `install_*`
//! and `heard_*` methods take the store's answers back in.

use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::clock::Micros;
use crate::policy::LeaseSettings;
use crate::store::{Charge, Item, StoreDecision};

use super::sizing;
use super::sketch::Ewma;

/// Units of a lease held by this instance, paid for in the store.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// Unspent units.
    pub(crate) units: u64,
    /// Local time the lease stops being valid: its TTL, or the end of the
    /// window it was charged to if sooner.
    pub(crate) expires: Micros,
    /// The end of the earliest window it was charged to, on the store's
    /// clock (`None` without window limits): takes in one window merge.
    window_end: Option<Micros>,
    /// Whether a limit it was charged to is still open when it ends (the
    /// TTL ended it, or another limit has a longer window, a bucket or a
    /// GCRA): then the unspent units go back at expiry.
    outlived: bool,
    /// The receipt of the latest take, to give unspent units back.
    pub(crate) charge: Option<Charge>,
}

/// What [`Entry::step`] decided for one request.
#[derive(Debug)]
pub(crate) enum Step {
    /// Answered here. `renew`: also take this many units in the background.
    Local {
        /// The answer, shaped as a store's.
        answer: StoreDecision,
        /// Units to take in the background, if the lease runs low.
        renew: Option<u64>,
        /// The receipt of the lease the units were spent from (`None` for
        /// a remembered refusal), so they can be put back into that lease
        /// and no other ([`Entry::put_back`]).
        from: Option<Charge>,
    },
    /// Take a lease of `units` (this request's cost included) and answer
    /// from it.
    Take {
        /// Units to take.
        units: u64,
    },
    /// Decide this request in the store, per request.
    Exact,
}

/// Why a key went into or out of lease mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The key's rate crossed `enter_per_second` (auto).
    Hot,
    /// The key's rate fell below `exit_per_second` (auto).
    Cooled,
    /// The limit or route says `mode = "leased"`.
    Configured,
    /// In the quota's tail, a take left too little for even one request
    /// per instance's share, or was refused: per-request decisions until
    /// the lease expires.
    Tail,
}

impl Transition {
    /// Every reason, in label order.
    pub const ALL: [Transition; 4] = [
        Transition::Hot,
        Transition::Cooled,
        Transition::Configured,
        Transition::Tail,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Hot => "hot",
            Transition::Cooled => "cooled",
            Transition::Configured => "configured",
            Transition::Tail => "tail",
        }
    }

    /// Whether the key is in lease mode after it.
    pub fn leased(self) -> bool {
        matches!(self, Transition::Hot | Transition::Configured)
    }
}

/// Side effects of a step for telemetry and for the caller: counted, never
/// acted on here.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Units spent locally.
    pub(crate) spent: u64,
    /// Units of a lease that expired unspent.
    pub(crate) expired: u64,
    /// A transition that happened.
    pub(crate) transition: Option<Transition>,
    /// A lease to give back (units, receipt).
    pub(crate) give_back: Option<(u64, Charge)>,
}

/// One key (all limits of one kind of request) as this instance sees it.
pub(crate) struct Entry {
    /// In lease mode.
    pub(crate) leased: bool,
    /// The last request's mode said `leased`: only going idle takes such a
    /// key out of lease mode, not a low rate (that is `auto`'s rule).
    pub(crate) configured: bool,
    pub(crate) held: Option<Held>,
    /// A take is in flight: no other starts.
    pub(crate) renewing: bool,
    /// Per-request decisions until then (the end of the tail).
    exact_until: Micros,
    /// In the quota's tail until then: leases of at most `tail_cap`.
    tail_until: Micros,
    tail_cap: u64,
    /// A store refusal and the local time it was heard: "still blocked"
    /// is answered here until its retry time.
    blocked: Option<(StoreDecision, Micros)>,
    blocked_until: Micros,
    /// The last take's answer and the local time it was heard.
    granted: Option<(StoreDecision, Micros)>,
    /// This key's decision rate here, units per second.
    pub(crate) rate: Ewma,
    /// The units the last take wanted.
    last_take: u64,
    /// Local time of the last request.
    pub(crate) last_seen: Micros,
    /// The request's limits, for background takes and give-backs.
    pub(crate) items: Arc<[Item]>,
    /// The largest lease for this key.
    pub(crate) cap: u64,
    /// Shown on the dashboard: the identity (display form), tier, route.
    pub(crate) label: Label,
}

/// What the dashboard shows of a key.
#[derive(Debug, Clone)]
pub(crate) struct Label {
    pub(crate) identity: String,
    pub(crate) tier: Arc<str>,
    pub(crate) route: Arc<str>,
}

impl Entry {
    pub(crate) fn new(items: Arc<[Item]>, cap: u64, label: Label, now: Micros) -> Self {
        Self {
            leased: false,
            configured: false,
            held: None,
            renewing: false,
            exact_until: 0,
            tail_until: 0,
            tail_cap: 0,
            blocked: None,
            blocked_until: 0,
            granted: None,
            rate: Ewma::default(),
            last_take: 0,
            last_seen: now,
            items,
            cap,
            label,
        }
    }

    /// One request of `cost` at `now`. `leased` is whether the key should be
    /// in lease mode now (the mode, with auto's hysteresis applied by the
    /// caller) and `why` the reason if that is a change.
    pub(crate) fn step(
        &mut self,
        now: Micros,
        cost: u64,
        leased: bool,
        why: Transition,
        s: &LeaseSettings,
        fx: &mut Effects,
    ) -> Step {
        self.last_seen = now;
        if now < self.blocked_until {
            if let Some((answer, at)) = &self.blocked {
                return Step::Local {
                    // `now` was read before the lock: another thread may
                    // have recorded this answer after it.
                    answer: aged(answer, now.saturating_sub(*at)),
                    renew: None,
                    from: None,
                };
            }
        }
        self.expire(now, fx);
        if leased != self.leased {
            self.leased = leased;
            fx.transition = Some(why);
            if !leased {
                if let Some(g) = self.release() {
                    fx.give_back = Some(g);
                }
            }
        }
        if !self.leased {
            return Step::Exact;
        }
        let rate = self.rate.rate(now);
        let cap = self.lease_cap(now);
        if let (Some(h), Some((g, at))) = (self.held.as_mut(), &self.granted) {
            if h.units >= cost {
                h.units -= cost;
                fx.spent = cost;
                let left = h.units;
                let renew = (!self.renewing
                    && now >= self.exact_until
                    && cap >= cost
                    && left < sizing::low_water(self.last_take.min(cap), cost))
                .then(|| sizing::take_size(rate, left, cost, cap, s));
                if renew.is_some() {
                    self.renewing = true;
                }
                let answer = lent(g, now.saturating_sub(*at), left);
                let from = h.charge.clone();
                return Step::Local {
                    answer,
                    renew,
                    from,
                };
            }
        }
        if now < self.exact_until || self.renewing || cap < cost {
            return Step::Exact;
        }
        self.renewing = true;
        let held = self.held.as_ref().map_or(0, |h| h.units);
        Step::Take {
            units: sizing::take_size(rate, held, cost, cap, s),
        }
    }

    /// The largest lease at `now`: `cap`, or in the quota's tail the
    /// smaller tail lease.
    fn lease_cap(&self, now: Micros) -> u64 {
        if now < self.tail_until {
            self.cap.min(self.tail_cap)
        } else {
            self.cap
        }
    }

    /// Drops a lease past its expiry. If a limit it was charged to is still
    /// open (the TTL ended it, or a longer window, a bucket or a GCRA
    /// outlives it), the unspent units go back: left as charged, they would
    /// be refused to everyone until that limit's window ends, a lease's
    /// worth per instance each time a shorter window rolls. Otherwise they
    /// count as expired: the next window never had them.
    pub(crate) fn expire(&mut self, now: Micros, fx: &mut Effects) {
        if self.held.as_ref().is_none_or(|h| now < h.expires) {
            return;
        }
        let Some(h) = self.held.take() else { return };
        match h.charge {
            Some(c) if h.outlived && h.units > 0 && fx.give_back.is_none() => {
                fx.give_back = Some((h.units, c));
            }
            _ => fx.expired += h.units,
        }
    }

    /// Takes the unspent lease out, to give back.
    pub(crate) fn release(&mut self) -> Option<(u64, Charge)> {
        let h = self.held.take()?;
        match h.charge {
            Some(c) if h.units > 0 => Some((h.units, c)),
            _ => None,
        }
    }

    /// A take of `units` sent at local time `t0` was admitted with `d`
    /// (and `charge`); `used` of it answers the request that took it in
    /// the foreground (0 for a background renewal). Returns a transition
    /// into the tail if the take left too little for leases.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn install(
        &mut self,
        t0: Micros,
        now: Micros,
        units: u64,
        used: u64,
        d: &StoreDecision,
        charge: Option<Charge>,
        s: &LeaseSettings,
        instances: u32,
        fx: &mut Effects,
    ) -> Option<Transition> {
        self.renewing = false;
        self.last_take = units;
        let (lifetime, window_end, outlived) = lifetime(&self.items, d, s);
        let expires = t0 + lifetime;
        self.expire(now, fx);
        let fresh = units - used;
        match self.held.as_mut() {
            Some(h) if h.window_end == window_end => {
                h.units += fresh;
                h.expires = expires;
                h.outlived = outlived;
                h.charge = charge;
            }
            _ => {
                if let Some(old) = self.held.take() {
                    fx.expired += old.units;
                }
                self.held = Some(Held {
                    units: fresh,
                    expires,
                    window_end,
                    outlived,
                    charge,
                });
            }
        }
        self.granted = Some((d.clone(), now));
        if !self.leased && fx.give_back.is_none() {
            // The key left lease mode while this take was in flight: no
            // request will spend it, so it goes back now rather than sit
            // charged (and, ended by its window, be lost) until it expires.
            fx.give_back = self.release();
        }
        let remaining = self
            .items
            .iter()
            .zip(&d.verdicts)
            .filter(|(i, _)| !i.shadow)
            .map(|(_, v)| v.remaining)
            .fold(f64::INFINITY, f64::min);
        self.tail_until = 0;
        if sizing::in_tail(remaining, self.cap, instances) {
            // Leases shrink with what is left, so the last units of the
            // window cost a few takes, not one call per request; below one
            // unit per instance, per request until the lease expires.
            let share = sizing::tail_lease(remaining, instances);
            if share == 0 {
                self.exact_until = expires;
                return Some(Transition::Tail);
            }
            self.tail_until = expires;
            self.tail_cap = share;
        }
        None
    }

    /// A take sent at `t0` was refused (`d`): the quota cannot hold a
    /// lease; decide per request until the refusal's retry time (at most
    /// one TTL).
    pub(crate) fn refused(
        &mut self,
        t0: Micros,
        d: &StoreDecision,
        s: &LeaseSettings,
    ) -> Transition {
        self.renewing = false;
        let retry = self.retry_us(d).min(s.ttl.as_micros() as u64);
        self.exact_until = t0 + retry.max(1);
        Transition::Tail
    }

    /// A take failed (store down, timeout): nothing was learnt.
    pub(crate) fn failed(&mut self) {
        self.renewing = false;
    }

    /// A per-request decision sent at `t0` was answered `d` at `now`: a
    /// refusal is remembered until its retry time.
    pub(crate) fn heard(&mut self, t0: Micros, now: Micros, d: &StoreDecision) {
        if d.allowed {
            return;
        }
        let retry = self.retry_us(d);
        if retry > 0 {
            // From the time the question was sent: the store decided after
            // it, so the remembered refusal ends no later than the real one.
            self.blocked_until = t0 + retry;
            self.blocked = Some((d.clone(), now));
        }
    }

    /// When a refused request would pass: the latest retry of the enforced
    /// limits that refused it (a shadow limit never holds a request back).
    fn retry_us(&self, d: &StoreDecision) -> Micros {
        self.items
            .iter()
            .zip(&d.verdicts)
            .filter(|(i, v)| !i.shadow && !v.allowed)
            .map(|(_, v)| v.retry_after_us)
            .max()
            .unwrap_or(0)
    }

    /// Puts `units` spent at `now` from the lease with receipt `from` back
    /// into it, if it is still that lease and still valid; `false` if not
    /// (a renewal replaced it or it expired), when the caller gives them
    /// back to the store instead: units never move to another lease, whose
    /// window may not be the one they were charged to.
    pub(crate) fn put_back(&mut self, units: u64, from: &Charge, now: Micros) -> bool {
        match self.held.as_mut() {
            Some(h)
                if now < h.expires
                    && h.charge
                        .as_ref()
                        .is_some_and(|c| Arc::ptr_eq(&c.inner, &from.inner)) =>
            {
                h.units += units;
                true
            }
            _ => false,
        }
    }

    /// Units held now.
    pub(crate) fn units(&self) -> u64 {
        self.held.as_ref().map_or(0, |h| h.units)
    }
}

/// How long a lease taken with answer `d` is valid: the TTL, cut at the
/// end of the first window it was charged to; that window's end on the
/// store's clock; and whether any limit it was charged to is still open
/// when it ends (its unspent units then go back).
fn lifetime(
    items: &[Item],
    d: &StoreDecision,
    s: &LeaseSettings,
) -> (Micros, Option<Micros>, bool) {
    let ttl = s.ttl.as_micros() as u64;
    let mut life = ttl;
    let mut end = None::<Micros>;
    // The latest end of a limit's charge; a bucket or GCRA never ends.
    let mut last = 0;
    for item in items {
        match item.algorithm {
            Algorithm::FixedWindow { window_us, .. }
            | Algorithm::SlidingWindow { window_us, .. } => {
                let w = window_us.max(1);
                let window_end = d.now - d.now % w + w;
                life = life.min(window_end - d.now);
                end = Some(end.map_or(window_end, |e: Micros| e.min(window_end)));
                last = last.max(window_end);
            }
            _ => last = Micros::MAX,
        }
    }
    (life, end, d.now.saturating_add(life) < last)
}

/// The answer to a request spent from a lease granted with `g`, `elapsed`
/// µs ago, with `units` still held: each limit shows what the store had
/// left plus what this instance still holds.
fn lent(g: &StoreDecision, elapsed: Micros, units: u64) -> StoreDecision {
    let mut d = aged(g, elapsed);
    for v in &mut d.verdicts {
        v.remaining += units as f64;
    }
    d
}

/// `d` as it reads `elapsed` µs after it was answered.
fn aged(d: &StoreDecision, elapsed: Micros) -> StoreDecision {
    let mut d = d.clone();
    d.now += elapsed;
    d.rtt = None;
    for v in &mut d.verdicts {
        v.reset_after_us = v.reset_after_us.saturating_sub(elapsed);
        v.retry_after_us = v.retry_after_us.saturating_sub(elapsed);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Verdict;

    fn verdict(allowed: bool, retry_after_us: u64) -> Verdict {
        Verdict {
            allowed,
            remaining: 0.0,
            reset_after_us: retry_after_us,
            retry_after_us,
            delay_us: 0,
        }
    }

    /// An admitting verdict with `remaining` left and its window ending in
    /// `reset_after_us`.
    fn open(remaining: f64, reset_after_us: u64) -> Verdict {
        Verdict {
            allowed: true,
            remaining,
            reset_after_us,
            retry_after_us: 0,
            delay_us: 0,
        }
    }

    fn window(name: &str, limit: u64, window_us: u64) -> Item {
        Item::new(name, Algorithm::FixedWindow { limit, window_us })
    }

    fn label(identity: &str, route: &str) -> Label {
        Label {
            identity: identity.into(),
            tier: "free".into(),
            route: route.into(),
        }
    }

    fn answer(allowed: bool, verdicts: Vec<Verdict>, now: Micros) -> StoreDecision {
        StoreDecision {
            allowed,
            verdicts: verdicts.into(),
            shard: "s".into(),
            now,
            rtt: None,
        }
    }

    #[test]
    fn a_refusal_is_remembered_until_the_enforced_retry_not_a_shadows() {
        let mut shadow = window("s", 5, 1_000_000);
        shadow.shadow = true;
        let items: Arc<[Item]> = vec![window("e", 5, 1_000_000), shadow].into();
        let mut e = Entry::new(items, 1, label("x", "*"), 0);
        let d = answer(
            false,
            vec![verdict(false, 1_000_000), verdict(false, 100_000_000)],
            0,
        );
        e.heard(10, 20, &d);
        let s = LeaseSettings::default();
        let mut fx = Effects::default();
        let still = e.step(500_000, 1, false, Transition::Cooled, &s, &mut fx);
        assert!(matches!(still, Step::Local { .. }));
        let after = e.step(1_000_011, 1, false, Transition::Cooled, &s, &mut fx);
        assert!(matches!(after, Step::Exact), "{after:?}");
    }

    /// Each request reads the clock before it takes the table's lock, so a
    /// thread can step with a `now` earlier than the answer another thread
    /// installed (seen under load: an overflow panic in debug builds; in
    /// release ones the wrapped age zeroed the answer's reset and retry).
    #[test]
    fn a_request_timed_before_the_answer_it_reads_is_answered_as_of_that_answer() {
        let items: Arc<[Item]> = vec![window("e", 1_000, 1_000_000)].into();
        let s = LeaseSettings::default();
        let mut fx = Effects::default();
        let mut e = Entry::new(items.clone(), 100, label("*", "/search"), 0);
        e.step(10, 1, true, Transition::Configured, &s, &mut fx);
        let granted = answer(true, vec![open(800.0, 999_000)], 500);
        e.install(10, 500, 50, 0, &granted, None, &s, 1, &mut fx);
        let Step::Local { answer: lent, .. } =
            e.step(400, 1, true, Transition::Configured, &s, &mut fx)
        else {
            panic!("not spent from the lease")
        };
        assert_eq!(lent.now, 500);
        assert_eq!(lent.verdicts[0].reset_after_us, 999_000);

        let mut e = Entry::new(items, 1, label("x", "*"), 0);
        e.heard(
            10,
            500,
            &answer(false, vec![verdict(false, 1_000_000)], 500),
        );
        let Step::Local {
            answer: refused, ..
        } = e.step(400, 1, false, Transition::Cooled, &s, &mut fx)
        else {
            panic!("the refusal was not remembered")
        };
        assert_eq!(refused.now, 500);
        assert_eq!(refused.verdicts[0].retry_after_us, 1_000_000);
    }

    #[test]
    fn spent_units_go_back_only_into_the_lease_they_came_from() {
        let items: Arc<[Item]> = vec![window("e", 1_000, 1_000_000)].into();
        let s = LeaseSettings::default();
        let mut fx = Effects::default();
        let mut e = Entry::new(items, 100, label("*", "/search"), 0);
        let granted = |now: Micros| {
            answer(
                true,
                vec![Verdict {
                    remaining: 800.0,
                    ..verdict(true, 0)
                }],
                now,
            )
        };
        e.step(10, 1, true, Transition::Configured, &s, &mut fx);
        let first = Charge::new(1u8);
        e.install(10, 20, 50, 0, &granted(20), Some(first), &s, 1, &mut fx);
        let Step::Local {
            from: Some(from), ..
        } = e.step(30, 1, true, Transition::Configured, &s, &mut fx)
        else {
            panic!("not spent from the lease")
        };
        assert_eq!(e.units(), 49);
        assert!(e.put_back(1, &from, 40));
        assert_eq!(e.units(), 50);
        // A take in the next window replaces the lease: the old window's
        // units must not be spent in it.
        let next = Charge::new(2u8);
        e.install(
            1_000_010,
            1_000_020,
            50,
            0,
            &granted(1_000_020),
            Some(next),
            &s,
            1,
            &mut fx,
        );
        assert!(!e.put_back(1, &from, 1_000_030));
        assert_eq!(e.units(), 50);
    }

    #[test]
    fn a_lease_ended_by_a_short_window_gives_its_units_back_to_the_long_one() {
        let items: Arc<[Item]> = vec![
            window("second", 1_000_000, 1_000_000),
            window("hour", 1_000_000, 3_600_000_000),
        ]
        .into();
        let s = LeaseSettings::default();
        let mut e = Entry::new(items, 50, label("x", "*"), 0);
        let mut fx = Effects::default();
        e.step(0, 1, true, Transition::Configured, &s, &mut fx);
        let ok = open(900_000.0, 100_000);
        // Taken 100 ms before the second's window ends.
        let d = answer(true, vec![ok, ok], 7_900_000);
        e.install(0, 0, 20, 1, &d, Some(Charge::new(())), &s, 1, &mut fx);
        let mut fx = Effects::default();
        e.expire(100_001, &mut fx);
        let (back, _) = fx
            .give_back
            .expect("the hour's window is open: the unspent units go back");
        assert_eq!(back, 19);
        assert_eq!(fx.expired, 0);
    }

    #[test]
    fn a_lease_ended_with_its_only_window_expires_without_a_round_trip() {
        let items: Arc<[Item]> = vec![window("second", 1_000_000, 1_000_000)].into();
        let s = LeaseSettings::default();
        let mut e = Entry::new(items, 50, label("x", "*"), 0);
        let mut fx = Effects::default();
        e.step(0, 1, true, Transition::Configured, &s, &mut fx);
        let d = answer(true, vec![open(900_000.0, 100_000)], 7_900_000);
        e.install(0, 0, 20, 1, &d, Some(Charge::new(())), &s, 1, &mut fx);
        let mut fx = Effects::default();
        e.expire(100_001, &mut fx);
        assert!(fx.give_back.is_none());
        assert_eq!(fx.expired, 19);
    }

    #[test]
    fn in_the_tail_leases_shrink_with_what_is_left_then_requests_go_per_request() {
        let items: Arc<[Item]> = vec![window("w", 1_000, 1_000_000)].into();
        let s = LeaseSettings::default();
        let mut e = Entry::new(items, 100, label("x", "*"), 0);
        let mut fx = Effects::default();
        // A steady 2,000/s: a take wants 200, the cap holds it to 100.
        e.rate = Ewma::starting_at(2_000.0, 0);
        let Step::Take { units } = e.step(10, 1, true, Transition::Configured, &s, &mut fx) else {
            panic!("no take")
        };
        assert_eq!(units, 100);
        // The take left 120 of the window: under 3 instances x 100, the
        // tail. Leases shrink to 120 / (2 x 3) = 20.
        let d = answer(true, vec![open(120.0, 500_000)], 20);
        let t = e.install(10, 20, 100, 1, &d, Some(Charge::new(())), &s, 3, &mut fx);
        assert_eq!(t, None);
        for at in 30..129 {
            let step = e.step(at, 1, true, Transition::Configured, &s, &mut fx);
            assert!(matches!(step, Step::Local { .. }), "{step:?}");
            if let Step::Local { renew: Some(n), .. } = step {
                assert!(n <= 20, "a renewal of {n} in the tail");
                e.failed();
            }
        }
        let Step::Take { units } = e.step(130, 1, true, Transition::Configured, &s, &mut fx) else {
            panic!("no take")
        };
        assert_eq!(units, 20);
        // That take left 5: not one unit per instance, per request.
        let d = answer(true, vec![open(5.0, 400_000)], 140);
        let t = e.install(130, 140, 20, 1, &d, Some(Charge::new(())), &s, 3, &mut fx);
        assert_eq!(t, Some(Transition::Tail));
        for at in 150..169 {
            assert!(matches!(
                e.step(at, 1, true, Transition::Configured, &s, &mut fx),
                Step::Local { renew: None, .. }
            ));
        }
        let step = e.step(170, 1, true, Transition::Configured, &s, &mut fx);
        assert!(matches!(step, Step::Exact), "{step:?}");
    }

    #[test]
    fn a_take_that_lands_after_the_key_left_lease_mode_goes_back_at_once() {
        let items: Arc<[Item]> = vec![window("w", 1_000, 1_000_000)].into();
        let s = LeaseSettings::default();
        let mut e = Entry::new(items, 50, label("x", "*"), 0);
        let mut fx = Effects::default();
        let step = e.step(10, 1, true, Transition::Configured, &s, &mut fx);
        assert!(matches!(step, Step::Take { .. }), "{step:?}");
        let units = 20;
        // Cooled before the take's answer came back.
        let mut fx = Effects::default();
        e.step(20, 1, false, Transition::Cooled, &s, &mut fx);
        let granted = answer(true, vec![open(900.0, 999_000)], 1_000);
        let mut fx = Effects::default();
        let receipt = Some(Charge::new(()));
        e.install(10, 30, units, 1, &granted, receipt, &s, 1, &mut fx);
        let (back, _) = fx.give_back.expect("the fresh units go back");
        assert_eq!(back, units - 1);
        assert_eq!(e.units(), 0);
    }
}
