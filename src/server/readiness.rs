//! Liveness, readiness and the drain on shutdown.
//!
//! `GET /health` is liveness: 200 while the process serves at all.
//! `GET /ready` is readiness: 200 `ready` while the policy is loaded and
//! the server is not draining, else 503. `GET /healthcheck` answers as
//! envoyproxy/ratelimit's does: 200 `OK` when healthy, 500 while draining.
//! gRPC health (`grpc.health.v1.Health/Check`) answers NOT_SERVING while
//! draining.
//!
//! On SIGTERM (or Ctrl-C) the server drains: readiness fails at once while
//! both ports keep serving for the drain time, so a load balancer or
//! Kubernetes stops sending new work; then the ports close and the
//! requests still running finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::{IntoResponse, Response};
use http::StatusCode;

/// Whether the server takes new work. Clones share one state.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    draining: Arc<AtomicBool>,
}

impl Readiness {
    /// A server that is ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on `/ready`, `/healthcheck` and gRPC health fail.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the server is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// `GET /ready`: 200 `ready`, or 503 `draining`.
    pub(super) fn ready(&self) -> Response {
        if self.is_draining() {
            (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
        } else {
            "ready".into_response()
        }
    }

    /// `GET /healthcheck`, as envoyproxy/ratelimit answers it: 200 `OK`,
    /// or 500 while draining.
    pub(super) fn healthcheck(&self) -> Response {
        if self.is_draining() {
            (StatusCode::INTERNAL_SERVER_ERROR, "draining").into_response()
        } else {
            "OK".into_response()
        }
    }
}

/// Waits for Ctrl-C or SIGTERM.
pub(super) async fn shutdown_signal() {
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
}
