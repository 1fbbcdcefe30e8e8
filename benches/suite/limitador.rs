//! limitador-server beside ratewatch: the same RLS call, the same load,
//! the same `redis-server`, in the same run.
//!
//! limitador (Kuadrant's rate limiter) is not on crates.io: its server
//! is built from its own repository. The benchmark only runs a binary it
//! is given: `RATEWATCH_LIMITADOR=/path/to/limitador-server`. Without it
//! the row says it was not measured.
//!
//! Both answer one `ShouldRateLimit` of [`crate::rls::grpc_request`] (domain
//! `bench`, one `api_key` entry) with a counter per `api_key` value that
//! never blocks, counted in Redis: ratewatch through the envoyproxy/
//! ratelimit YAML of `rls.rs`, limitador through the limits file below.
//! `h2load` posts the same pre-encoded call at the same concurrency as
//! the ratewatch gRPC rows (4 connections, 16 calls in flight each); one
//! call to each is checked to answer `OK` first.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::rls::{self, Rls};

/// limitador's limits: one counter per `api_key` value of the `bench`
/// namespace (the RLS domain), a billion an hour (never reached).
const LIMITS_YAML: &str = "\
- namespace: bench
  max_value: 1000000000
  seconds: 3600
  conditions: []
  variables:
    - descriptors[0]['api_key']
";

/// The limitador-server binary `RATEWATCH_LIMITADOR` names, if it exists.
pub fn binary() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("RATEWATCH_LIMITADOR")?);
    path.is_file().then_some(path)
}

/// A limitador-server on loopback, counting in Redis; killed on drop.
pub struct Limitador {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Limitador {
    /// Starts `bin` with its RLS and HTTP ports on 127.0.0.1, counting in
    /// the Redis at `redis_url`, and waits until its RLS port accepts.
    pub fn start(bin: &std::path::Path, redis_url: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let limits = dir.path().join("limits.yaml");
        std::fs::write(&limits, LIMITS_YAML).expect("write the limits");
        let port = crate::support::free_port();
        let http_port = crate::support::free_port();
        let child = Command::new(bin)
            .args(["-b", "127.0.0.1", "-p", &port.to_string()])
            .args(["-B", "127.0.0.1", "-P", &http_port.to_string()])
            .arg(&limits)
            .args(["redis", redis_url])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start limitador-server");
        let mut server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("limitador-server exited before listening: {status}");
            }
            assert!(Instant::now() < deadline, "limitador-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn rls(&self) -> Rls {
        Rls {
            port: self.port,
            pid: self.child.id(),
        }
    }
}

impl Drop for Limitador {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One round: limitador under the ratewatch gRPC rows' load, warmed for a
/// second first. Nothing when no binary is given.
pub fn round(o: &crate::Options, redis_url: &str, round: usize, r: &mut crate::Results) {
    let Some(bin) = binary() else {
        if round == 0 {
            eprintln!("bench: RATEWATCH_LIMITADOR unset: limitador's row is left out");
        }
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let request = dir.path().join("request.bin");
    std::fs::write(&request, rls::grpc_request()).expect("write the request");
    let server = Limitador::start(&bin, redis_url);
    rls::check_one_call(server.port, &request);
    rls::h2load_at(server.rls(), &request, 1, 4, 16);
    let run = rls::h2load_at(server.rls(), &request, o.secs, 4, 16);
    eprintln!(
        "bench: round {} limitador grpc redis      {:>9.0} decisions/s {:>6.2} µs CPU/decision mean {:.3} ms ({} errors)",
        round + 1,
        run.rps,
        run.cpu_us,
        run.mean_ms,
        run.errors
    );
    r.limitador.push(run);
}

/// The goal row: ratewatch's RLS on Redis against limitador's.
pub fn goal_rows(w: &mut String, r: &crate::Results) {
    use std::fmt::Write;
    let ours = rls::grpc(r, rls::Store::Redis);
    if r.limitador.is_empty() || ours.is_empty() {
        let _ = writeln!(
            w,
            "| ratewatch RLS on Redis ≥ 3× limitador-server's decisions/s (same call, load and Redis) | not measured: `RATEWATCH_LIMITADOR` unset | — |"
        );
        return;
    }
    let g = crate::report::Ratio::of(
        &ours.iter().map(|x| x.rps).collect::<Vec<_>>(),
        &r.limitador.iter().map(|x| x.rps).collect::<Vec<_>>(),
    );
    let _ = writeln!(
        w,
        "| ratewatch RLS on Redis ≥ 3× limitador-server's decisions/s (same call, load and Redis) | {} | {} |",
        g.show(),
        crate::report::verdict(g.value >= 3.0)
    );
}

/// The table beside the decision-service rows.
pub fn render(w: &mut String, r: &crate::Results) {
    use std::fmt::Write;
    if r.limitador.is_empty() {
        return;
    }
    let ours = rls::grpc(r, rls::Store::Redis);
    let _ = writeln!(
        w,
        "\n### Beside limitador\n\nlimitador-server (Kuadrant's limiter, built from its repository; the benchmark runs the binary `RATEWATCH_LIMITADOR` names) counting in the same `redis-server`, one counter per `api_key` value that never blocks (`benches/suite/limitador.rs`), under the same `h2load -t1 -c4 -m16` and the same pre-encoded `ShouldRateLimit` as ratewatch's gRPC row on Redis above, in the same rounds.\n\n| RLS on Redis | decisions/s | server CPU µs/decision | errors |\n|---|---|---|---|"
    );
    for (name, runs) in [("ratewatch", ours), ("limitador-server", &r.limitador[..])] {
        let _ = writeln!(
            w,
            "| {name} | {:.0} | {:.2} | {} |",
            rls::median(runs.iter().map(|x| x.rps).collect()),
            rls::median(runs.iter().map(|x| x.cpu_us).collect()),
            runs.iter().map(|x| x.errors).sum::<u64>()
        );
    }
}
