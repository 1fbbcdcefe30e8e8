//! One connection, HTTP/1.1 or HTTP/2 (h2c), served with hyper under the
//! bounds of `[server]`.
//!
//! A connection is *busy* while a request is being handled and *idle*
//! otherwise. An idle connection is closed after its idle timeout, and one
//! that has not started its first request after the header read timeout
//! (an HTTP/1 client that sends nothing, an HTTP/2 client that never
//! finishes its preface). Closing is graceful (the request in progress is
//! answered; HTTP/2 sends GOAWAY), and a connection still open
//! [`CLOSE_GRACE`] after being told to close is dropped.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use super::body::Stalling;
use crate::policy::{GRPC_SEND_BUFFER, ServerSettings};

/// How long a connection told to close (idle, or the server stopping) may
/// take to finish the request it is answering before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// How long a connection that never started a request may take to close
/// (an HTTP/2 client stuck in its preface never reads the GOAWAY).
const UNUSED_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Whether a connection is busy, and since when it is idle; `changed`
/// wakes the connection's timer when a request starts or ends.
#[derive(Clone)]
pub(super) struct Activity(Arc<Mutex<State>>, Arc<tokio::sync::Notify>);

struct State {
    busy: usize,
    idle_since: Instant,
    started: bool,
}

/// Marks its connection busy until dropped.
pub(super) struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = (self.0).0.lock();
        s.busy -= 1;
        if s.busy == 0 {
            s.idle_since = Instant::now();
        }
        (self.0).1.notify_one();
    }
}

impl Activity {
    fn new() -> Self {
        Self(
            Arc::new(Mutex::new(State {
                busy: 0,
                idle_since: Instant::now(),
                started: false,
            })),
            Arc::default(),
        )
    }

    /// A request starts; the connection is busy until the guard drops.
    pub(super) fn begin(&self) -> Busy {
        let mut s = self.0.lock();
        s.busy += 1;
        s.started = true;
        self.1.notify_one();
        Busy(self.clone())
    }

    /// How long closing may take: a request in progress is let finish.
    fn close_grace(&self) -> Duration {
        if self.0.lock().started {
            CLOSE_GRACE
        } else {
            UNUSED_CLOSE_GRACE
        }
    }

    /// When the connection is to be closed if nothing happens meanwhile;
    /// `None` while a request is in progress.
    fn close_at(&self, first_request: Duration, idle: Duration) -> Option<Instant> {
        let s = self.0.lock();
        if s.busy > 0 {
            return None;
        }
        let within = if s.started { idle } else { first_request };
        Some(s.idle_since + within)
    }
}

/// Drives `conn` until it ends: closes it gracefully (`shut`) when it has
/// been idle too long or `stop` turns true, and drops it [`CLOSE_GRACE`]
/// after that ([`UNUSED_CLOSE_GRACE`] if it never started a request).
async fn drive<C, E>(
    conn: C,
    shut: impl Fn(Pin<&mut C>),
    activity: &Activity,
    first_request: Duration,
    idle: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Option<E>
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = pin!(conn);
    let mut closing: Option<Instant> = None;
    loop {
        let wake = match closing {
            Some(at) => at + activity.close_grace(),
            None => activity
                .close_at(first_request, idle)
                .unwrap_or_else(|| Instant::now() + idle),
        };
        let close = tokio::select! {
            r = conn.as_mut() => return r.err(),
            _ = tokio::time::sleep_until(wake) => {
                if closing.is_some() {
                    return None;
                }
                activity.close_at(first_request, idle).is_some_and(|at| at <= Instant::now())
            }
            () = activity.1.notified(), if closing.is_none() => false,
            () = super::listener::stopped(stop), if closing.is_none() => true,
        };
        if close {
            shut(conn.as_mut());
            closing = Some(Instant::now());
        }
    }
}

/// Serves `app` on an HTTP/1.1 connection: `ConnectInfo<SocketAddr>` in
/// every request's extensions (as `into_make_service_with_connect_info`
/// gives), the request head within `header_read_timeout` and each part of
/// its body within as long of the last, keep-alive until `idle_timeout`.
pub(super) async fn http1(
    stream: TcpStream,
    remote: SocketAddr,
    app: Router,
    bounds: ServerSettings,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Activity::new();
    let service = {
        let activity = activity.clone();
        let body_within = bounds.header_read_timeout;
        hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(remote));
            let busy = activity.begin();
            let app = app.clone();
            let req = req.map(|b| axum::body::Body::new(Stalling::new(b, body_within)));
            async move {
                let res = app.oneshot(req).await;
                drop(busy);
                res
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    if let Some(e) = drive(
        conn,
        |c| c.graceful_shutdown(),
        &activity,
        bounds.header_read_timeout,
        bounds.idle_timeout,
        &mut stop,
    )
    .await
    {
        tracing::debug!(%remote, error = %e, "HTTP connection ended");
    }
}

/// Serves `service` on an HTTP/2 (h2c) connection, announcing the stream,
/// window, frame and header-list bounds of `bounds` in its SETTINGS.
/// `service` answers each request; `busy` marks the connection busy for
/// as long as it runs.
pub(super) async fn h2<S, F>(
    stream: TcpStream,
    remote: SocketAddr,
    service: S,
    bounds: ServerSettings,
    mut stop: watch::Receiver<bool>,
) where
    S: Fn(http::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<tonic::body::Body>> + Send + 'static,
{
    let activity = Activity::new();
    let svc = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let busy = activity.begin();
            let answer = service(req);
            async move {
                let res = answer.await;
                drop(busy);
                Ok::<_, Infallible>(res)
            }
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(bounds.grpc_max_concurrent_streams)
        .initial_stream_window_size(bounds.grpc_stream_window)
        .initial_connection_window_size(bounds.grpc_connection_window)
        .max_frame_size(bounds.grpc_max_frame_size)
        .max_header_list_size(bounds.grpc_max_header_list_size)
        .max_send_buf_size(GRPC_SEND_BUFFER as usize);
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    if let Some(e) = drive(
        conn,
        |c| c.graceful_shutdown(),
        &activity,
        bounds.header_read_timeout,
        bounds.grpc_idle_timeout,
        &mut stop,
    )
    .await
    {
        tracing::debug!(%remote, error = %e, "gRPC connection ended");
    }
}
