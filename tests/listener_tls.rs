//! TLS on `ratewatch serve`'s ports, against the real binary with a
//! throwaway CA made by `openssl`: HTTPS (HTTP/1.1 and HTTP/2 by ALPN) and
//! gRPC over TLS, plain text refused, mutual TLS, a certificate rotated by
//! a Kubernetes-style `..data` symlink swap, a bad new pair kept out, a
//! client that never sends its ClientHello dropped at the header read
//! timeout, and bad files refused by `serve` and `check-config`.
#![cfg(feature = "server")]

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::tls::Certs;
use support::{Ratewatch, free_port, policy_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A client trusting `cas`, presenting `client` (cert, key) if given,
/// offering `alpn`.
fn client_config(
    cas: &[PathBuf],
    client: Option<(PathBuf, PathBuf)>,
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        for c in CertificateDer::pem_file_iter(ca).expect("read CA") {
            roots.add(c.expect("CA cert")).expect("add CA");
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .expect("client cert")
                    .map(|c| c.expect("cert"))
                    .collect(),
                PrivateKeyDer::from_pem_file(key).expect("client key"),
            )
            .expect("client auth"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn connect(
    port: u16,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("127.0.0.1").expect("server name");
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// `GET path` over HTTP/1.1 on `s`: what came back (possibly nothing).
async fn get_http1(mut s: TlsStream<TcpStream>, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET path` over HTTP/2 on `io`: the status and the body.
async fn get_h2<T>(io: T, path: &str) -> (u16, String)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut client, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::get(format!("https://127.0.0.1{path}"))
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).expect("send");
    let resp = resp.await.expect("answer");
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        out.extend_from_slice(&chunk.expect("body"));
    }
    (status, String::from_utf8_lossy(&out).into_owned())
}

/// gRPC `grpc.health.v1.Health/Check` on `io`: the serving status of the
/// answer (1 SERVING, 2 NOT_SERVING) and its grpc-status.
async fn grpc_health<T>(io: T) -> (Option<u8>, String)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut client, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::post("https://127.0.0.1/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut send) = client.send_request(req, false).expect("send");
    // An empty HealthCheckRequest: uncompressed, zero bytes.
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .expect("send body");
    let resp = resp.await.expect("answer");
    let mut grpc_status = resp
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        out.extend_from_slice(&chunk.expect("body"));
    }
    if let Ok(Some(t)) = body.trailers().await {
        if let Some(v) = t.get("grpc-status") {
            grpc_status = Some(v.to_str().unwrap().to_owned());
        }
    }
    // [flag, len x4, 0x08, status]
    let serving = (out.len() >= 7 && out[5] == 0x08).then(|| out[6]);
    (serving, grpc_status.unwrap_or_default())
}

/// Polls `f` until it holds, failing with `what` after a generous bound.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn tls_args(certs: &Certs) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        s(&certs.server_cert()),
        "--tls-key".into(),
        s(&certs.server_key()),
    ]
}

fn start(args: &[String], config: Option<&Path>) -> Ratewatch {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Ratewatch::start_logged("serve", config, &[], &args)
}

#[tokio::test]
async fn https_health_answers_over_http1_and_h2_with_the_test_ca_and_plain_text_is_refused() {
    let certs = Certs::generate();
    let rw = start(&tls_args(&certs), None);
    let cas = [certs.ca()];

    let s1 = connect(rw.port, client_config(&cas, None, &[b"http/1.1"]))
        .await
        .expect("TLS handshake");
    assert_eq!(s1.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let answer = get_http1(s1, "/health").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");

    let s2 = connect(rw.port, client_config(&cas, None, &[b"h2", b"http/1.1"]))
        .await
        .expect("TLS handshake");
    assert_eq!(s2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(get_h2(s2, "/health").await, (200, "ok".to_owned()));

    // No ALPN at all: HTTP/1.1.
    let s3 = connect(rw.port, client_config(&cas, None, &[]))
        .await
        .expect("TLS handshake");
    assert!(get_http1(s3, "/ready").await.starts_with("HTTP/1.1 200"));

    // Plain text on the TLS port gets no HTTP answer.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", rw.port)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(
        !String::from_utf8_lossy(&out).contains("HTTP/1.1"),
        "a plain-text request was answered: {out:?}"
    );

    // A server certificate the client's CA did not sign is refused by it.
    let other = Certs::generate();
    assert!(
        connect(rw.port, client_config(&[other.ca()], None, &[b"http/1.1"]))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn grpc_health_answers_over_tls_and_h2c_is_refused() {
    let certs = Certs::generate();
    let policy = policy_file(&format!(
        "[server]\ntls_cert_file = {:?}\ntls_key_file = {:?}\n",
        s(&certs.server_cert()),
        s(&certs.server_key())
    ));
    let grpc_port = free_port();
    let rw = start(
        &["--grpc-listen".into(), format!("127.0.0.1:{grpc_port}")],
        Some(policy.path()),
    );
    eventually("the gRPC port listens", || async {
        TcpStream::connect(("127.0.0.1", grpc_port)).await.is_ok()
    })
    .await;
    let cas = [certs.ca()];
    let tls = connect(grpc_port, client_config(&cas, None, &[b"h2"]))
        .await
        .expect("TLS handshake on the gRPC port");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(grpc_health(tls).await, (Some(1), "0".to_owned()));

    // The gRPC port speaks HTTP/2 only: a client offering HTTP/1.1 alone
    // fails its handshake.
    assert!(
        connect(grpc_port, client_config(&cas, None, &[b"http/1.1"]))
            .await
            .is_err()
    );

    // h2c (plain HTTP/2) is not answered.
    let plain = TcpStream::connect(("127.0.0.1", grpc_port)).await.unwrap();
    let h2c = tokio::time::timeout(Duration::from_secs(20), async {
        let (mut client, conn) = h2::client::handshake(plain).await.ok()?;
        tokio::spawn(conn);
        let req = http::Request::get("http://127.0.0.1/").body(()).unwrap();
        let (resp, _) = client.send_request(req, true).ok()?;
        resp.await.ok()
    })
    .await
    .expect("the plain connection ends");
    assert!(h2c.is_none(), "h2c was answered: {h2c:?}");
    drop(rw);
}

#[tokio::test]
async fn mutual_tls_from_the_environment_refuses_a_client_without_a_certificate_and_serves_one_with()
 {
    let certs = Certs::generate();
    // Through the environment this time.
    let (cert, key, ca) = (
        s(&certs.server_cert()),
        s(&certs.server_key()),
        s(&certs.ca()),
    );
    let env = [
        ("RATEWATCH_TLS_CERT", cert.as_str()),
        ("RATEWATCH_TLS_KEY", key.as_str()),
        ("RATEWATCH_TLS_CLIENT_CA", ca.as_str()),
    ];
    let rw = Ratewatch::start_logged("serve", None, &env, &[]);
    let cas = [certs.ca()];

    // TLS 1.3: the client's handshake ends before the server checks its
    // (missing) certificate; the refusal arrives as the connection ends.
    let refused = match connect(rw.port, client_config(&cas, None, &[b"http/1.1"])).await {
        Err(_) => String::new(),
        Ok(s) => get_http1(s, "/health").await,
    };
    assert!(
        !refused.contains("200"),
        "served without a client certificate: {refused}"
    );

    // A certificate from another CA is refused too.
    let other = Certs::generate();
    let foreign = Some((other.client_cert(), other.client_key()));
    let refused = match connect(rw.port, client_config(&cas, foreign, &[b"http/1.1"])).await {
        Err(_) => String::new(),
        Ok(s) => get_http1(s, "/health").await,
    };
    assert!(
        !refused.contains("200"),
        "served a foreign client certificate: {refused}"
    );

    let ours = Some((certs.client_cert(), certs.client_key()));
    let s = connect(rw.port, client_config(&cas, ours, &[b"http/1.1"]))
        .await
        .expect("mutual TLS handshake");
    let answer = get_http1(s, "/health").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Points `dir/..data` at a new directory holding `cert` and `key`, as
/// Kubernetes updates a mounted secret (one rename of a symlink).
fn swap_secret(dir: &Path, version: &str, cert: &Path, key: &Path) {
    let v = dir.join(version);
    std::fs::create_dir(&v).unwrap();
    std::fs::copy(cert, v.join("tls.crt")).unwrap();
    std::fs::copy(key, v.join("tls.key")).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

/// The DER of the first certificate of a PEM file.
fn leaf(pem: &Path) -> Vec<u8> {
    CertificateDer::pem_file_iter(pem)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

async fn served_leaf(port: u16, cas: &[PathBuf]) -> Option<Vec<u8>> {
    let s = connect(port, client_config(cas, None, &[b"http/1.1"]))
        .await
        .ok()?;
    let leaf = s.get_ref().1.peer_certificates()?.first()?.to_vec();
    Some(leaf)
}

#[tokio::test]
async fn a_rotated_certificate_reaches_new_connections_and_a_bad_pair_is_kept_out() {
    let (a, b) = (Certs::generate(), Certs::generate());
    let secret = tempfile::tempdir().unwrap();
    let dir = secret.path();
    swap_secret(dir, "..v1", &a.server_cert(), &a.server_key());
    std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", dir.join("tls.key")).unwrap();
    let rw = start(
        &[
            "--tls-cert".into(),
            s(&dir.join("tls.crt")),
            "--tls-key".into(),
            s(&dir.join("tls.key")),
        ],
        None,
    );
    let cas = [a.ca(), b.ca()];
    assert_eq!(
        served_leaf(rw.port, &cas).await,
        Some(leaf(&a.server_cert()))
    );
    // A connection opened before the rotation keeps working after it.
    let before = connect(rw.port, client_config(&cas, None, &[b"http/1.1"]))
        .await
        .unwrap();

    swap_secret(dir, "..v2", &b.server_cert(), &b.server_key());
    let want = leaf(&b.server_cert());
    eventually("new connections get the rotated certificate", || async {
        served_leaf(rw.port, &cas).await.as_ref() == Some(&want)
    })
    .await;
    assert!(
        get_http1(before, "/health")
            .await
            .starts_with("HTTP/1.1 200")
    );

    // A pair that does not match (a's key for b's certificate): logged,
    // naming the key file, and b's certificate stays in use.
    swap_secret(dir, "..v3", &b.server_cert(), &a.server_key());
    eventually("the bad pair is logged", || async {
        rw.log().contains("do not load")
    })
    .await;
    let log = rw.log();
    let line = log
        .lines()
        .find(|l| l.contains("do not load"))
        .unwrap()
        .to_owned();
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("tls.key"),
        "the line names the key file: {line}"
    );
    assert_eq!(served_leaf(rw.port, &cas).await.as_ref(), Some(&want));
    // Logged once, not at every look.
    tokio::time::sleep(ratewatch::server::TLS_POLL * 3).await;
    assert_eq!(rw.log().matches("do not load").count(), 1, "{}", rw.log());
}

#[tokio::test]
async fn a_client_that_never_sends_its_client_hello_is_dropped_at_the_header_read_timeout() {
    let certs = Certs::generate();
    let mut args = tls_args(&certs);
    args.extend(["--header-read-timeout-ms", "1000", "--max-connections", "1"].map(String::from));
    let rw = start(&args, None);
    // The waiting loop of the start connected once; let that slot go.
    let cas = [certs.ca()];
    eventually("the slot of the start's probe is free", || async {
        match connect(rw.port, client_config(&cas, None, &[b"http/1.1"])).await {
            Ok(s) => get_http1(s, "/health").await.starts_with("HTTP/1.1 200"),
            Err(_) => false,
        }
    })
    .await;

    let mut silent = std::net::TcpStream::connect(("127.0.0.1", rw.port)).unwrap();
    let opened = Instant::now();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = silent.read(&mut buf);
    let held = opened.elapsed();
    assert!(matches!(n, Ok(0) | Err(_)), "closed: {n:?}");
    assert!(
        held >= Duration::from_millis(800) && held < Duration::from_secs(15),
        "a silent connection was held {held:?} (timeout 1 s)"
    );
    // Its slot is free again: a new client is served.
    eventually("a new client is served after the silent one", || async {
        match connect(rw.port, client_config(&cas, None, &[b"http/1.1"])).await {
            Ok(s) => get_http1(s, "/health").await.starts_with("HTTP/1.1 200"),
            Err(_) => false,
        }
    })
    .await;
}

/// Runs `ratewatch serve` with `args`, which must not start: its exit
/// code and stderr.
fn serve_refuses(args: &[String]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(args)
        .env("RUST_LOG", "off")
        .env_remove("RATEWATCH_CONFIG")
        .output()
        .expect("run ratewatch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_key_file_stops_serve_and_check_config_naming_the_file() {
    let certs = Certs::generate();
    let dir = tempfile::tempdir().unwrap();
    let bad_key = dir.path().join("bad.key");
    std::fs::write(&bad_key, "not a key\n").unwrap();
    let (code, err) = serve_refuses(&[
        "--tls-cert".into(),
        s(&certs.server_cert()),
        "--tls-key".into(),
        s(&bad_key),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("bad.key") && err.contains("tls_key_file"),
        "{err}"
    );

    // Another certificate's key.
    let other = Certs::generate();
    let (code, err) = serve_refuses(&[
        "--tls-cert".into(),
        s(&certs.server_cert()),
        "--tls-key".into(),
        s(&other.server_key()),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&s(&other.server_key())), "{err}");

    // A FIFO is refused, not waited on.
    let fifo = dir.path().join("fifo.key");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let (code, err) = serve_refuses(&[
        "--tls-cert".into(),
        s(&certs.server_cert()),
        "--tls-key".into(),
        s(&fifo),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("fifo.key") && err.contains("regular file"),
        "{err}"
    );

    let policy = |key: &Path| {
        policy_file(&format!(
            "[server]\ntls_cert_file = {:?}\ntls_key_file = {:?}\ntls_client_ca_file = {:?}\n",
            s(&certs.server_cert()),
            s(key),
            s(&certs.ca())
        ))
    };
    let bad = policy(&bad_key);
    let (code, out) = support::check_config(bad.path());
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("bad.key") && out.contains("tls_key_file"),
        "{out}"
    );
    let good = policy(&certs.server_key());
    let (code, out) = support::check_config(good.path());
    assert_eq!(code, 0, "{out}");

    // A certificate without its key is refused on its line.
    let lone = policy_file(&format!(
        "[server]\ntls_cert_file = {:?}\n",
        s(&certs.server_cert())
    ));
    let (code, out) = support::check_config(lone.path());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(":2:") && out.contains("tls_key_file"), "{out}");
}

/// grpcio (grpc-core's TLS, ALPN `h2` required) asks gRPC health over
/// mutual TLS: SERVING with the client certificate, UNAVAILABLE without.
#[test]
fn grpcio_reaches_grpc_health_over_mutual_tls() {
    let certs = Certs::generate();
    let grpc_port = free_port();
    let mut args = tls_args(&certs);
    args.extend([
        "--tls-client-ca".into(),
        s(&certs.ca()),
        "--grpc-listen".into(),
        format!("127.0.0.1:{grpc_port}"),
    ]);
    let _rw = start(&args, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_err() {
        assert!(Instant::now() < deadline, "the gRPC port never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let script = r#"
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
port, ca, cert, key = sys.argv[1:5]
read = lambda p: open(p, "rb").read()
for name, creds in [
    ("with", grpc.ssl_channel_credentials(read(ca), read(key), read(cert))),
    ("without", grpc.ssl_channel_credentials(read(ca))),
]:
    channel = grpc.secure_channel("localhost:" + port, creds)
    try:
        r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
        print(name, health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    except grpc.RpcError as e:
        print(name, e.code().name)
"#;
    let out = std::process::Command::new(support::envoy::rls_python())
        .args(["-c", script, &grpc_port.to_string()])
        .args([certs.ca(), certs.client_cert(), certs.client_key()])
        .output()
        .expect("run the grpcio client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "with SERVING\nwithout UNAVAILABLE",
        "{stdout}"
    );
}
