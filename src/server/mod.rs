//! The `ratewatch` server: the demo API behind the limiter, `/health`,
//! `/api/ratelimit/status`, `/metrics`, the dashboard, and the decision
//! service's HTTP endpoints (`POST /json`, `POST /v1/decide`); with a gRPC
//! address, Envoy's rate limit service beside them.
//!
//! [`app`] builds the whole router, so tests drive it with `oneshot` and no
//! socket; [`serve`] binds it.

mod body;
mod client_logs;
mod complete;
mod conn;
mod demo;
mod grpc;
mod listener;
mod readiness;
mod slow;
mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

pub use client_logs::{CLIENT_LOG_EVERY, ClientLogGate};
pub use conn::CLOSE_GRACE;
pub use demo::spawn_demo_traffic;
pub use listener::REFUSAL_LOG_EVERY;
pub use readiness::Readiness;
pub use slow::MAX_SLOW_MS;
pub use tls::{TLS_POLL, check_tls};

use crate::Limiter;

/// The server's router: `GET /api/users`, `POST /api/data`,
/// `POST /api/export`, `GET /api/slow?ms=N` (answers after N ms, N at
/// most 10,000; `&stream=true` streams), `POST /api/complete` (a pretend
/// model completion metered in tokens) behind the limiter; `GET /api/ratelimit/status`
/// (reports quota without consuming), `GET /health` (liveness, never
/// limited), `GET /ready` and `GET /healthcheck` (readiness, see
/// [`Readiness`]); `POST /json`, `POST /v1/decide` and `POST /v1/settle` (loopback or
/// `[rls] token` only).
pub fn app(limiter: Limiter) -> Router {
    app_with(limiter, Readiness::new())
}

/// [`app`], its readiness routes answering from `readiness`.
pub fn app_with(limiter: Limiter, readiness: Readiness) -> Router {
    routes(limiter, readiness, true)
}

/// What a public port serves when admin routes have their own listener
/// (`--admin-listen`): the decision service (`POST /v1/decide`,
/// `POST /json`) and the health routes, nothing else.
pub fn decision_app(limiter: Limiter, readiness: Readiness) -> Router {
    health_routes(readiness).merge(crate::service::http::routes(
        crate::service::RateLimitService::new(limiter),
    ))
}

/// What an admin listener serves (`--admin-listen`): the demo API,
/// `/api/ratelimit/status`, `/metrics`, the dashboard and the health
/// routes.
pub fn admin_app(limiter: Limiter, readiness: Readiness) -> Router {
    routes(limiter, readiness, false)
}

fn health_routes<S: Clone + Send + Sync + 'static>(readiness: Readiness) -> Router<S> {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/ready", {
            let r = readiness.clone();
            get(move || std::future::ready(r.ready()))
        })
        .route("/healthcheck", {
            let r = readiness;
            get(move || std::future::ready(r.healthcheck()))
        })
}

/// Everything but the decision service unless `decision`. The limiter's
/// layer covers the demo API only (not the 404 of an unknown path).
fn routes(limiter: Limiter, readiness: Readiness, decision: bool) -> Router {
    let api = Router::new()
        .route("/api/users", get(demo::users))
        .route("/api/data", post(demo::data))
        .route("/api/export", post(demo::export))
        .route("/api/slow", get(slow::slow))
        .route("/api/complete", post(complete::complete))
        .layer(limiter.layer())
        .layer(limiter.body_costs_layer());
    let mut router = Router::new()
        .merge(api)
        .route("/api/ratelimit/status", get(limiter.status_handler()))
        .merge(health_routes(readiness))
        .route("/metrics", get(limiter.metrics_handler()));
    if decision {
        router = router.merge(crate::service::http::routes(
            crate::service::RateLimitService::new(limiter.clone()),
        ));
    }
    let router = router.with_state(limiter.clone());
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

/// How [`run`] serves.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The HTTP port's address.
    pub listen: SocketAddr,
    /// The gRPC port's address (off when `None`).
    pub grpc: Option<SocketAddr>,
    /// How long both ports keep serving after SIGTERM while readiness
    /// fails, before they close (`--drain-ms`).
    pub drain: Duration,
    /// With an address, the HTTP port serves only the decision service
    /// ([`decision_app`]) and the admin routes ([`admin_app`]) are served
    /// here (`--admin-listen`).
    pub admin: Option<SocketAddr>,
}

/// Serves `app(limiter)` on `listen`, and with `grpc` the rate limit
/// service and gRPC health there (h2c), until Ctrl-C or SIGTERM, then lets
/// in-flight requests finish. As [`run`] without a drain, leaving the
/// limiter running.
pub async fn serve(
    limiter: Limiter,
    listen: SocketAddr,
    grpc: Option<SocketAddr>,
) -> std::io::Result<()> {
    let options = ServeOptions {
        listen,
        grpc,
        drain: Duration::ZERO,
        admin: None,
    };
    let stop = serve_ports(&limiter, &options, Readiness::new()).await?;
    stop.close(&limiter).await;
    Ok(())
}

/// `ratewatch serve`: both ports under the bounds of the policy's
/// `[server]` section until Ctrl-C or SIGTERM; then the drain (readiness
/// fails, the ports keep serving for `options.drain`), then the ports
/// close, the requests still running finish and the limiter shuts down.
/// From the end of the drain, all of that takes at most the store's
/// timeout plus a second, whatever the store does.
pub async fn run(limiter: Limiter, options: ServeOptions) -> std::io::Result<()> {
    let readiness = Readiness::new();
    let stop = serve_ports(&limiter, &options, readiness).await?;
    let deadline = stop.close(&limiter).await;
    if tokio::time::timeout_at(deadline, limiter.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "the limiter did not shut down in time (store unreachable?); exiting anyway"
        );
    }
    Ok(())
}

/// The ports being served, to be closed.
struct Serving {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Serving {
    /// Closes the ports and lets the requests still running finish, as
    /// long as the shutdown's deadline allows (the store's timeout plus a
    /// second from now, minus a margin for the process to exit) while
    /// keeping time for the limiter to give back what it holds; returns
    /// that deadline.
    async fn close(self, limiter: &Limiter) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let budget = limiter.policy().store.timeout;
        let deadline = now + budget + CLOSE_MARGIN;
        // A slot release or a flush is one store call: at most the budget.
        let for_limiter = budget.min(Duration::from_millis(300)) + Duration::from_millis(100);
        let _ = self.stop.send(true);
        let mut tasks = self.tasks;
        let all = futures_util::future::join_all(tasks.iter_mut());
        if tokio::time::timeout_at(deadline - for_limiter, all)
            .await
            .is_err()
        {
            tracing::warn!("requests still running when the ports closed were cut short");
            for t in &tasks {
                t.abort();
            }
        }
        deadline
    }
}

/// From the end of the drain, how long closing may take beyond the store's
/// timeout (a second, minus what exiting the process takes).
const CLOSE_MARGIN: Duration = Duration::from_millis(700);

/// Binds both ports and serves them until a signal and the drain after it;
/// returns with the ports still open, to be closed.
async fn serve_ports(
    limiter: &Limiter,
    options: &ServeOptions,
    readiness: Readiness,
) -> std::io::Result<Serving> {
    let bounds = limiter.policy().server.clone();
    let readiness = if bounds.healthcheck_store {
        readiness.with_store(limiter.clone())
    } else {
        readiness
    };
    let tls = tls::LiveTls::load(&bounds)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    let grpc_listener = match options.grpc {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
        None => None,
    };
    let admin_listener = match options.admin {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
        None => None,
    };
    tracing::info!(
        addr = %listener.local_addr()?,
        store = limiter.store().kind(),
        max_connections = bounds.max_connections,
        header_read_timeout_ms = bounds.header_read_timeout.as_millis() as u64,
        idle_timeout_ms = bounds.idle_timeout.as_millis() as u64,
        tls = tls.is_some(),
        "ratewatch listening"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    if let (Some(t), Some(cert)) = (&tls, &bounds.tls_cert_file) {
        tracing::info!(
            cert = %cert.display(),
            client_certificates = bounds.tls_client_ca_file.is_some(),
            "TLS on the HTTP and gRPC ports (the admin port stays plain text)"
        );
        tasks.push(tokio::spawn(t.clone().follow(stop_rx.clone())));
    }
    if let Some(l) = grpc_listener {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(
                %addr,
                max_connections = bounds.grpc_max_connections,
                max_concurrent_streams = bounds.grpc_max_concurrent_streams,
                request_timeout_ms = bounds.grpc_request_timeout.as_millis() as u64,
                idle_timeout_ms = bounds.grpc_idle_timeout.as_millis() as u64,
                bytes_per_connection = bounds.grpc_connection_bytes(),
                "rate limit service (gRPC) listening"
            );
        }
        let port = grpc::GrpcPort::new(
            crate::service::RateLimitService::new(limiter.clone()),
            readiness.clone(),
            bounds.grpc_request_timeout,
        );
        let b = bounds.clone();
        let t = tls.clone();
        tasks.push(tokio::spawn(listener::accept_loop(
            l,
            "grpc",
            bounds.grpc_max_connections,
            stop_rx.clone(),
            move |stream, remote, stop| {
                let port = port.clone();
                let answer = move |req| port.answer(req);
                conn::grpc(stream, remote, answer, b.clone(), stop, t.clone())
            },
        )));
    }
    let app = match admin_listener {
        Some(l) => {
            if let Ok(addr) = l.local_addr() {
                tracing::info!(%addr, "admin routes (dashboard, /metrics, demo API) listening");
            }
            let admin = admin_app(limiter.clone(), readiness.clone());
            let b = bounds.clone();
            tasks.push(tokio::spawn(listener::accept_loop(
                l,
                "admin",
                bounds.max_connections,
                stop_rx.clone(),
                move |stream, remote, stop| {
                    conn::http(stream, remote, admin.clone(), b.clone(), stop, None)
                },
            )));
            decision_app(limiter.clone(), readiness.clone())
        }
        None => app_with(limiter.clone(), readiness.clone()),
    };
    let b = bounds.clone();
    tasks.push(tokio::spawn(listener::accept_loop(
        listener,
        "http",
        bounds.max_connections,
        stop_rx,
        move |stream, remote, stop| {
            conn::http(stream, remote, app.clone(), b.clone(), stop, tls.clone())
        },
    )));
    readiness::shutdown_signal().await;
    readiness.start_draining();
    if !options.drain.is_zero() {
        tracing::info!(
            drain_ms = options.drain.as_millis() as u64,
            "draining: /ready fails, the ports stay open"
        );
        tokio::select! {
            _ = tokio::time::sleep(options.drain) => {}
            _ = readiness::shutdown_signal() => tracing::info!("second signal: drain cut short"),
        }
    }
    tracing::info!("shutting down: the ports close");
    Ok(Serving {
        stop: stop_tx,
        tasks,
    })
}
