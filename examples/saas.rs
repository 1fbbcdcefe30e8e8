//! An app with state, its own auth layer, and ratewatch fitted around it:
//! the tier comes from the plan the auth layer put into the request's
//! extensions, refusals are `application/problem+json`, a handler shows
//! the caller's remaining quota, and every block is counted for billing.
//!
//! cargo run --example saas
//! curl -i -H 'authorization: Bearer tok_alice' localhost:3000/api/orders
//!
//! Its tests (`tests/example_saas.rs`) drive [`app`] without a socket.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use http::request::Parts;
use ratewatch::layer::Refusal;
use ratewatch::policy::IdentitySettings;
use ratewatch::{Decision, Identity, Limit, Limiter, Policy, Tier, TierResolver};

/// What the auth layer learnt about the caller (in a real app: the claims
/// of a verified JWT).
#[derive(Debug, Clone)]
pub struct Claims {
    /// The customer.
    pub sub: String,
    /// The customer's plan: the ratewatch tier.
    pub plan: String,
}

/// The app's own state.
#[derive(Clone)]
pub struct AppState {
    /// Tokens and whom they belong to (stands in for a JWT verifier).
    pub tokens: Arc<HashMap<String, Claims>>,
    /// Requests refused by a limit, for billing and alerting.
    pub blocked: Arc<AtomicU64>,
}

/// The tier is the plan in the claims; callers without claims fall back
/// to ratewatch's key-prefix rule (the anonymous tier here).
struct PlanResolver;

impl TierResolver for PlanResolver {
    fn resolve(&self, _: &Identity, request: &Parts) -> Option<String> {
        request.extensions.get::<Claims>().map(|c| c.plan.clone())
    }
}

/// The policy, in code: two plans and anonymous callers. A token with no
/// known plan gets the smallest one.
pub fn policy() -> Policy {
    let identity = IdentitySettings {
        default_tier: "starter".into(),
        ..IdentitySettings::default()
    };
    Policy::builder()
        .identity(identity)
        .tier(Tier::new("starter").limit(Limit::token_bucket("burst", 3, 0.1)))
        .tier(Tier::new("business").limit(Limit::token_bucket("burst", 20, 1.0)))
        .tier(Tier::new("anonymous").limit(Limit::per_minute("minute", 2)))
        .build()
        .expect("a valid policy")
}

/// A limiter for [`policy`] whose tiers come from the claims.
pub async fn limiter() -> Limiter {
    Limiter::builder(policy())
        .with_resolver(Arc::new(PlanResolver))
        .build()
        .await
        .expect("the memory store always starts")
}

/// The app: `GET /api/orders` behind the limiter, with the quota status,
/// the dashboard and `/metrics` mounted in the same stateful router.
pub fn app(limiter: &Limiter, state: AppState) -> Router {
    let blocked = state.blocked.clone();
    let limited = limiter.layer().with_refusal(problem_json).on_decision(
        move |d: &Decision, _: &Identity| {
            if !d.allowed {
                blocked.fetch_add(1, Ordering::Relaxed);
            }
        },
    );
    Router::new()
        .route("/api/orders", get(orders))
        .layer(limited)
        .route("/api/quota", get(limiter.status_handler()))
        .route("/metrics", get(limiter.metrics_handler()))
        .nest("/dashboard", limiter.dashboard())
        // Outermost: runs first, so the claims are there for the resolver.
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(claims) = token.and_then(|t| state.tokens.get(t)) {
        req.extensions_mut().insert(claims.clone());
    }
    next.run(req).await
}

/// The handler sees the decision the limiter made for this request.
async fn orders(
    Extension(decision): Extension<Decision>,
    claims: Option<Extension<Claims>>,
) -> Json<serde_json::Value> {
    let top = decision.most_constraining();
    Json(serde_json::json!({
        "customer": claims.map(|c| c.0.sub),
        "plan": &*decision.tier,
        "remaining": top.and_then(|l| l.remaining).map(|r| r.floor() as u64),
        "orders": [],
    }))
}

/// RFC 9457 problem details instead of ratewatch's JSON body; the
/// rate-limit headers and `Retry-After` are still added.
fn problem_json(refusal: &Refusal<'_>) -> Response {
    let (title, detail) = match refusal {
        Refusal::RateLimited { decision, .. } => (
            "Too Many Requests",
            format!("your {} plan's limit is used up", decision.tier),
        ),
        Refusal::Unavailable { .. } => ("Service Unavailable", "try again shortly".to_owned()),
        _ => ("Bad Request", "send a valid API token".to_owned()),
    };
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": refusal.status().as_u16(),
        "detail": detail,
        "retry_after": refusal.retry_after_secs(),
    });
    (
        refusal.status(),
        [(http::header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// Two customers on different plans.
pub fn demo_state() -> AppState {
    let claims = |sub: &str, plan: &str| Claims {
        sub: sub.into(),
        plan: plan.into(),
    };
    let tokens = HashMap::from([
        ("tok_alice".to_owned(), claims("alice", "starter")),
        ("tok_bob".to_owned(), claims("bob", "business")),
    ]);
    AppState {
        tokens: Arc::new(tokens),
        blocked: Arc::default(),
    }
}

#[allow(dead_code)] // the tests include this file without running main
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = limiter().await;
    let app = app(&limiter, demo_state());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
