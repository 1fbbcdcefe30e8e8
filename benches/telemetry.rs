//! `Telemetry::record` throughput: metrics only (no fleet view), the fleet
//! view in process, and the Redis sink flushing to a real `redis-server`.
//! No Prometheus recorder is installed, so the figures isolate the fleet
//! view's cost; a last case adds the global Prometheus recorder.
//!
//! `cargo bench --bench telemetry`
#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewatch::policy::TelemetrySettings;
use ratewatch::telemetry::{Event, Outcome, RedisTarget, Telemetry, metrics};

fn events() -> Vec<Event> {
    (0..1024)
        .map(|i| Event {
            tier: Arc::from(["free", "pro", "anonymous"][i % 3]),
            route: Arc::from("/api/users"),
            limit: Some(Arc::from("burst")),
            exceeded: Vec::new(),
            outcome: Outcome::ALL[i % 5],
            shard: Arc::from("127.0.0.1:6379"),
            identity: format!("free_tk…{:04x}", i % 200).into(),
            cost: 1,
            units: Default::default(),
            redis_rtt: Some(Duration::from_micros(200 + i as u64)),
            fallback: None,
        })
        .collect()
}

fn record(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _guard = rt.enter();
    let redis = support::RedisServer::start();
    let settings = TelemetrySettings::default();
    let evs = events();
    let mut group = c.benchmark_group("record");
    group.throughput(Throughput::Elements(1));
    let cases = [
        ("metrics_only", Telemetry::disabled()),
        ("in_process", Telemetry::in_process(&settings)),
        (
            "redis_sink",
            Telemetry::redis(&settings, RedisTarget::node(redis.url(), "bench")),
        ),
    ];
    for (name, t) in &cases {
        let mut i = 0;
        group.bench_function(*name, |b| {
            b.iter(|| {
                t.record(&evs[i & 1023]);
                i += 1;
            })
        });
    }
    let _handle = metrics::install_prometheus().expect("recorder");
    let (_, t) = &cases[2];
    let mut i = 0;
    group.bench_function("redis_sink_with_prometheus", |b| {
        b.iter(|| {
            t.record(&evs[i & 1023]);
            i += 1;
        })
    });
    group.finish();
    rt.block_on(async {
        for (_, t) in &cases {
            t.shutdown().await;
        }
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    targets = record
}
criterion_main!(benches);
