//! One connection, HTTP/1.1 or HTTP/2 (h2c, or over TLS as ALPN chose),
//! served with hyper under the bounds of `[server]`.
//!
//! A connection is *busy* while a request is being handled and *idle*
//! otherwise. An idle connection is closed after its idle timeout, and one
//! that has not started its first request after the header read timeout
//! (an HTTP/1 client that sends nothing, an HTTP/2 client that never
//! finishes its preface). Closing is graceful (the request in progress is
//! answered; HTTP/2 sends GOAWAY), and a connection still open
//! [`CLOSE_GRACE`] after being told to close is dropped. Over TLS the
//! handshake is part of the first request's time: a client that never
//! sends its ClientHello is dropped at the header read timeout.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt;

use super::body::Stalling;
use super::tls::{LiveTls, Port};
use crate::policy::{GRPC_SEND_BUFFER, ServerSettings};

/// How long a connection told to close (idle, or the server stopping) may
/// take to finish the request it is answering before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// How long a connection that never started a request may take to close
/// (an HTTP/2 client stuck in its preface never reads the GOAWAY).
const UNUSED_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Whether a connection is busy, since when it is idle, and since when
/// the bytes of a request not yet started have been arriving. Requests and
/// reads only mark it (no wake-up each): the connection's timer looks when
/// it fires and sets itself again for what is left.
#[derive(Clone)]
pub(super) struct Activity(Arc<Mutex<State>>);

struct State {
    busy: usize,
    idle_since: Instant,
    started: bool,
    /// When the first byte of a request head arrived, until the request
    /// starts (HTTP/1 only).
    head_since: Option<Instant>,
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
    }
}

/// What the timer found.
enum Verdict {
    /// Nothing to do; look again then.
    Wait(Instant),
    /// Idle too long: close gracefully.
    Idle,
    /// A request head took too long: drop the connection.
    SlowHead,
}

impl Activity {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(State {
            busy: 0,
            idle_since: Instant::now(),
            started: false,
            head_since: None,
        })))
    }

    /// A request starts; the connection is busy until the guard drops.
    pub(super) fn begin(&self) -> Busy {
        let mut s = self.0.lock();
        s.busy += 1;
        s.started = true;
        s.head_since = None;
        Busy(self.clone())
    }

    /// Bytes arrived: the start of a request head if none is in progress.
    fn heard(&self) {
        let mut s = self.0.lock();
        if s.busy == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
        }
    }

    /// How long closing may take: a request in progress is let finish.
    fn close_grace(&self) -> Duration {
        if self.0.lock().started {
            CLOSE_GRACE
        } else {
            UNUSED_CLOSE_GRACE
        }
    }

    /// Whether to close now, and if not when to look again. `head` bounds
    /// a request head from its first byte and a connection's first request
    /// from its start; `idle` a connection with nothing in progress.
    fn verdict(&self, head: Duration, idle: Duration) -> Verdict {
        let now = Instant::now();
        let s = self.0.lock();
        if s.busy > 0 {
            // Requests end, and heads start, without waking the timer.
            return Verdict::Wait(now + head.min(idle));
        }
        if let Some(since) = s.head_since {
            return if now >= since + head {
                Verdict::SlowHead
            } else {
                Verdict::Wait(since + head)
            };
        }
        let close = s.idle_since + if s.started { idle } else { head.min(idle) };
        if now >= close {
            Verdict::Idle
        } else {
            // A head may start any time: look at least that often.
            Verdict::Wait(close.min(now + head))
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection's socket, telling its [`Activity`] when bytes arrive.
    struct Heard<I> {
        #[pin]
        io: I,
        activity: Activity,
    }
}

impl<I: AsyncRead> AsyncRead for Heard<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.heard();
        }
        r
    }
}

impl<I: AsyncWrite> AsyncWrite for Heard<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Drives `conn` until it ends: closes it gracefully (`shut`) when it has
/// been idle too long or `stop` turns true, and drops it [`CLOSE_GRACE`]
/// after that ([`UNUSED_CLOSE_GRACE`] if it never started a request); drops
/// it at once when a request head is not whole `head` after its first byte.
async fn drive<C, E>(
    conn: C,
    shut: impl Fn(Pin<&mut C>),
    activity: &Activity,
    head: Duration,
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
            None => match activity.verdict(head, idle) {
                Verdict::Wait(at) => at,
                Verdict::Idle => Instant::now(),
                Verdict::SlowHead => return None,
            },
        };
        let close = tokio::select! {
            r = conn.as_mut() => return r.err(),
            _ = tokio::time::sleep_until(wake) => {
                if closing.is_some() {
                    return None;
                }
                match activity.verdict(head, idle) {
                    Verdict::Wait(_) => false,
                    Verdict::Idle => true,
                    Verdict::SlowHead => return None,
                }
            }
            () = super::listener::stopped(stop), if closing.is_none() => true,
        };
        if close {
            shut(conn.as_mut());
            closing = Some(Instant::now());
        }
    }
}

/// The TLS handshake of a connection on `port`, within the header read
/// timeout from the connection's start; `None` when it failed, took too
/// long or the server stopped meanwhile.
async fn handshake(
    tls: &LiveTls,
    port: Port,
    stream: TcpStream,
    remote: SocketAddr,
    within: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    tokio::select! {
        r = tokio::time::timeout(within, tls.accept(port, stream)) => match r {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                tracing::debug!(%remote, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%remote, "no TLS handshake within the header read timeout");
                None
            }
        },
        () = super::listener::stopped(stop) => None,
    }
}

/// Whether ALPN chose HTTP/2.
fn negotiated_h2(s: &tokio_rustls::server::TlsStream<TcpStream>) -> bool {
    s.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// Serves `app` on a connection of the HTTP port: HTTP/1.1 in plain text;
/// over TLS (with `tls`) HTTP/2 or HTTP/1.1 as ALPN chose.
pub(super) async fn http(
    stream: TcpStream,
    remote: SocketAddr,
    app: Router,
    bounds: ServerSettings,
    mut stop: watch::Receiver<bool>,
    tls: Option<Arc<LiveTls>>,
) {
    let activity = Activity::new();
    let Some(tls) = tls else {
        return http1(stream, remote, app, bounds, stop, activity).await;
    };
    let within = bounds.header_read_timeout;
    let Some(s) = handshake(&tls, Port::Http, stream, remote, within, &mut stop).await else {
        return;
    };
    if negotiated_h2(&s) {
        let idle = bounds.idle_timeout;
        let service = move |req| app_answer(&app, remote, within, req);
        h2(s, remote, service, bounds, idle, stop, activity).await;
    } else {
        http1(s, remote, app, bounds, stop, activity).await;
    }
}

/// Serves the gRPC port's `service` on a connection: h2c in plain text,
/// HTTP/2 over TLS (with `tls`).
pub(super) async fn grpc<S, F>(
    stream: TcpStream,
    remote: SocketAddr,
    service: S,
    bounds: ServerSettings,
    mut stop: watch::Receiver<bool>,
    tls: Option<Arc<LiveTls>>,
) where
    S: Fn(http::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<tonic::body::Body>> + Send + 'static,
{
    let activity = Activity::new();
    let idle = bounds.grpc_idle_timeout;
    match tls {
        None => h2(stream, remote, service, bounds, idle, stop, activity).await,
        Some(tls) => {
            let within = bounds.header_read_timeout;
            if let Some(s) = handshake(&tls, Port::Grpc, stream, remote, within, &mut stop).await {
                h2(s, remote, service, bounds, idle, stop, activity).await;
            }
        }
    }
}

/// `app`'s answer to `req`: `ConnectInfo<SocketAddr>` in its extensions
/// (as `into_make_service_with_connect_info` gives), each part of its body
/// within `body_within` of the last.
fn app_answer(
    app: &Router,
    remote: SocketAddr,
    body_within: Duration,
    mut req: http::Request<Incoming>,
) -> impl Future<Output = http::Response<axum::body::Body>> + Send + use<> {
    req.extensions_mut().insert(ConnectInfo(remote));
    let app = app.clone();
    // A request without a body (most) needs no timer for it.
    let req = if http_body::Body::is_end_stream(req.body()) {
        req.map(axum::body::Body::new)
    } else {
        req.map(|b| axum::body::Body::new(Stalling::new(b, body_within)))
    };
    async move {
        match app.oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        }
    }
}

/// Serves `app` on an HTTP/1.1 connection: the request head within
/// `header_read_timeout` and each part of its body within as long of the
/// last, keep-alive until `idle_timeout`.
async fn http1<I>(
    stream: I,
    remote: SocketAddr,
    app: Router,
    bounds: ServerSettings,
    mut stop: watch::Receiver<bool>,
    activity: Activity,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let activity = activity.clone();
        let body_within = bounds.header_read_timeout;
        hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let busy = activity.begin();
            let answer = app_answer(&app, remote, body_within, req);
            async move {
                let res = answer.await;
                drop(busy);
                Ok::<_, Infallible>(res)
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own header timer also runs while a kept-alive connection
    // waits for its next request, closing it under a client about to reuse
    // it; the head is timed from its first byte here instead.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true);
    let io = Heard {
        io: stream,
        activity: activity.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(io), service);
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

/// Serves `service` on an HTTP/2 connection, announcing the stream,
/// window, frame and header-list bounds of `bounds` in its SETTINGS,
/// closing it after `idle` without a request. `service` answers each
/// request; the connection is busy for as long as it runs.
async fn h2<I, S, F, B>(
    stream: I,
    remote: SocketAddr,
    service: S,
    bounds: ServerSettings,
    idle: Duration,
    mut stop: watch::Receiver<bool>,
    activity: Activity,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Fn(http::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = http::Response<B>> + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
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
        idle,
        &mut stop,
    )
    .await
    {
        tracing::debug!(%remote, error = %e, "gRPC connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(60);

    fn waits_until(v: Verdict) -> Instant {
        match v {
            Verdict::Wait(at) => at,
            Verdict::Idle => panic!("closed as idle"),
            Verdict::SlowHead => panic!("dropped as a slow head"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_connection_lasts_the_idle_timeout_not_the_head_timeout() {
        let a = Activity::new();
        drop(a.begin());
        tokio::time::advance(HEAD + Duration::from_secs(1)).await;
        waits_until(a.verdict(HEAD, IDLE));
        tokio::time::advance(IDLE).await;
        assert!(matches!(a.verdict(HEAD, IDLE), Verdict::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_is_timed_from_its_first_byte() {
        let a = Activity::new();
        drop(a.begin());
        tokio::time::advance(Duration::from_secs(30)).await;
        a.heard();
        let first_byte = Instant::now();
        assert_eq!(waits_until(a.verdict(HEAD, IDLE)), first_byte + HEAD);
        tokio::time::advance(HEAD).await;
        assert!(matches!(a.verdict(HEAD, IDLE), Verdict::SlowHead));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_starts_no_request_is_closed_after_the_head_timeout() {
        let a = Activity::new();
        let opened = Instant::now();
        assert_eq!(waits_until(a.verdict(HEAD, IDLE)), opened + HEAD);
        tokio::time::advance(HEAD).await;
        assert!(matches!(a.verdict(HEAD, IDLE), Verdict::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_is_never_closed_by_its_timers() {
        let a = Activity::new();
        let busy = a.begin();
        a.heard();
        tokio::time::advance(IDLE * 2).await;
        waits_until(a.verdict(HEAD, IDLE));
        drop(busy);
        waits_until(a.verdict(HEAD, IDLE));
    }
}
