//! A Redis Sentinel deployment on one machine: one master, one replica and
//! three `redis-server --sentinel` processes (quorum 2) that fail over
//! within a few seconds of losing the master.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisServer, free_port, redis_cli, require};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "rwmaster";

/// One sentinel process with its own writable config file.
pub struct Sentinel {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its TLS port, if it serves TLS.
    pub tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Sentinel {
    /// Starts a sentinel monitoring the master on `master_port`, with
    /// `extra_conf` lines (TLS) and, if given, a TLS port.
    fn start(master_port: u16, extra_conf: &str, tls_port: Option<u16>) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("temp dir");
        let conf = dir.path().join("sentinel.conf");
        let tls = tls_port.map_or(String::new(), |p| format!("tls-port {p}\n"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n{tls}{extra_conf}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new(require("redis-server"))
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let s = Self {
            port,
            tls_port,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while redis_cli(port, &["PING"]).trim() != "PONG" {
            assert!(
                Instant::now() < deadline,
                "sentinel on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// What `SENTINEL MASTER` reports about the master, as `field value` lines.
    pub fn master_info(&self) -> String {
        redis_cli(self.port, &["SENTINEL", "MASTER", MASTER_NAME])
    }

    /// The `host:port` this sentinel names as master.
    pub fn master_addr(&self) -> String {
        let out = redis_cli(
            self.port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        );
        out.lines().map(str::trim).collect::<Vec<_>>().join(":")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A field of `SENTINEL MASTER` output (field and value on alternate lines).
fn field(info: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = info.lines().map(str::trim).collect();
    lines
        .chunks(2)
        .find(|kv| kv.first() == Some(&name))
        .and_then(|kv| kv.get(1))
        .map(|v| v.to_string())
}

/// One master, one replica, three sentinels.
pub struct SentinelSet {
    /// The master at start.
    pub master: RedisServer,
    /// Its replica at start.
    pub replica: RedisServer,
    /// The sentinels.
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSet {
    /// Starts the deployment and waits until the replica is in sync and
    /// every sentinel knows the replica and the two other sentinels.
    pub fn start() -> Self {
        Self::launch(Vec::new(), None, None, |_| (String::new(), None))
    }

    /// The same deployment serving TLS with `certs` everywhere: data nodes
    /// on TLS ports (replication over TLS), sentinels on TLS ports that
    /// monitor the master over TLS. Plain ports stay for control.
    pub fn start_tls(certs: &super::tls::Certs) -> Self {
        let (master_tls, replica_tls) = (free_port(), free_port());
        let s = |p: &std::path::Path| p.display().to_string();
        let files = format!(
            "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-replication yes",
            s(&certs.server_cert()),
            s(&certs.server_key()),
            s(&certs.ca())
        );
        let mut master = certs.server_args(master_tls, false, false);
        master.extend(["--tls-replication".into(), "yes".into()]);
        let mut replica = certs.server_args(replica_tls, false, false);
        replica.extend(["--tls-replication".into(), "yes".into()]);
        Self::launch(master, Some(replica), Some(master_tls), move |_| {
            (files.clone(), Some(free_port()))
        })
    }

    /// Starts a master with `master_args`, a replica (with `replica_args`,
    /// else the master's) following the master on `follow_port` (else its
    /// plain port), and three sentinels, sentinel `i` with the config lines
    /// and TLS port `sentinel(i)` gives.
    fn launch(
        master_args: Vec<String>,
        replica_args: Option<Vec<String>>,
        follow_port: Option<u16>,
        sentinel: impl Fn(usize) -> (String, Option<u16>),
    ) -> Self {
        // A replica syncs at once (the default waits 5 s for others).
        let fast = ["--repl-diskless-sync-delay".to_string(), "0".to_string()];
        let mut m = master_args.clone();
        m.extend(fast.clone());
        let m: Vec<&str> = m.iter().map(String::as_str).collect();
        let master = RedisServer::start_with(&m);
        let follow = follow_port.unwrap_or(master.port);
        let mut r = replica_args.unwrap_or(master_args);
        r.extend(fast);
        r.extend(["--replicaof".into(), "127.0.0.1".into(), follow.to_string()]);
        let r: Vec<&str> = r.iter().map(String::as_str).collect();
        let replica = RedisServer::start_with(&r);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|i| {
                let (conf, tls_port) = sentinel(i);
                Sentinel::start(follow, &conf, tls_port)
            })
            .collect();
        for s in &sentinels {
            loop {
                let info = s.master_info();
                let replicas = field(&info, "num-slaves").unwrap_or_default();
                let others = field(&info, "num-other-sentinels").unwrap_or_default();
                if replicas == "1" && others == "2" {
                    break;
                }
                assert!(
                    Instant::now() < deadline + Duration::from_secs(10),
                    "sentinel {} never saw the replica and its peers: {info}",
                    s.port
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Self {
            master,
            replica,
            sentinels,
        }
    }

    /// `rediss://127.0.0.1:tls_port` of every sentinel serving TLS.
    pub fn tls_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter_map(|s| s.tls_port)
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect()
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Waits until every sentinel names `addr` as the master.
    pub fn wait_for_master(&self, addr: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.sentinels.iter().all(|s| s.master_addr() == addr) {
            assert!(
                Instant::now() < deadline,
                "the sentinels did not name {addr} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
