//! The global Prometheus recorder (one per process, hence its own test
//! binary): the exposition lints clean, and a Redis outage is counted.
mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewatch::policy::{KeyDisplay, TelemetrySettings};
use ratewatch::telemetry::{Event, Outcome, RedisTarget, Telemetry, metrics, unix_now};

fn event(outcome: Outcome, identity: &str) -> Event {
    Event {
        tier: Arc::from("free"),
        route: Arc::from("/api/data"),
        limit: Some(Arc::from("minute")),
        exceeded: vec![Arc::from("minute")],
        outcome,
        shard: Arc::from("127.0.0.1:6379"),
        identity: identity.into(),
        cost: 1,
        units: Default::default(),
        redis_rtt: Some(Duration::from_micros(80)),
        fallback: None,
    }
}

fn dropped_total(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("ratewatch_telemetry_dropped_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_passes_promtool_with_real_histogram_buckets_and_no_identity() {
    let handle = metrics::install_prometheus().expect("install the recorder");
    let again = metrics::install_prometheus().expect("a second install returns the handle");
    let t = Telemetry::disabled();
    t.record(&event(Outcome::Blocked, "free_ab…9f3a"));
    metrics::record_breaker_state("127.0.0.1:6379", 2);
    metrics::record_breaker_trip("127.0.0.1:6379");
    metrics::record_script_reload("127.0.0.1:6379");
    metrics::record_redis_rtt(
        "127.0.0.1:6379",
        metrics::RttOp::Telemetry,
        Duration::from_millis(2),
    );
    let text = metrics::render(&handle);
    let decisions = r#"ratewatch_decisions_total{tier="free",route="/api/data",shard="127.0.0.1:6379",outcome="blocked"} 1"#;
    assert!(text.contains(decisions), "{text}");
    assert!(
        metrics::render(&again).contains(decisions),
        "both handles render one registry"
    );

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write the exposition");
    let out = promtool.wait_with_output().expect("promtool finishes");
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(
        r#"ratewatch_redis_rtt_seconds_bucket{shard="127.0.0.1:6379",op="decide",le="0.0001"} 1"#
    ));
    assert!(text.contains(r#"ratewatch_build_info{version=""#));
    assert!(text.contains(r#"ratewatch_breaker_state{shard="127.0.0.1:6379"} 2"#));
    assert!(text.contains("# HELP ratewatch_decisions_total"));
    assert!(
        !text.contains("free_ab"),
        "an identity leaked into the exposition"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_events_are_kept_bounded_and_written_once_it_is_back_and_shutdown_flushes()
{
    let handle = metrics::install_prometheus().expect("install the recorder");
    let mut redis = support::RedisServer::start();
    redis.kill();
    let settings = TelemetrySettings {
        flush_interval: Duration::from_millis(50),
        top_keys: 10,
        key_display: KeyDisplay::Masked,
        limiter_name: None,
    };
    let target = RedisTarget::node(redis.url(), "rw").with_timeout(Duration::from_millis(200));
    let t = Telemetry::redis(&settings, target);

    let before = dropped_total(&metrics::render(&handle));
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..50_000 {
        let one = Instant::now();
        t.record(&event(Outcome::Blocked, &format!("free_k…{i}")));
        slowest = slowest.max(one.elapsed());
        let backlog = t.backlog();
        assert!(
            backlog.identities <= 10 && backlog.series <= 1,
            "{backlog:?}"
        );
    }
    let spent = started.elapsed();
    eprintln!("50k records with Redis down: {spent:?}, slowest {slowest:?}");
    assert!(
        spent < Duration::from_secs(5),
        "record waited on Redis: {spent:?}"
    );
    // Flushes keep failing; their batches are kept for Redis (one bucket
    // or two: bounded by time, not traffic), nothing waits for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    t.flush().await;
    assert_eq!(t.backlog().events, 0);
    assert_eq!(dropped_total(&metrics::render(&handle)) - before, 0);
    let now = unix_now();
    let kept = t.fleet().query(now - 60, now).await.expect("query").source;
    assert_eq!(kept.unflushed_events, 50_000);
    assert!(kept.unflushed_buckets <= 2, "{kept:?}");

    redis.restart();
    // Reconnection happens in the background; wait until a flush lands.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        t.record(&event(Outcome::Allowed, "free_k…probe"));
        t.flush().await;
        let now = unix_now();
        let stats = t.fleet().query(now - 60, now).await;
        if stats.is_ok_and(|s| s.decisions > 50_000) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no flush landed after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = unix_now();
    let landed = t
        .fleet()
        .query(now - 60, now)
        .await
        .expect("query")
        .decisions;
    for _ in 0..100 {
        t.record(&event(Outcome::Allowed, "free_k…after"));
    }
    t.shutdown().await;
    let now = unix_now();
    let stats = t.fleet().query(now - 60, now).await.expect("query");
    assert_eq!(
        stats.decisions,
        landed + 100,
        "shutdown flushed what was left"
    );
}
