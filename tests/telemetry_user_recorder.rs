//! An application that installed its own Prometheus recorder before
//! building a limiter (its own test binary: one global recorder per
//! process). The supported way: build the recorder with ratewatch's
//! buckets, install it, hand its handle to ratewatch, then build the
//! limiter; `metrics_handler()` then renders the application's recorder,
//! ratewatch's metrics included, with the round-trip histogram as buckets.

mod support;

use axum::body::{Body, to_bytes};
use http::Request;
use metrics_exporter_prometheus::PrometheusBuilder;
use ratewatch::Limiter;
use ratewatch::policy::{Limit, Policy, StoreKind, StoreSettings, Tier};
use ratewatch::telemetry::metrics;
use tower::ServiceExt;

async fn scrape(limiter: &Limiter) -> (u16, String) {
    let app = axum::Router::new().route("/metrics", axum::routing::get(limiter.metrics_handler()));
    let res = app
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body = to_bytes(res.into_body(), 1 << 22).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_handler_renders_an_application_recorder_installed_first_with_real_buckets() {
    // The application's own recorder, with one metric of its own.
    let recorder = metrics::with_ratewatch_buckets(PrometheusBuilder::new())
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    ::metrics::set_global_recorder(recorder).expect("the application installs first");
    ::metrics::counter!("app_orders_total").increment(3);
    assert!(
        metrics::use_handle(handle.clone()),
        "ratewatch takes the handle"
    );

    let redis = support::RedisServer::start();
    let policy = Policy::builder()
        .store(StoreSettings {
            kind: StoreKind::Redis,
            url: Some(redis.url()),
            ..Default::default()
        })
        .tier(Tier::new("free").limit(Limit::per_second("burst", 100)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 100)))
        .build()
        .unwrap();
    let limiter = Limiter::new(policy).await.unwrap();
    let caller = ratewatch::Identity::new(ratewatch::identity::IdentityKind::ApiKey, "free_app");
    for _ in 0..5 {
        assert!(limiter.check(&caller, "free", None).await.allowed);
    }

    let (status, text) = scrape(&limiter).await;
    assert_eq!(status, 200);
    assert!(
        text.contains("app_orders_total 3"),
        "the application's own metric: {text}"
    );
    assert!(
        text.contains("ratewatch_decisions_total{"),
        "ratewatch's metrics reach the application's recorder: {text}"
    );
    let shard = redis.addr();
    assert!(
        text.contains(&format!(
            "ratewatch_redis_rtt_seconds_bucket{{shard=\"{shard}\",op=\"decide\",le=\"0.0001\"}}"
        )),
        "the round trip is a histogram with ratewatch's buckets: {text}"
    );
    assert!(!metrics::rtt_rendered_as_summary(&text));
    assert!(text.contains(&format!("ratewatch_breaker_state{{shard=\"{shard}\"}} 0")));
    assert!(
        text.contains("# HELP ratewatch_decisions_total"),
        "described"
    );
    assert!(text.contains("ratewatch_build_info{version="));
    // The same text the application would serve from its own handle.
    assert!(handle.render().contains("app_orders_total 3"));
}

#[test]
fn a_recorder_without_ratewatch_buckets_is_recognised_as_a_summary() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    ::metrics::with_local_recorder(&recorder, || {
        ::metrics::histogram!("ratewatch_redis_rtt_seconds", "shard" => "x", "op" => "decide")
            .record(0.001);
    });
    assert!(metrics::rtt_rendered_as_summary(&handle.render()));
    let good = metrics::with_ratewatch_buckets(PrometheusBuilder::new())
        .unwrap()
        .build_recorder();
    let good_handle = good.handle();
    ::metrics::with_local_recorder(&good, || {
        ::metrics::histogram!("ratewatch_redis_rtt_seconds", "shard" => "x", "op" => "decide")
            .record(0.001);
    });
    assert!(!metrics::rtt_rendered_as_summary(&good_handle.render()));
}
