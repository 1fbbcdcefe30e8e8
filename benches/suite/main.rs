//! ratewatch's benchmark: one run, rounds interleaved, written to
//! `BENCHMARKS.md` as ratios (absolute figures vary between machines;
//! ratios hold).
//!
//! ```text
//! bench/run.sh                      # installs wrk / redis-tools if missing, builds, runs
//! cargo bench --bench suite -- run [--rounds 2] [--secs 5] [--out BENCHMARKS.md]
//! cargo bench --bench suite -- memory   # only Redis bytes per identity
//! ```
//!
//! - HTTP end to end with `wrk` on loopback, the same handler each time.
//! - In process: `Limiter::check` against governor keyed.
//! - The Redis ceiling: `redis-benchmark` EVALSHA of ratewatch's own decide
//!   call (captured with `MONITOR`, byte for byte) and of a minimal
//!   token-bucket script, at the concurrency of the HTTP run.
//! - One hot key in lease mode (`Limiter::check`, 2 threads) against that
//!   ceiling, with the decide calls it cost (`cargo bench --bench suite --
//!   lease 5` runs it alone).
//! - Three servers sharing one identity in lease mode at 300 decisions/s
//!   each: decisions per script call and admissions per window
//!   (`cargo bench --bench suite -- fleet 5` runs it alone).
//! - Telemetry on against off; Redis bytes per identity per algorithm.
//! - Redis on loopback and, beside it, behind an emulated network round
//!   trip (`netem.rs`, `--net-delay-us`, one way), ratewatch's one round
//!   trip against the naive limiter's three.
//! - The decision service (`rls.rs`): RLS decisions/s and server CPU per
//!   decision over gRPC (`h2load`), memory and Redis, beside the axum
//!   layer's; `wrk` through a real Envoy alone, with a do-nothing RLS
//!   (`nop_rls.rs`) and with ratewatch's RLS (`cargo bench --bench suite
//!   -- rls SECS` runs only these); limitador-server beside it on the
//!   same Redis when `RATEWATCH_LIMITADOR` names its binary
//!   (`limitador.rs`; `-- limitador SECS`).
//! - A three-unit tier (requests, tokens from a header, a concurrency
//!   limit) against one limit, memory and Redis (`-- units SECS`).
//! - `ratewatch serve`'s HTTP port with its default edge bounds against
//!   the same router without them (`edge.rs`; `-- edge SECS`).
#![allow(clippy::print_stdout)]

#[path = "../../tests/support/mod.rs"]
mod support;

mod buildcost;
mod edge;
mod inflight;
mod inproc;
mod lease;
mod limitador;
mod load;
mod memory;
mod netem;
mod nop_rls;
mod report;
mod rls;
mod serve;
mod settle;

use std::collections::HashMap;
use std::time::Instant;

use load::{CeilingRun, HttpRun, Server};
use serve::Variant;

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    pub rounds: usize,
    pub secs: u64,
    pub inproc_secs: f64,
    pub connections: u32,
    pub wrk_threads: u32,
    pub out: String,
    /// One-way delay of the emulated network, µs.
    pub net_delay_us: u64,
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Results {
    pub http: HashMap<&'static str, Vec<HttpRun>>,
    /// Redis CPU per ratewatch decision under HTTP load, per round.
    pub http_usec: HashMap<&'static str, Vec<f64>>,
    pub ceiling_rw: Vec<CeilingRun>,
    pub ceiling_min: Vec<CeilingRun>,
    /// One hot key in lease mode, in process, per round.
    pub lease: Vec<lease::LeaseRun>,
    /// Reserve + settle against a plain decision, per round.
    pub settle: Vec<settle::SettleRun>,
    /// In-flight acquire/release against a plain decision, per round:
    /// memory store, Redis.
    pub inflight: Vec<(inflight::InflightRun, inflight::InflightRun)>,
    pub inproc: HashMap<(inproc::Who, bool, usize), Vec<f64>>,
    pub memory: Vec<memory::Footprint>,
    pub evalsha: Vec<String>,
    /// Median `PING` round trip to Redis directly and through the delay
    /// proxy, µs.
    pub rtt_direct_us: f64,
    pub rtt_net_us: f64,
    /// The decision service over gRPC, per store, per round.
    pub rls_grpc: HashMap<rls::Store, Vec<rls::GrpcRun>>,
    /// The decision service over HTTP (`POST /v1/decide`), per store, per
    /// round.
    pub rls_http: HashMap<rls::Store, Vec<HttpRun>>,
    /// The RLS over gRPC at Envoy's call and shape (two descriptors, four
    /// connections, one call at a time), per store, per round.
    pub rls_grpc_envoy_shape: HashMap<rls::Store, Vec<rls::GrpcRun>>,
    /// limitador-server's RLS on the same Redis, per round (only with
    /// `RATEWATCH_LIMITADOR`).
    pub limitador: Vec<rls::GrpcRun>,
    /// Three servers sharing one leased identity, per limit, per round.
    pub fleet: HashMap<u64, Vec<lease::FleetRun>>,
    /// wrk through Envoy: `alone`, with the do-nothing RLS (`nop`), or
    /// with ratewatch's RLS on `memory` / `redis`, per round.
    pub envoy: HashMap<&'static str, Vec<(HttpRun, rls::EnvoyExtras)>>,
    /// `ratewatch serve`'s HTTP port with and without its edge bounds,
    /// per setup, per round.
    pub edge: HashMap<edge::Setup, Vec<HttpRun>>,
    pub load_before: String,
    pub load_after: String,
    pub elapsed_s: f64,
}

const MINIMAL_LUA: &str = include_str!("minimal_token_bucket.lua");

fn main() {
    // `cargo bench` appends `--bench`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.first().map(String::as_str) {
        Some("serve") => {
            let variant = Variant::from_name(&args[1]).expect("a known variant");
            let port = args[2].parse().expect("a port");
            serve::serve(variant, port, &args[3..]);
        }
        Some("check") => {
            // `check SECS [THREADS] [off|governor]`: only `Limiter::check`
            // on one hot key (fleet view on, or off), or governor's keyed
            // check, for a profiler.
            let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let threads = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
            let who = match args.get(3).map(String::as_str) {
                Some("off") => inproc::Who::RatewatchNoTelemetry,
                Some("governor") => inproc::Who::Governor,
                _ => inproc::Who::Ratewatch,
            };
            let ops = inproc::Contenders::hot().measure(who, false, threads, secs);
            println!("{ops:.0} decisions/s");
        }
        Some("count") => {
            // `count N [off|governor]`: exactly N `Limiter::check`s (or
            // governor's `check_key`s) on one hot key, one thread, for
            // `valgrind --tool=callgrind` (instruction counts repeat where
            // wall-clock on a shared machine does not).
            let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
            let who = match args.get(2).map(String::as_str) {
                Some("off") => inproc::Who::RatewatchNoTelemetry,
                Some("governor") => inproc::Who::Governor,
                _ => inproc::Who::Ratewatch,
            };
            inproc::Contenders::hot().count(who, false, n);
        }
        Some("memory") => {
            // `memory`: only Redis bytes per identity, per algorithm.
            let redis = support::RedisServer::start();
            for f in memory::measure(&redis) {
                println!(
                    "{:<22} {:>6.0} bytes (MEMORY USAGE) {:>6.0} (used_memory growth)",
                    f.algorithm, f.memory_usage, f.used_memory
                );
            }
        }
        Some("lease") => {
            // `lease SECS`: only the leased hot key against a fresh Redis.
            let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let redis = support::RedisServer::start();
            let l = lease::measure(&redis.url(), redis.port, 2, secs);
            println!(
                "{:.0} decisions/s, {} decisions, {} Redis commands",
                l.ops, l.decisions, l.commands
            );
        }
        Some("fleet") => {
            // `fleet SECS [LIMIT...]`: only three servers sharing one leased
            // identity at 300 decisions/s each, against a fresh Redis.
            let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let limits: Vec<u64> = if args.len() > 2 {
                args[2..]
                    .iter()
                    .map(|a| a.parse().expect("a limit"))
                    .collect()
            } else {
                lease::FLEET_LIMITS.to_vec()
            };
            let redis = support::RedisServer::start();
            for limit in limits {
                let f = lease::fleet(&redis.url(), redis.port, limit, secs);
                println!(
                    "limit {}/s: {} decisions, {} admitted, {} script calls ({:.1} decisions per call), {} windows, most admitted in one {}, overshoot {}",
                    f.limit,
                    f.decisions,
                    f.admitted,
                    f.calls,
                    f.per_call(),
                    f.windows,
                    f.max_admitted,
                    f.overshoot
                );
            }
        }
        Some("settle") => {
            // `settle SECS`: only reserve + settle against a plain decision.
            let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let redis = support::RedisServer::start();
            let s = settle::measure(&redis.url(), secs);
            println!(
                "memory: {:.0} plain, {:.0} settled/s ({:.2}); redis: {:.0} plain, {:.0} settled/s ({:.2})",
                s.memory_plain,
                s.memory_settled,
                s.memory_ratio(),
                s.redis_plain,
                s.redis_settled,
                s.redis_ratio()
            );
        }
        Some("inflight") => {
            // `inflight SECS`: only in-flight acquire/release against a
            // plain decision, memory store and a fresh Redis.
            let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
            let redis = support::RedisServer::start();
            for (store, url) in [("memory", None), ("redis", Some(redis.url()))] {
                let r = inflight::measure(url.as_deref(), secs);
                println!(
                    "{store}: plain {:.0}/s, in-flight acquire+release {:.0}/s, ratio {:.3}",
                    r.plain,
                    r.inflight,
                    r.inflight / r.plain
                );
            }
        }
        Some("proxy") => {
            // `proxy UPSTREAM_PORT DELAY_US`: the emulated network alone, for
            // measuring a server behind it by hand.
            let upstream = args[1].parse().expect("an upstream port");
            let delay = args[2].parse().expect("a one-way delay in µs");
            let proxy = netem::DelayProxy::start(upstream, std::time::Duration::from_micros(delay));
            println!("{}", proxy.port);
            loop {
                std::thread::park();
            }
        }
        Some("requests") => {
            // `requests PORT N [CONNECTIONS]`: a fixed number of requests,
            // for counting instructions per request (bench/instructions.sh).
            let port = args[1].parse().expect("a port");
            let n = args[2].parse().expect("a request count");
            let conns = args.get(3).and_then(|c| c.parse().ok()).unwrap_or(8);
            load::fixed_requests(port, n, conns);
        }
        Some("rls") => {
            // `rls SECS`: only the decision-service rows, one round.
            let mut o = parse(&[]);
            o.secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
            let redis = support::RedisServer::start();
            let mut r = Results::default();
            rls::round(&o, &redis.url(), 0, &mut r);
            let mut text = String::new();
            rls::goal_rows(&mut text, &r);
            rls::render(&mut text, &o, &r);
            println!("{text}");
        }
        Some("serve-app") => {
            // `serve-app POLICY PORT`: the binary's router without bounds.
            edge::serve_app(&args[1], args[2].parse().expect("a port"));
        }
        Some("limitador") => {
            // `limitador SECS`: ratewatch's decision-service rows and
            // limitador-server's beside them, one round.
            let mut o = parse(&[]);
            o.secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
            let redis = support::RedisServer::start();
            let mut r = Results::default();
            rls::round(&o, &redis.url(), 0, &mut r);
            limitador::round(&o, &redis.url(), 0, &mut r);
            let mut text = String::new();
            limitador::goal_rows(&mut text, &r);
            limitador::render(&mut text, &r);
            println!("{text}");
        }
        Some("nop-rls") => {
            // `nop-rls PORT`: the do-nothing rate limit service.
            nop_rls::serve(args[1].parse().expect("a port"));
        }
        Some("edge") => {
            // `edge SECS`: only the edge-bounds rows, one round.
            let mut o = parse(&[]);
            o.secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
            let mut r = Results::default();
            edge::round(&o, 0, &mut r);
            let mut text = String::new();
            edge::goal_rows(&mut text, &r);
            edge::render(&mut text, &o, &r);
            println!("{text}");
        }
        Some("units") => {
            // `units SECS`: only the three-unit tier against one limit,
            // memory and a fresh Redis, one round.
            let mut o = parse(&[]);
            o.secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
            let redis = support::RedisServer::start();
            let urls = vec![redis.url()];
            let mut r = Results::default();
            for v in [
                Variant::Memory1,
                Variant::MemoryUnits,
                Variant::Redis1,
                Variant::RedisUnits,
            ] {
                r.http
                    .entry(v.name())
                    .or_default()
                    .push(http_cell(&o, v, &urls));
            }
            let mut text = String::new();
            report::units_goal_rows(&mut text, &r);
            println!("{text}");
        }
        Some("run") | None => run(parse(&args)),
        Some(other) => {
            eprintln!(
                "usage: bench run [--rounds N] [--secs S] [--out FILE] [--net-delay-us US] | bench memory | bench rls SECS | bench limitador SECS | bench edge SECS | bench units SECS | bench fleet SECS [LIMIT...] | bench serve VARIANT PORT [URL...] | bench proxy UPSTREAM_PORT DELAY_US | bench requests PORT N [CONNECTIONS] | bench check SECS [THREADS] [off|governor] | bench count N [off|governor]\nunknown: {other}"
            );
            std::process::exit(2);
        }
    }
}

fn parse(args: &[String]) -> Options {
    let mut o = Options {
        rounds: 2,
        secs: 5,
        inproc_secs: 1.0,
        connections: 32,
        wrk_threads: 2,
        out: "BENCHMARKS.md".into(),
        net_delay_us: 100,
    };
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().expect("a value").clone();
        match a.as_str() {
            "--rounds" => o.rounds = v().parse().expect("rounds"),
            "--secs" => o.secs = v().parse().expect("seconds"),
            "--inproc-secs" => o.inproc_secs = v().parse().expect("seconds"),
            "--connections" => o.connections = v().parse().expect("connections"),
            "--out" => o.out = v(),
            "--net-delay-us" => o.net_delay_us = v().parse().expect("microseconds"),
            other => panic!("unknown option {other}"),
        }
    }
    o
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn run(o: Options) {
    let started = Instant::now();
    let mut r = Results {
        load_before: loadavg(),
        ..Default::default()
    };
    eprintln!("bench: starting Redis and a 3-master Redis Cluster");
    let redis = support::RedisServer::start();
    let cluster = support::RedisCluster::start();
    let redis_urls = vec![redis.url()];
    let cluster_urls = cluster.urls();
    // The same Redis behind an emulated network, for the `-net` variants.
    let proxy =
        netem::DelayProxy::start(redis.port, std::time::Duration::from_micros(o.net_delay_us));
    let net_urls = vec![proxy.url()];
    r.rtt_direct_us = netem::DelayProxy::ping_rtt(redis.port, 200);
    r.rtt_net_us = netem::DelayProxy::ping_rtt(proxy.port, 200);
    eprintln!(
        "bench: Redis round trip {:.0} µs direct, {:.0} µs behind the {} µs delay proxy",
        r.rtt_direct_us, r.rtt_net_us, o.net_delay_us
    );

    // What ratewatch really sends for one decision, and the minimal script.
    r.evalsha = {
        let server = Server::start(Variant::Redis1, &redis_urls);
        load::capture_evalsha(redis.port, || {
            server.get("/api/data");
        })
    };
    let minimal_sha = redis
        .cli(&["SCRIPT", "LOAD", MINIMAL_LUA])
        .trim()
        .to_owned();
    let minimal: Vec<String> = [
        "EVALSHA",
        &minimal_sha,
        "1",
        "bench:minimal:{free_bench_key_0001}",
        "1000000000",
        "1000000000",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();

    for round in 0..o.rounds {
        // Rotate the order so no variant always runs first or last.
        let mut order: Vec<Variant> = Variant::ALL.to_vec();
        let n = order.len();
        order.rotate_left(round * 3 % n);
        for v in order {
            let urls = if v.needs_cluster() {
                &cluster_urls
            } else if v.behind_network() {
                &net_urls
            } else {
                &redis_urls
            };
            let server = Server::start(v, urls);
            let headers = v.wrk_headers();
            load::wrk_with(server.port, 1, o.connections, o.wrk_threads, &headers);
            if v.needs_redis() {
                redis.cli(&["CONFIG", "RESETSTAT"]);
            }
            let cpu = server.cpu_us();
            let mut run =
                load::wrk_with(server.port, o.secs, o.connections, o.wrk_threads, &headers);
            run.cpu_us = (server.cpu_us() - cpu) / run.requests.max(1) as f64;
            if v.needs_redis() && v.is_ratewatch() {
                r.http_usec
                    .entry(v.name())
                    .or_default()
                    .push(load::evalsha_usec(redis.port));
            }
            if v.is_ratewatch() {
                run.fallbacks = load::fallbacks(&server.get("/metrics"));
            }
            eprintln!(
                "bench: round {} {:<26} {:>9.0} req/s {:>6.2} µs CPU/req p50 {:.3} ms p99 {:.3} ms{}",
                round + 1,
                v.name(),
                run.rps,
                run.cpu_us,
                run.p50_ms,
                run.p99_ms,
                if run.errors + run.fallbacks > 0 {
                    format!(" ({} errors, {} fallbacks)", run.errors, run.fallbacks)
                } else {
                    String::new()
                }
            );
            r.http.entry(v.name()).or_default().push(run);
        }
        let ceilings = [(&r.evalsha, true), (&minimal, false)];
        let ceilings = if round % 2 == 0 {
            ceilings
        } else {
            [ceilings[1], ceilings[0]]
        };
        for (args, own) in ceilings {
            let c = load::redis_benchmark(redis.port, o.connections, o.secs as f64, args);
            eprintln!(
                "bench: round {} redis-benchmark {} {:>9.0} calls/s {:.2} µs/call",
                round + 1,
                if own {
                    "ratewatch decide"
                } else {
                    "minimal script  "
                },
                c.rps,
                c.usec_per_call
            );
            if own {
                r.ceiling_rw.push(c)
            } else {
                r.ceiling_min.push(c)
            }
        }
        // Right after the ceiling, on the same Redis.
        let l = lease::measure(&redis.url(), redis.port, 2, o.secs as f64);
        eprintln!(
            "bench: round {} lease, one hot key       {:>9.0} decisions/s {:.0} decisions per Redis command",
            round + 1,
            l.ops,
            l.per_command()
        );
        r.lease.push(l);
        for limit in lease::FLEET_LIMITS {
            let f = lease::fleet(&redis.url(), redis.port, limit, o.secs as f64);
            eprintln!(
                "bench: round {} leases, 3 servers × {:.0}/s, limit {}/s: {:.1} decisions per script call, overshoot {}",
                round + 1,
                lease::FLEET_RATE,
                limit,
                f.per_call(),
                f.overshoot
            );
            r.fleet.entry(limit).or_default().push(f);
        }
        let s = settle::measure(&redis.url(), o.secs as f64 / 2.0);
        eprintln!(
            "bench: round {} settle                  memory {:.2}, Redis {:.2} of a plain decision",
            round + 1,
            s.memory_ratio(),
            s.redis_ratio()
        );
        r.settle.push(s);
        let memory = inflight::measure(None, o.secs as f64);
        let on_redis = inflight::measure(Some(&redis.url()), o.secs as f64);
        eprintln!(
            "bench: round {} in-flight / plain         memory {:.3} redis {:.3}",
            round + 1,
            memory.inflight / memory.plain,
            on_redis.inflight / on_redis.plain
        );
        r.inflight.push((memory, on_redis));
        rls::round(&o, &redis.url(), round, &mut r);
        limitador::round(&o, &redis.url(), round, &mut r);
        edge::round(&o, round, &mut r);
    }

    eprintln!(
        "bench: in process (hashing {} identities)",
        inproc::DISTINCT
    );
    let contenders = inproc::Contenders::new();
    for round in 0..o.rounds.max(2) {
        for who in inproc::Who::ALL {
            for distinct in [false, true] {
                for threads in [1, 2] {
                    let ops = contenders.measure(who, distinct, threads, o.inproc_secs);
                    eprintln!(
                        "bench: round {} {:<45} {} threads {} {:>10.0}/s",
                        round + 1,
                        who.name(),
                        threads,
                        if distinct { "1M keys" } else { "hot key" },
                        ops
                    );
                    r.inproc
                        .entry((who, distinct, threads))
                        .or_default()
                        .push(ops);
                }
            }
        }
    }
    drop(contenders);

    eprintln!("bench: Redis bytes per identity");
    r.memory = memory::measure(&redis);
    r.load_after = loadavg();
    r.elapsed_s = started.elapsed().as_secs_f64();
    let text = report::render(&o, &r);
    std::fs::write(&o.out, text).expect("write the report");
    eprintln!("bench: wrote {} in {:.0} s", o.out, r.elapsed_s);
}

/// One wrk cell of the HTTP section on its own: `v` started fresh, warmed
/// 1 s, measured for `o.secs` (server CPU per request, fallbacks).
fn http_cell(o: &Options, v: Variant, urls: &[String]) -> HttpRun {
    let server = Server::start(v, urls);
    let headers = v.wrk_headers();
    load::wrk_with(server.port, 1, o.connections, o.wrk_threads, &headers);
    let cpu = server.cpu_us();
    let mut run = load::wrk_with(server.port, o.secs, o.connections, o.wrk_threads, &headers);
    run.cpu_us = (server.cpu_us() - cpu) / run.requests.max(1) as f64;
    if v.is_ratewatch() {
        run.fallbacks = load::fallbacks(&server.get("/metrics"));
    }
    eprintln!(
        "bench: {:<26} {:>9.0} req/s {:>6.2} µs CPU/req p50 {:.3} ms p99 {:.3} ms ({} errors, {} fallbacks)",
        v.name(),
        run.rps,
        run.cpu_us,
        run.p50_ms,
        run.p99_ms,
        run.errors,
        run.fallbacks
    );
    run
}
