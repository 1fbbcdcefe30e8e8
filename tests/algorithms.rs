//! The six algorithms against simple reference models, over arbitrary
//! arrival sequences: bounds, quota coming back at the declared rate, TTLs,
//! blocked steps writing nothing, fractional rates and zero-cost peeks.
//!
//! Each reference model follows the verdicts the algorithm gave (so one
//! disagreement cannot cascade) and checks every verdict against its own
//! bookkeeping. The integer algorithms (fixed window, sliding log, GCRA,
//! leaky bucket) must agree exactly; the token bucket is checked against an
//! exact integer model within a tolerance of 1e-8 token.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use ratewatch::algorithm::{Algorithm, State, Step, interval_us};

const SEC: u64 = 1_000_000;
/// A realistic epoch time, so window alignment is exercised.
const T0: u64 = 1_700_000_000_000_000;

/// One decision of a run: when, what it cost, the state it saw, the answer.
struct Record {
    now: u64,
    /// The latest `now` of the run so far (a clock that never stepped back).
    high: u64,
    cost: u64,
    prior: Option<State>,
    step: Step,
}

/// Feeds `arrivals` (gap before the request, cost) to `alg` starting at
/// `start`, keeping the state the way a store does: written only when the
/// step admits. Checks on every step that a blocked step writes nothing.
fn run(alg: &Algorithm, start: u64, arrivals: &[(u64, u64)]) -> Vec<Record> {
    let signed: Vec<(i64, u64)> = arrivals.iter().map(|&(g, c)| (g as i64, c)).collect();
    run_signed(alg, start, &signed)
}

/// [`run`] with gaps that may be negative: the clock steps back.
fn run_signed(alg: &Algorithm, start: u64, arrivals: &[(i64, u64)]) -> Vec<Record> {
    let mut state: Option<State> = None;
    let mut now = start;
    let mut high = start;
    let mut out = Vec::with_capacity(arrivals.len());
    for &(gap, cost) in arrivals {
        now = now
            .checked_add_signed(gap)
            .expect("time stays after the epoch");
        high = high.max(now);
        let step = alg.decide(state.as_ref(), now, cost);
        assert_eq!(
            step.verdict.allowed,
            step.state.is_some(),
            "{alg:?} at {now}: a step writes a state exactly when it admits"
        );
        let prior = state.clone();
        if step.verdict.allowed {
            state = step.state.clone();
        }
        out.push(Record {
            now,
            high,
            cost,
            prior,
            step,
        });
    }
    out
}

/// Gaps from 0 (several requests in one microsecond) to beyond `scale`.
fn gaps(scale: u64) -> impl Strategy<Value = u64> {
    let scale = scale.max(1);
    prop_oneof![
        2 => Just(0u64),
        3 => 0..=scale / 8,
        3 => 0..=scale,
        1 => 0..=scale * 3,
    ]
}

fn arrivals(scale: u64, quota: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((gaps(scale), 1..=quota), 1..48)
}

/// Rates from 0.01/s to 1000/s, in hundredths so the token bucket's
/// reference model can count in exact integers.
fn centi_rate() -> impl Strategy<Value = u64> {
    prop_oneof![Just(33u64), Just(100), 1..=100u64, 1..=100_000u64]
}

fn window_us() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1_000u64), Just(SEC), 1_000..=10 * SEC]
}

/// Time until a full quota is back, from the declared parameters.
fn full_recovery_us(alg: &Algorithm) -> u64 {
    match *alg {
        Algorithm::TokenBucket {
            capacity,
            refill_per_second,
            // One microsecond of slack: the rate is an f64, and 3 tokens at
            // 0.48/s take 6.25 s to the declared rate but 6_250_001 µs once
            // 0.48 is rounded to binary.
        } => (capacity as f64 * SEC as f64 / refill_per_second).ceil() as u64 + 1,
        Algorithm::Gcra {
            rate_per_second,
            burst,
        } => burst * interval_us(rate_per_second),
        Algorithm::LeakyBucket {
            rate_per_second,
            capacity,
            ..
        } => capacity * interval_us(rate_per_second),
        Algorithm::FixedWindow { window_us, .. } | Algorithm::SlidingLog { window_us, .. } => {
            window_us
        }
        Algorithm::SlidingWindow { window_us, .. } => 2 * window_us,
        // Not among the generated algorithms: slots come back by release.
        Algorithm::Concurrency { hold_us, .. } => hold_us,
    }
}

/// Properties every algorithm shares, checked on every record of a run:
/// (b) a blocked request passes at `now + retry_after` and not one
/// microsecond earlier (every algorithm is exact here) and a full quota is back after idling;
/// (c) a state past its TTL decides like a fresh key; (f) cost 0 peeks.
fn check_common(alg: &Algorithm, records: &[Record]) {
    for r in records {
        let v = r.step.verdict;
        if v.allowed {
            assert_eq!(v.retry_after_us, 0);
            let state = r.step.state.as_ref().expect("an admitting step writes");
            for extra in [0, 1, r.step.ttl_us / 3 + 7, 5 * SEC] {
                let at = r.now + r.step.ttl_us + extra;
                for cost in [0, 1, alg.quota()] {
                    assert_eq!(
                        alg.decide(Some(state), at, cost).verdict,
                        alg.decide(None, at, cost).verdict,
                        "{alg:?}: state written at {} with ttl {} differs from a fresh key at +{extra} for cost {cost}",
                        r.now,
                        r.step.ttl_us
                    );
                }
            }
        } else {
            assert!(v.retry_after_us >= 1);
            let later = alg.decide(r.prior.as_ref(), r.now + v.retry_after_us, r.cost);
            assert!(
                later.verdict.allowed,
                "{alg:?}: blocked at {} for cost {}, told to retry after {} µs, still blocked then",
                r.now, r.cost, v.retry_after_us
            );
            if v.retry_after_us > 1 {
                let early = alg.decide(r.prior.as_ref(), r.now + v.retry_after_us - 1, r.cost);
                assert!(
                    !early.verdict.allowed,
                    "{alg:?}: blocked at {} for cost {}, retry after {} µs is later than needed",
                    r.now, r.cost, v.retry_after_us
                );
            }
        }

        // A peek admits (a shaper excepted, when the queue ahead is already
        // longer than it may delay) and sees the quota before the charge.
        let peek = alg.decide(r.prior.as_ref(), r.now, 0);
        // A shaper whose queue ahead is longer than its delay blocks even a
        // peek. So may, after the clock stepped back, a meter behind its TAT
        // or a sliding window counter before its stored window starts (its
        // previous window still weighs fully): they are over quota until
        // the clock catches up.
        let shaper =
            matches!(alg, Algorithm::LeakyBucket { max_delay_us, .. } if *max_delay_us > 0);
        let behind = r.now < r.high
            && matches!(
                alg,
                Algorithm::Gcra { .. }
                    | Algorithm::LeakyBucket { .. }
                    | Algorithm::SlidingWindow { .. }
            );
        let shaper_full = (shaper || behind) && !peek.verdict.allowed;
        if !shaper_full {
            assert!(peek.verdict.allowed, "{alg:?}: a peek at {} blocked", r.now);
            if v.allowed {
                let charged = peek.verdict.remaining - v.remaining;
                let expected =
                    if matches!(alg, Algorithm::Gcra { .. } | Algorithm::LeakyBucket { .. }) {
                        // GCRA reports whole units left; the floor may drop one more.
                        assert!((r.cost as f64..=r.cost as f64 + 1.0).contains(&charged));
                        charged
                    } else {
                        r.cost as f64
                    };
                assert!(
                    (charged - expected).abs() < 1e-9,
                    "{alg:?}: peek saw {} left, the request charged {} and left {}",
                    peek.verdict.remaining,
                    r.cost,
                    v.remaining
                );
            }
            // Whatever a peek would write changes nothing that follows. (A
            // token bucket re-anchored at `now` may round its retry time one
            // microsecond apart; stores never write a peek anyway.)
            let mut after_peek = alg
                .decide(peek.state.as_ref().or(r.prior.as_ref()), r.now, r.cost)
                .verdict;
            if matches!(alg, Algorithm::TokenBucket { .. })
                && after_peek.retry_after_us.abs_diff(v.retry_after_us) <= 1
            {
                after_peek.retry_after_us = v.retry_after_us;
            }
            assert_eq!(after_peek, v, "{alg:?}: a peek changed the next verdict");
        }
    }

    // After idling for the declared recovery time, a full quota passes
    // (counted from the latest time seen: a clock that stepped back must
    // first catch up with what the state remembers).
    if let Some(last) = records.last() {
        let state = if last.step.verdict.allowed {
            last.step.state.as_ref()
        } else {
            last.prior.as_ref()
        };
        let at = last.high + full_recovery_us(alg);
        let full = alg.decide(state, at, alg.quota());
        assert!(
            full.verdict.allowed,
            "{alg:?}: a full quota is not back {} µs after {}",
            full_recovery_us(alg),
            last.high
        );
    }
}

/// The admitted requests of a run: (time, cost).
fn admitted(records: &[Record]) -> Vec<(u64, u64)> {
    records
        .iter()
        .filter(|r| r.step.verdict.allowed)
        .map(|r| (r.now, r.cost))
        .collect()
}

/// The most units admitted in any span `[t_i, t_i + len)` starting at an
/// admission (the spans that hold the most), with the span start.
fn max_in_any_window(adm: &[(u64, u64)], len: u64) -> (u64, u64) {
    adm.iter()
        .map(|&(t, _)| {
            let sum = adm
                .iter()
                .filter(|&&(u, _)| u >= t && u < t + len)
                .map(|&(_, c)| c)
                .sum();
            (sum, t)
        })
        .max()
        .unwrap_or((0, 0))
}

/// Checks `units in [t_i, t_j] <= quota + rate × (t_j - t_i)` for every span
/// between two admissions, `rate` in units per µs.
fn check_rate_bound(adm: &[(u64, u64)], quota: f64, per_us: f64, what: &str) {
    for i in 0..adm.len() {
        let mut sum = 0u64;
        for &(t, c) in &adm[i..] {
            sum += c;
            let bound = quota + (t - adm[i].0) as f64 * per_us;
            assert!(
                sum as f64 <= bound + 1e-6,
                "{what}: {sum} units admitted in [{}, {t}], bound {bound}",
                adm[i].0
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 192,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/algorithms.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn token_bucket_admits_what_an_exact_integer_bucket_holds(
        capacity in 1..=10u64,
        centi in centi_rate(),
        offset in 0..SEC,
        seq in (1..=10u64).prop_flat_map(|q| arrivals(10 * SEC, q)),
    ) {
        let rate = centi as f64 / 100.0;
        let alg = Algorithm::TokenBucket { capacity, refill_per_second: rate };
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(capacity))).collect();
        let records = run(&alg, T0 + offset, &seq);

        // Exact model: one token is 10^8 units and the bucket gains
        // `centi` units per µs (centi/100 tokens per second).
        const UNIT: i128 = 100_000_000;
        const TOLERANCE: i128 = 1; // 1e-8 token
        let cap = capacity as i128 * UNIT;
        let (mut tokens, mut last) = (cap, records[0].now);
        for r in &records {
            tokens = cap.min(tokens + (r.now - last) as i128 * centi as i128);
            last = r.now;
            let need = r.cost as i128 * UNIT;
            let v = r.step.verdict;
            if v.allowed {
                prop_assert!(tokens + TOLERANCE >= need, "admitted with {tokens} < {need}");
                tokens = (tokens - need).max(0);
                prop_assert!((v.remaining * UNIT as f64 - tokens as f64).abs() <= 2.0);
            } else {
                prop_assert!(tokens < need + TOLERANCE, "blocked with {tokens} >= {need}");
                prop_assert!((v.remaining * UNIT as f64 - tokens as f64).abs() <= 2.0);
            }
        }
        check_rate_bound(&admitted(&records), capacity as f64, rate / SEC as f64, "token bucket");
        check_common(&alg, &records);
    }

    #[test]
    fn gcra_admits_what_a_meter_of_whole_microseconds_admits(
        burst in 1..=10u64,
        centi in centi_rate(),
        offset in 0..SEC,
        seq in (1..=10u64).prop_flat_map(|q| arrivals(10 * SEC, q)),
    ) {
        let rate = centi as f64 / 100.0;
        let alg = Algorithm::Gcra { rate_per_second: rate, burst };
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(burst))).collect();
        let records = run(&alg, T0 + offset, &seq);

        // Model: a bucket holding `level` µs of work that drains 1 µs per µs.
        let interval = interval_us(rate);
        prop_assert!(interval as f64 >= SEC as f64 / rate);
        let (mut level, mut last) = (0u64, records[0].now);
        for r in &records {
            level = level.saturating_sub(r.now - last);
            last = r.now;
            let fits = level + r.cost * interval <= burst * interval;
            prop_assert_eq!(r.step.verdict.allowed, fits);
            if fits {
                level += r.cost * interval;
            }
        }
        let adm = admitted(&records);
        for i in 0..adm.len() {
            let mut sum = 0;
            for &(t, c) in &adm[i..] {
                sum += c;
                prop_assert!(sum <= burst + (t - adm[i].0) / interval);
            }
        }
        check_rate_bound(&adm, burst as f64, rate / SEC as f64, "gcra");
        check_common(&alg, &records);
    }

    #[test]
    fn leaky_bucket_polices_or_shapes_within_its_delay_and_spacing(
        capacity in 1..=10u64,
        centi in centi_rate(),
        shape in any::<bool>(),
        delay_share in 0..=200u64,
        offset in 0..SEC,
        seq in (1..=10u64).prop_flat_map(|q| arrivals(10 * SEC, q)),
    ) {
        let rate = centi as f64 / 100.0;
        let interval = interval_us(rate);
        let max_delay_us = if shape { (capacity * interval * delay_share / 100).max(1) } else { 0 };
        let alg = Algorithm::LeakyBucket { rate_per_second: rate, capacity, max_delay_us };
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(capacity))).collect();
        let records = run(&alg, T0 + offset, &seq);

        // Model: the queue ahead of a request, in µs of work.
        let (mut queued, mut last) = (0u64, records[0].now);
        let mut next_start = 0u64;
        for r in &records {
            queued = queued.saturating_sub(r.now - last);
            last = r.now;
            let v = r.step.verdict;
            let fits = queued + r.cost * interval <= capacity * interval
                && (max_delay_us == 0 || queued <= max_delay_us);
            prop_assert_eq!(v.allowed, fits, "queue {} at {}", queued, r.now);
            if fits {
                if shape {
                    prop_assert!(v.delay_us <= max_delay_us);
                    prop_assert_eq!(v.delay_us, queued);
                    // Admitted units start one interval apart per unit.
                    let start = r.now + v.delay_us;
                    prop_assert!(start >= next_start, "started at {start} before {next_start}");
                    next_start = start + r.cost * interval;
                } else {
                    prop_assert_eq!(v.delay_us, 0);
                }
                queued += r.cost * interval;
            }
        }
        check_rate_bound(&admitted(&records), capacity as f64, rate / SEC as f64, "leaky bucket");
        check_common(&alg, &records);
    }

    #[test]
    fn fixed_window_admits_at_most_its_limit_per_aligned_window(
        limit in 1..=10u64,
        window in window_us(),
        offset in 0..10 * SEC,
        seq in (1..=10u64).prop_flat_map(|q| arrivals(4 * SEC, q)),
    ) {
        let alg = Algorithm::FixedWindow { limit, window_us: window };
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(limit))).collect();
        let records = run(&alg, T0 + offset, &seq);
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for r in &records {
            let count = counts.entry(r.now / window).or_default();
            let fits = *count + r.cost <= limit;
            prop_assert_eq!(r.step.verdict.allowed, fits);
            if fits {
                *count += r.cost;
            }
        }
        prop_assert!(counts.values().all(|&c| c <= limit));
        check_common(&alg, &records);
    }

    #[test]
    fn sliding_log_admits_exactly_its_limit_in_any_window(
        limit in 1..=10u64,
        window in window_us(),
        offset in 0..SEC,
        seq in (1..=10u64).prop_flat_map(|q| arrivals(4 * SEC, q)),
    ) {
        let alg = Algorithm::SlidingLog { limit, window_us: window };
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(limit))).collect();
        let records = run(&alg, T0 + offset, &seq);
        let mut log: VecDeque<(u64, u64)> = VecDeque::new();
        for r in &records {
            let in_window: u64 = log.iter().filter(|&&(t, _)| t + window > r.now).map(|&(_, c)| c).sum();
            let fits = in_window + r.cost <= limit;
            prop_assert_eq!(r.step.verdict.allowed, fits, "{} in window at {}", in_window, r.now);
            if fits {
                log.push_back((r.now, r.cost));
            }
        }
        let (most, at) = max_in_any_window(&admitted(&records), window);
        prop_assert!(most <= limit, "{} units in the window from {}", most, at);
        check_common(&alg, &records);
    }

    #[test]
    fn sliding_window_follows_the_weighted_estimate_and_stays_under_twice_its_limit(
        limit in 1..=10u64,
        window in window_us(),
        offset in 0..10 * SEC,
        seq in (1..=10u64).prop_flat_map(|q| arrivals(4 * SEC, q)),
    ) {
        let alg = Algorithm::SlidingWindow { limit, window_us: window };
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(limit))).collect();
        let records = run(&alg, T0 + offset, &seq);
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for r in &records {
            let k = r.now / window;
            let elapsed = r.now % window;
            let prev = k.checked_sub(1).and_then(|p| counts.get(&p)).copied().unwrap_or(0);
            let curr = counts.get(&k).copied().unwrap_or(0);
            let estimate = prev as f64 * ((window - elapsed) as f64 / window as f64) + curr as f64;
            let fits = estimate + r.cost as f64 <= limit as f64;
            prop_assert_eq!(r.step.verdict.allowed, fits, "estimate {} at {}", estimate, r.now);
            if fits {
                *counts.entry(k).or_default() += r.cost;
            }
        }
        let (most, at) = max_in_any_window(&admitted(&records), window);
        prop_assert!(most <= 2 * limit, "{} units in the window from {}", most, at);
        check_common(&alg, &records);
    }
}

#[test]
fn a_token_bucket_at_a_third_of_a_token_per_second_keeps_the_fraction() {
    let alg = Algorithm::TokenBucket {
        capacity: 1,
        refill_per_second: 0.33,
    };
    let first = alg.decide(None, T0, 1);
    assert!(first.verdict.allowed);
    let state = first.state.expect("admitted");
    let peek = alg.decide(Some(&state), T0 + SEC, 0);
    assert!((peek.verdict.remaining - 0.33).abs() < 1e-9);
    let blocked = alg.decide(Some(&state), T0 + SEC, 1);
    assert!(!blocked.verdict.allowed);
    // 0.67 token at 0.33/s: 2.030303... s.
    assert_eq!(blocked.verdict.retry_after_us, 2_030_304);
    assert!(alg.decide(Some(&state), T0 + 3_030_304, 1).verdict.allowed);

    // Over 101 s of requests every 10 ms: the one token held, then 33 more.
    let arrivals = vec![(10_000u64, 1u64); 10_100];
    let passed = run(&alg, T0, &arrivals)
        .iter()
        .filter(|r| r.step.verdict.allowed)
        .count();
    assert_eq!(passed, 1 + 33);
}

#[test]
fn gcra_and_leaky_bucket_at_a_third_of_a_unit_per_second_admit_a_third_per_second() {
    for alg in [
        Algorithm::Gcra {
            rate_per_second: 0.33,
            burst: 1,
        },
        Algorithm::LeakyBucket {
            rate_per_second: 0.33,
            capacity: 1,
            max_delay_us: 0,
        },
    ] {
        let arrivals = vec![(10_000u64, 1u64); 10_100];
        let passed = run(&alg, T0, &arrivals)
            .iter()
            .filter(|r| r.step.verdict.allowed)
            .count();
        assert_eq!(passed, 1 + 33, "{alg:?}");
    }
}

#[test]
fn a_shaper_delays_a_second_request_by_one_interval_instead_of_rejecting_it() {
    let alg = Algorithm::LeakyBucket {
        rate_per_second: 10.0,
        capacity: 5,
        max_delay_us: 250_000,
    };
    let first = alg.decide(None, T0, 1);
    let second = alg.decide(first.state.as_ref(), T0, 1);
    assert!(second.verdict.allowed);
    assert_eq!(second.verdict.delay_us, 100_000);
    let third = alg.decide(second.state.as_ref(), T0, 1);
    let fourth = alg.decide(third.state.as_ref(), T0, 1);
    assert_eq!(third.verdict.delay_us, 200_000);
    assert!(
        !fourth.verdict.allowed,
        "a 300 ms wait exceeds the 250 ms bound"
    );
    assert_eq!(fourth.verdict.retry_after_us, 50_000);
}

/// Gaps that are sometimes negative: the clock steps back by up to three
/// times `scale` (an NTP step, a failover to a Redis whose clock is behind).
fn signed_gaps(scale: u64) -> impl Strategy<Value = i64> {
    let scale = scale.max(1);
    prop_oneof![
        3 => gaps(scale).prop_map(|g| g as i64),
        1 => (1..=3 * scale).prop_map(|g| -(g as i64)),
    ]
}

/// Any of the six algorithms, quotas from 1 to 10.
fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    let quota = 1..=10u64;
    prop_oneof![
        (quota.clone(), centi_rate()).prop_map(|(capacity, c)| Algorithm::TokenBucket {
            capacity,
            refill_per_second: c as f64 / 100.0
        }),
        (quota.clone(), window_us())
            .prop_map(|(limit, window_us)| Algorithm::SlidingWindow { limit, window_us }),
        (quota.clone(), window_us())
            .prop_map(|(limit, window_us)| Algorithm::SlidingLog { limit, window_us }),
        (quota.clone(), window_us())
            .prop_map(|(limit, window_us)| Algorithm::FixedWindow { limit, window_us }),
        (quota.clone(), centi_rate()).prop_map(|(burst, c)| Algorithm::Gcra {
            rate_per_second: c as f64 / 100.0,
            burst
        }),
        (quota, centi_rate(), 0..=200u64).prop_map(|(capacity, c, share)| {
            let rate = c as f64 / 100.0;
            Algorithm::LeakyBucket {
                rate_per_second: rate,
                capacity,
                max_delay_us: capacity * interval_us(rate) * share / 100,
            }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 384,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/algorithms.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// Whatever the algorithm, a clock that steps back decides no more
    /// generously than a clock that stood still at the latest time seen:
    /// a step back never hands a quota out again. Retry times stay exact,
    /// TTLs still cover the state and a full quota is back one recovery
    /// time after the latest time seen.
    #[test]
    fn a_clock_that_steps_back_admits_no_more_than_a_clock_that_stood_still(
        alg in any_algorithm(),
        offset in 0..10 * SEC,
        seq in prop::collection::vec((signed_gaps(4 * SEC), 1..=10u64), 1..48),
    ) {
        let quota = alg.quota();
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(quota))).collect();
        // Far enough from the epoch for every step back.
        let records = run_signed(&alg, T0 + offset, &seq);
        for r in &records {
            let stood_still = alg.decide(r.prior.as_ref(), r.high, r.cost).verdict;
            let v = r.step.verdict;
            prop_assert!(
                !v.allowed || stood_still.allowed,
                "{:?}: admitted at {} after the clock had reached {}, blocked at {}",
                alg, r.now, r.high, r.high
            );
            let (seen, seen_still) = (
                alg.decide(r.prior.as_ref(), r.now, 0).verdict.remaining,
                alg.decide(r.prior.as_ref(), r.high, 0).verdict.remaining,
            );
            prop_assert!(
                seen <= seen_still + 1e-9,
                "{:?}: a peek saw {} left at {} but {} at the latest time {}",
                alg, seen, r.now, seen_still, r.high
            );
        }
        check_models_with_steps_back(&alg, &records)?;
        if let Algorithm::FixedWindow { limit, .. } = alg {
            // Windows are only ever written forwards, never over quota.
            let mut per_window: HashMap<u64, u64> = HashMap::new();
            let mut latest = 0;
            for r in records.iter().filter(|r| r.step.verdict.allowed) {
                let Some(State::Window { start_us, .. }) = r.step.state else {
                    panic!("a fixed window writes a window");
                };
                prop_assert!(start_us >= latest, "window {} written after {}", start_us, latest);
                latest = start_us;
                *per_window.entry(start_us).or_default() += r.cost;
            }
            prop_assert!(per_window.values().all(|&n| n <= limit), "{:?}", per_window);
        }
        check_common(&alg, &records);
    }
}

/// The reference models, written for a clock that may step back: each
/// keeps what the algorithm's state means in absolute time (tokens as of
/// the latest refill, the TAT, the admissions, the latest window) and must
/// agree with every verdict.
fn check_models_with_steps_back(alg: &Algorithm, records: &[Record]) -> Result<(), TestCaseError> {
    match *alg {
        Algorithm::TokenBucket {
            capacity,
            refill_per_second,
        } => {
            // Tokens in units of 1e-8, gaining `centi` units per µs from
            // the latest refill written, never for time before it. Only an
            // admission writes.
            const UNIT: i128 = 100_000_000;
            let centi = (refill_per_second * 100.0).round() as i128;
            let cap = capacity as i128 * UNIT;
            let (mut stored, mut last) = (cap, records[0].now);
            for r in records {
                let mut tokens = if r.now > last {
                    cap.min(stored + (r.now - last) as i128 * centi)
                } else {
                    stored
                };
                let need = r.cost as i128 * UNIT;
                let v = r.step.verdict;
                if v.allowed {
                    prop_assert!(tokens + 1 >= need, "admitted with {} < {}", tokens, need);
                    tokens = (tokens - need).max(0);
                    stored = tokens;
                    last = last.max(r.now);
                } else {
                    prop_assert!(tokens < need + 1, "blocked with {} >= {}", tokens, need);
                }
                prop_assert!((v.remaining * UNIT as f64 - tokens as f64).abs() <= 2.0);
            }
        }
        Algorithm::Gcra {
            rate_per_second,
            burst,
        } => check_meter(interval_us(rate_per_second), burst, 0, records)?,
        Algorithm::LeakyBucket {
            rate_per_second,
            capacity,
            max_delay_us,
        } => check_meter(
            interval_us(rate_per_second),
            capacity,
            max_delay_us,
            records,
        )?,
        Algorithm::SlidingLog { limit, window_us } => {
            // Every admission counts while it is less than a window old,
            // and one logged after `now` counts too.
            let mut log: Vec<(u64, u64)> = Vec::new();
            for r in records {
                let in_window: u64 = log
                    .iter()
                    .filter(|&&(t, _)| t + window_us > r.now)
                    .map(|&(_, c)| c)
                    .sum();
                let fits = in_window + r.cost <= limit;
                prop_assert_eq!(
                    r.step.verdict.allowed,
                    fits,
                    "{} in window at {}",
                    in_window,
                    r.now
                );
                if fits {
                    log.retain(|&(t, _)| t + window_us > r.now);
                    log.push((r.now, r.cost));
                }
            }
        }
        Algorithm::FixedWindow { limit, window_us } => {
            // The current window is the later of the clock's and the one
            // last written.
            let mut written: Option<(u64, u64)> = None;
            for r in records {
                let aligned = r.now - r.now % window_us;
                let (start, count) = match written {
                    Some((start, count)) if start >= aligned => (start, count),
                    _ => (aligned, 0),
                };
                let fits = count + r.cost <= limit;
                prop_assert_eq!(
                    r.step.verdict.allowed,
                    fits,
                    "{} in window {} at {}",
                    count,
                    start,
                    r.now
                );
                if fits {
                    written = Some((start, count + r.cost));
                }
            }
        }
        // Checked against the clock that stood still and the common
        // properties only.
        Algorithm::SlidingWindow { .. } | Algorithm::Concurrency { .. } => {}
    }
    Ok(())
}

/// GCRA and the leaky bucket: the absolute time the queue drains, which a
/// clock stepping back cannot move, so the queue ahead only grows.
fn check_meter(
    interval: u64,
    burst: u64,
    max_delay: u64,
    records: &[Record],
) -> Result<(), TestCaseError> {
    let mut tat = 0u64;
    for r in records {
        let drains = tat.max(r.now);
        let queued = drains - r.now;
        let fits = queued + r.cost * interval <= burst * interval
            && (max_delay == 0 || queued <= max_delay);
        prop_assert_eq!(
            r.step.verdict.allowed,
            fits,
            "queue {} at {}",
            queued,
            r.now
        );
        if fits {
            tat = drains + r.cost * interval;
        }
    }
    Ok(())
}

/// Every algorithm with a quota of 3 and 10 s to get it back.
fn quota_of_three_per_ten_seconds() -> [Algorithm; 6] {
    let window_us = 10 * SEC;
    [
        Algorithm::TokenBucket {
            capacity: 3,
            refill_per_second: 0.3,
        },
        Algorithm::SlidingWindow {
            limit: 3,
            window_us,
        },
        Algorithm::SlidingLog {
            limit: 3,
            window_us,
        },
        Algorithm::FixedWindow {
            limit: 3,
            window_us,
        },
        Algorithm::Gcra {
            rate_per_second: 0.3,
            burst: 3,
        },
        Algorithm::LeakyBucket {
            rate_per_second: 0.3,
            capacity: 3,
            max_delay_us: 0,
        },
    ]
}

#[test]
fn a_clock_stepped_back_thirty_seconds_hands_out_no_quota_again() {
    // Aligned so the step back crosses three fixed windows.
    let t = T0 - T0 % (10 * SEC) + 9 * SEC;
    for alg in quota_of_three_per_ten_seconds() {
        let mut state = None;
        for _ in 0..3 {
            let step = alg.decide(state.as_ref(), t, 1);
            assert!(step.verdict.allowed, "{alg:?}");
            state = step.state;
        }
        // The clock steps back 30 s and walks forward to where it was,
        // one request per 100 ms: 300 tries at three stale windows.
        let mut admitted = 0;
        for k in 0..300 {
            let now = t - 30 * SEC + k * SEC / 10;
            let step = alg.decide(state.as_ref(), now, 1);
            if step.verdict.allowed {
                admitted += 1;
                state = step.state;
            } else {
                assert!(
                    now + step.verdict.retry_after_us >= t,
                    "{alg:?}: told to retry at {} before the quota's own time {t}",
                    now + step.verdict.retry_after_us
                );
            }
        }
        assert_eq!(admitted, 0, "{alg:?}: a step back handed out quota again");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/algorithms.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// A reload that shortens a window to a length dividing the old one
    /// (1d -> 12h -> 1h, 1h -> 60s) and changes its limit: every window of
    /// the new length, counting the units admitted in it before the reload
    /// too, admits at most the new limit, on the fixed and the sliding
    /// counter (whose estimate never counts less than the fixed count of
    /// the current window).
    #[test]
    fn a_shortened_window_never_admits_more_than_its_new_limit_in_any_new_window(
        sliding in any::<bool>(),
        old_limit in 1..=12u64,
        new_limit in 1..=12u64,
        divisor in prop::sample::select(vec![1u64, 2, 3, 4, 12, 24, 60]),
        before in prop::collection::vec((0..90_000_000u64, 1..=3u64), 1..30),
        after in prop::collection::vec((0..90_000_000u64, 1..=3u64), 1..60),
    ) {
        let old_window = 3_600 * SEC;
        let new_window = old_window / divisor;
        let make = |limit, window_us| if sliding {
            Algorithm::SlidingWindow { limit, window_us }
        } else {
            Algorithm::FixedWindow { limit, window_us }
        };
        let (old, new) = (make(old_limit, old_window), make(new_limit, new_window));
        let mut state: Option<State> = None;
        let mut now = T0 - T0 % old_window;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (alg, seq) in [(&old, &before), (&new, &after)] {
            for &(gap, cost) in seq {
                now += gap;
                let step = alg.decide(state.as_ref(), now, cost.min(alg.quota()));
                if step.verdict.allowed {
                    admitted.push((now, cost.min(alg.quota())));
                    state = step.state;
                }
            }
            if std::ptr::eq(alg, &old) {
                // The reload happens here: from now on the new window applies.
                admitted.push((now, 0));
            }
        }
        let reload_at = admitted.iter().position(|&(_, c)| c == 0).unwrap();
        let reload_time = admitted[reload_at].0;
        // Per window of the new length: units admitted before the reload
        // (under the old limit) and after it.
        let mut per_window: HashMap<u64, (u64, u64)> = HashMap::new();
        for (i, &(t, c)) in admitted.iter().enumerate() {
            let e = per_window.entry(t - t % new_window).or_default();
            if i < reload_at { e.0 += c } else { e.1 += c }
        }
        for (w, (pre, post)) in per_window {
            if post == 0 {
                continue;
            }
            prop_assert!(w + new_window > reload_time);
            // What was admitted before counts against the new limit: a
            // window already past it admits nothing more.
            prop_assert!(
                pre + post <= new_limit.max(pre),
                "window at {w}: {pre} admitted before the reload and {post} after, new limit {new_limit}"
            );
        }
    }
}
