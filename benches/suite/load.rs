//! The load tools: `wrk` against a server, `redis-benchmark` against Redis,
//! and their output parsed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::serve::{API_KEY, Variant};

/// What one wrk run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpRun {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Responses that were not 2xx/3xx, plus socket errors.
    pub errors: u64,
    /// ratewatch decisions answered by the failure policy (Redis variants).
    pub fallbacks: u64,
    /// Requests wrk completed.
    pub requests: u64,
    /// CPU time (user + system) the server process spent per request, µs:
    /// steadier than throughput on a shared machine.
    pub cpu_us: f64,
}

/// A server process of one variant, killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// CPU time the process has used so far (user + system), in µs.
    pub fn cpu_us(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime and
        // stime are the 12th and 13th, in clock ticks (100 per second).
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<f64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        f.get(11)
            .zip(f.get(12))
            .map_or(0.0, |(u, s)| (u + s) * 10_000.0)
    }

    pub fn start(variant: Variant, urls: &[String]) -> Self {
        let port = crate::support::free_port();
        let exe = std::env::current_exe().expect("own path");
        let mut child = Command::new(exe)
            .args(["serve", variant.name(), &port.to_string()])
            .args(urls)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a bench server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{} exited: {status}", variant.name());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not listen",
                variant.name()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }

    /// `GET path` over HTTP/1.0: the body.
    pub fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nx-api-key: {API_KEY}\r\n\r\n"
        )
        .expect("send");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sum of `ratewatch_decisions_total` samples whose outcome is a fallback.
pub fn fallbacks(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("ratewatch_decisions_total{") && l.contains("fallback_"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Runs wrk against `port` for `secs` seconds.
pub fn wrk(port: u16, secs: u64, connections: u32, threads: u32) -> HttpRun {
    wrk_with(port, secs, connections, threads, &[])
}

/// [`wrk`] with `headers` (`name: value`) added to every request.
pub fn wrk_with(
    port: u16,
    secs: u64,
    connections: u32,
    threads: u32,
    headers: &[String],
) -> HttpRun {
    wrk_at(port, "/api/data", secs, connections, threads, headers)
}

/// [`wrk_with`] on `path`.
pub fn wrk_at(
    port: u16,
    path: &str,
    secs: u64,
    connections: u32,
    threads: u32,
    headers: &[String],
) -> HttpRun {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t",
        &threads.to_string(),
        "-c",
        &connections.to_string(),
        "-d",
        &format!("{secs}s"),
        "--latency",
        "-H",
        &format!("x-api-key: {API_KEY}"),
    ]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text)
}

/// Runs wrk posting `body` (JSON) to `path` on `port` for `secs` seconds.
pub fn wrk_post(
    port: u16,
    path: &str,
    body: &str,
    secs: u64,
    connections: u32,
    threads: u32,
) -> HttpRun {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("post.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = [[{body}]]\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
        ),
    )
    .expect("write the wrk script");
    let out = Command::new("wrk")
        .args([
            "-t",
            &threads.to_string(),
            "-c",
            &connections.to_string(),
            "-d",
            &format!("{secs}s"),
            "--latency",
            "-s",
        ])
        .arg(&script)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text)
}

fn duration_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => return None,
    })
}

pub fn parse_wrk(text: &str) -> HttpRun {
    let mut run = HttpRun::default();
    for line in text.lines() {
        let t = line.trim();
        let mut words = t.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Requests/sec:"), Some(n)) => run.rps = n.parse().unwrap_or(0.0),
            (Some(n), Some("requests")) => run.requests = n.parse().unwrap_or(0),
            (Some("50%"), Some(d)) => run.p50_ms = duration_ms(d).unwrap_or(0.0),
            (Some("99%"), Some(d)) => run.p99_ms = duration_ms(d).unwrap_or(0.0),
            (Some("Non-2xx"), _) => {
                run.errors += t
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            }
            (Some("Socket"), _) => {
                // Socket errors: connect 0, read 0, write 0, timeout 0
                run.errors += t
                    .split(',')
                    .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    run
}

/// What one redis-benchmark run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct CeilingRun {
    pub rps: f64,
    /// Redis CPU per call (`INFO commandstats` `usec_per_call` of evalsha).
    pub usec_per_call: f64,
}

/// `redis-benchmark` of `args` (a whole command) at `clients` connections
/// for about `secs` seconds.
pub fn redis_benchmark(port: u16, clients: u32, secs: f64, args: &[String]) -> CeilingRun {
    let run = |n: u64| -> f64 {
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-c", &clients.to_string(), "-n", &n.to_string(), "--csv"])
            .args(args)
            .output()
            .expect("run redis-benchmark");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .last()
            .and_then(|l| l.split("\",\"").nth(1))
            .and_then(|n| n.trim_matches('"').parse().ok())
            .unwrap_or(0.0)
    };
    // A short run sizes the measured one to about `secs` seconds.
    let probe = run(5_000).max(1000.0);
    crate::support::redis_cli(port, &["CONFIG", "RESETSTAT"]);
    let rps = run((probe * secs) as u64);
    CeilingRun {
        rps,
        usec_per_call: evalsha_usec(port),
    }
}

/// `usec_per_call` of EVALSHA on `port` since the last `CONFIG RESETSTAT`.
pub fn evalsha_usec(port: u16) -> f64 {
    crate::support::redis_cli(port, &["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("usec_per_call=").nth(1))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}

/// The arguments of the first `EVALSHA` Redis sees while `trigger` runs,
/// read from `MONITOR`: what ratewatch really sends, byte for byte.
pub fn capture_evalsha(port: u16, trigger: impl FnOnce()) -> Vec<String> {
    let mut monitor = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "MONITOR"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli MONITOR");
    std::thread::sleep(Duration::from_millis(300));
    trigger();
    let mut stdout = monitor.stdout.take().expect("monitor output");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut text = String::new();
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            if let Some(line) = text.lines().find(|l| l.contains("\"EVALSHA\"")) {
                let _ = tx.send(line.to_owned());
                return;
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("ratewatch sent an EVALSHA");
    let _ = monitor.kill();
    let _ = monitor.wait();
    // `ts [db addr] "EVALSHA" "sha" ...`: quoted, with C escapes.
    let start = line.find("\"EVALSHA\"").expect("evalsha");
    unquote_all(&line[start..])
}

fn unquote_all(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some('x') => {
                        let h: String = chars.by_ref().take(2).collect();
                        arg.push(u8::from_str_radix(&h, 16).unwrap_or(b'?') as char);
                    }
                    Some(o) => arg.push(o),
                    None => {}
                },
                o => arg.push(o),
            }
        }
        out.push(arg);
    }
    out
}

/// Sends `n` `GET /api/data` requests over `connections` keep-alive
/// connections, each waiting for its answer: a fixed amount of work, for
/// counting instructions per request under a profiler.
pub fn fixed_requests(port: u16, n: usize, connections: usize) {
    let per = n.div_ceil(connections.max(1));
    let workers: Vec<_> = (0..connections.max(1))
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                s.set_nodelay(true).ok();
                s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let req = format!(
                    "GET /api/data HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {API_KEY}\r\n\r\n"
                );
                let mut buf = Vec::with_capacity(4096);
                for _ in 0..per {
                    s.write_all(req.as_bytes()).expect("send");
                    buf.clear();
                    read_response(&mut s, &mut buf);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a request worker");
    }
}

/// Reads one HTTP/1.1 response with a `content-length` body into `buf`.
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => panic!("the server closed the connection"),
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
}
