//! `ratewatch serve` holds at the edge: the HTTP port bounds half-sent
//! requests, idle connections and open connections; the gRPC port bounds
//! HTTP/2 streams, their time, idle connections and connections. Real
//! binary, real sockets, raw clients that never finish what they start.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Ratewatch, free_port, policy_file};

/// A `ratewatch serve` started through `sh` with its soft open-file limit
/// at 1024 (the usual default of a login or a service), its log kept.
struct Limited {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl Limited {
    fn start(config: Option<&Path>) -> Self {
        let port = free_port();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("ulimit -Sn 1024 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_ratewatch"))
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")]);
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        cmd.env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log.reopen().expect("reopen log")));
        let child = cmd.spawn().expect("start ratewatch");
        wait_listening(port);
        Self { child, port, log }
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "ratewatch did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks that this test process may open `n` files (its clients need
/// descriptors too; a child shell inherits its limit).
fn needs_open_files(n: u64) {
    let out = Command::new("sh")
        .args(["-c", "ulimit -Sn"])
        .output()
        .expect("ulimit");
    let soft = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let ok = soft == "unlimited" || soft.parse::<u64>().is_ok_and(|s| s >= n);
    assert!(ok, "this test needs {n} open files; `ulimit -Sn` is {soft}");
}

/// Opens a connection and sends a request head without its final blank
/// line: the server waits for the rest.
fn half_sent(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .expect("send half a head");
    s
}

/// `GET /health` on a new connection: its status line, or why none came
/// within `within`.
fn health(port: u16, within: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(within))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {e}"))?;
    out.lines()
        .next()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| "closed without an answer".to_owned())
}

/// Waits until the server closes `s`, reading and discarding what it
/// sends; how long that took, or `None` if it was still open at `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.checked_sub(start.elapsed())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            // Reset by the server: closed too.
            Err(_) => return Some(start.elapsed()),
        }
    }
}

#[test]
fn health_answers_promptly_while_a_thousand_half_sent_requests_are_open() {
    needs_open_files(1_200);
    let server = Limited::start(None);
    let mut open = Vec::new();
    for _ in 0..1_100 {
        match TcpStream::connect(("127.0.0.1", server.port)) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
                open.push(s);
            }
            Err(e) => panic!("connection {} refused: {e}", open.len()),
        }
    }
    let started = Instant::now();
    let answer = health(server.port, Duration::from_secs(5));
    assert_eq!(
        answer.as_deref(),
        Ok("HTTP/1.1 200 OK"),
        "with {} half-sent requests open, /health did not answer within 5 s (took {:?}); log: {}",
        open.len(),
        started.elapsed(),
        std::fs::read_to_string(server.log.path()).unwrap_or_default()
    );
    drop(open);
}

#[test]
fn a_half_sent_request_is_closed_after_the_header_read_timeout() {
    let policy = policy_file("[server]\nheader_read_timeout_ms = 500\n");
    let server = Ratewatch::start_logged("serve", Some(policy.path()), &[], &[]);
    let mut s = half_sent(server.port);
    let took = closed_within(&mut s, Duration::from_secs(15))
        .expect("a request head half sent 15 s ago is still waited for");
    assert!(
        took >= Duration::from_millis(400),
        "closed before the header read timeout: {took:?}"
    );
    // A silent connection (not one byte) is held no longer.
    let mut silent = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    closed_within(&mut silent, Duration::from_secs(15))
        .expect("a connection that sent nothing for 15 s is still open");
    assert_eq!(
        health(server.port, Duration::from_secs(10)).as_deref(),
        Ok("HTTP/1.1 200 OK")
    );
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let policy = policy_file("[server]\nidle_timeout_ms = 500\n");
    let server = Ratewatch::start_logged("serve", Some(policy.path()), &[], &[]);
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("send");
    let mut head = [0u8; 15];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut head).expect("an answer");
    assert_eq!(&head, b"HTTP/1.1 200 OK");
    // Well before the header read timeout (10 s) would close it.
    let took = closed_within(&mut s, Duration::from_secs(5))
        .expect("a keep-alive connection idle for 5 s is still open");
    assert!(
        took >= Duration::from_millis(300),
        "closed too soon: {took:?}"
    );
}

#[test]
fn connections_beyond_the_cap_are_closed_on_arrival_and_logged() {
    let policy = policy_file("[server]\nmax_connections = 5\nheader_read_timeout_ms = 60000\n");
    let server = Ratewatch::start_logged("serve", Some(policy.path()), &[], &[]);
    // Eight half-sent requests: at most five are held, whatever the order
    // in which the server sees them (and the probe that found it listening).
    let outcomes: Vec<Option<Duration>> = (0..8)
        .map(|_| half_sent(server.port))
        .map(|mut s| std::thread::spawn(move || closed_within(&mut s, Duration::from_secs(5))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let held = outcomes.iter().filter(|o| o.is_none()).count();
    assert!(
        held <= 5,
        "{held} connections held with max_connections = 5"
    );
    assert!(held >= 4, "only {held} connections held: {outcomes:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("connection limit reached") {
        assert!(Instant::now() < deadline, "no log line: {}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Slots free up as the held connections close (the threads dropped them).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match health(server.port, Duration::from_secs(5)) {
            Ok(line) if line == "HTTP/1.1 200 OK" => break,
            other => assert!(Instant::now() < deadline, "no slot came free: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_server_bound_out_of_range_is_refused_with_file_line_and_field() {
    let policy = policy_file("[server]\n\nmax_connections = 0\n");
    let (code, out) = support::check_config(policy.path());
    assert_eq!(code, 2, "{out}");
    let file = policy.path().display().to_string();
    assert!(
        out.contains(&format!("{file}:3:")) && out.contains("server.max_connections"),
        "{out}"
    );
    let policy = policy_file("[server]\ngrpc_max_frame_size = 100\n");
    let (code, out) = support::check_config(policy.path());
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("server.grpc_max_frame_size") && out.contains("16384"),
        "{out}"
    );
    let policy = policy_file("[server]\nheader_read_timeout = 5\n");
    let (code, out) = support::check_config(policy.path());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("header_read_timeout_ms"), "{out}");
}

// ---------------------------------------------------------------------------
// The gRPC port, with a raw HTTP/2 client.
// ---------------------------------------------------------------------------

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `ratewatch serve --grpc-listen` with `server` as its `[server]` section.
fn grpc_server(server: &str) -> (tempfile::NamedTempFile, support::envoy::RlsServer) {
    let policy = policy_file(&format!("[server]\n{server}\n"));
    let rls = support::envoy::RlsServer::start(policy.path());
    (policy, rls)
}

/// An HTTP/2 connection whose SETTINGS from the server are in.
async fn h2_connect(
    port: u16,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
    usize,
) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the gRPC port");
    let (client, mut conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let mut ping = conn.ping_pong().expect("ping");
    // The server's SETTINGS come before its answer to a PING.
    tokio::select! {
        r = &mut conn => panic!("the connection ended during the handshake: {r:?}"),
        r = ping.ping(h2::Ping::opaque()) => {
            r.expect("pong");
        }
    }
    let max_streams = conn.max_concurrent_send_streams();
    (client, tokio::spawn(conn), max_streams)
}

/// An HTTP/2 connection, tried again while the server refuses it (the
/// probe that found the port listening may still hold a slot an instant).
async fn h2_connect_held(
    port: u16,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to the gRPC port");
        if let Ok((client, mut conn)) = h2::client::handshake(tcp).await {
            // The server's answer to a PING proves it kept the connection.
            let mut ping = conn.ping_pong().expect("ping");
            let ponged = tokio::select! {
                _ = &mut conn => false,
                r = ping.ping(h2::Ping::opaque()) => r.is_ok(),
            };
            if ponged {
                return (client, tokio::spawn(conn));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no HTTP/2 connection came through"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a ShouldRateLimit stream announcing a 100-byte message and
/// sending 10 bytes of it, never finishing.
async fn unfinished_stream(
    client: h2::client::SendRequest<bytes::Bytes>,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    h2::client::ResponseFuture,
    h2::SendStream<bytes::Bytes>,
) {
    let mut client = client.ready().await.expect("a stream slot");
    let req = http::Request::post(SHOULD_RATE_LIMIT)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut body) = client.send_request(req, false).expect("open a stream");
    let mut frame = vec![0u8, 0, 0, 0, 100];
    frame.extend_from_slice(&[0x0a; 10]);
    body.send_data(frame.into(), false)
        .expect("send part of a message");
    (client, answer, body)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_announces_a_stream_bound_and_frees_streams_never_finished() {
    let (_policy, rls) = grpc_server("grpc_request_timeout_ms = 1000");
    let before = rss_kib(rls.pid());
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut bodies = Vec::new();
    let mut drivers = Vec::new();
    for _ in 0..2 {
        let (mut client, driver, max_streams) = h2_connect(rls.grpc_port).await;
        assert_eq!(
            max_streams, 100,
            "the server's SETTINGS_MAX_CONCURRENT_STREAMS"
        );
        drivers.push(driver);
        // Three times what the server lets run at once on this connection:
        // the client waits for slots, which only the request timeout frees.
        for _ in 0..300 {
            let (c, answer, body) = unfinished_stream(client).await;
            client = c;
            answers.push(answer);
            bodies.push(body);
        }
    }
    let mut deadline_exceeded = 0;
    for answer in answers {
        let res = tokio::time::timeout(Duration::from_secs(30), answer)
            .await
            .expect("an unfinished stream was never answered")
            .expect("an answer");
        if res.headers().get("grpc-status").map(|v| v.as_bytes()) == Some(b"4") {
            deadline_exceeded += 1;
        }
    }
    assert_eq!(
        deadline_exceeded, 600,
        "every unfinished stream ends DEADLINE_EXCEEDED"
    );
    // Three rounds of the 1 s timeout on each connection, with room for a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(40));
    let after = rss_kib(rls.pid());
    assert!(
        after < before + 64 * 1024,
        "600 unfinished streams grew the server from {before} KiB to {after} KiB"
    );
    drop(bodies);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_silent_grpc_connections_are_closed() {
    let (_policy, rls) = grpc_server("grpc_idle_timeout_ms = 500\nheader_read_timeout_ms = 500");
    // An HTTP/2 connection with no stream is sent away (GOAWAY, then closed).
    let (_client, driver, _) = h2_connect(rls.grpc_port).await;
    tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("an idle gRPC connection was still open after 10 s")
        .expect("driver")
        .ok();
    // A connection that never sends the HTTP/2 preface is closed too.
    let mut silent = TcpStream::connect(("127.0.0.1", rls.grpc_port)).expect("connect");
    let took =
        tokio::task::spawn_blocking(move || closed_within(&mut silent, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(
        took.is_some(),
        "a silent gRPC connection was still open after 10 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connections_beyond_the_cap_are_closed_on_arrival() {
    let (_policy, rls) = grpc_server("grpc_max_connections = 2\nheader_read_timeout_ms = 60000");
    // Two held connections (each with a stream open) fill the port; a third is closed on arrival.
    let (c1, _d1) = h2_connect_held(rls.grpc_port).await;
    let (c2, _d2) = h2_connect_held(rls.grpc_port).await;
    let _held = (unfinished_stream(c1).await, unfinished_stream(c2).await);
    let mut third = TcpStream::connect(("127.0.0.1", rls.grpc_port)).expect("connect");
    let took =
        tokio::task::spawn_blocking(move || closed_within(&mut third, Duration::from_secs(10)))
            .await
            .unwrap();
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(5)),
        "a third connection beyond grpc_max_connections = 2 was held: {took:?}"
    );
}

// ---------------------------------------------------------------------------
// A proxy on this host is not a local caller.
// ---------------------------------------------------------------------------

const DECIDE_BODY: &str = r#"{"identity": "user-1"}"#;
const JSON_BODY: &str =
    r#"{"domain": "none", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}"#;

/// The status of `method path` on `server` with `headers`.
async fn status_of(server: &Ratewatch, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let client = reqwest::Client::new();
    let url = format!("{}{path}", server.url());
    let mut req = if method == "POST" {
        let body = if path == "/json" {
            JSON_BODY
        } else {
            DECIDE_BODY
        };
        client
            .post(url)
            .body(body)
            .header("content-type", "application/json")
    } else {
        client.get(url)
    };
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("an answer").status().as_u16()
}

const ADMIN: [(&str, &str); 3] = [
    ("POST", "/v1/decide"),
    ("POST", "/json"),
    ("GET", "/dashboard"),
];

#[tokio::test]
async fn a_loopback_peer_that_forwards_for_someone_else_is_refused_by_every_admin_endpoint() {
    let server = Ratewatch::start("serve", None, &[]);
    for (method, path) in ADMIN {
        assert_eq!(
            status_of(&server, method, path, &[]).await,
            200,
            "{method} {path} from a local caller"
        );
        for header in [
            ("x-forwarded-for", "203.0.113.9"),
            ("x-real-ip", "203.0.113.9"),
            ("forwarded", "for=203.0.113.9"),
            // Even one claiming to forward for this host.
            ("x-forwarded-for", "127.0.0.1"),
        ] {
            assert_eq!(
                status_of(&server, method, path, &[header]).await,
                403,
                "{method} {path} forwarded by a proxy on this host ({header:?})"
            );
        }
    }
    // With a token configured, the token judges such a proxy.
    let policy = policy_file(
        "[rls]\ntoken = \"rls-secret-0123456789\"\n\n[dashboard]\ntoken = \"dash-secret-0123456789\"\n",
    );
    let server = Ratewatch::start("serve", Some(policy.path()), &[]);
    let fwd = ("x-forwarded-for", "203.0.113.9");
    for (method, path) in [("POST", "/v1/decide"), ("POST", "/json")] {
        assert_eq!(
            status_of(&server, method, path, &[fwd]).await,
            401,
            "{path}"
        );
        let auth = ("authorization", "Bearer rls-secret-0123456789");
        assert_eq!(
            status_of(&server, method, path, &[fwd, auth]).await,
            200,
            "{path}"
        );
    }
    assert_eq!(status_of(&server, "GET", "/dashboard", &[fwd]).await, 401);
    let auth = ("authorization", "Bearer dash-secret-0123456789");
    assert_eq!(
        status_of(&server, "GET", "/dashboard", &[fwd, auth]).await,
        200
    );
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_client_is_judged() {
    let policy = policy_file("[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n");
    let server = Ratewatch::start("serve", Some(policy.path()), &[]);
    for (method, path) in ADMIN {
        let remote = [("x-forwarded-for", "203.0.113.9")];
        assert_eq!(
            status_of(&server, method, path, &remote).await,
            403,
            "{method} {path}"
        );
        let local = [("x-forwarded-for", "127.0.0.1")];
        assert_eq!(
            status_of(&server, method, path, &local).await,
            200,
            "{method} {path}"
        );
        // A trusted proxy that names no client in X-Forwarded-For.
        let unnamed = [("x-real-ip", "127.0.0.1")];
        assert_eq!(
            status_of(&server, method, path, &unnamed).await,
            403,
            "{method} {path}"
        );
    }
}

#[test]
fn a_request_body_that_never_comes_is_answered_and_its_connection_closed() {
    let policy = policy_file("[server]\nheader_read_timeout_ms = 500\n");
    let server = Ratewatch::start_logged("serve", Some(policy.path()), &[], &[]);
    // A whole head declaring 100 bytes of body, and 11 of them sent: the
    // handler reading the body would wait, and hold the connection, for ever.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    s.write_all(
        b"POST /v1/decide HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"identity\"",
    )
    .expect("send");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head)
        .expect("a stalled body was never answered");
    assert_eq!(&head, b"HTTP/1.1 400");
    closed_within(&mut s, Duration::from_secs(10))
        .expect("the connection of a stalled body is still open");
}

#[tokio::test]
async fn with_an_admin_listener_the_public_port_serves_only_the_decision_service() {
    let admin_port = free_port();
    let admin = format!("127.0.0.1:{admin_port}");
    let server = Ratewatch::start_logged("serve", None, &[], &["--admin-listen", &admin]);
    wait_listening(admin_port);
    let client = reqwest::Client::new();
    let status = |base: String, method: &'static str, path: &'static str| {
        let client = client.clone();
        async move {
            let url = format!("{base}{path}");
            let req = if method == "POST" {
                client
                    .post(url)
                    .body(DECIDE_BODY)
                    .header("content-type", "application/json")
            } else {
                client.get(url)
            };
            req.send().await.expect("an answer").status().as_u16()
        }
    };
    let public = server.url();
    let admin = format!("http://{admin}");
    assert_eq!(status(public.clone(), "POST", "/v1/decide").await, 200);
    for path in ["/health", "/ready", "/healthcheck"] {
        assert_eq!(
            status(public.clone(), "GET", path).await,
            200,
            "public {path}"
        );
        assert_eq!(
            status(admin.clone(), "GET", path).await,
            200,
            "admin {path}"
        );
    }
    for path in [
        "/dashboard",
        "/metrics",
        "/api/users",
        "/api/ratelimit/status",
    ] {
        assert_eq!(
            status(public.clone(), "GET", path).await,
            404,
            "public {path}"
        );
        assert_eq!(
            status(admin.clone(), "GET", path).await,
            200,
            "admin {path}"
        );
    }
    assert_eq!(status(admin, "POST", "/v1/decide").await, 404);
}
