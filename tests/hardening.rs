//! A client that tries gets no more than its quota.
//!
//! Each test plays a hostile (or merely unlucky) client against the real
//! `ratewatch serve` binary, or, for nested routers, against an app that
//! embeds the layer, and counts what was admitted: the same secret in two
//! headers, HEAD instead of GET, a nested router, two rules on one path,
//! keys of several tiers, a dual-stack listener, rotating IPv6 addresses,
//! quota shares, and a policy `check-config` accepts but `serve` would not.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use ratewatch::{Limiter, Policy};
use support::{Ratewatch, check_config, free_port, policy_file};
use tower::ServiceExt;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}

/// Sends one request and returns its status.
async fn send(
    client: &reqwest::Client,
    server: &Ratewatch,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let method = http::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client.request(method, format!("{}{path}", server.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send()
        .await
        .expect("the server answers")
        .status()
        .as_u16()
}

/// An anonymous tier with room to spare, for policies about keyed callers.
const ANONYMOUS: &str = r#"
[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 1 }]
"#;

/// A Redis URL nothing answers on: every decision falls back.
fn dead_redis() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

// 1. One credential, one identity -------------------------------------------

#[tokio::test]
async fn a_key_spent_in_the_api_key_header_is_spent_for_its_bearer_token_too() {
    let file = policy_file(&format!(
        r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.001 }}]
{ANONYMOUS}"#
    ));
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let mut admitted = 0;
    for i in 0..8 {
        let status = if i % 2 == 0 {
            send(
                &client,
                &server,
                "GET",
                "/api/users",
                &[("x-api-key", "free_same_secret")],
            )
            .await
        } else {
            send(
                &client,
                &server,
                "GET",
                "/api/users",
                &[("authorization", "Bearer free_same_secret")],
            )
            .await
        };
        admitted += usize::from(status == 200);
    }
    assert_eq!(admitted, 3, "one secret, one quota of 3, whichever header");
}

// 2. HEAD is GET -------------------------------------------------------------

#[tokio::test]
async fn head_pays_the_get_rules_cost_and_meets_its_route_limit() {
    let file = policy_file(&format!(
        r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 20, refill_per_second = 0.001 }}]
{ANONYMOUS}
[[routes]]
method = "GET"
path = "/api/users"
cost = 10
limits = [{{ name = "users", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.001 }}]
"#
    ));
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let key = [("x-api-key", "free_header_only")];
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += usize::from(send(&client, &server, "HEAD", "/api/users", &key).await == 200);
    }
    assert_eq!(admitted, 1, "the route limit admits one request of cost 10");
    assert_eq!(
        send(&client, &server, "GET", "/api/users", &key).await,
        429,
        "the HEAD requests spent what GET would"
    );
}

#[tokio::test]
async fn head_fails_closed_where_get_does() {
    let file = policy_file(&format!(
        r#"
[store]
kind = "redis"
url = "{}"

[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 20, refill_per_second = 1 }}]
{ANONYMOUS}
[[routes]]
method = "GET"
path = "/api/users"
on_store_failure = "closed"
"#,
        dead_redis()
    ));
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    for method in ["GET", "HEAD"] {
        let status = send(
            &client,
            &server,
            method,
            "/api/users",
            &[("x-api-key", "k")],
        )
        .await;
        assert_eq!(status, 503, "{method} with the store away");
    }
}

// 3. Route rules follow axum's routing ---------------------------------------

async fn nested_limiter() -> Limiter {
    let policy = Policy::from_toml_str(
        &format!(
            r#"
[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 20, refill_per_second = 0.001 }}]
{ANONYMOUS}
[[routes]]
method = "POST"
path = "/v1/api/export"
cost = 10
"#
        ),
        None,
    )
    .expect("valid policy");
    Limiter::new(policy).await.expect("limiter")
}

async fn admitted_of(app: Router, key: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let req = Request::post("/v1/api/export")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        admitted += usize::from(res.status() == 200);
    }
    admitted
}

#[tokio::test]
async fn a_layer_inside_a_nested_router_applies_the_full_path_rule() {
    let limiter = nested_limiter().await;
    let api = Router::new()
        .route("/api/export", post(|| async { "exported" }))
        .layer(limiter.layer());
    let app = Router::new().nest("/v1", api);
    assert_eq!(
        admitted_of(app, "key_layer", 5).await,
        2,
        "cost 10 against a burst of 20"
    );

    let api = Router::new()
        .route("/api/export", post(|| async { "exported" }))
        .route_layer(limiter.layer());
    let app = Router::new().nest("/v1", api);
    assert_eq!(admitted_of(app, "key_route_layer", 5).await, 2);

    let res = limiter.metrics_handler()().await;
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .expect("metrics body");
    let metrics = String::from_utf8_lossy(&body).into_owned();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ratewatch_decisions_total")
                && l.contains("route=\"/v1/api/export\"")),
        "the route label is the matched rule's full pattern:\n{metrics}"
    );
}

#[tokio::test]
async fn a_percent_encoded_path_pays_the_rule_of_the_path_the_handler_sees() {
    let limiter = nested_limiter().await;
    // axum decodes `{action}` for the handler: `%65xport` is `export` there.
    let api = Router::new()
        .route(
            "/api/{action}",
            post(|axum::extract::Path(action): axum::extract::Path<String>| async move { action }),
        )
        .layer(limiter.layer());
    let app = Router::new().nest("/v1", api);
    let mut admitted = 0;
    for path in ["/v1/api/%65xport", "/v1/api/%65%78port", "/v1/api/expor%74"] {
        for _ in 0..2 {
            let req = Request::post(path)
                .header("x-api-key", "encoder")
                .body(Body::empty())
                .unwrap();
            let res = app.clone().oneshot(req).await.unwrap();
            admitted += usize::from(res.status() == 200);
        }
    }
    assert_eq!(
        admitted, 2,
        "cost 10 against a burst of 20, however it is spelt"
    );
}

#[tokio::test]
async fn rules_that_could_never_match_are_refused_with_file_line_and_field() {
    let cases = [
        (
            "method = \"GTE\"\npath = \"/api/users\"",
            "routes[0].method",
            2,
        ),
        (
            "method = \"GET\"\npath = \"/api/users/:id\"",
            "routes[0].path",
            3,
        ),
        (
            "method = \"GET\"\npath = \"api/users\"",
            "routes[0].path",
            3,
        ),
        (
            "method = \"GET\"\npath = \"/api/users/{id}\"\n[[routes]]\nmethod = \"GET\"\npath = \"/api/users/{user}\"",
            "routes[1].path",
            6,
        ),
    ];
    for (routes, field, line) in cases {
        let file = policy_file(&format!("[[routes]]\n{routes}\n"));
        let (code, out) = check_config(file.path());
        assert_eq!(code, 2, "{routes:?} must be refused: {out}");
        let at = format!("{}:{line}: `{field}`", file.path().display());
        assert!(out.starts_with(&at), "{out:?} does not start with {at:?}");
    }
}

// 4. Two rules on one path never share counters ------------------------------

#[tokio::test]
async fn get_and_post_rules_on_one_path_never_share_a_counter() {
    let file = policy_file(&format!(
        r#"
[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 1 }}]
{ANONYMOUS}
[[routes]]
method = "POST"
path = "/api/data"
limits = [{{ name = "writes", algorithm = "fixed_window", limit = 2, window = "366d" }}]

[[routes]]
method = "GET"
path = "/api/data"
limits = [{{ name = "writes", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 }}]
"#
    ));
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let key = [("x-api-key", "two_rules")];
    let mut posts = 0;
    for _ in 0..6 {
        posts += usize::from(send(&client, &server, "POST", "/api/data", &key).await == 200);
        // Answered 405 by the app, but decided (and charged) by the GET rule.
        send(&client, &server, "GET", "/api/data", &key).await;
    }
    assert_eq!(posts, 2, "the POST rule's window of 2");
}

// 5. Scopes ------------------------------------------------------------------

#[tokio::test]
async fn a_route_scoped_ceiling_holds_for_clients_of_every_tier() {
    let file = policy_file(
        r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 }]

[[tiers]]
name = "pro"
match_prefix = "pro_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 }]

[[routes]]
method = "POST"
path = "/api/data"
limits = [{ name = "ceiling", algorithm = "token_bucket", capacity = 4, refill_per_second = 0.001, scope = "route" }]
"#,
    );
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let mut admitted = 0;
    for i in 0..3 {
        let free = format!("free_client_{i}");
        let pro = format!("pro_client_{i}");
        let xff = format!("198.51.100.{}", i + 1);
        for headers in [
            vec![("x-api-key", free.as_str())],
            vec![("x-api-key", pro.as_str())],
            vec![("x-forwarded-for", xff.as_str())],
        ] {
            admitted +=
                usize::from(send(&client, &server, "POST", "/api/data", &headers).await == 200);
        }
    }
    assert_eq!(
        admitted, 4,
        "one ceiling of 4 for the route, whatever the tier"
    );
}

#[tokio::test]
async fn an_ip_scoped_limit_counts_an_address_once_whatever_tier_its_keys_claim() {
    let file = policy_file(
        r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 },
  { name = "per_ip", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.001, scope = "ip" },
]

[[tiers]]
name = "pro"
match_prefix = "pro_"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 },
  { name = "per_ip", algorithm = "token_bucket", capacity = 5, refill_per_second = 0.001, scope = "ip" },
]

[[tiers]]
name = "anonymous"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 },
  { name = "per_ip", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.001, scope = "ip" },
]
"#,
    );
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let from = ("x-forwarded-for", "203.0.113.50");
    let mut admitted = 0;
    for prefix in ["pro_", "free_", ""] {
        for i in 0..6 {
            let key = format!("{prefix}invented_{i}");
            let mut headers = vec![from];
            if !prefix.is_empty() {
                headers.push(("x-api-key", key.as_str()));
            }
            admitted +=
                usize::from(send(&client, &server, "GET", "/api/users", &headers).await == 200);
        }
    }
    assert!(
        (1..=5).contains(&admitted),
        "one address, one counter: at most the largest tier's quota of 5, got {admitted}"
    );
}

// 6. Canonical addresses -----------------------------------------------------

const TWO_PER_CLIENT: &str = r#"
[[tiers]]
name = "free"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 2, refill_per_second = 0.001 }]
"#;

#[tokio::test]
async fn behind_a_proxy_on_a_dual_stack_listener_each_client_gets_its_own_quota() {
    let file = policy_file(&format!(
        "[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n{TWO_PER_CLIENT}"
    ));
    let server = Ratewatch::start_on("[::]", "serve", Some(file.path()), &[]);
    let client = client();
    let a = [("x-forwarded-for", "203.0.113.1")];
    let b = [("x-forwarded-for", "203.0.113.2")];
    let mut admitted_a = 0;
    for _ in 0..4 {
        admitted_a += usize::from(send(&client, &server, "GET", "/api/users", &a).await == 200);
    }
    assert_eq!(admitted_a, 2, "client A has its quota of 2");
    assert_eq!(
        send(&client, &server, "GET", "/api/users", &b).await,
        200,
        "client B is not client A: the proxy, seen as ::ffff:127.0.0.1, is trusted"
    );
}

#[tokio::test]
async fn ipv6_addresses_of_one_prefix_share_one_quota() {
    let file = policy_file(
        r#"
[identity]
trusted_proxies = ["127.0.0.1/32"]

[[tiers]]
name = "free"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 1 },
  { name = "per_ip", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.001, scope = "ip" },
]

[[tiers]]
name = "anonymous"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 2, refill_per_second = 0.001 },
  { name = "per_ip", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.001, scope = "ip" },
]
"#,
    );
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let mut anonymous = 0;
    for i in 1..=6 {
        let xff = format!("2001:db8:7:7::{i:x}");
        let h = [("x-forwarded-for", xff.as_str())];
        anonymous += usize::from(send(&client, &server, "GET", "/api/users", &h).await == 200);
    }
    assert_eq!(anonymous, 2, "one /64, one anonymous quota of 2");

    let mut keyed = 0;
    for i in 1..=6 {
        let xff = format!("2001:db8:7:8:{i:x}::1");
        let key = format!("invented_{i}");
        let h = [
            ("x-forwarded-for", xff.as_str()),
            ("x-api-key", key.as_str()),
        ];
        keyed += usize::from(send(&client, &server, "GET", "/api/users", &h).await == 200);
    }
    assert_eq!(
        keyed, 3,
        "one /64, one IP-scoped quota of 3, whatever the keys"
    );
}

#[tokio::test]
async fn the_dashboard_knows_a_loopback_client_on_a_dual_stack_listener() {
    let file = policy_file(&format!(
        "[identity]\ntrusted_proxies = []\n{TWO_PER_CLIENT}"
    ));
    let server = Ratewatch::start_on("[::]", "serve", Some(file.path()), &[]);
    let status = send(&client(), &server, "GET", "/dashboard", &[]).await;
    assert_eq!(
        status, 200,
        "::ffff:127.0.0.1 is the loopback address 127.0.0.1"
    );
}

// 7. Shares never inflate a quota --------------------------------------------

#[test]
fn a_split_share_below_a_route_cost_is_refused_not_raised() {
    let file = policy_file(&format!(
        r#"[[tiers]]
name = "free"
split = 8
limits = [
  {{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }},
  {{ name = "day", algorithm = "fixed_window", limit = 16, window = "1d" }},
]
{ANONYMOUS}
[[routes]]
method = "POST"
path = "/api/export"
cost = 5
"#
    ));
    let (code, out) = check_config(file.path());
    assert_eq!(code, 2, "{out}");
    let at = format!("{}:3: `tiers[0].split`", file.path().display());
    assert!(out.starts_with(&at), "{out:?} does not start with {at:?}");
}

#[tokio::test]
async fn the_local_fallback_shares_against_the_cost_of_the_route_being_decided() {
    let file = policy_file(&format!(
        r#"
[store]
kind = "redis"
url = "{}"

[resilience]
on_store_failure = "local"
expected_instances = 4

[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 8, refill_per_second = 0.001 }}]
{ANONYMOUS}
[[routes]]
method = "POST"
path = "/api/export"
cost = 5
on_store_failure = "closed"
"#,
        dead_redis()
    ));
    let server = Ratewatch::start("serve", Some(file.path()), &[]);
    let client = client();
    let key = [("x-api-key", "local_share")];
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(send(&client, &server, "GET", "/api/users", &key).await == 200);
    }
    assert_eq!(
        admitted, 2,
        "8 / 4 instances; the export route's cost 5 is never decided locally"
    );
}

/// Runs `ratewatch serve` on `file` and waits for it to exit (it must not
/// start): its exit code and stderr.
fn serve_refuses(file: &std::path::Path) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .arg("serve")
        .arg("--config")
        .arg(file)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratewatch");
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ratewatch serve started on a policy it should refuse");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    (code, err)
}

#[test]
fn check_config_refuses_exactly_what_serve_refuses_after_partition_scaling() {
    let cases = [
        // A rate valid in the file, out of range once halved.
        (
            "partition = 0.5\n[[tiers]]\nname = \"free\"\nlimits = [{ name = \"slow\", algorithm = \"token_bucket\", capacity = 10, refill_per_second = 0.000001 }]\n",
            "tiers[0].limits[0].refill_per_second",
            4,
        ),
        // A quota whose partition share falls below a route's cost.
        (
            "partition = 0.1\n[[tiers]]\nname = \"free\"\nlimits = [{ name = \"burst\", algorithm = \"token_bucket\", capacity = 10, refill_per_second = 1 }]\n[[routes]]\nmethod = \"POST\"\npath = \"/api/export\"\ncost = 5\n",
            "tiers[0].limits[0].capacity",
            4,
        ),
    ];
    for (text, field, line) in cases {
        let file = policy_file(&format!("{text}{ANONYMOUS}"));
        let at = format!("{}:{line}: `{field}`", file.path().display());
        let (code, out) = check_config(file.path());
        assert_eq!(code, 2, "check-config must refuse it: {out}");
        assert!(out.starts_with(&at), "{out:?} does not start with {at:?}");
        let (code, err) = serve_refuses(file.path());
        assert_eq!(code, 2, "serve refuses it the same way: {err}");
        assert!(err.starts_with(&at), "{err:?} does not start with {at:?}");
    }
}
