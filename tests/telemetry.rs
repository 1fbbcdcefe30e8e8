//! The fleet view against real Redis: exact totals from several instances,
//! constant Redis load whatever the request rate, a cluster, and Prometheus
//! counters per decision.
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{FailurePolicy, KeyDisplay, TelemetrySettings};
use ratewatch::telemetry::{
    Event, FallbackReason, Outcome, RedisTarget, Telemetry, metrics, unix_now,
};

fn settings(flush_ms: u64, top_keys: usize) -> TelemetrySettings {
    TelemetrySettings {
        flush_interval: Duration::from_millis(flush_ms),
        top_keys,
        key_display: KeyDisplay::Masked,
        limiter_name: None,
    }
}

fn event(tier: &str, outcome: Outcome, identity: &str, shard: &str) -> Event {
    let blocked = matches!(outcome, Outcome::Blocked | Outcome::ShadowBlocked);
    Event {
        tier: Arc::from(tier),
        route: Arc::from("/api/users"),
        limit: Some(Arc::from("burst")),
        exceeded: if blocked {
            vec![Arc::from("burst")]
        } else {
            vec![]
        },
        outcome,
        shard: Arc::from(shard),
        identity: identity.into(),
        cost: 1,
        units: Default::default(),
        redis_rtt: Some(Duration::from_micros(300)),
        fallback: match outcome {
            Outcome::FallbackAllowed => Some((FallbackReason::Timeout, FailurePolicy::Open)),
            Outcome::FallbackBlocked => Some((FallbackReason::Error, FailurePolicy::Closed)),
            _ => None,
        },
    }
}

fn masked(raw: &str) -> String {
    Identity::new(IdentityKind::ApiKey, raw).display(KeyDisplay::Masked)
}

/// Every key of a node with every string it holds (members, fields, values).
fn dump(url: &str) -> Vec<(String, Vec<String>)> {
    let mut con = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    keys.into_iter()
        .map(|k| {
            let ty: String = redis::cmd("TYPE").arg(&k).query(&mut con).expect("TYPE");
            let values: Vec<String> = match ty.as_str() {
                "hash" => redis::cmd("HGETALL")
                    .arg(&k)
                    .query(&mut con)
                    .expect("HGETALL"),
                "zset" => redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(&mut con)
                    .expect("ZRANGE"),
                other => panic!("unexpected telemetry key type {other} for {k}"),
            };
            (k, values)
        })
        .collect()
}

/// Decisions per (tier, outcome) summed over every counter hash of one
/// resolution (`10s` or `1m`).
fn raw_totals(dump: &[(String, Vec<String>)], res: &str) -> HashMap<(String, String), u64> {
    let mut totals = HashMap::new();
    for (k, v) in dump {
        if k.contains(&format!(":tm:{{{res}:")) && k.ends_with(":c") {
            for pair in v.chunks(2) {
                let mut parts = pair[0].splitn(4, '|');
                let tier = parts.next().unwrap_or_default().to_owned();
                let outcome = parts.next().unwrap_or_default().to_owned();
                let n: u64 = pair[1].parse().expect("counter value");
                *totals.entry((tier, outcome)).or_insert(0) += n;
            }
        }
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_add_up_exactly_and_name_the_abusive_key_first() {
    let redis = support::RedisServer::start();
    let instances: Vec<Telemetry> = (0..3)
        .map(|_| Telemetry::redis(&settings(100, 10), RedisTarget::node(redis.url(), "rw")))
        .collect();
    let abuser_raw = "free_sk_live_abusive_0123456789";
    let raws: Vec<String> = (0..30)
        .map(|i| format!("pro_sk_live_customer_{i:04}"))
        .collect();
    let tiers = ["free", "pro", "anonymous"];
    let mut expected: HashMap<(String, String), u64> = HashMap::new();
    for round in 0..20 {
        for (n, t) in instances.iter().enumerate() {
            for i in 0..50usize {
                let tier = tiers[(i + n) % 3];
                let outcome = Outcome::ALL[(i + round) % 5];
                let id = masked(&raws[(i * 7 + round) % raws.len()]);
                t.record(&event(tier, outcome, &id, &redis.addr()));
                *expected
                    .entry((tier.into(), outcome.as_str().into()))
                    .or_insert(0) += 1;
            }
            // One client hammers a limit from every instance.
            for _ in 0..5 {
                t.record(&event(
                    "free",
                    Outcome::Blocked,
                    &masked(abuser_raw),
                    &redis.addr(),
                ));
                *expected
                    .entry(("free".into(), "blocked".into()))
                    .or_insert(0) += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    for t in &instances {
        t.shutdown().await;
    }
    let total: u64 = expected.values().sum();
    assert_eq!(total, 20 * 3 * 55);

    let now = unix_now();
    let stats = instances[1]
        .fleet()
        .query(now - 300, now)
        .await
        .expect("fleet query");
    assert_eq!(stats.decisions, total);
    for ((tier, outcome), n) in &expected {
        assert_eq!(
            stats.totals[tier][outcome], *n,
            "fleet total of {tier}/{outcome}"
        );
        let series: u64 = stats.series[tier][outcome].iter().sum();
        assert_eq!(series, *n, "series of {tier}/{outcome}");
    }
    assert_eq!(stats.top_blocked[0].identity, masked(abuser_raw));
    assert!(stats.top_blocked[0].blocked >= 300);
    let fallback_allowed: u64 = tiers
        .iter()
        .map(|t| {
            expected
                .get(&(t.to_string(), "fallback_allowed".into()))
                .copied()
                .unwrap_or(0)
        })
        .sum();
    assert!((stats.fail_open_rate - fallback_allowed as f64 / total as f64).abs() < 1e-9);
    let rtt = &stats.rtt[&redis.addr()];
    assert_eq!(rtt.count, total);
    assert!(
        rtt.p50_s > 0.00025 && rtt.p50_s <= 0.0005,
        "p50 {}",
        rtt.p50_s
    );

    let dump = dump(&redis.url());
    assert_eq!(raw_totals(&dump, "10s"), expected, "10 s hashes");
    assert_eq!(raw_totals(&dump, "1m"), expected, "1 min hashes");
    for (key, values) in &dump {
        assert!(key.starts_with("rw:tm:{"), "unexpected key {key}");
        for raw in raws.iter().map(String::as_str).chain([abuser_raw]) {
            assert!(!key.contains(raw), "raw key in key name {key}");
            assert!(!values.iter().any(|v| v.contains(raw)), "raw key in {key}");
        }
    }
    let mut con = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect");
    for (key, _) in &dump {
        let ttl: i64 = redis::cmd("TTL").arg(key).query(&mut con).expect("TTL");
        assert!(ttl > 0 && ttl <= 2 * 86_400 + 60, "{key} has TTL {ttl}");
    }
}

/// Telemetry commands (everything the flushes send) since the last RESETSTAT.
fn telemetry_calls(redis: &support::RedisServer) -> u64 {
    ["hincrby", "zincrby", "expire", "zremrangebyrank"]
        .iter()
        .map(|c| redis.command_calls(c))
        .sum()
}

async fn drive(t: &Telemetry, events: usize, over: Duration, shard: &str) {
    let ticks = 100;
    let mut tick = tokio::time::interval(over / ticks);
    let ids: Vec<String> = (0..8).map(|i| masked(&format!("free_sk_{i}"))).collect();
    let mut sent = 0;
    for k in 1..=ticks as usize {
        tick.tick().await;
        while sent < events * k / ticks as usize {
            let tier = ["free", "pro", "anonymous"][sent % 3];
            let outcome = Outcome::ALL[(sent / 3) % 5];
            t.record(&event(tier, outcome, &ids[sent % 8], shard));
            sent += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_per_second_stay_flat_when_the_request_rate_grows_twentyfold() {
    let redis = support::RedisServer::start();
    let mut calls = Vec::new();
    for events in [1_000, 20_000] {
        let t = Telemetry::redis(&settings(250, 10), RedisTarget::node(redis.url(), "rw"));
        redis.cli(&["CONFIG", "RESETSTAT"]);
        drive(&t, events, Duration::from_secs(3), &redis.addr()).await;
        t.shutdown().await;
        calls.push(telemetry_calls(&redis));
    }
    eprintln!(
        "telemetry commands over 3 s: {} at 1k events, {} at 20k events",
        calls[0], calls[1]
    );
    assert!(calls[0] > 0);
    // Twenty times the events, the same number of flushes: the load is
    // O(flushes). The slack covers a flush more or less in 3 s and a flush
    // that crosses a bucket boundary (two buckets written), not growth.
    let ratio = calls[1] as f64 / calls[0] as f64;
    assert!((0.75..=1.33).contains(&ratio), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_lands_on_a_three_master_cluster_in_one_slot_per_bucket() {
    let cluster = support::RedisCluster::start();
    let t = Telemetry::redis(
        &settings(100, 10),
        RedisTarget::cluster(cluster.urls(), "rw"),
    );
    let mut expected: HashMap<(String, String), u64> = HashMap::new();
    for i in 0..500usize {
        let tier = ["free", "pro"][i % 2];
        let outcome = Outcome::ALL[i % 5];
        t.record(&event(
            tier,
            outcome,
            &masked(&format!("free_k{}", i % 13)),
            "cluster",
        ));
        *expected
            .entry((tier.into(), outcome.as_str().into()))
            .or_insert(0) += 1;
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
    }
    t.shutdown().await;
    let now = unix_now();
    let stats = t.fleet().query(now - 120, now).await.expect("fleet query");
    for ((tier, outcome), n) in &expected {
        assert_eq!(stats.totals[tier][outcome], *n, "{tier}/{outcome}");
    }
    // Every key of one bucket lives on the node owning its hash tag.
    let mut buckets = 0;
    for node in &cluster.nodes {
        for (key, _) in dump(&node.url()) {
            assert_eq!(
                cluster.node_for(&key).port,
                node.port,
                "{key} on the wrong node"
            );
            buckets += 1;
        }
    }
    assert!(buckets >= 4, "only {buckets} telemetry keys");
}

#[test]
fn each_decision_counts_once_per_outcome_per_exceeded_limit_and_per_fallback() {
    let recorder = metrics::prometheus_builder()
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    let t = Telemetry::disabled();
    ::metrics::with_local_recorder(&recorder, || {
        let mut e = event("free", Outcome::Blocked, "free_ab…1234", "127.0.0.1:6379");
        e.exceeded = vec![Arc::from("burst"), Arc::from("day")];
        t.record(&e);
        t.record(&e);
        t.record(&event(
            "free",
            Outcome::FallbackAllowed,
            "free_ab…1234",
            "127.0.0.1:6379",
        ));
    });
    let text = handle.render();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no line {needle} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        line(
            r#"ratewatch_decisions_total{tier="free",route="/api/users",shard="127.0.0.1:6379",outcome="blocked"}"#
        ),
        "2"
    );
    assert_eq!(
        line(r#"ratewatch_limit_exceeded_total{tier="free",limit="day"}"#),
        "2"
    );
    assert_eq!(
        line(r#"ratewatch_fallbacks_total{shard="127.0.0.1:6379",reason="timeout",policy="open"}"#),
        "1"
    );
    assert_eq!(
        line(r#"ratewatch_redis_rtt_seconds_count{shard="127.0.0.1:6379",op="decide"}"#),
        "3"
    );
    assert!(!text.contains("free_ab"), "an identity leaked into a label");
}

#[tokio::test]
async fn the_in_process_view_answers_at_once_and_keeps_the_top_k_bounded() {
    let t = Telemetry::in_process(&settings(10_000, 5));
    for i in 0..10_000 {
        t.record(&event(
            "anonymous",
            Outcome::Blocked,
            &format!("ip…{i}"),
            "memory",
        ));
        t.record(&event("anonymous", Outcome::Blocked, "ip…abuser", "memory"));
    }
    assert_eq!(t.backlog().identities, 5);
    assert_eq!(t.backlog().events, 20_000);
    let now = unix_now();
    let stats = t
        .fleet()
        .query(now - 60, now)
        .await
        .expect("in-process query");
    assert_eq!(stats.totals["anonymous"]["blocked"], 20_000);
    assert_eq!(stats.top_blocked[0].identity, "ip…abuser");
    assert!(stats.top_blocked.len() <= 5);
    assert_eq!(stats.fail_open_rate, 0.0);
}
