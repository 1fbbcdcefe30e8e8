//! Embedding ratewatch in an axum app: load a policy, wrap the router.
//!
//! cargo run --example embed
//! curl -i -H 'x-api-key: free_me' localhost:3000/api/orders
use std::net::SocketAddr;

use axum::{Router, routing::get};
use ratewatch::Limiter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The same policy can be built in code with `ratewatch::Policy::builder()`.
    let limiter = Limiter::from_config_file("ratewatch.toml").await?;
    let app = Router::new()
        .route(
            "/api/orders",
            get(|| async { "orders" }).post(|| async { "created" }),
        )
        .layer(limiter.layer())
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
