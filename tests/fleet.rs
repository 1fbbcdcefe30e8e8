//! Several `ratewatch serve` processes share one Redis: one identity
//! hammered through all of them at once is admitted exactly to its bound.

mod support;

use support::{Ratewatch, RedisServer};

const CAPACITY: usize = 25;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("fleet.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:1"
timeout_ms = 500

# The test reads the dashboard from 127.0.0.1 directly, not via a proxy.
[identity]
trusted_proxies = []

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  {{ name = "burst", algorithm = "token_bucket", capacity = {CAPACITY}, refill_per_second = 0.000001 }},
  {{ name = "day", algorithm = "fixed_window", limit = 100000, window = "1d" }},
]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
"#
        ),
    )
    .expect("write config");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_servers_on_one_redis_admit_exactly_the_bucket_capacity() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let servers: Vec<Ratewatch> = (0..3)
        .map(|_| {
            Ratewatch::start(
                "serve",
                Some(&cfg),
                &[("RATEWATCH_REDIS_URL", &redis.url())],
            )
        })
        .collect();
    let client = reqwest::Client::new();

    let mut tasks = Vec::new();
    for round in 0..120 {
        let port = servers[round % 3].port;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client
                .get(format!("http://127.0.0.1:{port}/api/users"))
                .header("x-api-key", "free_shared_identity")
                .send()
                .await
                .expect("server answers")
                .status()
                .as_u16()
        }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok, CAPACITY, "exactly the capacity passes across the fleet");
    assert_eq!(limited, 120 - CAPACITY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_view_in_redis_counts_every_decision_of_every_server() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let env = [("RATEWATCH_REDIS_URL", redis.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let servers: Vec<Ratewatch> = (0..3)
        .map(|_| Ratewatch::start("serve", Some(&cfg), &env))
        .collect();
    let client = reqwest::Client::new();

    // A known mix: one abusive free key (25 pass, the rest blocked), five
    // polite free keys, and anonymous callers within their burst.
    let mut sent = std::collections::BTreeMap::new();
    let send = |key: Option<String>, n: usize| {
        let client = client.clone();
        let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
        async move {
            let mut statuses = Vec::new();
            for i in 0..n {
                let mut req = client.get(format!("http://127.0.0.1:{}/api/users", ports[i % 3]));
                if let Some(k) = &key {
                    req = req.header("x-api-key", k);
                }
                statuses.push(req.send().await.expect("answer").status().as_u16());
            }
            statuses
        }
    };
    let abusive = send(Some("free_abusive_client".into()), 60).await;
    sent.insert(
        "free/allowed",
        abusive.iter().filter(|s| **s == 200).count(),
    );
    sent.insert(
        "free/blocked",
        abusive.iter().filter(|s| **s == 429).count(),
    );
    for i in 0..5 {
        let polite = send(Some(format!("free_polite_{i}")), 4).await;
        assert!(polite.iter().all(|s| *s == 200));
        *sent.get_mut("free/allowed").unwrap() += 4;
    }
    let anon = send(None, 5).await;
    assert!(anon.iter().all(|s| *s == 200));
    sent.insert("anonymous/allowed", 5);
    assert_eq!(sent["free/allowed"], CAPACITY + 20);
    assert_eq!(sent["free/blocked"], 60 - CAPACITY);

    // Graceful shutdown flushes what each server still holds.
    for s in servers {
        s.stop();
    }
    let reader = Ratewatch::start("serve", Some(&cfg), &env);
    let stats: serde_json::Value = client
        .get(format!("{}/dashboard/api/stats?range=5m", reader.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["totals"]["free"]["allowed"], sent["free/allowed"]);
    assert_eq!(stats["totals"]["free"]["blocked"], sent["free/blocked"]);
    assert_eq!(stats["totals"]["anonymous"]["allowed"], 5);
    assert_eq!(stats["decisions"], 60 + 20 + 5);
    let top = &stats["top_blocked"][0];
    assert_eq!(top["blocked"], 60 - CAPACITY);
    assert!(
        top["identity"].as_str().unwrap().starts_with("free_a"),
        "the abuser tops the list: {top}"
    );
    assert!(
        !stats.to_string().contains("free_abusive_client"),
        "masked, never raw"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_redis_reports_the_quota_without_consuming_it() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let server = Ratewatch::start(
        "serve",
        Some(&cfg),
        &[("RATEWATCH_REDIS_URL", &redis.url())],
    );
    let client = reqwest::Client::new();
    let remaining = || async {
        let body: serde_json::Value = client
            .get(format!("{}/api/ratelimit/status", server.url()))
            .header("x-api-key", "free_status_check")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(body["limits"][0]["name"], "burst");
        body["limits"][0]["remaining"].as_u64().unwrap()
    };
    assert_eq!(remaining().await, CAPACITY as u64);
    for _ in 0..3 {
        client
            .get(format!("{}/api/users", server.url()))
            .header("x-api-key", "free_status_check")
            .send()
            .await
            .unwrap();
    }
    for _ in 0..5 {
        assert_eq!(
            remaining().await,
            CAPACITY as u64 - 3,
            "looking consumes nothing"
        );
    }
}
