//! `lua/settle.lua` repeats `ratewatch::algorithm::settle` exactly: random
//! decisions interleaved with random settles (charges and refunds, some of
//! a window that has rolled since, some of hostile sizes up to `u64::MAX`)
//! at explicit times leave the memory store (the Rust functions) and Redis
//! (the script) deciding every later request bit for bit alike.

mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratewatch::algorithm::{Adjust, Algorithm};
use ratewatch::clock::{Clock, SystemClock};
use ratewatch::policy::StoreSettings;
use ratewatch::store::{Batch, Item, MemoryStore, RedisStore, Settle, Store};
use std::time::Duration;
use support::RedisServer;

fn random_algorithm(rng: &mut StdRng, kind: usize) -> Algorithm {
    let window_us = rng.random_range(1_000_000..=20_000_000u64);
    let limit = rng.random_range(1..=25u64);
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
            max_delay_us: 0,
        },
    }
}

fn units(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..10) {
        0 => u64::MAX,
        1 => u64::MAX / 3,
        2 => rng.random_range(20..=200),
        _ => rng.random_range(1..=6),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_settles_leave_rust_and_lua_deciding_alike() {
    let server = RedisServer::start();
    let redis = RedisStore::connect(&StoreSettings {
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    })
    .await
    .expect("connect");
    let memory = MemoryStore::new();
    let mut rng = StdRng::seed_from_u64(0x5e77_1e20);
    let (mut charged, mut refunded, mut compared) = (0, 0, 0);
    for config in 0..36 {
        let algorithms: Vec<Algorithm> = (0..rng.random_range(1..=3))
            .map(|i| random_algorithm(&mut rng, (config + i) % 6))
            .collect();
        let items: Vec<Item> = algorithms
            .iter()
            .enumerate()
            .map(|(i, a)| {
                Item::new(
                    format!("rw:{{settle:{config}}}:{i}:{}", a.kind()),
                    a.clone(),
                )
            })
            .collect();
        // Explicit time runs ahead of real time, so Redis never expires a
        // key before the explicit clock has passed its TTL.
        let base = SystemClock.now_us();
        let real = std::time::Instant::now();
        let mut offset = 0u64;
        let mut decided: Vec<u64> = Vec::new();
        for step in 0..80 {
            offset += match rng.random_range(0..10) {
                0..=2 => 0,
                3..=7 => rng.random_range(1..=400_000),
                _ => rng.random_range(1_000_000..=12_000_000),
            };
            let now = base + offset + real.elapsed().as_micros() as u64;
            let context = format!("config {config} step {step} at {now}: {algorithms:?}");
            if !decided.is_empty() && rng.random_range(0..3) == 0 {
                // Usually the latest decision, sometimes an older one whose
                // window may have rolled.
                let at = if rng.random_bool(0.7) {
                    *decided.last().unwrap()
                } else {
                    decided[rng.random_range(0..decided.len())]
                };
                let adjust = if rng.random_bool(0.5) {
                    charged += 1;
                    Adjust::Charge(units(&mut rng))
                } else {
                    refunded += 1;
                    Adjust::Refund(units(&mut rng))
                };
                let settle = Settle::new(&items, at, adjust).at(now);
                memory.settle(&settle).await.expect("memory settles");
                redis.settle(&settle).await.expect("redis settles");
            }
            let cost = rng.random_range(0..=3);
            let batch = Batch::consume(&items, cost).at(now);
            let want = memory.decide(&batch).await.expect("memory decides");
            let got = redis.decide(&batch).await.expect("redis decides");
            assert_eq!(want.allowed, got.allowed, "allowed: {context}");
            for (w, g) in want.verdicts.iter().zip(&got.verdicts) {
                assert_eq!(w.allowed, g.allowed, "{context}");
                assert_eq!(
                    w.remaining.to_bits(),
                    g.remaining.to_bits(),
                    "remaining {} vs {}: {context}",
                    w.remaining,
                    g.remaining
                );
                assert_eq!(w.reset_after_us, g.reset_after_us, "reset: {context}");
                assert_eq!(w.retry_after_us, g.retry_after_us, "retry: {context}");
            }
            if want.allowed && cost > 0 {
                decided.push(now);
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 36 * 80);
    assert!(
        charged > 100 && refunded > 100,
        "{charged} charges, {refunded} refunds"
    );
}
