//! Decision throughput: the memory store deciding one limit versus a tier's
//! three (burst + minute + day) per request, single-threaded, and each
//! algorithm's pure `decide` on a warm state.
//!
//! `cargo bench --bench decide -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewatch::algorithm::Algorithm;
use ratewatch::clock::ManualClock;
use ratewatch::store::{Batch, Item, MemoryStore};

const SEC: u64 = 1_000_000;
const T0: u64 = 1_700_000_000_000_000;

/// Generous limits, so every request is admitted and every state written.
fn tier_items(count: usize) -> Vec<Item> {
    let all = [
        Item::new(
            "rw:{free:bench}:burst",
            Algorithm::TokenBucket {
                capacity: 1_000_000,
                refill_per_second: 1_000_000.0,
            },
        ),
        Item::new(
            "rw:{free:bench}:minute",
            Algorithm::SlidingWindow {
                limit: u64::MAX / 4,
                window_us: 60 * SEC,
            },
        ),
        Item::new(
            "rw:{free:bench}:day",
            Algorithm::FixedWindow {
                limit: u64::MAX / 4,
                window_us: 86_400 * SEC,
            },
        ),
    ];
    all.into_iter().take(count).collect()
}

fn store_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));
    for (name, count) in [("1_limit", 1), ("3_limits", 3)] {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let items = tier_items(count);
        group.bench_function(name, |b| {
            b.iter(|| {
                clock.advance_us(1);
                let d = store.decide_now(black_box(&Batch::consume(&items, 1)));
                assert!(d.allowed);
                d
            })
        });
    }
    group.finish();
}

fn algorithm_decide(c: &mut Criterion) {
    let algorithms = [
        Algorithm::TokenBucket {
            capacity: 10,
            refill_per_second: 0.33,
        },
        Algorithm::SlidingWindow {
            limit: 20,
            window_us: 60 * SEC,
        },
        Algorithm::SlidingLog {
            limit: 20,
            window_us: 60 * SEC,
        },
        Algorithm::FixedWindow {
            limit: 1000,
            window_us: 86_400 * SEC,
        },
        Algorithm::Gcra {
            rate_per_second: 10.0,
            burst: 20,
        },
        Algorithm::LeakyBucket {
            rate_per_second: 10.0,
            capacity: 20,
            max_delay_us: 500_000,
        },
    ];
    let mut group = c.benchmark_group("algorithm");
    group.throughput(Throughput::Elements(1));
    for alg in algorithms {
        // A warm state: half the quota used a moment ago.
        let mut state = None;
        for i in 0..alg.quota() / 2 {
            let step = alg.decide(state.as_ref(), T0 + i, 1);
            state = step.state.or(state);
        }
        let now = T0 + alg.quota();
        group.bench_function(alg.kind(), |b| {
            b.iter(|| alg.decide(black_box(state.as_ref()), black_box(now), black_box(1)))
        });
    }
    group.finish();
}

criterion_group!(benches, store_decide, algorithm_decide);
criterion_main!(benches);
