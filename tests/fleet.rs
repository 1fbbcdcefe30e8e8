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
        .map(|_| Ratewatch::start("serve", Some(&cfg), &[("RATEWATCH_REDIS_URL", &redis.url())]))
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
