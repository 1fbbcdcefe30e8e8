//! The `ratewatch` server: the demo API behind the limiter, `/health`,
//! `/api/ratelimit/status`, `/metrics`, the dashboard, and the decision
//! service's HTTP endpoints (`POST /json`, `POST /v1/decide`); with a gRPC
//! address, Envoy's rate limit service beside them.
//!
//! [`app`] builds the whole router, so tests drive it with `oneshot` and no
//! socket; [`serve`] binds it.

mod client_logs;
mod complete;
mod demo;
mod slow;

use std::net::SocketAddr;

use axum::Router;
use axum::routing::{get, post};

pub use client_logs::{CLIENT_LOG_EVERY, ClientLogGate};
pub use demo::spawn_demo_traffic;
pub use slow::MAX_SLOW_MS;

use crate::Limiter;

/// The server's router: `GET /api/users`, `POST /api/data`,
/// `POST /api/export`, `GET /api/slow?ms=N` (answers after N ms, N at
/// most 10,000; `&stream=true` streams), `POST /api/complete` (a pretend
/// model completion metered in tokens) behind the limiter; `GET /api/ratelimit/status`
/// (reports quota without consuming), `GET /health` (never limited);
/// `POST /json`, `POST /v1/decide` and `POST /v1/settle` (loopback or
/// `[rls] token` only).
pub fn app(limiter: Limiter) -> Router {
    let api = Router::new()
        .route("/api/users", get(demo::users))
        .route("/api/data", post(demo::data))
        .route("/api/export", post(demo::export))
        .route("/api/slow", get(slow::slow))
        .route("/api/complete", post(complete::complete))
        .layer(limiter.layer())
        .layer(limiter.body_costs_layer());
    let router = Router::new()
        .merge(api)
        .route("/api/ratelimit/status", get(limiter.status_handler()))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(limiter.metrics_handler()))
        .merge(crate::service::http::routes(
            crate::service::RateLimitService::new(limiter.clone()),
        ))
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

/// Serves `app(limiter)` on `listen`, and with `grpc` the rate limit
/// service and gRPC health there (h2c), until Ctrl-C or SIGTERM, then lets
/// in-flight requests finish.
pub async fn serve(
    limiter: Limiter,
    listen: SocketAddr,
    grpc: Option<SocketAddr>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let grpc_listener = match grpc {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
        None => None,
    };
    tracing::info!(addr = %listener.local_addr()?, store = limiter.store().kind(), "ratewatch listening");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let grpc_task = grpc_listener.map(|l| {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(%addr, "rate limit service (gRPC) listening");
        }
        let service = crate::service::RateLimitService::new(limiter.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            crate::service::serve(service, l, stopped).await
        })
    });
    let app = app(limiter.clone());
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    })
    .await;
    if let Some(task) = grpc_task {
        match task.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server ended with an error"),
            Err(e) => tracing::warn!(error = %e, "gRPC server task failed"),
            Ok(Ok(())) => {}
        }
    }
    served
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
