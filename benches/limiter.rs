//! Whole decisions through `Limiter::check` (identity → tier → store →
//! telemetry), with telemetry off and on, on the memory store and on a real
//! `redis-server`, side by side in one run so the ratios mean something.
//!
//! `cargo bench --bench limiter`
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewatch::Limiter;
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{Limit, Policy, StoreKind, StoreSettings, Tier};
use ratewatch::telemetry::Telemetry;

fn policy(store: StoreSettings) -> Policy {
    Policy::builder()
        .store(store)
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 1_000_000_000, 1e6))
                .limit(Limit::sliding_window(
                    "minute",
                    1_000_000_000,
                    Duration::from_secs(60),
                ))
                .limit(Limit::fixed_window(
                    "day",
                    1_000_000_000,
                    Duration::from_secs(86_400),
                )),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)))
        .build()
        .expect("valid policy")
}

fn check(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let redis = support::RedisServer::start();
    let redis_store = StoreSettings {
        kind: StoreKind::Redis,
        url: Some(redis.url()),
        timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let ids: Vec<Identity> = (0..1000)
        .map(|i| Identity::new(IdentityKind::ApiKey, format!("free_bench_{i}")))
        .collect();
    let cases = rt.block_on(async {
        let build = |store: StoreSettings, telemetry: Option<Telemetry>| async move {
            let p = policy(store);
            let t = telemetry.unwrap_or_else(|| Telemetry::for_store(&p.telemetry, &p.store));
            Limiter::builder(p)
                .with_telemetry(t)
                .build()
                .await
                .expect("limiter")
        };
        vec![
            (
                "memory/telemetry_off",
                build(StoreSettings::default(), Some(Telemetry::disabled())).await,
            ),
            (
                "memory/telemetry_on",
                build(StoreSettings::default(), None).await,
            ),
            (
                "redis/telemetry_off",
                build(redis_store.clone(), Some(Telemetry::disabled())).await,
            ),
            ("redis/telemetry_on", build(redis_store.clone(), None).await),
        ]
    });
    let mut group = c.benchmark_group("check_3_limits");
    group.throughput(Throughput::Elements(1));
    for (name, limiter) in &cases {
        let mut i = 0;
        group.bench_function(*name, |b| {
            b.to_async(&rt).iter(|| {
                i += 1;
                let id = &ids[i % ids.len()];
                async move {
                    let d = limiter.check(id, "free", None).await;
                    assert!(d.allowed && !d.is_fallback());
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, check);
criterion_main!(benches);
