//! An application installed its own recorder and did not hand its handle
//! to ratewatch (its own test binary: one global recorder per process).
//! `/metrics` says what to do instead of answering an empty page.

use axum::body::{Body, to_bytes};
use http::Request;
use metrics_exporter_prometheus::PrometheusBuilder;
use ratewatch::Limiter;
use ratewatch::policy::{Limit, Policy, Tier};
use tower::ServiceExt;

#[tokio::test]
async fn without_the_handle_metrics_handler_fails_loudly_and_names_the_fix() {
    PrometheusBuilder::new()
        .install_recorder()
        .expect("the application installs its own recorder first");
    let policy = Policy::builder()
        .tier(Tier::new("free").limit(Limit::per_second("burst", 5)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
        .build()
        .unwrap();
    let limiter = Limiter::new(policy).await.unwrap();
    let app = axum::Router::new().route("/metrics", axum::routing::get(limiter.metrics_handler()));
    let res = app
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 500, "an empty 200 would hide the problem");
    let body = to_bytes(res.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("use_handle") && text.contains("with_ratewatch_buckets"),
        "{text}"
    );
}
