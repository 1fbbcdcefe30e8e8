//! The built-in dashboard as an operator sees it: loaded in headless
//! Chromium after its scripts ran, and its access rules.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::connect_info::MockConnectInfo;
use http::Request;
use ratewatch::policy::{DashboardSettings, IdentitySettings, Limit, Policy, Tier};
use ratewatch::{Limiter, server};
use tower::ServiceExt;

/// The DOM of `url` after its scripts ran (and, in virtual time, refreshed
/// twice), and what the page logged, from headless Chromium.
fn dump_dom(url: &str) -> (String, String) {
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("chromium is not installed: `apt-get install chromium` (or run .ci/test.sh)");
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=12000",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const HOSTILE_KEY: &str = "free_<script>window.pwned=1</script>";

#[tokio::test]
async fn the_dashboard_draws_charts_and_tables_and_escapes_what_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dash.toml");
    std::fs::write(
        &config,
        r#"
[identity]
trusted_proxies = []

[telemetry]
flush_interval_ms = 100
key_display = "raw"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.01 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 30, refill_per_second = 1 }]
"#,
    )
    .unwrap();
    let server = support::Ratewatch::start("serve", Some(&config), &[]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let res = client
            .get(format!("{base}/api/users"))
            .header("x-api-key", HOSTILE_KEY)
            .send()
            .await
            .expect("server answers");
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    // Wait until the in-process fleet view has the decisions.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats: serde_json::Value = client
            .get(format!("{base}/dashboard/api/stats?range=5m"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if stats["decisions"] == 10 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fleet view never saw 10 decisions: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (dom, log) =
        tokio::task::spawn_blocking(move || dump_dom(&format!("{base}/dashboard?range=5m")))
            .await
            .unwrap();
    assert!(
        !log.contains("Uncaught") && !log.contains("refresh failed"),
        "the page's script failed: {log}"
    );
    assert!(
        dom.contains("Decisions over time"),
        "the page rendered: {dom:.500}"
    );
    let bars = dom.matches("class=\"bar ").count();
    assert!(
        bars >= 2,
        "the charts were drawn by the page's script ({bars} bars)"
    );
    assert!(dom.contains("class=\"bar allowed\"") && dom.contains("class=\"bar blocked\""));
    assert!(
        dom.contains("token bucket 3, +0.01/s"),
        "the tier's limits are listed"
    );
    assert!(dom.contains("0.00 %"), "the fail-open rate is shown");
    // After the script's refreshes too: 7 of the 10 decisions blocked.
    assert!(
        dom.contains(r#"id="headline-block-rate">70.00 %</b>"#),
        "the headline block rate is shown"
    );
    // The hostile key is shown as text, escaped, and nothing it carried ran.
    assert!(
        dom.contains("free_&lt;script&gt;window.pwned=1&lt;/script&gt;"),
        "the top blocked key is listed, escaped"
    );
    assert!(
        !dom.contains("<script>window.pwned"),
        "no markup from a key reached the page"
    );
}

#[tokio::test]
async fn the_dashboard_refuses_remote_peers_and_requires_its_token() {
    let policy = |dashboard: DashboardSettings| {
        Policy::builder()
            .identity(direct())
            .dashboard(dashboard)
            .tier(Tier::new("free").limit(Limit::per_second("burst", 5)))
            .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
            .build()
            .unwrap()
    };
    let get = |app: axum::Router, peer: &str, auth: Option<&str>, uri: &str| {
        let peer: SocketAddr = peer.parse().unwrap();
        let mut req = Request::get(uri.to_owned());
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let app = app.layer(MockConnectInfo(peer));
        async move {
            app.oneshot(req.body(Body::empty()).unwrap())
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };

    let open = server::app(
        Limiter::new(policy(DashboardSettings::default()))
            .await
            .unwrap(),
    );
    assert_eq!(
        get(open.clone(), "127.0.0.1:5000", None, "/dashboard").await,
        200
    );
    // With a trailing slash: the same page, by a permanent redirect.
    assert_eq!(
        get(open.clone(), "127.0.0.1:5000", None, "/dashboard/").await,
        308
    );
    let res = open
        .clone()
        .layer(MockConnectInfo(
            "127.0.0.1:5000".parse::<SocketAddr>().unwrap(),
        ))
        .oneshot(
            Request::get("/dashboard/?range=1h")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.headers()["location"], "/dashboard?range=1h");
    assert_eq!(
        get(open.clone(), "203.0.113.9:5000", None, "/dashboard").await,
        403
    );
    assert_eq!(
        get(open, "203.0.113.9:5000", None, "/dashboard/api/stats").await,
        403
    );

    let locked = server::app(
        Limiter::new(policy(DashboardSettings {
            token: Some("s3cret".into()),
            allow_remote: true,
            ..Default::default()
        }))
        .await
        .unwrap(),
    );
    assert_eq!(
        get(locked.clone(), "203.0.113.9:5000", None, "/dashboard").await,
        401
    );
    assert_eq!(
        get(
            locked.clone(),
            "203.0.113.9:5000",
            Some("Bearer wrong"),
            "/dashboard"
        )
        .await,
        401
    );
    assert_eq!(
        get(
            locked.clone(),
            "203.0.113.9:5000",
            Some("Bearer s3cret"),
            "/dashboard"
        )
        .await,
        200
    );
}

/// Identity settings for a server that no proxy stands in front of.
fn direct() -> IdentitySettings {
    IdentitySettings {
        trusted_proxies: Vec::new(),
        ..Default::default()
    }
}

fn locked_policy(identity: IdentitySettings) -> Policy {
    Policy::builder()
        .identity(identity)
        .dashboard(DashboardSettings {
            token: Some("s3cret".into()),
            ..Default::default()
        })
        .tier(Tier::new("free").limit(Limit::per_second("burst", 5)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap()
}

async fn send(app: &axum::Router, peer: &str, req: http::request::Builder) -> http::Response<Body> {
    let peer: SocketAddr = peer.parse().unwrap();
    app.clone()
        .layer(MockConnectInfo(peer))
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_token_in_the_url_is_traded_once_for_a_session_cookie_and_redirected_away() {
    let limiter = Limiter::new(locked_policy(direct())).await.unwrap();
    let app = axum::Router::new().nest("/ops/dashboard", limiter.dashboard());
    let first = send(
        &app,
        "127.0.0.1:1",
        Request::get("/ops/dashboard/api/policy?range=5m&token=s3cret"),
    )
    .await;
    assert_eq!(first.status(), 303, "a ?token= visit is redirected");
    assert_eq!(
        first.headers()["location"],
        "/ops/dashboard/api/policy?range=5m",
        "the redirect drops the token and keeps the rest"
    );
    let cookie = first.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        !cookie.contains("s3cret"),
        "the cookie never holds the token: {cookie}"
    );
    for part in ["HttpOnly", "SameSite=Strict", "Path=/ops/dashboard"] {
        assert!(cookie.contains(part), "{part} missing: {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP, no proxy: {cookie}");
    let pair = cookie.split(';').next().unwrap().to_owned();
    let id = pair.split_once('=').unwrap().1.to_owned();
    assert!(id.len() >= 32, "a random session id: {id}");

    let again = send(
        &app,
        "127.0.0.1:1",
        Request::get("/ops/dashboard/api/stats").header("cookie", &pair),
    )
    .await;
    assert_eq!(
        again.status(),
        200,
        "the session cookie lets the browser in"
    );

    // Another visit opens another session: ids are not derived from the token.
    let second = send(
        &app,
        "127.0.0.1:1",
        Request::get("/ops/dashboard?token=s3cret"),
    )
    .await;
    let other = second.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert_ne!(other.split(';').next().unwrap(), pair);
    assert_eq!(second.headers()["location"], "/ops/dashboard");

    // The token itself as a cookie, or an invented session, is refused.
    for forged in ["ratewatch_dashboard=s3cret", "ratewatch_dashboard=00ff"] {
        let res = send(
            &app,
            "127.0.0.1:1",
            Request::get("/ops/dashboard/api/stats").header("cookie", forged),
        )
        .await;
        assert_eq!(res.status(), 401, "{forged}");
    }
    // A wrong token in the URL opens nothing.
    let wrong = send(
        &app,
        "127.0.0.1:1",
        Request::get("/ops/dashboard?token=guess"),
    )
    .await;
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());
}

#[tokio::test]
async fn the_session_cookie_is_secure_when_a_trusted_proxy_says_the_client_used_tls() {
    let proxy = IdentitySettings {
        trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
        ..Default::default()
    };
    let mut policy = locked_policy(proxy);
    policy.dashboard.allow_remote = true;
    let app = server::app(Limiter::new(policy).await.unwrap());
    let via_proxy = send(
        &app,
        "10.0.0.7:4000",
        Request::get("/dashboard?token=s3cret")
            .header("x-forwarded-for", "198.51.100.4")
            .header("x-forwarded-proto", "https"),
    )
    .await;
    assert_eq!(via_proxy.status(), 303);
    let cookie = via_proxy.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(cookie.contains("Path=/dashboard"), "{cookie}");
    // Anyone else saying so is not believed.
    let claimed = send(
        &app,
        "203.0.113.9:4000",
        Request::get("/dashboard?token=s3cret").header("x-forwarded-proto", "https"),
    )
    .await;
    let cookie = claimed.headers()["set-cookie"].to_str().unwrap();
    assert!(!cookie.contains("Secure"), "{cookie}");
}

#[tokio::test]
async fn a_trusted_proxy_that_names_no_client_is_not_a_loopback_client() {
    // A proxy on this host is trusted.
    let policy = Policy::builder()
        .identity(ratewatch::policy::IdentitySettings {
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            ..Default::default()
        })
        .tier(Tier::new("free").limit(Limit::per_second("burst", 5)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    assert!(!policy.identity.trusted_proxies.is_empty());
    let app = server::app(Limiter::new(policy).await.unwrap());
    let status = |peer: &'static str, xff: Option<&'static str>| {
        let app = app.clone();
        async move {
            let mut req = Request::get("/dashboard/api/stats");
            if let Some(x) = xff {
                req = req.header("x-forwarded-for", x);
            }
            send(&app, peer, req).await.status().as_u16()
        }
    };
    assert_eq!(
        status("127.0.0.1:9000", None).await,
        403,
        "a local proxy forwarding a remote client without X-Forwarded-For"
    );
    assert_eq!(
        status("[::ffff:127.0.0.1]:9000", None).await,
        403,
        "the same, mapped"
    );
    assert_eq!(status("127.0.0.1:9000", Some("203.0.113.9")).await, 403);
    assert_eq!(status("127.0.0.1:9000", Some("127.0.0.1")).await, 200);
}

#[tokio::test]
async fn the_stats_api_counts_every_decision_on_the_memory_store() {
    let p = Policy::builder()
        .identity(direct())
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 4, 0.01)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let app = server::app(Limiter::new(p).await.unwrap()).layer(MockConnectInfo(
        "127.0.0.1:1".parse::<SocketAddr>().unwrap(),
    ));
    for _ in 0..10 {
        let req = Request::get("/api/users")
            .header("x-api-key", "free_counted")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap();
    }
    let req = Request::get("/dashboard/api/stats?range=5m")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let body: serde_json::Value =
        serde_json::from_slice(&to_bytes(res.into_body(), 1 << 20).await.unwrap()).unwrap();
    assert_eq!(body["totals"]["free"]["allowed"], 4);
    assert_eq!(body["totals"]["free"]["blocked"], 6);
    assert_eq!(body["top_blocked"][0]["blocked"], 6);
    assert_eq!(body["top_blocked"][0]["cause"], "burst");
    assert_eq!(body["hot_keys"][0]["decisions"], 10);
    assert_eq!(body["hot_keys"][0]["tier"], "free");
    assert_eq!(body["hot_keys"][0]["shard"], "memory");
    assert_eq!(body["hot_shard"]["shard"], "memory");
    assert_eq!(body["source"]["kind"], "in_process");
    let shown = body["top_blocked"][0]["identity"].as_str().unwrap();
    assert!(
        shown.contains('…') && !shown.contains("free_counted"),
        "masked: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_page_marks_its_stats_stale_when_they_stop_answering_and_keeps_refreshing_breakers()
 {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let p = Policy::builder()
        .identity(direct())
        .tier(Tier::new("free").limit(Limit::per_second("burst", 5)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let limiter = Limiter::new(p).await.unwrap();
    // The stats endpoint stops answering once the page is served; the
    // breakers endpoint keeps answering and counts its calls.
    let failing = Arc::new(AtomicBool::new(false));
    let breaker_calls = Arc::new(AtomicU64::new(0));
    let (f, b) = (failing.clone(), breaker_calls.clone());
    let app = axum::Router::new()
        .nest("/dashboard", limiter.dashboard())
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let (f, b) = (f.clone(), b.clone());
                async move {
                    let path = req.uri().path().to_owned();
                    if path.ends_with("/api/breakers") {
                        b.fetch_add(1, Ordering::SeqCst);
                    }
                    if path.ends_with("/api/stats") && f.load(Ordering::SeqCst) {
                        return http::StatusCode::BAD_GATEWAY.into_response();
                    }
                    next.run(req).await
                }
            },
        ));
    use axum::response::IntoResponse;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    failing.store(true, Ordering::SeqCst);
    let url = format!("http://{addr}/dashboard?range=5m");
    let (dom, log) = tokio::task::spawn_blocking(move || dump_dom(&url))
        .await
        .unwrap();
    assert!(!log.contains("Uncaught"), "{log}");
    let note = dom.split("id=\"stale\"").nth(1).expect("the stale note");
    let note = &note[..note.find("</span>").unwrap_or(note.len())];
    assert!(
        !note.starts_with(" hidden") && note.contains("stats stale since"),
        "the page says its stats are stale: {note}"
    );
    assert!(!note.contains("breakers stale"), "{note}");
    assert!(
        dom.contains("id=\"over-time\" class=\"wide stale\"")
            || dom.contains("class=\"wide stale\" id=\"over-time\""),
        "the charts are marked stale"
    );
    assert!(
        breaker_calls.load(Ordering::SeqCst) >= 2,
        "the breakers kept refreshing"
    );
}

/// The `name=value` pair of the session cookie a `?token=` visit set.
async fn session_pair(app: &axum::Router, uri: &str) -> String {
    let res = send(app, "127.0.0.1:1", Request::get(uri)).await;
    assert_eq!(res.status(), 303, "{uri}");
    let cookie = res.headers()["set-cookie"].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

#[tokio::test]
async fn rotating_the_token_ends_the_sessions_the_old_token_opened() {
    // A leaked token is rotated by a reload: whoever traded it for a
    // session must lose access with it, not keep it for the session's life.
    let limiter = Limiter::new(locked_policy(direct())).await.unwrap();
    let app = axum::Router::new().nest("/dashboard", limiter.dashboard());
    let old = session_pair(&app, "/dashboard?token=s3cret").await;
    let stats = || Request::get("/dashboard/api/stats");
    assert_eq!(
        send(&app, "127.0.0.1:1", stats().header("cookie", &old))
            .await
            .status(),
        200
    );
    let mut rotated = limiter.policy().as_ref().clone();
    rotated.dashboard.token = Some("n3w-s3cret".into());
    limiter.replace_policy(rotated).unwrap();
    assert_eq!(
        send(&app, "127.0.0.1:1", stats().header("cookie", &old))
            .await
            .status(),
        401,
        "a session of the old token is over"
    );
    let new = session_pair(&app, "/dashboard?token=n3w-s3cret").await;
    assert_eq!(
        send(&app, "127.0.0.1:1", stats().header("cookie", &new))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn a_percent_encoded_token_parameter_is_dropped_from_the_redirect_too() {
    let limiter = Limiter::new(locked_policy(direct())).await.unwrap();
    let app = axum::Router::new().nest("/dashboard", limiter.dashboard());
    for uri in [
        "/dashboard?%74oken=s3cret&range=5m",
        "/dashboard?range=5m&tok%65n=s3cret",
        "/dashboard?range=5m&token=s3%63ret",
    ] {
        let res = send(&app, "127.0.0.1:1", Request::get(uri)).await;
        assert_eq!(res.status(), 303, "{uri}");
        assert_eq!(res.headers()["location"], "/dashboard?range=5m", "{uri}");
    }
}

#[tokio::test]
async fn the_bearer_scheme_is_read_without_case_as_the_limiter_reads_it() {
    let limiter = Limiter::new(locked_policy(direct())).await.unwrap();
    let app = axum::Router::new().nest("/dashboard", limiter.dashboard());
    for (value, status) in [
        ("Bearer s3cret", 200),
        ("bearer s3cret", 200),
        ("BEARER  s3cret", 200),
        ("Basic s3cret", 401),
        ("Bearer s3cre", 401),
        ("Bearers3cret", 401),
    ] {
        let req = Request::get("/dashboard/api/policy").header("authorization", value);
        assert_eq!(
            send(&app, "127.0.0.1:1", req).await.status(),
            status,
            "{value}"
        );
    }
}

#[tokio::test]
async fn the_page_heads_with_the_block_rate_and_the_fail_open_rate_of_its_stats() {
    let p = Policy::builder()
        .identity(direct())
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 4, 0.01)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let app = server::app(Limiter::new(p).await.unwrap()).layer(MockConnectInfo(
        "127.0.0.1:1".parse::<SocketAddr>().unwrap(),
    ));
    // 4 admitted, 6 blocked by the free key's burst, 0 failed open.
    for _ in 0..10 {
        let req = Request::get("/api/users")
            .header("x-api-key", "free_headline")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap();
    }
    let req = Request::get("/dashboard?range=5m")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let page =
        String::from_utf8(to_bytes(res.into_body(), 1 << 22).await.unwrap().to_vec()).unwrap();
    assert!(
        page.contains(r#"id="headline-block-rate">60.00 %</b>"#),
        "block rate 6/10 in the headline"
    );
    assert!(
        page.contains(r#"ok" id="headline-fail-open-rate">0.00 %</b>"#),
        "no fail-open in the headline"
    );
}

/// The `<svg ... data-tier="tier">...</svg>` chart of `tier` in `dom`.
fn tier_chart<'a>(dom: &'a str, tier: &str) -> &'a str {
    let start = dom
        .find(&format!("data-tier=\"{tier}\" viewBox"))
        .or_else(|| dom.find(&format!("data-tier=\"{tier}\"")))
        .unwrap_or_else(|| panic!("chart of {tier}"));
    let rest = &dom[start..];
    &rest[..rest.find("</svg>").unwrap_or(rest.len())]
}

/// Heights of the bars in a chart's markup.
fn bar_heights(svg: &str) -> Vec<f64> {
    svg.split("<rect ")
        .skip(1)
        .filter(|r| r.contains("class=\"bar "))
        .filter_map(|r| r.split("height=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_glance_the_page_shows_trends_keeps_small_tiers_visible_and_explains_the_memory_store()
{
    let p = Policy::builder()
        .identity(direct())
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 30, 0.01)),
        )
        .tier(
            Tier::new("pro")
                .match_prefix("pro_")
                .limit(Limit::token_bucket("burst", 100, 1.0)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let app = server::app(Limiter::new(p).await.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    // A big tier (200 decisions, 170 blocked) and a small one (1).
    for (key, n) in [("free_big_tier", 200), ("pro_small_tier", 1)] {
        for _ in 0..n {
            client
                .get(format!("{base}/api/users"))
                .header("x-api-key", key)
                .send()
                .await
                .unwrap();
        }
    }
    let stats = support::eventually(Duration::from_secs(10), "201 decisions", || async {
        let s = support::get_json(&client, &format!("{base}/dashboard/api/stats?range=5m")).await?;
        (s["decisions"] == 201).then_some(s)
    })
    .await;
    // The previous period was read for the trend (nothing decided in it).
    assert_eq!(stats["previous"]["decisions"], 0, "{}", stats["previous"]);
    assert!((stats["block_rate"].as_f64().unwrap() - 170.0 / 201.0).abs() < 1e-9);

    let url = format!("{base}/dashboard?range=5m");
    let (dom, log) = tokio::task::spawn_blocking(move || dump_dom(&url))
        .await
        .unwrap();
    assert!(!log.contains("Uncaught"), "the page's script failed: {log}");
    assert!(dom.contains(r#"id="headline-block-rate">84.58 %</b>"#));
    assert!(
        dom.contains(r#"id="block-trend">no decisions the previous 5m</span>"#),
        "the trend says why there is none"
    );
    assert!(dom.contains(r#"id="fail-open-trend">no decisions the previous 5m</span>"#));

    // Per-tier scales: the one-request tier fills its own chart.
    let pro = tier_chart(&dom, "pro");
    assert!(pro.contains("data-y-max=\"1\""), "{pro:.300}");
    let plot_height = 120.0 - 8.0 - 22.0;
    let tallest = bar_heights(pro).into_iter().fold(0.0, f64::max);
    assert!(
        tallest > plot_height * 0.9,
        "the small tier's bar is visible: {tallest} of {plot_height}"
    );
    let free = tier_chart(&dom, "free");
    assert!(free.contains("data-y-max=\"200\""), "{free:.300}");
    assert!(
        dom.contains("id=\"shared-scale\""),
        "the shared-scale toggle"
    );

    // The memory store: the Redis panels are hidden, and the page says why.
    for id in ["rtt", "shard-load", "breakers"] {
        let tag = dom
            .split(&format!("<section id=\"{id}\""))
            .nth(1)
            .unwrap_or_else(|| panic!("section {id}"));
        assert!(
            tag[..tag.find('>').unwrap()].contains("hidden"),
            "{id} is hidden on the memory store"
        );
    }
    let note = dom
        .split("<section id=\"memory-store\"")
        .nth(1)
        .expect("memory-store note");
    assert!(!note[..note.find('>').unwrap()].contains("hidden"));
    assert!(note.contains("no round trips, no circuit breakers"));
}
