//! Incident drills on real processes: `ratewatch serve`, redis-server (or a
//! 3-master cluster), a real Prometheus loading `dashboards/alerts.yml`,
//! and headless Chromium loading the dashboard. For each incident the
//! dashboard's JSON and the rendered page show it within two flush
//! intervals (plus slack for a loaded machine), and the matching alert
//! expression, evaluated by Prometheus without its `for`, is above its
//! threshold.
//!
//! (a) one abusive key; (b) Redis killed; (c) Redis slow but alive;
//! (d) one enterprise key, never blocked, hammering one cluster shard.
//! The invalid-policy-reload drill waits for live policy reload.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratewatch::Identity;
use ratewatch::identity::IdentityKind;
use serde_json::Value;
use support::{Prometheus, Ratewatch, RedisCluster, RedisServer};

/// The fleet view's flush interval in every drill.
const FLUSH: Duration = Duration::from_millis(1000);

/// What "within two flush intervals" may take on a loaded shared machine:
/// two intervals, one more for the page's refresh, and slack.
const SHOWN_WITHIN: Duration = Duration::from_millis(2 * 1000 + 3000);

fn config(dir: &Path, store: &str) -> PathBuf {
    let path = dir.join("drill.toml");
    std::fs::write(
        &path,
        format!(
            r#"
{store}

[resilience]
on_store_failure = "open"
breaker = {{ failures = 5, open_ms = 2000 }}

[identity]
trusted_proxies = []

[telemetry]
flush_interval_ms = {flush}
top_keys = 20

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }}]

[[tiers]]
name = "enterprise"
match_prefix = "ent_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000000, refill_per_second = 1000000 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 100 }}]

[[routes]]
method = "POST"
path = "/api/export"
on_store_failure = "closed"
"#,
            flush = FLUSH.as_millis()
        ),
    )
    .expect("write config");
    path
}

/// Callers sending `per_tick` requests every 100 ms until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Traffic {
    fn start(base: String, callers: Vec<(String, u32)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let mut sent = 0;
            while !flag.load(Ordering::Relaxed) {
                let tick = tokio::time::sleep(Duration::from_millis(100));
                for (key, per_tick) in &callers {
                    for _ in 0..*per_tick {
                        let _ = client
                            .get(format!("{base}/api/users"))
                            .header("x-api-key", key)
                            .send()
                            .await;
                        sent += 1;
                    }
                }
                tick.await;
            }
            sent
        });
        Self { stop, task }
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or(0)
    }
}

async fn get_json(url: &str) -> Option<Value> {
    reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Polls the dashboard's stats until `shows` holds; returns them and how
/// long it took.
async fn wait_stats(
    server: &Ratewatch,
    within: Duration,
    what: &str,
    shows: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let started = Instant::now();
    let url = format!("{}/dashboard/api/stats?range=5m", server.url());
    loop {
        if let Some(v) = get_json(&url).await {
            if shows(&v) {
                return (v, started.elapsed());
            }
            assert!(
                started.elapsed() < within,
                "the dashboard JSON did not show {what} within {within:?}: {v}"
            );
        } else {
            assert!(started.elapsed() < within, "no stats within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the alert's expression (one of its severities), evaluated
/// without its `for`, returns a series satisfying `matches`.
async fn wait_alert(prom: &Prometheus, alert: &str, matches: impl Fn(&Value) -> bool) -> Value {
    let exprs = support::alert_expr(alert);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for e in &exprs {
            if let Some(hit) = prom.query(e).await.into_iter().find(|s| matches(s)) {
                return hit;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{alert} never rose above its threshold; Prometheus log:\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn start_prometheus(server: &Ratewatch) -> Prometheus {
    let target = server.addr();
    tokio::task::spawn_blocking(move || Prometheus::start(&[target], &[support::alerts_file()]))
        .await
        .unwrap()
}

/// The page after its scripts ran, failing on a script error.
async fn page(server: &Ratewatch) -> String {
    let url = format!("{}/dashboard?range=5m", server.url());
    let (dom, log) = tokio::task::spawn_blocking(move || support::dump_dom(&url, 4_000))
        .await
        .unwrap();
    assert!(!log.contains("Uncaught"), "the page's script failed: {log}");
    assert!(
        dom.contains("Decisions over time"),
        "the page rendered: {dom:.300}"
    );
    dom
}

fn masked(key: &str) -> String {
    Identity::new(IdentityKind::ApiKey, key).masked()
}

fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn redis_config(url: &str, timeout_ms: u64) -> String {
    format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout_ms = {timeout_ms}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_a_one_abusive_key_is_named_with_its_limit_on_the_page_and_in_prometheus() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = Ratewatch::start(
        "serve",
        Some(&config(dir.path(), &redis_config(&redis.url(), 200))),
        &[],
    );
    let prom = start_prometheus(&server).await;
    let abuser = "free_drill_abuser_0001";
    let traffic = Traffic::start(
        server.url(),
        vec![(abuser.into(), 4), ("free_drill_polite_02".into(), 1)],
    );
    let (stats, took) = wait_stats(
        &server,
        SHOWN_WITHIN + Duration::from_secs(10),
        "the abuser",
        |v| v["top_blocked"][0]["identity"] == masked(abuser),
    )
    .await;
    eprintln!("drill a: abuser on top of the JSON after {took:?}");
    assert_eq!(
        stats["top_blocked"][0]["cause"], "burst",
        "blocked by its limit"
    );
    assert_eq!(stats["hot_keys"][0]["identity"], masked(abuser));
    assert_eq!(stats["hot_keys"][0]["tier"], "free");

    let dom = page(&server).await;
    let shown = html(&masked(abuser));
    assert!(dom.contains(&shown), "the abuser is listed on the page");
    let row = dom
        .split("id=\"top-blocked-rows\"")
        .nth(1)
        .expect("top blocked table");
    assert!(row.contains(&shown) && row.contains("burst"), "{row:.400}");

    // RatewatchBlockRateSpike also asks for twice the 1 h average, which a
    // Prometheus younger than 5 minutes cannot have (both windows hold the
    // same samples); its block-rate part is evaluated here, the whole rule
    // by promtool's unit tests.
    let spike = &support::alert_expr("RatewatchBlockRateSpike")[0];
    let block_rate = spike
        .split("and on (tier)")
        .next()
        .expect("the block-rate part")
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let hit = prom.query(&block_rate).await;
        if hit.iter().any(|s| s["metric"]["tier"] == "free") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "block rate never above 50%: {hit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    traffic.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_b_redis_killed_the_page_stays_up_with_a_banner_fail_open_and_an_open_breaker() {
    let mut redis = RedisServer::start();
    let shard = redis.addr();
    let dir = tempfile::tempdir().unwrap();
    let server = Ratewatch::start(
        "serve",
        Some(&config(dir.path(), &redis_config(&redis.url(), 50))),
        &[],
    );
    let prom = start_prometheus(&server).await;
    let traffic = Traffic::start(
        server.url(),
        vec![
            ("free_drill_alice_0001".into(), 2),
            ("ent_drill_bigcorp_001".into(), 3),
        ],
    );
    // Healthy first: the fleet view answers from Redis.
    wait_stats(&server, Duration::from_secs(20), "the fleet view", |v| {
        v["source"]["kind"] == "fleet" && v["decisions"].as_u64() > Some(10)
    })
    .await;

    redis.kill();
    let killed = Instant::now();
    let (stats, took) = wait_stats(&server, SHOWN_WITHIN, "the outage", |v| {
        v["source"]["fleet_unavailable"].is_object()
            && v["fail_open_series"]
                .as_array()
                .is_some_and(|s| s.iter().rev().take(3).any(|r| r.as_f64() > Some(0.0)))
            && v["breaker_series"][&shard]
                .as_array()
                .is_some_and(|s| s.iter().any(|b| b == "open"))
    })
    .await;
    eprintln!("drill b: outage in the JSON {took:?} after the kill");
    // A fail-closed route refuses while Redis is away: listed as a
    // refusal, not as a block by a limit.
    let refused = "free_drill_exporter_01";
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let res = client
            .post(format!("{}/api/export", server.url()))
            .header("x-api-key", refused)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 503);
    }
    let (refusals, _) = wait_stats(&server, SHOWN_WITHIN, "the fail-closed refusals", |v| {
        v["top_blocked"].as_array().is_some_and(|t| {
            t.iter()
                .any(|k| k["identity"] == masked(refused) && k["cause"] == "fail_closed")
        })
    })
    .await;
    assert!(refusals["blocked_by_cause"]["fail_closed"].as_u64() >= Some(3));
    assert_eq!(stats["source"]["kind"], "instance");
    assert!(stats["source"]["fleet_unavailable"]["since"].as_u64() > Some(0));
    assert!(
        !stats["source"]["fleet_unavailable"]["reason"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );
    let breakers = get_json(&format!("{}/dashboard/api/breakers", server.url()))
        .await
        .expect("breakers");
    // Open, or half-open once its cooldown has passed with no request to
    // probe Redis (the refusals above may take longer than the cooldown):
    // never closed while Redis is dead.
    assert!(
        breakers[&shard] == "open" || breakers[&shard] == "half_open",
        "{breakers}"
    );

    // Every endpoint answers at once: well within the 300 ms budget on an
    // idle machine, a generous bound here.
    for path in [
        "/dashboard",
        "/dashboard/api/stats?range=1h",
        "/dashboard/api/breakers",
    ] {
        let t = Instant::now();
        let res = reqwest::get(format!("{}{path}", server.url()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{path} took {:?}",
            t.elapsed()
        );
    }

    let dom = page(&server).await;
    eprintln!(
        "drill b: page rendered {:?} after the kill",
        killed.elapsed()
    );
    let banner = dom.split("id=\"banner\"").nth(1).expect("banner");
    assert!(
        !banner[..banner.find('>').unwrap_or(0)].contains("hidden"),
        "the banner is shown: {banner:.300}"
    );
    assert!(dom.contains("Fleet view unavailable"));
    assert!(
        dom.contains("class=\"state open\""),
        "the open interval is drawn"
    );
    assert!(
        dom.contains("class=\"point\""),
        "the fail-open series is drawn"
    );
    assert!(
        dom.contains("class=\"cause bad\">fail_closed"),
        "the refusal is shown as such"
    );

    // A picture for the README, taken while Redis is down.
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/drill-b-redis-killed.png");
    let url = format!("{}/dashboard?range=5m", server.url());
    let file = shot.clone();
    tokio::task::spawn_blocking(move || support::screenshot(&url, &file, 1400, 1900))
        .await
        .unwrap();
    if std::env::var_os("RATEWATCH_UPDATE_SCREENSHOT").is_some() {
        std::fs::copy(
            &shot,
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard-redis-down.png"),
        )
        .unwrap();
    }

    let fail_open = wait_alert(&prom, "RatewatchFailOpenRateHigh", |_| true).await;
    eprintln!("drill b: fail-open rate {}", fail_open["value"][1]);
    wait_alert(&prom, "RatewatchBreakerOpen", |s| {
        s["metric"]["shard"] == shard.as_str()
    })
    .await;
    traffic.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_frozen_every_dashboard_endpoint_answers_at_once_from_this_instance() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = Ratewatch::start(
        "serve",
        Some(&config(dir.path(), &redis_config(&redis.url(), 50))),
        &[],
    );
    let traffic = Traffic::start(server.url(), vec![("free_drill_frozen_01".into(), 2)]);
    wait_stats(&server, Duration::from_secs(20), "the fleet view", |v| {
        v["source"]["kind"] == "fleet" && v["decisions"].as_u64() > Some(5)
    })
    .await;
    redis.pause();
    let (stats, took) = wait_stats(&server, SHOWN_WITHIN, "the frozen Redis", |v| {
        v["source"]["kind"] == "instance"
    })
    .await;
    eprintln!("frozen: in-process view after {took:?}");
    assert!(
        stats["decisions"].as_u64() > Some(0),
        "this instance's own decisions: {stats}"
    );
    let reason = stats["source"]["fleet_unavailable"]["reason"]
        .as_str()
        .unwrap_or("");
    assert!(
        reason.contains("in time"),
        "a frozen Redis times out: {reason}"
    );
    for path in [
        "/dashboard",
        "/dashboard/api/stats?range=15m",
        "/dashboard/api/breakers",
    ] {
        let t = Instant::now();
        let res = reqwest::get(format!("{}{path}", server.url()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
        let took = t.elapsed();
        eprintln!("frozen: {path} answered in {took:?}");
        assert!(took < Duration::from_secs(2), "{path} took {took:?}");
    }
    redis.resume();
    wait_stats(
        &server,
        Duration::from_secs(20),
        "the fleet view back",
        |v| v["source"]["kind"] == "fleet" && v["source"]["fleet_unavailable"].is_null(),
    )
    .await;
    traffic.stop().await;
}

/// Clients looping `DEBUG SLEEP` keep Redis alive but slow.
struct Sleepers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Sleepers {
    fn start(url: &str, clients: usize, seconds: f64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..clients)
            .map(|_| {
                let stop = stop.clone();
                let url = url.to_owned();
                std::thread::spawn(move || {
                    let client = redis::Client::open(url).unwrap();
                    let mut conn = client.get_connection().unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                            .arg("SLEEP")
                            .arg(seconds)
                            .query(&mut conn);
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_c_redis_slow_but_alive_shows_in_the_p99_series_and_the_slow_redis_alert() {
    let redis = RedisServer::start();
    let shard = redis.addr();
    let dir = tempfile::tempdir().unwrap();
    // A budget above the sleeps: decisions wait, they do not fail over.
    let server = Ratewatch::start(
        "serve",
        Some(&config(dir.path(), &redis_config(&redis.url(), 400))),
        &[],
    );
    let prom = start_prometheus(&server).await;
    let traffic = Traffic::start(
        server.url(),
        vec![
            ("ent_drill_steady_0001".into(), 2),
            ("ent_drill_steady_0002".into(), 2),
        ],
    );
    wait_stats(&server, Duration::from_secs(20), "round trips", |v| {
        v["rtt"][&shard]["count"].as_u64() > Some(5)
    })
    .await;
    // Three clients looping `DEBUG SLEEP 0.02`: a decision waits behind one
    // to three of them.
    let sleepers = Sleepers::start(&redis.url(), 3, 0.02);
    let slow = |v: &Value| {
        v["rtt_series"][&shard]["p99_s"]
            .as_array()
            .is_some_and(|s| s.iter().rev().take(2).any(|p| p.as_f64() > Some(0.02)))
    };
    let (stats, took) = wait_stats(&server, SHOWN_WITHIN, "slow round trips", slow).await;
    eprintln!(
        "drill c: p99 per bucket {} after {took:?}",
        stats["rtt_series"][&shard]["p99_s"]
    );
    assert_eq!(stats["source"]["kind"], "fleet", "slow is not down");
    assert_eq!(
        stats["totals"]["enterprise"]["fallback_allowed"], 0,
        "nothing failed over"
    );
    let dom = page(&server).await;
    let rtt = dom.split("id=\"rtt-chart\"").nth(1).expect("rtt chart");
    assert!(
        rtt.contains(&format!("{shard} p99")),
        "the p99 series is drawn: {rtt:.300}"
    );

    let hit = wait_alert(&prom, "RatewatchRedisSlow", |s| {
        s["metric"]["shard"] == shard.as_str()
    })
    .await;
    eprintln!("drill c: Prometheus p99 {}", hit["value"][1]);
    sleepers.stop();
    traffic.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_d_one_enterprise_key_hammering_one_cluster_shard_is_a_hot_key_and_a_hot_shard() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "[store]\nkind = \"redis-cluster\"\nnodes = [{}]\ntimeout_ms = 200",
        nodes.join(", ")
    );
    let server = Ratewatch::start("serve", Some(&config(dir.path(), &store)), &[]);
    let prom = start_prometheus(&server).await;
    let big = "ent_drill_bigcorp_0001";
    // The big client at 100/s, a few small ones spread over the shards.
    let mut callers: Vec<(String, u32)> = vec![(big.into(), 10)];
    for i in 0..6 {
        callers.push((format!("free_drill_small_{i:04}"), 1));
    }
    let traffic = Traffic::start(server.url(), callers);
    let (stats, took) = wait_stats(
        &server,
        SHOWN_WITHIN + Duration::from_secs(15),
        "the hot key",
        |v| {
            v["hot_keys"][0]["identity"] == masked(big)
                && v["hot_shard"]["share"].as_f64() > Some(0.5)
                && v["decisions"].as_u64() > Some(100)
        },
    )
    .await;
    eprintln!("drill d: hot key and shard in the JSON after {took:?}");
    let hot = &stats["hot_keys"][0];
    assert_eq!(hot["tier"], "enterprise");
    assert!(hot["share"].as_f64() > Some(0.5), "{hot}");
    let shard = hot["shard"].as_str().expect("a shard").to_owned();
    assert_eq!(
        stats["hot_shard"]["shard"],
        shard.as_str(),
        "its shard is the busiest"
    );
    assert_eq!(stats["totals"]["enterprise"]["blocked"], 0, "never blocked");
    assert!(
        stats["shard_series"].as_object().map_or(0, |m| m.len()) >= 2,
        "decisions per shard over time: {}",
        stats["shard_series"]
    );

    let dom = page(&server).await;
    let keys = dom
        .split("id=\"hot-key-rows\"")
        .nth(1)
        .expect("hot keys table");
    assert!(keys.contains(&html(&masked(big))) && keys.contains("enterprise"));
    let busiest = dom.split("id=\"hot-shard\"").nth(1).expect("hot shard");
    assert!(
        busiest[..200.min(busiest.len())].contains(&shard),
        "{busiest:.200}"
    );

    let hit = wait_alert(&prom, "RatewatchHotShard", |s| {
        s["metric"]["shard"] == shard.as_str()
    })
    .await;
    eprintln!("drill d: Prometheus share of {shard}: {}", hit["value"][1]);
    traffic.stop().await;
}
