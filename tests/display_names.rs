//! Display names: an app names its verified callers (a customer id from its
//! auth layer), and the dashboard shows the name beside the masked
//! identity, cleaned and escaped, while the raw id still never appears and
//! the name is never a metric label.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use ratewatch::identity::{MAX_DISPLAY_NAME, Principal};
use ratewatch::{Limiter, Policy};
use serde_json::Value;

/// The raw id of the named caller: what must never be shown.
const SECRET_ID: &str = "sk_live_51HxyzSECRETTOKENVALUE";
/// The id of the caller with a hostile name.
const HOSTILE_ID: &str = "sk_live_99ZZZhostileCALLERtoken";

/// 10 KB of name with markup, a script and line breaks.
fn hostile_name() -> String {
    format!(
        "<script>window.pwned=1</script>\r\n<img src=x onerror=alert(1)>{}\nsecond line",
        "A".repeat(10 * 1024)
    )
}

/// An auth layer: `x-customer: acme` or `x-customer: hostile` is verified.
async fn auth(mut req: Request, next: Next) -> Response {
    let who = req
        .headers()
        .get("x-customer")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match who.as_deref() {
        Some("acme") => {
            req.extensions_mut().insert(
                Principal::new(SECRET_ID)
                    .with_tier("free")
                    .with_display_name("acme-corp (customer 42)"),
            );
        }
        Some("hostile") => {
            req.extensions_mut().insert(
                Principal::new(HOSTILE_ID)
                    .with_tier("free")
                    .with_display_name(hostile_name()),
            );
        }
        _ => {}
    }
    next.run(req).await
}

const POLICY: &str = r#"
[identity]
trusted_proxies = []

[telemetry]
flush_interval_ms = 100

[[tiers]]
name = "free"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.01 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 30, refill_per_second = 1 }]
"#;

fn named<'a>(list: &'a Value, name_start: &str) -> &'a Value {
    list.as_array()
        .and_then(|a| {
            a.iter().find(|k| {
                k["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(name_start))
            })
        })
        .unwrap_or_else(|| panic!("{name_start} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_top_lists_show_display_names_cleaned_and_escaped_never_raw_ids_or_labels() {
    let policy = Policy::from_toml_str(POLICY, None).expect("policy");
    let limiter = Limiter::builder(policy)
        .identity_from_extension::<Principal>()
        .build()
        .await
        .unwrap();
    let app: Router = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(limiter.layer())
        .layer(middleware::from_fn(auth))
        .nest("/dashboard", limiter.dashboard())
        .route("/metrics", get(limiter.metrics_handler()));
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
    for who in ["acme", "hostile"] {
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let res = client
                .get(format!("{base}/api"))
                .header("x-customer", who)
                .send()
                .await
                .unwrap();
            statuses.push(res.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429], "{who}");
    }

    let stats = support::eventually(
        Duration::from_secs(10),
        "the fleet view has both callers",
        || async {
            let s =
                support::get_json(&client, &format!("{base}/dashboard/api/stats?range=5m")).await?;
            (s["decisions"] == 10 && s["top_blocked"].as_array()?.len() == 2).then_some(s)
        },
    )
    .await;
    let acme = named(&stats["top_blocked"], "acme-corp");
    assert_eq!(acme["name"], "acme-corp (customer 42)");
    assert_eq!(acme["blocked"], 2);
    assert!(
        acme["identity"].as_str().unwrap().contains('…'),
        "the identity stays masked: {acme}"
    );
    let hot = named(&stats["hot_keys"], "acme-corp");
    assert_eq!(hot["decisions"], 5);
    // The hostile name: control characters gone, at most 64 characters.
    let hostile = named(&stats["top_blocked"], "<script>");
    let name = hostile["name"].as_str().unwrap();
    assert_eq!(name.chars().count(), MAX_DISPLAY_NAME, "{name}");
    assert!(!name.chars().any(char::is_control), "{name:?}");
    assert!(
        name.starts_with("<script>window.pwned=1</script><img src=x onerror=alert(1)>AAA"),
        "{name}"
    );
    let json = stats.to_string();
    for raw in [SECRET_ID, HOSTILE_ID] {
        assert!(!json.contains(raw), "a raw id in the stats: {json}");
    }

    // The page, rendered in headless Chromium after its script refreshed.
    let url = format!("{base}/dashboard?range=5m");
    let (dom, log) = tokio::task::spawn_blocking(move || support::dump_dom(&url, 4_000))
        .await
        .unwrap();
    assert!(!log.contains("Uncaught"), "the page's script failed: {log}");
    assert!(
        dom.contains("<span class=\"display-name\">acme-corp (customer 42)</span>"),
        "the name beside the masked identity"
    );
    assert!(
        dom.contains(
            "&lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;AAA"
        ),
        "the hostile name is shown as text"
    );
    assert!(
        !dom.contains("<script>window.pwned"),
        "no markup from a name"
    );
    assert!(!dom.contains("<img src=x"), "no markup from a name");
    assert!(
        !dom.contains("second line"),
        "the name was cut at 64 characters"
    );
    for raw in [SECRET_ID, HOSTILE_ID] {
        assert!(!dom.contains(raw), "a raw id on the page");
    }
    // The server-rendered page escapes it too (askama's numeric entities).
    let html = client
        .get(format!("{base}/dashboard?range=5m"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("acme-corp (customer 42)"));
    assert!(!html.contains("<script>window.pwned") && !html.contains("<img src=x"));

    // Never a metric label: names stay out of /metrics.
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ratewatch_decisions_total"),
        "{metrics:.300}"
    );
    for s in ["acme-corp", "pwned", SECRET_ID, HOSTILE_ID] {
        assert!(!metrics.contains(s), "{s} in /metrics");
    }
}

#[test]
fn a_display_name_does_not_change_who_the_caller_is() {
    use ratewatch::identity::{Identity, IdentityKind};
    let plain = Identity::new(IdentityKind::Custom, "customer-42");
    let named = plain.clone().with_display_name("  Acme\n\u{7}Corp  ");
    assert_eq!(named.display_name(), Some("AcmeCorp"));
    assert_eq!(plain, named, "the same caller, the same quota");
    assert_eq!(plain.hash(), named.hash());
    assert_eq!(
        plain.clone().with_display_name("\n\t ").display_name(),
        None
    );
}
