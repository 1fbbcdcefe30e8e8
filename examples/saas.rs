//! An app with state, its own auth layer, and ratewatch fitted around it:
//! the limiter decides on the customer the auth layer verified (its id and
//! plan, read from the request's extensions), never on whatever credential
//! a request carries; refusals are `application/problem+json`, a handler
//! shows the caller's remaining quota, and every block is counted for
//! billing.
//!
//! cargo run --example saas
//! curl -i -H 'authorization: Bearer tok_alice' localhost:3000/api/orders
//!
//! Its tests (`tests/example_saas.rs`) drive [`app`] without a socket, as
//! its users and as an attacker would.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use ratewatch::identity::VerifiedCaller;
use ratewatch::layer::Refusal;
use ratewatch::policy::IdentitySettings;
use ratewatch::{Decision, Identity, Limit, Limiter, Policy, Tier};

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

/// The verified claims are the caller: one quota per customer, in the
/// tier of its plan.
impl VerifiedCaller for Claims {
    fn caller_id(&self) -> &str {
        &self.sub
    }

    fn caller_tier(&self) -> Option<&str> {
        Some(&self.plan)
    }
}

/// The policy, in code: two plans and anonymous callers. A verified
/// customer without a plan gets the smallest one; a plan the policy does
/// not define is refused (403) and counted in
/// `ratewatch_unknown_tier_total`.
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

/// A limiter for [`policy`] deciding on the verified claims: a request
/// without them (no token, or one the auth layer did not accept) is the
/// anonymous caller at its client address, whatever it sends.
pub async fn limiter() -> Limiter {
    Limiter::builder(policy())
        .identity_from_extension::<Claims>()
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
        // Added last, so it runs first: the claims are in the extensions
        // before the limiter (and the quota route) look for them.
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// Verifies the Bearer token and leaves its claims in the extensions. An
/// unknown token is passed on without claims: the limiter then counts the
/// request as anonymous, so inventing tokens buys nothing.
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
    let detail = match refusal {
        Refusal::RateLimited { decision, .. } => {
            format!("your {} plan's limit is used up", decision.tier)
        }
        Refusal::Unavailable { .. } => "try again shortly".to_owned(),
        // Conflicting credentials (400), a token required (401), a plan
        // this service does not define (403): ratewatch's reason.
        Refusal::BadIdentity(e) | Refusal::Unauthorized(e) => e.to_string(),
        _ => "refused".to_owned(),
    };
    let title = refusal.status().canonical_reason().unwrap_or("Error");
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
