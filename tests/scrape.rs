//! The real server's `/metrics`, as Prometheus and promtool see it: a valid
//! exposition with real histograms and bounded labels, scraped by a real
//! Prometheus that answers the fleet-wide queries the dashboards use.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Prometheus, Ratewatch, RedisServer};

const KEYS: [&str; 3] = [
    "free_scrape_alice_01",
    "free_scrape_abuser_2",
    "pro_scrape_carol_003",
];

async fn traffic(server: &Ratewatch) {
    let client = reqwest::Client::new();
    for i in 0..60 {
        let key = KEYS[i % 3];
        let _ = client
            .get(format!("{}/api/users", server.url()))
            .header("x-api-key", key)
            .send()
            .await
            .expect("server answers");
    }
}

fn promtool_check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is not installed: `apt-get install prometheus` (or run .ci/test.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

async fn query(client: &reqwest::Client, prom: &Prometheus, expr: &str) -> Value {
    client
        .get(format!("{}/api/v1/query", prom.url()))
        .query(&[("query", expr)])
        .send()
        .await
        .expect("prometheus answers")
        .json()
        .await
        .expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_metrics_pass_promtool_carry_no_keys_and_answer_fleet_queries() {
    let mut redis = RedisServer::start();
    let server = Ratewatch::start("serve", None, &[("RATEWATCH_REDIS_URL", &redis.url())]);
    traffic(&server).await;

    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (ok, said) = promtool_check_metrics(&text);
    assert!(ok, "promtool check metrics: {said}\n{text}");
    for needle in [
        "ratewatch_decisions_total{",
        "ratewatch_limit_exceeded_total{",
        "ratewatch_build_info{",
        "ratewatch_breaker_state{",
        "ratewatch_redis_rtt_seconds_bucket{",
        "le=\"0.0001\"",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    assert!(
        text.contains(&format!("shard=\"{}\"", redis.addr())),
        "decisions name their shard"
    );
    for key in KEYS {
        assert!(!text.contains(key), "a raw key reached /metrics");
        assert!(!text.contains(&key[..9]), "part of a key reached /metrics");
    }
    assert!(!text.contains('…'), "no masked identity is a label either");

    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/alerts.yml");
    let target = server.addr();
    let prom = tokio::task::spawn_blocking(move || Prometheus::start(&[target], &[rules]))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let by_outcome = loop {
        traffic(&server).await;
        let r = query(
            &client,
            &prom,
            "sum by (outcome) (increase(ratewatch_decisions_total[1m]))",
        )
        .await;
        let outcomes: Vec<String> = r["data"]["result"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["metric"]["outcome"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if outcomes.contains(&"allowed".into()) && outcomes.contains(&"blocked".into()) {
            break outcomes;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the decisions: {r}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(by_outcome.len() >= 2);

    let p99 = query(
        &client,
        &prom,
        "histogram_quantile(0.99, sum by (le, shard) (rate(ratewatch_redis_rtt_seconds_bucket{op=\"decide\"}[1m])))",
    )
    .await;
    let value: f64 = p99["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no fleet-wide p99: {p99}"));
    assert!(
        value > 0.0 && value < 1.0,
        "p99 of loopback round trips: {value}"
    );
    assert_eq!(p99["data"]["result"][0]["metric"]["shard"], redis.addr());

    let fail_open = query(
        &client,
        &prom,
        "sum(rate(ratewatch_decisions_total{outcome=\"fallback_allowed\"}[5m])) / sum(rate(ratewatch_decisions_total[5m]))",
    )
    .await;
    assert_eq!(fail_open["status"], "success");
    // With Redis healthy no fallback_allowed series exists yet, so the
    // ratio is empty (or 0 once one has appeared): never above zero.
    let rate: f64 = fail_open["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert_eq!(
        rate, 0.0,
        "Redis is healthy: nothing fails open: {fail_open}"
    );

    // Redis dies: the built-in policy fails open, and the fail-open rate
    // the alert watches rises above zero, with the breaker open.
    let shard = redis.addr();
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        traffic(&server).await;
        let r = query(
            &client,
            &prom,
            "sum(rate(ratewatch_decisions_total{outcome=\"fallback_allowed\"}[5m])) / sum(rate(ratewatch_decisions_total[5m]))",
        )
        .await;
        let rate: f64 = r["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let breaker = query(
            &client,
            &prom,
            &format!("ratewatch_breaker_state{{shard=\"{shard}\"}}"),
        )
        .await;
        let open = breaker["data"]["result"][0]["value"][1] == "2";
        if rate > 0.0 && open {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the fail-open traffic: {r} {breaker}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The first scrape of a server that decided nothing yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_known_series_exists_at_zero_before_the_first_request() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("zero.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
kind = "redis"
url = "{}"

[resilience]
on_store_failure = "open"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[routes]]
method = "POST"
path = "/api/export"
cost = 2
on_store_failure = "closed"
"#,
            redis.url()
        ),
    )
    .unwrap();
    let server = Ratewatch::start("serve", Some(&config), &[]);
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let shard = redis.addr();
    let mut expected = vec![
        format!("ratewatch_breaker_state{{shard=\"{shard}\"}} 0"),
        format!("ratewatch_breaker_trips_total{{shard=\"{shard}\"}} 0"),
        format!("ratewatch_script_reloads_total{{shard=\"{shard}\"}} 0"),
        "ratewatch_telemetry_dropped_total{reason=\"timeout\"} 0".to_owned(),
        "ratewatch_telemetry_dropped_total{reason=\"error\"} 0".to_owned(),
        "ratewatch_telemetry_dropped_total{reason=\"overflow\"} 0".to_owned(),
        "ratewatch_limit_exceeded_total{tier=\"free\",limit=\"burst\"} 0".to_owned(),
        format!(
            "ratewatch_redis_rtt_seconds_bucket{{shard=\"{shard}\",op=\"decide\",le=\"0.0001\"}} 0"
        ),
    ];
    for policy in ["open", "closed"] {
        for reason in ["timeout", "error", "breaker_open"] {
            expected.push(format!(
                "ratewatch_fallbacks_total{{shard=\"{shard}\",reason=\"{reason}\",policy=\"{policy}\"}} 0"
            ));
        }
    }
    for route in ["/api/export", "*"] {
        for outcome in [
            "allowed",
            "blocked",
            "fallback_allowed",
            "fallback_blocked",
            "shadow_blocked",
        ] {
            expected.push(format!(
                "ratewatch_decisions_total{{tier=\"anonymous\",route=\"{route}\",shard=\"{shard}\",outcome=\"{outcome}\"}} 0"
            ));
        }
    }
    for line in &expected {
        assert!(text.contains(line.as_str()), "{line} missing from:\n{text}");
    }
    let (ok, said) = promtool_check_metrics(&text);
    assert!(ok, "promtool check metrics: {said}\n{text}");
}
