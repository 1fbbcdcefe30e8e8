//! ratewatch on a Redis Cluster: every limit of a request decided in one
//! EVALSHA on the master that owns the caller's slot, a breaker per master,
//! and a failure policy per route.
//!
//! RATEWATCH_REDIS_URL=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 \
//!     cargo run --example cluster
//! curl -i -H 'x-api-key: free_me' localhost:3000/api/orders
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use ratewatch::policy::{FailurePolicy, StoreKind, StoreSettings};
use ratewatch::{Limit, Limiter, Policy, RouteRule, Tier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = StoreSettings {
        kind: StoreKind::RedisCluster,
        // Seed nodes; the slot map is discovered and kept fresh.
        nodes: vec!["redis://127.0.0.1:7000".into()],
        timeout: Duration::from_millis(50),
        ..StoreSettings::default()
    };
    let policy = Policy::builder()
        .store(store)
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 10, 0.33))
                .limit(Limit::per_day("day", 1_000)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_minute("minute", 30)))
        // Exports are expensive: cost 5, and refused while Redis cannot
        // decide rather than let through unchecked.
        .route(
            RouteRule::new("POST", "/api/export")
                .with_cost(5)
                .on_store_failure(FailurePolicy::Closed),
        )
        .build()?
        // RATEWATCH_REDIS_URL, when set, replaces the seed nodes.
        .with_env()?;
    // A cluster that is down at start-up does not stop the app: decisions
    // answer by failure policy until it is reachable.
    let limiter = Limiter::new(policy).await?;
    let app: Router = Router::new()
        .route("/api/orders", get(|| async { "orders" }))
        .route("/api/export", post(|| async { "exported" }))
        .layer(limiter.layer())
        .route("/metrics", get(limiter.metrics_handler()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    limiter.shutdown().await;
    Ok(())
}
