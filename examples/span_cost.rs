//! What a decision costs in process, to weigh the decision span: N
//! `Limiter::check` calls on the memory store (three limits, fleet view
//! off, no tracing subscriber), over 1,000 identities.
//!
//! cargo run --profile bench --example span_cost -- 200000
//!
//! Wall time is noisy on a shared machine; instruction counts are not:
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/examples/span_cost 200000
//! gives the total instructions (Ir) of N decisions plus start-up; run it at
//! two N and divide the difference by the difference of N.
use std::time::{Duration, Instant};

use ratewatch::Limiter;
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{Limit, Policy, Tier};
use ratewatch::telemetry::Telemetry;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let policy = Policy::builder()
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
            .expect("valid policy");
        let limiter = Limiter::builder(policy)
            .with_telemetry(Telemetry::disabled())
            .build()
            .await
            .expect("limiter");
        let ids: Vec<Identity> = (0..1000)
            .map(|i| Identity::new(IdentityKind::ApiKey, format!("free_cost_{i}")))
            .collect();
        let started = Instant::now();
        for i in 0..n {
            let d = limiter.check(&ids[i % ids.len()], "free", None).await;
            assert!(d.allowed);
        }
        let took = started.elapsed();
        println!(
            "{n} decisions in {took:?}: {:.0} ns each",
            took.as_nanos() as f64 / n as f64
        );
    });
}
