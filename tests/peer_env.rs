//! envoyproxy/ratelimit's Deployment environment kept as it is, with the
//! binary swapped for `ratewatch serve`: it serves the YAML rule files of
//! `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config` over gRPC on `GRPC_PORT`,
//! decides against the Redis of `REDIS_URL`, follows a swap of the
//! runtime root, and refuses to start (naming the variable) on what it
//! cannot honour or on a rule directory without rules, never falling back
//! to the built-in demo policy.

mod support;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratewatch::service::grpc::ProstCodec;
use ratewatch::service::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
};
use support::sentinel::{MASTER_NAME, SentinelSet};
use support::tls::{Certs, TlsRedis};
use support::{RedisCluster, RedisServer, free_port};
use tonic::transport::Channel;

const WITHIN: Duration = Duration::from_secs(30);

fn rules(per_hour: u64) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: {per_hour}\n"
    )
}

/// `ratewatch serve` with no argument but `env` (and nothing of ratewatch's
/// own environment).
struct Peer(Child);

impl Peer {
    fn start(env: &[(&str, String)]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ratewatch");
        Self(child)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The start's exit code and what it printed, for a start that must fail.
fn refused(env: &[(&str, String)]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .arg("serve")
        .env_clear()
        .env("RUST_LOG", "off")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratewatch");
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "still running: it started".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn channel(port: u16) -> Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + WITHIN;
    loop {
        match endpoint.connect().await {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no gRPC server on {port}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn ask(channel: &Channel, ip: &str) -> Option<RateLimitResponse> {
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: ip.into(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    };
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.ok()?;
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
    )
    .await
    .ok()
    .map(tonic::Response::into_inner)
}

/// The limit the rule for `remote_address` has now, once the store
/// answers (a decision that reports time until reset).
async fn limit_now(channel: &Channel, ip: &str) -> Option<u64> {
    let r = ask(channel, ip).await?;
    let s = r.statuses.first()?;
    s.duration_until_reset.as_ref().filter(|d| d.seconds > 0)?;
    s.current_limit
        .as_ref()
        .map(|l| u64::from(l.requests_per_unit))
}

async fn until_limit(channel: &Channel, want: u64) {
    let deadline = Instant::now() + WITHIN;
    let mut n = 0;
    loop {
        n += 1;
        if limit_now(channel, &format!("probe-{n}")).await == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "the limit never became {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn peer_env(root: &Path, redis_url: &str, grpc_port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", redis_url.into()),
        ("USE_STATSD", "false".into()),
        ("LOG_LEVEL", "debug".into()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", free_port().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc_port.to_string()),
    ]
}

#[tokio::test]
async fn the_peers_environment_answers_over_grpc_from_its_yaml_on_its_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), rules(2)).unwrap();
    let grpc_port = free_port();
    let mut env = peer_env(dir.path(), &redis.addr(), grpc_port);
    env.push(("RUNTIME_WATCH_ROOT", "false".into()));
    let _server = Peer::start(&env);
    let c = channel(grpc_port).await;
    until_limit(&c, 2).await;

    let codes: Vec<i32> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(ask(&c, "10.0.0.1").await.expect("answer").overall_code);
        }
        v
    };
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    let keys: u64 = redis.cli(&["DBSIZE"]).trim().parse().unwrap();
    assert!(keys > 0, "the counters live in REDIS_URL's Redis");
    // HOST:PORT is the HTTP listener.
    let port = &env.iter().find(|(k, _)| *k == "PORT").unwrap().1;
    let health = reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .expect("HTTP on HOST:PORT");
    assert_eq!(health.status(), 200);

    // An edit in the directory is followed, as RUNTIME_WATCH_ROOT=false
    // promises.
    let tmp = config.join("edge.yaml.tmp");
    std::fs::write(&tmp, rules(5)).unwrap();
    std::fs::rename(&tmp, config.join("edge.yaml")).unwrap();
    until_limit(&c, 5).await;
}

#[tokio::test]
async fn a_swap_of_the_runtime_root_symlink_is_followed_with_a_redis_url() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    for (version, limit) in [("v1", 3), ("v2", 4)] {
        let config = dir.path().join(version).join("ratelimit/config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("edge.yaml"), rules(limit)).unwrap();
    }
    let current = dir.path().join("current");
    symlink("v1", &current).unwrap();
    let grpc_port = free_port();
    let _server = Peer::start(&peer_env(&current, &redis.url(), grpc_port));
    let c = channel(grpc_port).await;
    until_limit(&c, 3).await;

    symlink("v2", dir.path().join("next")).unwrap();
    std::fs::rename(dir.path().join("next"), &current).unwrap();
    until_limit(&c, 4).await;
}

/// The rules of `limit` per hour in a runtime directory under `dir`.
fn runtime(dir: &Path, limit: u64) {
    let config = dir.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), rules(limit)).unwrap();
}

/// Three hits of one caller: OK, OK, OVER_LIMIT under a limit of 2.
async fn two_then_over(c: &Channel) {
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(c, "10.0.0.9").await.expect("answer").overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
}

#[tokio::test]
async fn the_peers_cluster_settings_decide_on_the_cluster() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().unwrap();
    runtime(dir.path(), 2);
    let nodes: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_owned())
        .collect();
    let grpc_port = free_port();
    let mut env = peer_env(dir.path(), &nodes.join(","), grpc_port);
    env.push(("REDIS_TYPE", "cluster".into()));
    let _server = Peer::start(&env);
    let c = channel(grpc_port).await;
    until_limit(&c, 2).await;
    two_then_over(&c).await;
    let keys: u64 = cluster
        .urls()
        .iter()
        .map(|u| {
            let port: u16 = u.rsplit(':').next().unwrap().parse().unwrap();
            support::redis_cli(port, &["DBSIZE"])
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert!(keys > 0, "the counters live on the cluster");
}

#[tokio::test]
async fn the_peers_sentinel_settings_decide_on_the_master_the_sentinels_name() {
    let set = SentinelSet::start();
    let dir = tempfile::tempdir().unwrap();
    runtime(dir.path(), 2);
    let sentinels: Vec<String> = set
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_owned())
        .collect();
    let grpc_port = free_port();
    let url = format!("{MASTER_NAME},{}", sentinels.join(","));
    let mut env = peer_env(dir.path(), &url, grpc_port);
    env.push(("REDIS_TYPE", "SENTINEL".into()));
    let _server = Peer::start(&env);
    let c = channel(grpc_port).await;
    until_limit(&c, 2).await;
    two_then_over(&c).await;
    let keys: u64 = set.master.cli(&["DBSIZE"]).trim().parse().unwrap();
    assert!(keys > 0, "the counters live on the master");
}

#[tokio::test]
async fn redis_auth_as_user_and_password_reaches_a_redis_that_requires_it() {
    // The default user may only PING: every counter needs the "rw" user.
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "on",
        "nopass",
        "-@all",
        "+ping",
        "--user",
        "rw",
        "on",
        ">s3cret-pass",
        "~*",
        "&*",
        "+@all",
    ]);
    let dir = tempfile::tempdir().unwrap();
    runtime(dir.path(), 2);
    let grpc_port = free_port();
    let mut env = peer_env(dir.path(), &redis.addr(), grpc_port);
    env.push(("REDIS_AUTH", "rw:s3cret-pass".into()));
    let _server = Peer::start(&env);
    let c = channel(grpc_port).await;
    until_limit(&c, 2).await;
    two_then_over(&c).await;
}

#[tokio::test]
async fn redis_tls_with_the_peers_ca_and_client_certificate_reaches_a_mutual_tls_redis() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, true);
    let dir = tempfile::tempdir().unwrap();
    runtime(dir.path(), 2);
    let grpc_port = free_port();
    let mut env = peer_env(
        dir.path(),
        &format!("127.0.0.1:{}", redis.tls_port),
        grpc_port,
    );
    env.push(("REDIS_TLS", "true".into()));
    env.push(("REDIS_TLS_CACERT", certs.ca().display().to_string()));
    env.push((
        "REDIS_TLS_CLIENT_CERT",
        certs.client_cert().display().to_string(),
    ));
    env.push((
        "REDIS_TLS_CLIENT_KEY",
        certs.client_key().display().to_string(),
    ));
    let _server = Peer::start(&env);
    let c = channel(grpc_port).await;
    until_limit(&c, 2).await;
    two_then_over(&c).await;
}

#[test]
fn a_peer_variable_ratewatch_cannot_honour_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), rules(2)).unwrap();
    let mut env = peer_env(dir.path(), "127.0.0.1:6379", free_port());
    env.retain(|(k, _)| *k != "USE_STATSD");
    env.push(("USE_STATSD", "true".into()));
    let (code, err) = refused(&env);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("USE_STATSD") && err.contains("statsd"),
        "{err}"
    );
}

#[test]
fn a_rule_directory_without_rules_stops_the_start_instead_of_serving_the_demo_policy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ratelimit/config")).unwrap();
    let env = peer_env(dir.path(), "127.0.0.1:6379", free_port());
    let (code, err) = refused(&env);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("RUNTIME_ROOT") && err.contains("ratelimit/config"),
        "{err}"
    );
}
