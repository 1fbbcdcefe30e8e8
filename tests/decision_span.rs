//! One `tracing` span per decision, with the fields an app's traces need to
//! say why a request was refused, from every front end: the layer,
//! `Limiter::check` and the decision service.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::service::{RateLimitService, RlsDescriptor, RlsRequest};
use ratewatch::telemetry::span::DECISION_SPAN;
use ratewatch::{Limiter, Policy};
use tower::ServiceExt;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

type Fields = BTreeMap<String, String>;

/// Keeps every decision span's fields, recorded late ones included.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<(u64, Fields)>>>,
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.to_string());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() != DECISION_SPAN {
            return;
        }
        let mut f = Fields::new();
        attrs.record(&mut Collect(&mut f));
        self.spans.lock().unwrap().push((id.into_u64(), f));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.spans.lock().unwrap();
        if let Some((_, f)) = spans.iter_mut().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Collect(f));
        }
    }
}

impl Capture {
    fn take(&self) -> Vec<Fields> {
        std::mem::take(&mut *self.spans.lock().unwrap())
            .into_iter()
            .map(|(_, f)| f)
            .collect()
    }
}

const POLICY: &str = r#"
[identity]
trusted_proxies = []

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 2, refill_per_second = 0.01 },
  { name = "day", algorithm = "fixed_window", limit = 1000, window = "1d" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 30, refill_per_second = 1 }]

[[routes]]
method = "GET"
path = "/api/users"

[[rls.domains]]
name = "edge"

[[rls.domains.rules]]
descriptor = ["remote_address"]
limits = [{ name = "minute", algorithm = "fixed_window", limit = 1, window = "60s" }]
"#;

fn expect(f: &Fields, want: &[(&str, &str)]) {
    for (k, v) in want {
        assert_eq!(f.get(*k).map(String::as_str), Some(*v), "{k} in {f:?}");
    }
}

#[tokio::test]
async fn every_front_end_makes_one_decision_span_with_tier_route_outcome_limit_path_and_rtt() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));

    // The layer: two allowed, then blocked by `burst`.
    let limiter = Limiter::new(Policy::from_toml_str(POLICY, None).unwrap())
        .await
        .unwrap();
    let app: Router = Router::new()
        .route("/api/users", get(|| async { "ok" }))
        .layer(limiter.layer());
    for _ in 0..3 {
        let req = Request::get("/api/users")
            .header("x-api-key", "free_span_client")
            .extension(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                9,
            ))))
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap();
    }
    let spans = capture.take();
    assert_eq!(spans.len(), 3, "one span per decision: {spans:?}");
    for f in &spans[..2] {
        expect(
            f,
            &[
                ("tier", "free"),
                ("route", "/api/users"),
                ("outcome", "allowed"),
                ("path", "store"),
            ],
        );
    }
    expect(
        &spans[2],
        &[
            ("tier", "free"),
            ("route", "/api/users"),
            ("outcome", "blocked"),
            ("limit", "burst"),
            ("path", "store"),
        ],
    );
    assert!(
        !spans[2].contains_key("store_rtt_us"),
        "the memory store has no round trip"
    );

    // Limiter::check on a Redis store: the round trip is a field.
    let redis = support::RedisServer::start();
    let policy = Policy::from_toml_str(
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\n{POLICY}",
            redis.url()
        ),
        None,
    )
    .unwrap();
    let on_redis = Limiter::new(policy).await.unwrap();
    let caller = Identity::new(IdentityKind::ApiKey, "free_span_checker");
    let d = on_redis.check(&caller, "free", None).await;
    assert!(d.allowed);
    let spans = capture.take();
    assert_eq!(spans.len(), 1, "{spans:?}");
    expect(
        &spans[0],
        &[
            ("tier", "free"),
            ("route", "*"),
            ("outcome", "allowed"),
            ("path", "store"),
        ],
    );
    let rtt: u64 = spans[0]["store_rtt_us"].parse().unwrap();
    assert!(rtt > 0 && rtt < 5_000_000, "store_rtt_us = {rtt}");

    // The decision service: one span per descriptor decision.
    let service = RateLimitService::new(limiter.clone());
    let request = RlsRequest {
        domain: "edge".into(),
        descriptors: vec![RlsDescriptor {
            entries: vec![("remote_address".into(), "10.0.0.1".into())],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    service.decide(&request, "grpc").await.unwrap();
    assert!(service.decide(&request, "grpc").await.unwrap().over_limit);
    let spans = capture.take();
    assert_eq!(spans.len(), 2, "{spans:?}");
    expect(&spans[0], &[("tier", "edge"), ("outcome", "allowed")]);
    expect(
        &spans[1],
        &[
            ("tier", "edge"),
            ("outcome", "blocked"),
            ("limit", "minute"),
            ("path", "store"),
        ],
    );
}
