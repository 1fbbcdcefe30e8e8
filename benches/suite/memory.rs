//! Redis bytes per identity for each algorithm: a thousand identities make
//! one request each through a real limiter; `MEMORY USAGE` of their keys
//! and the growth of `used_memory` are divided by the count.

use std::time::Duration;

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::StoreKind;
use ratewatch::telemetry::Telemetry;
use ratewatch::{Limit, Limiter, Policy, Tier};

use crate::support::RedisServer;

/// One algorithm's footprint.
#[derive(Debug, Clone)]
pub struct Footprint {
    pub algorithm: &'static str,
    /// Mean `MEMORY USAGE key SAMPLES 0` over the identities' keys.
    pub memory_usage: f64,
    /// Growth of `used_memory` per identity (key, value, expiry entry and
    /// the keyspace's own tables).
    pub used_memory: f64,
    /// Goal in bytes, where the design sets one.
    pub goal: Option<f64>,
}

const IDENTITIES: usize = 1000;

/// Rates slow enough that no key expires while the thousand identities
/// are decided and measured: a bucket's or GCRA's key lives until it is
/// full again, one unit at 1/s was a second, so most keys had gone (and
/// read as 0 bytes) before.
fn limits() -> Vec<(&'static str, Limit, Option<f64>)> {
    let hour = Duration::from_secs(3600);
    vec![
        (
            "token_bucket",
            Limit::token_bucket("l", 1000, 0.001),
            Some(80.0),
        ),
        ("gcra", Limit::gcra("l", 0.001, 1000), Some(80.0)),
        (
            "sliding_window",
            Limit::sliding_window("l", 1000, hour),
            Some(100.0),
        ),
        (
            "fixed_window",
            Limit::fixed_window("l", 1000, hour),
            Some(100.0),
        ),
        ("leaky_bucket", Limit::leaky_bucket("l", 0.001, 1000), None),
        (
            "sliding_log (1 entry)",
            Limit::sliding_log("l", 1000, hour),
            None,
        ),
    ]
}

fn used_memory(server: &RedisServer) -> f64 {
    server
        .cli(&["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0)
}

pub fn measure(server: &RedisServer) -> Vec<Footprint> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let ids: Vec<Identity> = (0..IDENTITIES)
        .map(|i| Identity::new(IdentityKind::ApiKey, format!("free_mem_{i:05}")))
        .collect();
    let mut out = Vec::new();
    for (algorithm, limit, goal) in limits() {
        server.cli(&["FLUSHALL", "SYNC"]);
        let policy = Policy::builder()
            .store(crate::serve::redis_settings(
                StoreKind::Redis,
                &[server.url()],
            ))
            .tier(Tier::new("free").match_prefix("free_").limit(limit))
            .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)))
            .build()
            .expect("policy");
        let before = rt.block_on(async {
            let limiter = Limiter::builder(policy)
                .with_telemetry(Telemetry::disabled())
                .build()
                .await
                .expect("limiter");
            // The script is loaded and the connection made before measuring.
            let warm = Identity::new(IdentityKind::ApiKey, "free_warm");
            limiter.check(&warm, "free", None).await;
            server.cli(&["DEL", &first_key(server)]);
            let before = used_memory(server);
            for id in &ids {
                let d = limiter.check(id, "free", None).await;
                assert!(d.allowed && !d.is_fallback(), "{algorithm}: {d:?}");
            }
            before
        });
        let after = used_memory(server);
        let keys: Vec<String> = server
            .cli(&["KEYS", "rw:*"])
            .lines()
            .take(100)
            .map(str::to_owned)
            .collect();
        // Only keys still there: one that expired has no usage to read.
        let usage: Vec<f64> = keys
            .iter()
            .filter_map(|k| {
                server
                    .cli(&["MEMORY", "USAGE", k, "SAMPLES", "0"])
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .collect();
        out.push(Footprint {
            algorithm,
            memory_usage: usage.iter().sum::<f64>() / usage.len().max(1) as f64,
            used_memory: (after - before) / IDENTITIES as f64,
            goal,
        });
    }
    out
}

fn first_key(server: &RedisServer) -> String {
    server.cli(&["RANDOMKEY"]).trim().to_owned()
}
