//! An app exporting ratewatch's decision spans with its own traces.
//!
//! cargo run --example traces
//!
//! Every decision makes one `ratewatch.decision` span (tier, route,
//! outcome, limit, path, store_rtt_us) inside the request's span. Here
//! tracing-subscriber's `fmt` layer prints them as they close; an app
//! exporting OpenTelemetry adds `tracing_opentelemetry::layer()` to the same
//! registry instead, and the spans reach its collector as children of the
//! request's span (not built here: this example uses only crates ratewatch
//! already depends on).
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::{Router, routing::get};
use http::Request;
use ratewatch::{Limit, Limiter, Policy, Tier};
use tower::ServiceExt;
use tracing::Instrument;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_span_events(FmtSpan::CLOSE)
                .with_target(true),
        )
        .with(tracing_subscriber::EnvFilter::new(
            "ratewatch::decision=info,traces=info",
        ))
        .init();

    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 2, 0.1)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_minute("minute", 10)))
        .build()?;
    let limiter = Limiter::new(policy).await?;
    let app: Router = Router::new()
        .route("/api/orders", get(|| async { "orders" }))
        .layer(limiter.layer());

    for i in 1..=3 {
        let req = Request::get("/api/orders")
            .header("x-api-key", "free_example_customer")
            .extension(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 4000))))
            .body(Body::empty())?;
        // The app's own request span: the decision span is its child.
        let span = tracing::info_span!("request", n = i, path = "/api/orders");
        let res = app.clone().oneshot(req).instrument(span).await?;
        tracing::info!(n = i, status = res.status().as_u16(), "answered");
    }
    Ok(())
}
