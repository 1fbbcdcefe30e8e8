//! Reloading the policy: in process (`reload`, `replace_policy`, under
//! concurrent load) and on the real `ratewatch serve` binary (SIGHUP and a
//! file edit), with counters kept, invalid files refused and visible, and
//! restart-only settings reported instead of applied.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use ratewatch::{Limiter, ReloadError};
use support::{Ratewatch, RedisServer, eventually};
use tower::ServiceExt;

/// `[store]` of a memory store, or of the Redis at `url`.
fn store(redis: Option<&str>) -> String {
    match redis {
        Some(url) => format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 1000\n"),
        None => "[store]\nkind = \"memory\"\n".into(),
    }
}

/// A policy whose free tier has a `burst` of `burst`, plus `extra` limits
/// (TOML inline tables), and whose `GET /work` and `GET /api/users` carry
/// the route limit `route` (so a request shows which policy decided both
/// its tier and its route).
fn policy(version: &str, store: &str, burst: u64, extra: &str, route: &str) -> String {
    format!(
        r#"version = "{version}"
{store}
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  {{ name = "burst", algorithm = "token_bucket", capacity = {burst}, refill_per_second = 1000 }},
  {extra}
]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 10 }}]

[[routes]]
method = "GET"
path = "/work"
limits = [{{ name = "{route}", algorithm = "token_bucket", capacity = 1000000, refill_per_second = 1000 }}]

[[routes]]
method = "GET"
path = "/api/users"
limits = [{{ name = "{route}", algorithm = "token_bucket", capacity = 1000000, refill_per_second = 1000 }}]
"#
    )
}

fn policy_a(store: &str) -> String {
    policy("a", store, 1_000_000, "", "route_a")
}

fn policy_b(store: &str) -> String {
    policy(
        "b",
        store,
        2_000_000,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 3000000, window = "60s" },"#,
        "route_b",
    )
}

/// `name -> quota` of a `RateLimit-Policy` header.
fn quotas(header: &str) -> BTreeMap<String, u64> {
    header
        .split(',')
        .filter_map(|item| {
            let item = item.trim();
            let name = item.strip_prefix('"')?.split('"').next()?.to_owned();
            let q = item.split(";q=").nth(1)?.split(';').next()?.parse().ok()?;
            Some((name, q))
        })
        .collect()
}

/// Which policy a `RateLimit-Policy` header came from: `a`, `b`, or a
/// mix (`?`), which must never happen.
fn which(header: &str) -> char {
    let q = quotas(header);
    let a = BTreeMap::from([
        ("burst".to_owned(), 1_000_000),
        ("route_a".into(), 1_000_000),
    ]);
    let b = BTreeMap::from([
        ("burst".to_owned(), 2_000_000),
        ("minute".into(), 3_000_000),
        ("route_b".into(), 1_000_000),
    ]);
    if q == a {
        'a'
    } else if q == b {
        'b'
    } else {
        '?'
    }
}

/// A limiter built from `file` that reloads only when told (`reload()`),
/// so each test knows every reload it counts.
async fn unfollowed(file: &Path) -> Limiter {
    Limiter::builder_from_file(file)
        .await
        .unwrap()
        .with_follow(ratewatch::Follow::off())
        .build()
        .await
        .unwrap()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the policy file");
}

fn app(limiter: &Limiter) -> Router {
    Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(limiter.layer())
}

/// One request of `key` to `/work`: status and `RateLimit-Policy`.
async fn work(app: &Router, key: &str) -> (u16, String) {
    let req = Request::get("/work")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.expect("infallible");
    let policy = res
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (res.status().as_u16(), policy)
}

/// `(remaining of `limit`, allowed)` of one decision for `key`.
async fn remaining(limiter: &Limiter, key: &str, limit: &str) -> (f64, bool) {
    let id = ratewatch::Identity::new(ratewatch::identity::IdentityKind::ApiKey, key);
    let snap = limiter.snapshot();
    let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
    let tier = snap.resolve_tier(&id, &parts);
    let d = snap.check(&id, &tier, None).await;
    let l = d
        .limits
        .iter()
        .find(|l| &*l.name == limit)
        .unwrap_or_else(|| panic!("no limit {limit} in {d:?}"));
    (l.remaining.expect("counted"), d.allowed)
}

struct Sample {
    started: Instant,
    ended: Instant,
    status: u16,
    policy: char,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_fails_no_request_and_decides_each_wholly_under_old_then_new() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let limiter = unfollowed(&file).await;
    let app = app(&limiter);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (app, stop, done) = (app.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let (status, header) = work(&app, &format!("free_client{c}")).await;
                    samples.push(Sample {
                        started,
                        ended: Instant::now(),
                        status,
                        policy: which(&header),
                    });
                    done.fetch_add(1, Ordering::Relaxed);
                    // The memory store never makes a request wait: without
                    // this the loop would never give its thread back.
                    tokio::task::yield_now().await;
                }
                samples
            })
        })
        .collect();
    let wait_for = |n: u64| {
        let done = done.clone();
        async move {
            eventually(Duration::from_secs(60), "requests to complete", || {
                let ok = done.load(Ordering::Relaxed) >= n;
                async move { ok.then_some(()) }
            })
            .await
        }
    };
    wait_for(500).await;
    // One switch from a to b, through the file.
    let switch_started = Instant::now();
    write(&file, &policy_b(&store(None)));
    let outcome = limiter.reload().expect("a valid policy reloads");
    let switched = Instant::now();
    assert!(outcome.changed);
    assert_eq!(outcome.version.version, "b");
    let after = done.load(Ordering::Relaxed);
    wait_for(after + 500).await;
    let flips_started = Instant::now();
    // Then many switches back and forth, in code, under the same load.
    let policies = [
        ratewatch::Policy::from_toml_str(&policy_a(&store(None)), None).unwrap(),
        ratewatch::Policy::from_toml_str(&policy_b(&store(None)), None).unwrap(),
    ];
    for i in 0..100 {
        limiter
            .replace_policy(policies[i % 2].clone())
            .expect("valid");
        tokio::task::yield_now().await;
    }
    let flips_ended = Instant::now();
    let after = done.load(Ordering::Relaxed);
    wait_for(after + 200).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for c in clients {
        samples.extend(c.await.unwrap());
    }

    let failed = samples.iter().filter(|s| s.status != 200).count();
    assert_eq!(failed, 0, "requests failed during reloads");
    let mixed = samples.iter().filter(|s| s.policy == '?').count();
    assert_eq!(mixed, 0, "requests decided under a mix of two policies");
    for s in &samples {
        if s.ended < switch_started {
            assert_eq!(
                s.policy, 'a',
                "a request before the reload saw the new policy"
            );
        }
        if s.started > switched && s.ended < flips_started {
            assert_eq!(
                s.policy, 'b',
                "a request after the reload saw the old policy"
            );
        }
    }
    let before = samples.iter().filter(|s| s.ended < switch_started).count();
    let after_b = samples
        .iter()
        .filter(|s| s.started > switched && s.policy == 'b')
        .count();
    assert!(
        before >= 400 && after_b >= 400,
        "{before} before, {after_b} after"
    );
    let latencies = |during: &dyn Fn(&Sample) -> bool| {
        let mut l: Vec<Duration> = samples
            .iter()
            .filter(|s| during(s))
            .map(|s| s.ended - s.started)
            .collect();
        l.sort();
        let p = |q: f64| l[((l.len() - 1) as f64 * q) as usize];
        (l.len(), p(0.5), p(0.99), p(1.0))
    };
    let calm = latencies(&|s| s.ended < switch_started);
    let storm = latencies(&|s| s.started >= flips_started && s.ended <= flips_ended);
    let all = latencies(&|_| true);
    println!(
        "no reload: {} requests, p50 {:?}, p99 {:?}, max {:?}; \
         during 100 reloads: {} requests, p50 {:?}, p99 {:?}, max {:?}",
        calm.0, calm.1, calm.2, calm.3, storm.0, storm.1, storm.2, storm.3
    );
    assert!(
        all.3 < Duration::from_secs(2),
        "a request waited {:?}",
        all.3
    );
}

#[tokio::test]
async fn a_pinned_snapshot_decides_under_its_policy_after_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let limiter = unfollowed(&file).await;
    let id = ratewatch::Identity::new(ratewatch::identity::IdentityKind::ApiKey, "free_pin");
    let old = limiter.snapshot();
    let route = old.route_for("GET", "/work");
    write(&file, &policy_b(&store(None)));
    limiter.reload().unwrap();
    // The old route match and the old snapshot still decide under a.
    let d = old.check(&id, "free", route.as_ref()).await;
    let names: Vec<&str> = d.limits.iter().map(|l| &*l.name).collect();
    assert_eq!(names, ["burst", "route_a"]);
    // Through the limiter, a match made before the reload keeps its policy.
    let d = limiter.check(&id, "free", route).await;
    let names: Vec<&str> = d.limits.iter().map(|l| &*l.name).collect();
    assert_eq!(names, ["burst", "route_a"]);
    let fresh = limiter.snapshot();
    let d = fresh
        .check(&id, "free", fresh.route_for("GET", "/work").as_ref())
        .await;
    let names: Vec<&str> = d.limits.iter().map(|l| &*l.name).collect();
    assert_eq!(names, ["burst", "minute", "route_b"]);
}

/// A policy with a `minute` limit of `algorithm` (limit 5) and a `day`
/// fixed window of `day`.
fn counting(version: &str, store: &str, algorithm: &str, day: u64) -> String {
    format!(
        r#"version = "{version}"
{store}
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  {{ name = "minute", algorithm = "{algorithm}", limit = 5, window = "60s" }},
  {{ name = "day", algorithm = "fixed_window", limit = {day}, window = "1d" }},
]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 10 }}]
"#
    )
}

async fn counters_survive(redis: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &counting("1", &store(redis), "fixed_window", 100));
    let limiter = unfollowed(&file).await;
    let key = format!("free_keep{}", std::process::id());
    for _ in 0..3 {
        assert!(remaining(&limiter, &key, "minute").await.1);
    }
    // Same limits, a new version and a higher daily quota: nothing of the
    // minute's quota comes back, and the day keeps its count.
    write(&file, &counting("2", &store(redis), "fixed_window", 200));
    assert!(limiter.reload().unwrap().changed);
    assert_eq!(remaining(&limiter, &key, "minute").await, (1.0, true));
    assert_eq!(remaining(&limiter, &key, "day").await, (195.0, true));
    assert!(
        !remaining(&limiter, &key, "minute").await.1,
        "a reload handed out fresh quota"
    );
}

#[tokio::test]
async fn counters_survive_a_reload_that_keeps_the_limit_on_memory() {
    counters_survive(None).await;
}

#[tokio::test]
async fn counters_survive_a_reload_that_keeps_the_limit_on_redis() {
    let redis = RedisServer::start();
    counters_survive(Some(&redis.url())).await;
}

async fn changed_algorithm_starts_fresh(redis: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &counting("1", &store(redis), "fixed_window", 100));
    let limiter = unfollowed(&file).await;
    let key = format!("free_fresh{}", std::process::id());
    for _ in 0..5 {
        assert!(remaining(&limiter, &key, "minute").await.1);
    }
    assert!(
        !remaining(&limiter, &key, "minute").await.1,
        "the sixth is blocked"
    );
    write(&file, &counting("2", &store(redis), "sliding_window", 100));
    assert!(limiter.reload().unwrap().changed);
    // A sliding window is a different state: it starts from nothing, and
    // never reads the fixed window's fields as its own.
    assert_eq!(remaining(&limiter, &key, "minute").await, (4.0, true));
    for _ in 0..4 {
        assert!(remaining(&limiter, &key, "minute").await.1);
    }
    assert!(!remaining(&limiter, &key, "minute").await.1);
}

#[tokio::test]
async fn a_limit_whose_algorithm_changed_starts_fresh_on_memory() {
    changed_algorithm_starts_fresh(None).await;
}

#[tokio::test]
async fn a_limit_whose_algorithm_changed_starts_fresh_on_redis() {
    let redis = RedisServer::start();
    changed_algorithm_starts_fresh(Some(&redis.url())).await;
}

#[tokio::test]
async fn an_invalid_file_never_replaces_the_policy_and_its_error_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let limiter = unfollowed(&file).await;
    let app = app(&limiter);
    let broken =
        policy_a(&store(None)).replace("capacity = 1000000, refill", "capacity = -3, refill");
    let line = broken
        .lines()
        .position(|l| l.contains("capacity = -3"))
        .unwrap()
        + 1;
    write(&file, &broken);
    let err = limiter.reload().expect_err("an invalid file is refused");
    let ReloadError::Config(e) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(e.line(), Some(line));
    assert_eq!(e.field(), Some("tiers[0].limits[0].capacity"));
    assert!(
        err.to_string()
            .contains(&format!("{}:{line}", file.display())),
        "{err}"
    );
    // The old policy keeps deciding.
    let (status, header) = work(&app, "free_still").await;
    assert_eq!((status, which(&header)), (200, 'a'));
    let s = limiter.policy_status();
    assert_eq!(s.version, "a");
    let last = s.last_reload.expect("the attempt is recorded");
    assert!(!last.ok);
    assert!(last.error.unwrap().contains("capacity"));
    assert_eq!((s.reloads_ok, s.reloads_failed), (0, 1));
    // A policy built in code is checked the same way.
    let mut bad = limiter.policy().as_ref().clone();
    bad.partition = 2.0;
    let err = limiter.replace_policy(bad).expect_err("invalid");
    assert!(err.to_string().contains("partition"), "{err}");
    assert_eq!(limiter.policy_status().reloads_failed, 2);
    assert_eq!(which(&work(&app, "free_still").await.1), 'a');
    // Fixing the file applies it.
    write(&file, &policy_b(&store(None)));
    assert!(limiter.reload().unwrap().changed);
    assert_eq!(which(&work(&app, "free_still").await.1), 'b');
    assert!(limiter.policy_status().last_reload.unwrap().ok);
}

#[tokio::test]
async fn a_limiter_built_in_code_has_nothing_to_reload_but_replaces_its_policy() {
    let policy = ratewatch::Policy::from_toml_str(&policy_a(&store(None)), None).unwrap();
    let limiter = Limiter::new(policy).await.unwrap();
    assert!(matches!(limiter.reload(), Err(ReloadError::NoSource)));
    let b = ratewatch::Policy::from_toml_str(&policy_b(&store(None)), None).unwrap();
    let out = limiter.replace_policy(b.clone()).unwrap();
    assert!(out.changed);
    // The same policy again changes nothing.
    assert!(!limiter.replace_policy(b).unwrap().changed);
    assert_eq!(limiter.policy_status().reloads_ok, 2);
}

// ---------------------------------------------------------------------------
// The real binary
// ---------------------------------------------------------------------------

async fn get_text(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// The value of the exposition line starting with `series`, if any.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn users(client: &reqwest::Client, base: &str, key: &str) -> (u16, char) {
    let res = client
        .get(format!("{base}/api/users"))
        .header("x-api-key", key)
        .send()
        .await
        .expect("the server answers");
    let status = res.status().as_u16();
    let header = res
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (status, which(&header))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_real_server_under_load_without_a_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    // No polling: only the signal can reload.
    let server = Ratewatch::start_logged("serve", Some(&file), &[], &["--reload-poll-ms", "0"]);
    let base = server.url();
    let metrics = get_text(&format!("{base}/metrics")).await;
    assert_eq!(
        metric(&metrics, r#"ratewatch_config_reloads_total{result="ok"}"#),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &metrics,
            r#"ratewatch_config_reloads_total{result="error"}"#
        ),
        Some(0.0)
    );
    let hash_a = policy_hash(&metrics, "a");

    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let clients: Vec<_> = (0..6)
        .map(|c| {
            let (base, stop, counts) = (base.clone(), stop.clone(), counts.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let got = users(&client, &base, &format!("free_load{c}")).await;
                    counts[usize::from(got.1 == 'b')].fetch_add(1, Ordering::Relaxed);
                    seen.push(got);
                }
                seen
            })
        })
        .collect();
    let client = reqwest::Client::new();
    let at_least = |which: usize, n: u64| {
        let counts = counts.clone();
        async move {
            eventually(Duration::from_secs(30), "load runs", || {
                let ok = counts[which].load(Ordering::Relaxed) >= n;
                async move { ok.then_some(()) }
            })
            .await
        }
    };
    at_least(0, 300).await;
    write(&file, &policy_b(&store(None)));
    server.signal("HUP");
    at_least(1, 300).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let seen = c.await.unwrap();
        assert!(
            seen.iter().all(|(s, _)| *s == 200),
            "a request failed: {seen:?}"
        );
        let order: String = seen.iter().map(|(_, p)| *p).collect();
        // Each client's requests are sequential: a's, then b's, never back.
        let switched = order.trim_start_matches('a');
        assert!(switched.chars().all(|p| p == 'b'), "{order}");
    }

    let status: serde_json::Value = client
        .get(format!("{base}/api/ratelimit/status"))
        .header("x-api-key", "free_probe")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["policy"]["version"], "b");
    let metrics = get_text(&format!("{base}/metrics")).await;
    assert_eq!(
        metric(&metrics, r#"ratewatch_config_reloads_total{result="ok"}"#),
        Some(1.0)
    );
    let hash_b = policy_hash(&metrics, "b");
    assert_eq!(status["policy"]["hash"], hash_b.as_str());
    assert_ne!(hash_a, hash_b);
    assert_eq!(
        metric(
            &metrics,
            &format!(r#"ratewatch_policy_info{{version="a",hash="{hash_a}"}}"#)
        ),
        Some(0.0),
        "the replaced policy's info series is 0"
    );
    assert!(server.log().contains("policy reloaded"), "{}", server.log());
}

/// The hash label of `ratewatch_policy_info{version}` at 1.
fn policy_hash(metrics: &str, version: &str) -> String {
    let prefix = format!(r#"ratewatch_policy_info{{version="{version}",hash=""#);
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&prefix) && l.ends_with(" 1"))
        .unwrap_or_else(|| panic!("no info series at 1 for {version}:\n{metrics}"));
    line[prefix.len()..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn editing_the_policy_file_reloads_the_real_server_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let server = Ratewatch::start_logged("serve", Some(&file), &[], &["--reload-poll-ms", "200"]);
    let base = server.url();
    let client = reqwest::Client::new();
    assert_eq!(users(&client, &base, "free_edit").await, (200, 'a'));
    write(&file, &policy_b(&store(None)));
    eventually(Duration::from_secs(20), "the edit applies b", || {
        let (client, base) = (client.clone(), base.clone());
        async move { (users(&client, &base, "free_edit").await.1 == 'b').then_some(()) }
    })
    .await;
    // An unchanged file is not reloaded again (the poller compares content).
    let polled = Instant::now();
    eventually(Duration::from_secs(20), "several polls pass", || async {
        (polled.elapsed() > Duration::from_millis(1000)).then_some(())
    })
    .await;
    let metrics = get_text(&format!("{base}/metrics")).await;
    assert_eq!(
        metric(&metrics, r#"ratewatch_config_reloads_total{result="ok"}"#),
        Some(1.0)
    );
    assert!(
        server.log().contains("policy file changed"),
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn an_invalid_file_keeps_the_real_server_on_its_policy_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let server = Ratewatch::start_logged("serve", Some(&file), &[], &["--reload-poll-ms", "0"]);
    let base = server.url();
    let client = reqwest::Client::new();
    write(
        &file,
        &policy_a(&store(None)).replace(
            "refill_per_second = 1000 }",
            "refill_per_second = \"fast\" }",
        ),
    );
    server.signal("HUP");
    let metrics = eventually(Duration::from_secs(20), "the error is counted", || {
        let base = base.clone();
        async move {
            let m = get_text(&format!("{base}/metrics")).await;
            (metric(&m, r#"ratewatch_config_reloads_total{result="error"}"#) == Some(1.0))
                .then_some(m)
        }
    })
    .await;
    assert_eq!(
        metric(&metrics, "ratewatch_config_last_reload_successful"),
        Some(0.0)
    );
    assert_eq!(
        metric(&metrics, r#"ratewatch_config_reloads_total{result="ok"}"#),
        Some(0.0)
    );
    policy_hash(&metrics, "a");
    assert_eq!(users(&client, &base, "free_kept").await, (200, 'a'));
    let json = support::get_json(&client, &format!("{base}/dashboard/api/policy"))
        .await
        .expect("the policy JSON");
    let live = &json["live"];
    assert_eq!(live["version"], "a");
    assert_eq!(live["last_reload"]["ok"], false);
    let error = live["last_reload"]["error"].as_str().unwrap();
    assert!(
        error.contains(&file.display().to_string()) && error.contains("refill_per_second"),
        "{error}"
    );
    assert!(live["last_reload"]["at_unix"].as_u64().unwrap() > 1_700_000_000);
    assert!(
        server.log().contains("policy reload failed"),
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn a_changed_store_needs_a_restart_and_the_rest_of_the_file_applies() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let server = Ratewatch::start_logged("serve", Some(&file), &[], &["--reload-poll-ms", "0"]);
    let base = server.url();
    let client = reqwest::Client::new();
    let unused = format!("redis://127.0.0.1:{}", support::free_port());
    write(&file, &policy_b(&store(Some(&unused))));
    server.signal("HUP");
    eventually(Duration::from_secs(20), "the tiers apply", || {
        let (client, base) = (client.clone(), base.clone());
        async move { (users(&client, &base, "free_restart").await == (200, 'b')).then_some(()) }
    })
    .await;
    let json = support::get_json(&client, &format!("{base}/dashboard/api/policy"))
        .await
        .expect("the policy JSON");
    // The timeout is a live setting: it applies, and is not listed.
    assert_eq!(
        json["live"]["restart_required"],
        serde_json::json!(["store.kind", "store.url"])
    );
    let metrics = get_text(&format!("{base}/metrics")).await;
    assert_eq!(
        metric(&metrics, "ratewatch_config_restart_required"),
        Some(2.0)
    );
    // Still the memory store: no decision went to the (absent) Redis.
    assert!(
        metrics.contains(r#"shard="memory",outcome="allowed"}"#),
        "{metrics}"
    );
    assert!(!metrics.contains("shard=\"127.0.0.1"), "{metrics}");
    let fallbacks = metrics
        .lines()
        .filter(|l| l.contains("fallback") && !l.starts_with('#'));
    assert!(fallbacks.clone().all(|l| l.ends_with(" 0")), "{metrics}");
    // The new tier's limit exists at zero from the reload on.
    assert!(
        metrics.contains(r#"ratewatch_limit_exceeded_total{tier="free",limit="minute"} 0"#),
        "{metrics}"
    );
    assert!(server.log().contains("need a restart"), "{}", server.log());
}

#[tokio::test]
async fn instances_running_different_policies_show_in_the_fleet_view() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old.toml"), dir.path().join("new.toml"));
    let fast = "[telemetry]\nflush_interval_ms = 200\n";
    write(
        &old,
        &format!("{}{fast}", policy_a(&store(Some(&redis.url())))),
    );
    write(
        &new,
        &format!("{}{fast}", policy_b(&store(Some(&redis.url())))),
    );
    let servers = [
        Ratewatch::start("serve", Some(&old), &[]),
        Ratewatch::start("serve", Some(&new), &[]),
    ];
    let client = reqwest::Client::new();
    for s in &servers {
        assert_eq!(users(&client, &s.url(), "free_fleet").await.0, 200);
    }
    let base = servers[0].url();
    let seen = eventually(
        Duration::from_secs(30),
        "both policies in the fleet view",
        || {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let stats =
                    support::get_json(&client, &format!("{base}/dashboard/api/stats?range=5m"))
                        .await?;
                let versions: Vec<String> = stats["policies"]
                    .as_array()?
                    .iter()
                    .map(|p| p["version"].as_str().unwrap_or("").to_owned())
                    .collect();
                (versions.len() == 2).then_some(versions)
            }
        },
    )
    .await;
    let mut seen = seen;
    seen.sort();
    assert_eq!(seen, ["a", "b"]);
    let page = get_text(&format!("{base}/dashboard?range=5m")).await;
    assert!(page.contains("the fleet ran 2 policies"), "{page}");
}

#[tokio::test]
async fn an_emptied_file_never_lifts_every_limit() {
    // An editor or a config map that truncates the file before writing it,
    // or an accidental `> ratewatch.toml`, leaves a file that parses as a
    // policy without tiers: applying it would let every request through.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    write(&file, &policy_a(&store(None)));
    let limiter = unfollowed(&file).await;
    let app = app(&limiter);
    for emptied in ["", "[store]\nkind = \"memory\"\n"] {
        write(&file, emptied);
        let err = limiter
            .reload()
            .expect_err("a file without tiers is refused");
        let ReloadError::Config(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(e.field(), Some("tiers"), "{err}");
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{err}"
        );
        assert_eq!(which(&work(&app, "free_still").await.1), 'a');
    }
    assert_eq!(limiter.policy_status().reloads_failed, 2);
}
