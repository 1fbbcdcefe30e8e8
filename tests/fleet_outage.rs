//! The fleet view keeps an outage: decisions made while Redis was away
//! reach the fleet view in Redis once it is back, in the buckets of the
//! time they were made, on real `ratewatch serve` and redis-server
//! processes; the page's JSON and the page rendered in headless Chromium
//! then show every fallback, the trip, which instances reported, and that
//! the outage was kept.
//!
//! `RATEWATCH_UPDATE_SCREENSHOT=1 cargo test --test fleet_outage` also
//! copies the page's picture after the outage to
//! `docs/dashboard-after-outage.png`.

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

/// Fail-open decisions of the `free` tier, the outage's traffic (the
/// second instance's anonymous traffic after the outage may hit a first
/// failing command of its reconnecting connection).
fn fallbacks(stats: &Value) -> u64 {
    stats["totals"]["free"]["fallback_allowed"]
        .as_u64()
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
        &[
            ("RATEWATCH_REDIS_URL", &redis.url()),
            ("RATEWATCH_INSTANCE", "edge-a"),
        ],
    );
    // A second instance, which decides only once Redis is back.
    let quiet = Ratewatch::start(
        "serve",
        Some(&cfg),
        &[
            ("RATEWATCH_REDIS_URL", &redis.url()),
            ("RATEWATCH_INSTANCE", "edge-b"),
        ],
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
    let returned = ratewatch::telemetry::unix_now();
    tokio::task::block_in_place(|| redis.restart());
    for _ in 0..5 {
        let status = client
            .get(format!("{}/api/users", quiet.url()))
            .send()
            .await
            .expect("server answers")
            .status();
        assert_eq!(status, 200);
    }
    let after = eventually(
        Duration::from_secs(20),
        "the fleet view in Redis shows every fallback and the trip",
        || async {
            let s = get_json(&client, &stats_url).await?;
            (s["source"]["kind"] == "fleet"
                && fallbacks(&s) >= DURING_OUTAGE
                && trips(&s) >= 1
                && s["source"]["unflushed_events"] == 0
                && s["source"]["last_outage"].is_object()
                && s["instances"].as_array()?.len() == 2
                // Every event of both instances has been flushed (the
                // quiet one's 5 may land over more than one flush).
                && reported(&s, "edge-a") >= DURING_OUTAGE
                && reported(&s, "edge-b") >= 5)
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

    // Which instances reported: the one that lived through the outage,
    // with every event it decided during it (its 3 before the outage went
    // with the restarted Redis), and the one that decided after it.
    let a = instance(&after, "edge-a");
    assert_eq!(a["events"].as_u64(), Some(DURING_OUTAGE), "{a}");
    // Stamped when its write was built, to the second: a write built in
    // the second before the restart that Redis took after it reads one
    // second early.
    assert!(
        a["last_report"].as_u64() >= Some(returned - 1),
        "{a}, Redis returned at {returned}"
    );
    let b = instance(&after, "edge-b");
    assert_eq!(b["events"].as_u64(), Some(5), "{b}");
    assert!(b["last_report"].as_u64() >= Some(returned - 1), "{b}");
    // And that the fleet view kept the outage.
    let outage = &after["source"]["last_outage"];
    assert!(
        outage["kept_events"].as_u64() >= Some(DURING_OUTAGE),
        "{outage}"
    );
    assert!(
        outage["since"].as_u64() <= Some(outage_bucket + 10),
        "{outage}"
    );
    assert!(outage["until"].as_u64() >= Some(returned), "{outage}");

    // The page, rendered in headless Chromium after its script ran.
    let page_url = format!("{}/dashboard?range=5m", server.url());
    let url = page_url.clone();
    let (dom, log) = tokio::task::spawn_blocking(move || support::dump_dom(&url, 4_000))
        .await
        .unwrap();
    assert!(dom.contains("id=\"instance-rows\""), "page rendered: {log}");
    let recovered = dom
        .split("id=\"recovered\"")
        .nth(1)
        .expect("recovered note");
    assert!(
        !recovered[..recovered.find('>').unwrap_or(0)].contains("hidden"),
        "the recovery note is shown: {recovered:.300}"
    );
    assert!(dom.contains("Fleet view recovered."));
    let kept = recovered
        .split("id=\"outage-kept\">")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        kept >= Some(DURING_OUTAGE),
        "kept events on the page: {kept:?}"
    );
    let rows = dom
        .split("id=\"instance-rows\">")
        .nth(1)
        .and_then(|r| r.split("</tbody>").next())
        .expect("instance rows");
    assert!(
        rows.contains("<code>edge-a</code>") && rows.contains("<code>edge-b</code>"),
        "{rows}"
    );
    assert!(
        rows.contains(&format!("<td class=\"num\">{DURING_OUTAGE}</td>")),
        "{rows}"
    );
    // Every fallback in the tier table, and the trip in the shard table.
    assert!(
        dom.contains(&format!(
            "data-tier=\"free\" data-outcome=\"2\">{DURING_OUTAGE}<"
        )),
        "all {DURING_OUTAGE} fallbacks on the page"
    );
    let shard_rows = dom
        .split("id=\"shard-rows\">")
        .nth(1)
        .and_then(|r| r.split("</tbody>").next())
        .expect("shard rows");
    let trips_on_page: u64 = shard_rows
        .split("<tr>")
        .skip(1)
        .filter_map(|row| {
            row.rsplit("<td class=\"num\">")
                .next()
                .and_then(|c| c.split('<').next())
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum();
    assert!(trips_on_page >= 1, "the trip on the page: {shard_rows}");

    // The picture for the README, beside the one taken during an outage.
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-after-outage.png");
    let file = shot.clone();
    tokio::task::spawn_blocking(move || support::screenshot(&page_url, &file, 1400, 2300))
        .await
        .unwrap();
    if std::env::var_os("RATEWATCH_UPDATE_SCREENSHOT").is_some() {
        std::fs::copy(
            &shot,
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard-after-outage.png"),
        )
        .unwrap();
    }
}

/// The instance named `name` in a stats answer's `instances`.
/// The events `name` reported in the range (0 when it is not listed).
fn reported(stats: &Value, name: &str) -> u64 {
    stats["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["instance"] == name))
        .and_then(|i| i["events"].as_u64())
        .unwrap_or(0)
}

fn instance<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["instance"] == name))
        .unwrap_or_else(|| panic!("{name} in {}", stats["instances"]))
}
