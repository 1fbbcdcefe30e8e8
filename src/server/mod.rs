//! The `ratewatch` server: the demo API behind the limiter, `/health`,
//! `/api/ratelimit/status`, `/metrics` and the dashboard.
//!
//! [`app`] builds the whole router, so tests drive it with `oneshot` and no
//! socket; [`serve`] binds it.

mod demo;
mod reload;

use std::net::SocketAddr;

use axum::Router;
use axum::routing::{get, post};

pub use demo::spawn_demo_traffic;
pub use reload::spawn_reloader;

use crate::Limiter;

/// The server's router: `GET /api/users`, `POST /api/data`,
/// `POST /api/export` behind the limiter; `GET /api/ratelimit/status`
/// (reports quota without consuming), `GET /health` (never limited).
pub fn app(limiter: Limiter) -> Router {
    let api = Router::new()
        .route("/api/users", get(demo::users))
        .route("/api/data", post(demo::data))
        .route("/api/export", post(demo::export))
        .layer(limiter.layer());
    let router = Router::new()
        .merge(api)
        .route("/api/ratelimit/status", get(limiter.status_handler()))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(limiter.metrics_handler()))
        .with_state(limiter.clone());
    #[cfg(feature = "dashboard")]
    let router = router
        .nest("/dashboard", limiter.dashboard())
        // A nested router's `/` answers `/dashboard` only; `/dashboard/` is
        // the same page, so it redirects there, keeping the query.
        .route("/dashboard/", get(dashboard_slash));
    router
}

#[cfg(feature = "dashboard")]
async fn dashboard_slash(q: axum::extract::RawQuery) -> axum::response::Redirect {
    let to = match q.0 {
        Some(q) if !q.is_empty() => format!("/dashboard?{q}"),
        _ => "/dashboard".to_owned(),
    };
    axum::response::Redirect::permanent(&to)
}

/// Serves `app(limiter)` on `listen` until Ctrl-C or SIGTERM, then lets
/// in-flight requests finish.
pub async fn serve(limiter: Limiter, listen: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(addr = %listener.local_addr()?, store = limiter.store().kind(), "ratewatch listening");
    let app = app(limiter.clone());
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
