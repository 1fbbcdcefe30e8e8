//! What the edge bounds of `ratewatch serve`'s HTTP port cost: the binary
//! with its default `[server]` bounds (header read timeout 10 s, idle
//! timeout 60 s, at most 4096 connections) against the same router served
//! without any bound, and against the binary with the bounds at their
//! widest.
//!
//! The bounds cannot be switched off in the binary (every connection runs
//! under its timers and counts against the cap), so the "no bounds"
//! baseline is the binary's own router (`ratewatch::server::app_with`,
//! the same policy) served by plain `axum::serve` in the benchmark's
//! process (`serve-app`): no head timeout, no idle timeout, no cap. The
//! widest-bounds row (10-day timeouts, a million connections) is context:
//! it keeps the bounding code and only moves the settings.
//!
//! The load is `wrk` on `GET /health`: never limited, the cheapest route,
//! so a per-connection or per-request cost of the bounds is the largest
//! share of a request it can be.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::load::{self, HttpRun};
use crate::support::{Ratewatch, free_port, policy_file};

/// The policy of every setup: the memory store; `[server]` as given.
fn policy_text(server: &str) -> String {
    format!("[store]\nkind = \"memory\"\n{server}")
}

/// The widest bounds `[server]` accepts for the HTTP port.
const WIDEST: &str = "\n[server]\nheader_read_timeout_ms = 864000000\nidle_timeout_ms = 864000000\nmax_connections = 1000000\n";

/// One setup of the edge rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setup {
    /// `ratewatch serve`, default `[server]`.
    Defaults,
    /// `ratewatch serve`, the bounds at their widest.
    Widest,
    /// The same router under `axum::serve`: no bounds at all.
    Unbounded,
}

impl Setup {
    pub const ALL: [Setup; 3] = [Setup::Defaults, Setup::Widest, Setup::Unbounded];

    pub fn name(self) -> &'static str {
        match self {
            Setup::Defaults => "serve-default-bounds",
            Setup::Widest => "serve-widest-bounds",
            Setup::Unbounded => "router-no-bounds",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Setup::Defaults => "`ratewatch serve`, default `[server]` bounds",
            Setup::Widest => {
                "`ratewatch serve`, bounds at their widest (10-day timeouts, 1M connections)"
            }
            Setup::Unbounded => "the same router under plain `axum::serve` (no bounds)",
        }
    }
}

/// A server of one setup, stopped when dropped.
enum Running {
    Binary(Ratewatch),
    Router(Child, u16),
}

impl Running {
    fn port(&self) -> u16 {
        match self {
            Running::Binary(r) => r.port,
            Running::Router(_, p) => *p,
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Running::Binary(r) => r.pid(),
            Running::Router(c, _) => c.id(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Router(c, _) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start(setup: Setup, file: &std::path::Path) -> Running {
    match setup {
        Setup::Defaults | Setup::Widest => {
            Running::Binary(Ratewatch::start("serve", Some(file), &[]))
        }
        Setup::Unbounded => {
            let port = free_port();
            let exe = std::env::current_exe().expect("own path");
            let mut child = Command::new(exe)
                .arg("serve-app")
                .arg(file)
                .arg(port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start the unbounded router");
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("serve-app exited: {status}");
                }
                assert!(Instant::now() < deadline, "serve-app did not listen");
                std::thread::sleep(Duration::from_millis(20));
            }
            Running::Router(child, port)
        }
    }
}

/// One round: each setup, started fresh, warmed 1 s, then `wrk` for
/// `o.secs` on `/health`; order rotated by round.
pub fn round(o: &crate::Options, round: usize, r: &mut crate::Results) {
    let defaults = policy_file(&policy_text(""));
    let widest = policy_file(&policy_text(WIDEST));
    let mut order = Setup::ALL;
    order.rotate_left(round % Setup::ALL.len());
    for setup in order {
        let file = if setup == Setup::Widest {
            widest.path()
        } else {
            defaults.path()
        };
        let server = start(setup, file);
        let port = server.port();
        load::wrk_at(port, "/health", 1, o.connections, o.wrk_threads, &[]);
        let cpu = crate::rls::cpu_us(server.pid());
        let mut run = load::wrk_at(port, "/health", o.secs, o.connections, o.wrk_threads, &[]);
        run.cpu_us = (crate::rls::cpu_us(server.pid()) - cpu) / run.requests.max(1) as f64;
        eprintln!(
            "bench: round {} edge {:<24} {:>9.0} req/s {:>6.2} µs CPU/req p50 {:.3} ms p99 {:.3} ms{}",
            round + 1,
            setup.name(),
            run.rps,
            run.cpu_us,
            run.p50_ms,
            run.p99_ms,
            if run.errors > 0 {
                format!(" ({} errors)", run.errors)
            } else {
                String::new()
            }
        );
        r.edge.entry(setup).or_default().push(run);
    }
}

/// `serve-app POLICY PORT`: the binary's router for `POLICY` under plain
/// `axum::serve`, until killed.
pub fn serve_app(policy: &str, port: u16) {
    let text = std::fs::read_to_string(policy).expect("read the policy");
    let policy = ratewatch::Policy::from_toml_str(&text, None).expect("a valid policy");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let limiter = ratewatch::Limiter::builder(policy)
            .build()
            .await
            .expect("limiter");
        let app = ratewatch::server::app_with(limiter, ratewatch::server::Readiness::new());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
}

fn runs(r: &crate::Results, s: Setup) -> Vec<HttpRun> {
    r.edge.get(&s).cloned().unwrap_or_default()
}

/// The goal rows: default bounds against no bounds, by throughput and by
/// server CPU per request.
pub fn goal_rows(w: &mut String, r: &crate::Results) {
    use std::fmt::Write;
    let with = runs(r, Setup::Defaults);
    let without = runs(r, Setup::Unbounded);
    if with.is_empty() || without.is_empty() {
        return;
    }
    let g = crate::report::Ratio::of(
        &with.iter().map(|x| x.rps).collect::<Vec<_>>(),
        &without.iter().map(|x| x.rps).collect::<Vec<_>>(),
    );
    let _ = writeln!(
        w,
        "| `ratewatch serve`'s HTTP port with its default `[server]` bounds ≥ 0.98 of the same router without bounds (`GET /health`, wrk) | {} | {} |",
        g.show(),
        crate::report::verdict(g.value >= 0.98)
    );
    let g = crate::report::Ratio::of(
        &without.iter().map(|x| x.cpu_us).collect::<Vec<_>>(),
        &with.iter().map(|x| x.cpu_us).collect::<Vec<_>>(),
    );
    let _ = writeln!(
        w,
        "| the same, by server CPU per request (no-bounds CPU / bounded CPU) | {} | {} |",
        g.show(),
        crate::report::verdict(g.value >= 0.98)
    );
}

/// The edge section of `BENCHMARKS.md`.
pub fn render(w: &mut String, o: &crate::Options, r: &crate::Results) {
    use std::fmt::Write;
    if r.edge.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## The edge bounds of `ratewatch serve`\n\n\
         `wrk -t{} -c{} -d{}s --latency` on `GET /health` (never limited: the cheapest route, so \
         whatever the bounds cost per connection or request is the largest share it can be). \
         The bounds (a 10 s header read timeout, a 60 s idle timeout, at most 4096 connections) \
         cannot be switched off in the binary, so \"no bounds\" is the binary's own router \
         (`ratewatch::server::app_with`, the same policy, memory store) served by plain \
         `axum::serve` in the benchmark's process: no timers, no cap. The widest-bounds row keeps \
         the bounding code and only widens its settings. Each server started fresh per round, \
         warmed 1 s; order rotated by round.\n",
        o.wrk_threads, o.connections, o.secs
    );
    let _ = writeln!(
        w,
        "| setup | of no bounds | req/s | p50 ms | p99 ms | server CPU µs/req | errors |\n|---|---|---|---|---|---|---|"
    );
    let base = crate::report::median(runs(r, Setup::Unbounded).iter().map(|x| x.rps).collect());
    for s in Setup::ALL {
        let rs = runs(r, s);
        if rs.is_empty() {
            continue;
        }
        let m = crate::report::median(rs.iter().map(|x| x.rps).collect());
        let _ = writeln!(
            w,
            "| {} | {:.3} | {m:.0} | {:.3} | {:.3} | {:.2} | {} |",
            s.describe(),
            m / base,
            crate::report::median(rs.iter().map(|x| x.p50_ms).collect()),
            crate::report::median(rs.iter().map(|x| x.p99_ms).collect()),
            crate::report::median(rs.iter().map(|x| x.cpu_us).collect()),
            rs.iter().map(|x| x.errors).sum::<u64>()
        );
    }
}
