//! What a dashboard refresh costs Redis: O(top_keys) per time bucket,
//! whatever the number of identities written into the bucket.

mod support;

use std::time::Duration;

use ratewatch::policy::{KeyDisplay, TelemetrySettings};
use ratewatch::telemetry::{RESOLUTIONS, RedisTarget, Telemetry, unix_now};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_read_asks_each_bucket_for_its_top_entries_only() {
    let redis = support::RedisServer::start();
    let top_keys = 5;
    let settings = TelemetrySettings {
        flush_interval: Duration::from_millis(100),
        top_keys,
        key_display: KeyDisplay::Masked,
        limiter_name: None,
    };
    let target = RedisTarget::node(redis.url(), "rw");
    // An attacker's many blocked identities, as a fleet of instances with
    // generous `top_keys` would leave them in the current buckets.
    let now = unix_now();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for res in RESOLUTIONS {
        let start = res.bucket_of(now);
        for part in ["blk", "hot"] {
            let key = target.key(res, start, part);
            let mut p = redis::pipe();
            for i in 0..20_000u32 {
                p.zadd(&key, format!("burst|free_k…{i:05}"), f64::from(i % 97))
                    .ignore();
            }
            p.zadd(&key, "burst|free_abuser…0001", 1_000_000.0).ignore();
            let () = p.query_async(&mut conn).await.unwrap();
        }
    }
    let t = Telemetry::redis(&settings, target);
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    redis.cli(&["CONFIG", "SET", "slowlog-max-len", "100000"]);
    redis.cli(&["SLOWLOG", "RESET"]);
    let stats = t.fleet().query(now - 60, now).await.expect("fleet view");
    assert_eq!(stats.source.kind, "fleet");
    assert!(stats.top_blocked.len() <= top_keys);
    assert_eq!(stats.top_blocked[0].identity, "free_abuser…0001");
    assert_eq!(stats.top_blocked[0].cause, "burst");

    // Every zset read named its range: 0 .. top_keys - 1, never 0 .. -1.
    let log = redis.cli(&["SLOWLOG", "GET", "100000"]);
    let lines: Vec<&str> = log.lines().map(str::trim).collect();
    let mut reads = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.eq_ignore_ascii_case("zrevrange") {
            reads += 1;
            assert_eq!(lines.get(i + 2), Some(&"0"), "{log}");
            assert_eq!(
                lines.get(i + 3),
                Some(&(top_keys - 1).to_string().as_str()),
                "a read asked for more than the top entries:\n{log}"
            );
        }
    }
    assert!(reads >= 2, "the read went through ZREVRANGE:\n{log}");
}
