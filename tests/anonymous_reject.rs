//! `[identity] anonymous = "reject"` with `unmatched_keys = "reject"`
//! asks for no anonymous tier: such a policy passes `check-config` and
//! loads, callers without a key and keys of no tier get 401, and a key of
//! a tier is limited as usual.

mod support;

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::get;
use http::Request;
use ratewatch::Limiter;
use tower::ServiceExt;

fn policy(anonymous: &str, unmatched: &str) -> String {
    format!(
        r#"
[identity]
anonymous = "{anonymous}"
unmatched_keys = "{unmatched}"
default_tier = "free"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 2, refill_per_second = 0.001 }}]
"#
    )
}

async fn status(app: &Router, key: Option<&str>) -> u16 {
    let mut req = Request::get("/work");
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    app.clone()
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))))
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_policy_rejecting_anonymous_callers_and_unmatched_keys_needs_no_anonymous_tier() {
    let file = support::policy_file(&policy("reject", "reject"));
    let (code, out) = support::check_config(file.path());
    assert_eq!(code, 0, "{out}");

    let limiter = Limiter::builder_from_file(file.path())
        .await
        .unwrap()
        .build()
        .await
        .expect("it loads");
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(limiter.layer());
    assert_eq!(status(&app, None).await, 401, "no key: refused");
    assert_eq!(
        status(&app, Some("pro_unknown")).await,
        401,
        "a key of no tier: refused"
    );
    assert_eq!(status(&app, Some("free_alice")).await, 200);
    assert_eq!(status(&app, Some("free_alice")).await, 200);
    assert_eq!(
        status(&app, Some("free_alice")).await,
        429,
        "a tier's key is limited"
    );
}

#[test]
fn the_anonymous_tier_is_still_required_wherever_a_caller_could_land_in_it() {
    for (anonymous, unmatched) in [
        ("ip", "reject"),
        ("reject", "anonymous"),
        ("ip", "default_tier"),
    ] {
        let file = support::policy_file(&policy(anonymous, unmatched));
        let (code, out) = support::check_config(file.path());
        assert_ne!(code, 0, "{anonymous}/{unmatched}: {out}");
        assert!(
            out.contains("identity.anonymous_tier"),
            "{anonymous}/{unmatched}: {out}"
        );
    }
}
