//! The Lua scripts repeat the Rust algorithms exactly: random arrival
//! sequences at explicit times give the same verdicts, bit for bit, through
//! `Algorithm::decide` and through Redis, also when the explicit clock steps
//! back (then the TTLs Redis sets are compared too), and when a reload
//! changes an algorithm's parameters under the same key (a window, limit,
//! capacity or rate: the state is read conservatively under the new ones).

mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratewatch::algorithm::{Algorithm, State};
use ratewatch::clock::{Clock, SystemClock};
use ratewatch::policy::StoreSettings;
use ratewatch::store::{Batch, Item, RedisStore, Store};
use std::time::Duration;
use support::RedisServer;

/// A random algorithm, with fractional rates and windows of seconds.
fn random_algorithm(rng: &mut StdRng, kind: usize) -> Algorithm {
    let window_us = rng.random_range(1_000_000..=90_000_000u64);
    let limit = rng.random_range(1..=25u64);
    // Fractional rates that are not round in binary.
    let rate = rng.random_range(0.01..5.0f64);
    match kind {
        0 => Algorithm::TokenBucket {
            capacity: limit,
            refill_per_second: rate,
        },
        1 => Algorithm::SlidingWindow { limit, window_us },
        2 => Algorithm::SlidingLog { limit, window_us },
        3 => Algorithm::FixedWindow { limit, window_us },
        4 => Algorithm::Gcra {
            rate_per_second: rate,
            burst: limit,
        },
        _ => Algorithm::LeakyBucket {
            rate_per_second: rate,
            capacity: limit,
            max_delay_us: match rng.random_range(0..3) {
                0 => 0,
                1 => rng.random_range(1..=1_000),
                _ => rng.random_range(1..=5_000_000),
            },
        },
    }
}

/// A gap between arrivals: often none (same microsecond), often short,
/// sometimes longer than a window.
fn random_gap(rng: &mut StdRng, scale_us: u64) -> u64 {
    match rng.random_range(0..10) {
        0..=1 => 0,
        2..=5 => rng.random_range(1..=scale_us / 10 + 1),
        6..=8 => rng.random_range(1..=scale_us),
        _ => rng.random_range(scale_us..=3 * scale_us),
    }
}

fn scale_of(algorithm: &Algorithm) -> u64 {
    algorithm.window_secs() * 1_000_000 / algorithm.quota().max(1) + 1
}

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&StoreSettings {
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    })
    .await
    .expect("connect")
}

/// Runs 6 × 12 random configurations of 120 steps each through Rust and
/// through Redis and compares every verdict bit for bit. With `steps_back`,
/// one gap in five is negative (up to three windows): the clock steps back.
/// Redis expires keys on its own clock, which the explicit clock no longer
/// follows then; so each written key's TTL is compared with the step's and
/// then removed (`PERSIST`), and both sides keep their state for good.
/// With `reloads`, one step in ten first draws new parameters for the same
/// algorithm and key, as a reload does (and keys are kept the same way,
/// since a longer window reads state past the old one's TTL).
async fn compare(server: &RedisServer, seed: u64, steps_back: bool, reloads: bool) -> usize {
    let store = connect(server).await;
    let mut conn = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut compared = 0;
    for kind in 0..6 {
        for config in 0..12 {
            let mut algorithm = random_algorithm(&mut rng, kind);
            let key = format!("rw:{{parity:{seed}:{kind}-{config}}}:{}", algorithm.kind());
            let mut items = [Item::new(key.clone(), algorithm.clone())];
            let mut state: Option<State> = None;
            // Explicit time runs ahead of real time by the random gaps, so
            // Redis never expires a key before the explicit clock has passed
            // its TTL (past it, old state decides exactly like a fresh key).
            let base = SystemClock.now_us();
            let real = std::time::Instant::now();
            let mut offset: i64 = 0;
            let scale = scale_of(&algorithm);
            let mut last_retry = 0;
            for step in 0..120 {
                if reloads && rng.random_range(0..10) == 0 {
                    algorithm = random_algorithm(&mut rng, kind);
                    items = [Item::new(key.clone(), algorithm.clone())];
                }
                // Often come back exactly when told to (or a microsecond
                // early): the retry arithmetic is where rounding hides.
                let gap = match (last_retry, rng.random_range(0..3)) {
                    (0, _) | (_, 2) => random_gap(&mut rng, scale),
                    (r, 0) => r,
                    (r, _) => r - 1,
                } as i64;
                offset += if steps_back && rng.random_range(0..5) == 0 {
                    -(rng.random_range(1..=3 * scale) as i64)
                } else {
                    gap
                };
                let now = (base as i64 + offset + real.elapsed().as_micros() as i64) as u64;
                let peek = rng.random_range(0..8) == 0;
                let cost = if peek {
                    0
                } else {
                    rng.random_range(1..=algorithm.quota().min(3))
                };
                let expected = algorithm.decide(state.as_ref(), now, cost);
                let batch = if peek {
                    Batch::peek(&items).at(now)
                } else {
                    Batch::consume(&items, cost).at(now)
                };
                let got = store.decide(&batch).await.expect("redis decides");
                let context = format!("{algorithm:?} step {step} at {now} cost {cost}");
                let (want, have) = (expected.verdict, got.verdicts[0]);
                assert_eq!(want.allowed, have.allowed, "allowed: {context}");
                assert_eq!(
                    want.remaining.to_bits(),
                    have.remaining.to_bits(),
                    "remaining {} vs {}: {context}",
                    want.remaining,
                    have.remaining
                );
                assert_eq!(want.reset_after_us, have.reset_after_us, "reset: {context}");
                assert_eq!(want.retry_after_us, have.retry_after_us, "retry: {context}");
                assert_eq!(want.delay_us, have.delay_us, "delay: {context}");
                assert_eq!(got.now, now, "the script decides at the explicit time");
                let written = want.allowed && !peek;
                if written {
                    state = expected.state;
                }
                if (steps_back || reloads) && written {
                    let pttl: i64 = redis::cmd("PTTL")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .expect("pttl");
                    let ttl_ms = expected.ttl_us.div_ceil(1000).max(1) as i64;
                    // Real time passed since the write: a generous second.
                    // A key whose TTL was a few milliseconds (a fixed window
                    // written just before its end) may be gone already.
                    assert!(
                        pttl <= ttl_ms && (pttl > ttl_ms - 1000 || (pttl == -2 && ttl_ms < 1000)),
                        "ttl {pttl} ms in Redis, {ttl_ms} ms in Rust: {context}"
                    );
                    let persisted: i64 = redis::cmd("PERSIST")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .expect("persist");
                    if persisted == 0 {
                        // Expired before it could be kept: Redis starts the
                        // key afresh, and so does the model.
                        assert!(ttl_ms < 1000, "a key with {ttl_ms} ms to live vanished");
                        state = None;
                    }
                }
                last_retry = want.retry_after_us;
                compared += 1;
            }
        }
    }
    compared
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_arrivals_get_identical_verdicts_in_rust_and_in_lua() {
    let server = RedisServer::start();
    assert_eq!(
        compare(&server, 0x5eed_2026, false, false).await,
        6 * 12 * 120
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_that_steps_back_gets_identical_verdicts_and_ttls_in_rust_and_in_lua() {
    let server = RedisServer::start();
    assert_eq!(
        compare(&server, 0xbac_2026, true, false).await,
        6 * 12 * 120
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_that_change_parameters_get_identical_verdicts_and_ttls_in_rust_and_in_lua() {
    let server = RedisServer::start();
    assert_eq!(
        compare(&server, 0x4e10_2026, false, true).await,
        6 * 12 * 120
    );
}

/// Batches of several limits, each asked its own cost (0 checks without
/// charging), as the decision service sends them: the memory store (the
/// Rust algorithms) and the Lua script decide them alike, all or nothing,
/// and a blocked batch charges nothing on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_item_costs_get_identical_verdicts_in_rust_and_in_lua() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let memory = ratewatch::store::MemoryStore::new();
    let mut rng = StdRng::seed_from_u64(0x17e3_2026);
    let mut blocked = 0;
    for config in 0..24 {
        let algorithms: Vec<Algorithm> = (0..rng.random_range(2..=4))
            .map(|_| {
                let kind = rng.random_range(0..6);
                random_algorithm(&mut rng, kind)
            })
            .collect();
        let base = SystemClock.now_us();
        let real = std::time::Instant::now();
        let mut offset = 0u64;
        for step in 0..60 {
            offset += random_gap(&mut rng, 200_000);
            let now = base + offset + real.elapsed().as_micros() as u64;
            let items: Vec<Item> = algorithms
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let cost = match rng.random_range(0..4) {
                        0 => 0,
                        _ => rng.random_range(1..=a.quota().min(3)),
                    };
                    Item::new(format!("rw:{{pi:{config}}}:{i}:{}", a.kind()), a.clone())
                        .with_cost(cost)
                })
                .collect();
            let batch = Batch::consume(&items, 1).at(now);
            let want = memory.decide(&batch).await.expect("memory decides");
            let got = redis.decide(&batch).await.expect("redis decides");
            let context = format!("config {config} step {step}: {items:?}");
            assert_eq!(want.allowed, got.allowed, "allowed: {context}");
            blocked += usize::from(!want.allowed);
            for (w, g) in want.verdicts.iter().zip(&got.verdicts) {
                assert_eq!(w.allowed, g.allowed, "{context}");
                assert_eq!(w.remaining.to_bits(), g.remaining.to_bits(), "{context}");
                assert_eq!(w.reset_after_us, g.reset_after_us, "{context}");
                assert_eq!(w.retry_after_us, g.retry_after_us, "{context}");
            }
        }
    }
    assert!(
        blocked > 20,
        "the sequences must reach refusals ({blocked})"
    );
}

/// Batches that name one counter several times (a descriptor repeated in
/// one rate limit service request): each copy is charged in order, on
/// the state the copies before it left, inside the one atomic call, and a
/// refused batch charges none of them. The memory store (the Rust
/// algorithms) and the Lua script decide them alike, every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_keys_get_identical_verdicts_in_rust_and_in_lua() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let memory = ratewatch::store::MemoryStore::new();
    let mut rng = StdRng::seed_from_u64(0x2e9e_2026);
    let (mut blocked, mut repeated, mut chained) = (0, 0, 0);
    for config in 0..36 {
        // One or two counters, named again and again.
        let counters: Vec<(String, Algorithm)> = (0..rng.random_range(1..=2))
            .map(|c| {
                let kind = rng.random_range(0..6);
                let a = random_algorithm(&mut rng, kind);
                (format!("rw:{{rk:{config}}}:{c}:{}", a.kind()), a)
            })
            .collect();
        let base = SystemClock.now_us();
        let real = std::time::Instant::now();
        let mut offset = 0u64;
        for step in 0..50 {
            offset += random_gap(&mut rng, 300_000);
            let now = base + offset + real.elapsed().as_micros() as u64;
            let items: Vec<Item> = (0..rng.random_range(2..=5))
                .map(|_| {
                    let (key, a) = &counters[rng.random_range(0..counters.len())];
                    let cost = match rng.random_range(0..5) {
                        0 => 0,
                        _ => rng.random_range(1..=a.quota().min(3)),
                    };
                    let mut item = Item::new(key.clone(), a.clone()).with_cost(cost);
                    item.shadow = rng.random_range(0..8) == 0;
                    item
                })
                .collect();
            let batch = Batch::consume(&items, 1).at(now);
            let want = memory.decide(&batch).await.expect("memory decides");
            let got = redis.decide(&batch).await.expect("redis decides");
            let context = format!("config {config} step {step}: {items:?}");
            assert_eq!(want.allowed, got.allowed, "allowed: {context}");
            blocked += usize::from(!want.allowed);
            let keys: std::collections::HashSet<&str> = items.iter().map(|i| &*i.key).collect();
            if keys.len() < items.len() {
                repeated += 1;
                // Two charged copies of a key admitted together: the later
                // one was decided on the earlier one's charge.
                chained += usize::from(
                    want.allowed
                        && items.iter().enumerate().any(|(i, a)| {
                            a.cost != Some(0)
                                && items[..i]
                                    .iter()
                                    .any(|b| b.key == a.key && b.cost != Some(0))
                        }),
                );
            }
            for (w, g) in want.verdicts.iter().zip(&got.verdicts) {
                assert_eq!(w.allowed, g.allowed, "{context}");
                assert_eq!(w.remaining.to_bits(), g.remaining.to_bits(), "{context}");
                assert_eq!(w.reset_after_us, g.reset_after_us, "{context}");
                assert_eq!(w.retry_after_us, g.retry_after_us, "{context}");
                assert_eq!(w.delay_us, g.delay_us, "{context}");
            }
        }
    }
    assert!(repeated > 500, "the batches must repeat keys ({repeated})");
    assert!(
        chained > 100,
        "admitted batches must charge a key twice ({chained})"
    );
    assert!(
        blocked > 50,
        "the sequences must reach refusals ({blocked})"
    );
}

/// A key named twice is charged twice: `[k +1, k +1]` on a fixed window
/// of 5 admits twice and refuses the third time, on Redis as in memory,
/// and a refused batch leaves the counter as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_named_twice_in_one_batch_is_charged_twice_on_both_stores() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let memory = ratewatch::store::MemoryStore::new();
    let window = Algorithm::FixedWindow {
        limit: 5,
        window_us: 3_600_000_000,
    };
    let key = "rw:{twice}:k:fw";
    let pair = [
        Item::new(key, window.clone()).with_cost(2),
        Item::new(key, window.clone()).with_cost(1),
    ];
    let check = [Item::new(key, window.clone()).with_cost(0)];
    for store in [&redis as &dyn Store, &memory as &dyn Store] {
        let first = store.decide(&Batch::consume(&pair, 1)).await.unwrap();
        assert!(first.allowed, "{}", store.kind());
        let left: Vec<f64> = first.verdicts.iter().map(|v| v.remaining).collect();
        assert_eq!(left, [3.0, 2.0], "each copy reports its own charge");
        // 3 more would make 6: refused, and neither copy is charged.
        let second = store.decide(&Batch::consume(&pair, 1)).await.unwrap();
        assert!(!second.allowed, "{}", store.kind());
        assert!(second.verdicts[0].allowed && !second.verdicts[1].allowed);
        assert_eq!(second.verdicts[0].remaining, 2.0, "uncharged");
        let after = store.decide(&Batch::consume(&check, 1)).await.unwrap();
        assert_eq!(after.verdicts[0].remaining, 2.0, "{}", store.kind());
    }
}
