//! One listening port: accept connections up to a cap, hand each to its
//! own task, and on stop close the port and wait for the connections.
//!
//! A connection beyond the cap is closed on arrival (the peer sees the
//! connection end before any answer) rather than queued: queued sockets
//! still cost a file descriptor each, and file descriptors are what a
//! flood of half-sent requests exhausts first. Refusals are logged at most
//! once per [`REFUSAL_LOG_EVERY`], with how many there were.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// At most one line about refused connections (or failed accepts) per
/// port this often.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// How long accepting pauses after the operating system refused to accept
/// (out of file descriptors): long enough not to spin, short enough that a
/// freed descriptor is used soon.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// A line logged at most once per interval, counting what it held back.
struct Throttled {
    last: Mutex<Option<(Instant, u64)>>,
}

impl Throttled {
    fn new() -> Self {
        Self {
            last: Mutex::new(None),
        }
    }

    /// `Some(n)` when a line may go now, `n` being the events since the
    /// last line (this one included).
    fn note(&self, now: Instant) -> Option<u64> {
        let mut last = self.last.lock();
        match &mut *last {
            Some((since, n)) if now.duration_since(*since) < REFUSAL_LOG_EVERY => {
                *n += 1;
                None
            }
            Some((since, n)) => {
                let out = *n + 1;
                *since = now;
                *n = 0;
                Some(out)
            }
            None => {
                *last = Some((now, 0));
                Some(1)
            }
        }
    }
}

/// Accepts on `listener` until `stop` turns true, serving each connection
/// with `serve` while fewer than `max` are open; then closes the port and
/// waits for the open connections (each sees `stop` too). Dropping the
/// returned future aborts the connections still open.
pub(super) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    port: &'static str,
    max: usize,
    mut stop: watch::Receiver<bool>,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, watch::Receiver<bool>) -> Fut + Send,
    Fut: Future<Output = ()> + Send + 'static,
{
    let open = Arc::new(Semaphore::new(max));
    let refused = Throttled::new();
    let failed = Throttled::new();
    let mut connections = JoinSet::new();
    let for_connections = stop.clone();
    loop {
        tokio::select! {
            () = stopped(&mut stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => match open.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let _ = stream.set_nodelay(true);
                        let served = serve(stream, remote, for_connections.clone());
                        connections.spawn(async move {
                            served.await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        drop(stream);
                        if let Some(n) = refused.note(Instant::now()) {
                            tracing::warn!(
                                port,
                                limit = max,
                                refused = n,
                                "connection limit reached: closed {n} new connection(s) on arrival \
                                 (at most one such line every {}s)",
                                REFUSAL_LOG_EVERY.as_secs()
                            );
                        }
                    }
                },
                Err(e) => {
                    if let Some(n) = failed.note(Instant::now()) {
                        tracing::warn!(port, error = %e, failures = n, "cannot accept connections");
                    }
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Completes once `stop` is true (or its sender is gone).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counts_the_events_it_held_back() {
        let t = Throttled::new();
        let t0 = Instant::now();
        assert_eq!(t.note(t0), Some(1));
        assert_eq!(t.note(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.note(t0 + Duration::from_secs(2)), None);
        assert_eq!(t.note(t0 + REFUSAL_LOG_EVERY), Some(3));
    }
}
