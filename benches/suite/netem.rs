//! An emulated network between the benchmark's servers and Redis: a TCP
//! proxy on loopback that forwards every chunk a fixed one-way delay after
//! it arrived, in each direction.
//!
//! On loopback a Redis round trip costs CPU but no waiting, so a limiter
//! that pays one round trip per limit looks cheap there. Behind this proxy
//! each round trip waits twice the delay, as it would across a real
//! network, while pipelined chunks are not serialised: each chunk is due
//! at its own arrival time plus the delay, so a chunk read while another
//! waits does not wait for it.
//!
//! The delay is kept with OS threads and `std::thread::sleep` rather than
//! tokio timers, whose wheel ticks in whole milliseconds: a 100 µs delay
//! would become one or two milliseconds. A sleeping thread wakes within
//! the kernel's timer slack (50 µs by default), so the round trip really
//! emulated is measured ([`DelayProxy::ping_rtt`]) and reported beside the
//! figures.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A delaying proxy in front of one upstream port; stops accepting when
/// dropped (connections already made end with their peers).
pub struct DelayProxy {
    /// The port clients connect to.
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// A proxy on a free loopback port to `127.0.0.1:upstream`, delaying
    /// each chunk by `delay` each way.
    pub fn start(upstream: u16, delay: Duration) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the delay proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                pipe(client, server, delay);
                pipe(s2, c2, delay);
            }
        });
        Self { port, stop }
    }

    /// The proxy's URL for a Redis client.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The median of `n` sequential `PING` round trips to port `port` (this
    /// proxy's or Redis's own), in µs: the round trip really emulated.
    pub fn ping_rtt(port: u16, n: usize) -> f64 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect for PING");
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut buf = [0u8; 64];
        let mut rtts = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            s.write_all(b"*1\r\n$4\r\nPING\r\n").expect("send PING");
            let mut got = 0;
            while !buf[..got].ends_with(b"\r\n") {
                match s.read(&mut buf[got..]) {
                    Ok(0) | Err(_) => return f64::NAN,
                    Ok(k) => got += k,
                }
            }
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        rtts.sort_by(f64::total_cmp);
        rtts[rtts.len() / 2]
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accepting thread so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Forwards `from` to `to`, each chunk `delay` after it was read: one
/// thread reads and stamps, another writes each chunk when it is due.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        // Dropping `tx` ends the writer once the queued chunks are out.
    });
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
