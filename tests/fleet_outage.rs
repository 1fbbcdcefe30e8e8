//! The fleet view keeps an outage: decisions made while Redis was away
//! reach the fleet view in Redis once it is back, in the buckets of the
//! time they were made, on real `ratewatch serve` and redis-server
//! processes.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::{Ratewatch, RedisServer, eventually, get_json};

/// Fail-open decisions made while Redis is down.
const DURING_OUTAGE: u64 = 60;

fn config(dir: &Path) -> PathBuf {
    let path = dir.join("outage.toml");
    std::fs::write(
        &path,
        r#"
[store]
kind = "redis"
timeout_ms = 100

[resilience]
on_store_failure = "open"
breaker = { failures = 5, open_ms = 1000 }

[identity]
trusted_proxies = []

[telemetry]
flush_interval_ms = 200

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 100 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 100 }]
"#,
    )
    .expect("write config");
    path
}

fn fallbacks(stats: &Value) -> u64 {
    stats["totals"]
        .as_object()
        .map(|tiers| {
            tiers
                .values()
                .map(|t| t["fallback_allowed"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

fn trips(stats: &Value) -> u64 {
    stats["breaker_trips"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fail_open_decisions_made_while_redis_was_down_reach_the_fleet_view_once_it_is_back() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let server = Ratewatch::start(
        "serve",
        Some(&cfg),
        &[("RATEWATCH_REDIS_URL", &redis.url())],
    );
    let client = reqwest::Client::new();
    let stats_url = format!("{}/dashboard/api/stats?range=5m", server.url());
    let send = |n: u64| {
        let client = client.clone();
        let url = format!("{}/api/users", server.url());
        async move {
            for _ in 0..n {
                let status = client
                    .get(&url)
                    .header("x-api-key", "free_outage_client")
                    .send()
                    .await
                    .expect("server answers")
                    .status();
                assert_eq!(status, 200, "fail open: every request passes");
            }
        }
    };
    // Connected and flushing before the outage.
    send(3).await;
    eventually(
        Duration::from_secs(10),
        "the fleet view answers",
        || async {
            let s = get_json(&client, &stats_url).await?;
            (s["source"]["kind"] == "fleet" && s["decisions"].as_u64()? >= 3).then_some(())
        },
    )
    .await;

    tokio::task::block_in_place(|| redis.kill());
    send(DURING_OUTAGE).await;
    // The page says, during the outage, that events wait for Redis.
    let during = eventually(
        Duration::from_secs(10),
        "the page shows the outage's events waiting for Redis",
        || async {
            let s = get_json(&client, &stats_url).await?;
            (s["source"]["kind"] == "instance"
                && s["source"]["unflushed_events"].as_u64()? >= DURING_OUTAGE)
                .then_some(s)
        },
    )
    .await;
    assert_eq!(fallbacks(&during), DURING_OUTAGE, "this instance's view");
    assert_eq!(during["source"]["dropped_events"], 0);

    // Redis returns in a later 10 s bucket than the outage's last, so the
    // buckets the fallbacks land in tell their time apart from the return.
    let outage_bucket =
        ratewatch::telemetry::RESOLUTIONS[0].bucket_of(ratewatch::telemetry::unix_now());
    eventually(Duration::from_secs(11), "the next 10 s bucket", || async {
        (ratewatch::telemetry::unix_now() >= outage_bucket + 10).then_some(())
    })
    .await;

    // Restarted on the same port, empty: what the fleet view shows now can
    // only come from what this instance kept.
    tokio::task::block_in_place(|| redis.restart());
    let after = eventually(
        Duration::from_secs(20),
        "the fleet view in Redis shows every fallback and the trip",
        || async {
            let s = get_json(&client, &stats_url).await?;
            (s["source"]["kind"] == "fleet"
                && fallbacks(&s) >= DURING_OUTAGE
                && trips(&s) >= 1
                && s["source"]["unflushed_events"] == 0)
                .then_some(s)
        },
    )
    .await;
    assert_eq!(
        fallbacks(&after),
        DURING_OUTAGE,
        "every fail-open decision, counted once: {}",
        after["totals"]
    );
    assert_eq!(after["source"]["dropped_events"], 0);
    // Written into the buckets of the outage, not the one Redis returned in.
    let starts = after["bucket_starts"].as_array().unwrap();
    let series = after["series"]["free"]["fallback_allowed"]
        .as_array()
        .unwrap();
    for (start, n) in starts.iter().zip(series) {
        if n.as_u64() > Some(0) {
            assert!(
                start.as_u64().unwrap() <= outage_bucket,
                "fallbacks in bucket {start}, after the outage's last ({outage_bucket})"
            );
        }
    }
}
