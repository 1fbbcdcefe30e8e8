//! Embedding ratewatch in an axum app: load a policy, wrap the router.
//! Run: cargo run --example embed, then curl -i -H 'x-api-key: free_me' localhost:3000/api/orders
use axum::{Router, routing::get, routing::post};
use ratewatch::{Limit, Limiter, Policy, RouteRule, Tier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Or: Limiter::from_config_file("ratewatch.toml").await?
    let policy = Policy::builder()
        .tier(Tier::new("free").match_prefix("free_").limit(Limit::token_bucket("burst", 10, 0.33)))
        .tier(Tier::new("pro").match_prefix("pro_").limit(Limit::token_bucket("burst", 100, 10.0)))
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 2)))
        .route(RouteRule::new("POST", "/api/orders").with_cost(2))
        .build()?;
    let limiter = Limiter::new(policy).await?;
    let app = Router::new()
        .route("/api/orders", post(|| async { "created" }).get(|| async { "orders" }))
        .layer(limiter.layer())
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
