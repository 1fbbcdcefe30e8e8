//! Liveness, readiness and the drain on shutdown.
//!
//! `GET /health` is liveness: 200 while the process serves at all.
//! `GET /ready` is readiness: 200 `ready` while the policy is loaded and
//! the server is not draining, else 503. `GET /healthcheck` answers as
//! envoyproxy/ratelimit's does: 200 `OK` when healthy, 500 while draining
//! and, with `[server] healthcheck_store = true`, while the store is down
//! (every shard's circuit breaker open or probing: a look at the breakers,
//! no store call). gRPC health (`grpc.health.v1.Health/Check`) answers
//! NOT_SERVING in the same cases.
//!
//! On SIGTERM (or Ctrl-C) the server drains: readiness fails at once while
//! both ports keep serving for the drain time, so a load balancer or
//! Kubernetes stops sending new work; then the ports close and the
//! requests still running finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::Limiter;
use crate::resilience::BreakerState;

/// Whether the server takes new work. Clones share one state.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    draining: Arc<AtomicBool>,
    /// With `healthcheck_store`: the limiter whose breakers say whether
    /// the store is down.
    store: Option<Limiter>,
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

    /// This readiness, its health also failing while `limiter`'s store is
    /// down (`[server] healthcheck_store`).
    pub(super) fn with_store(mut self, limiter: Limiter) -> Self {
        self.store = Some(limiter);
        self
    }

    /// Why `/healthcheck` and gRPC health fail now, if they do.
    pub(super) fn unhealthy(&self) -> Option<&'static str> {
        if self.is_draining() {
            return Some("draining");
        }
        let limiter = self.store.as_ref()?;
        // No shard known yet (no call made) is no evidence of an outage.
        let states = limiter.breaker_states();
        let down = !states.is_empty() && states.iter().all(|(_, s)| *s != BreakerState::Closed);
        down.then_some("store unreachable")
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
    /// or 500 and why ([`Readiness::unhealthy`]).
    pub(super) fn healthcheck(&self) -> Response {
        match self.unhealthy() {
            Some(why) => (StatusCode::INTERNAL_SERVER_ERROR, why).into_response(),
            None => "OK".into_response(),
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
