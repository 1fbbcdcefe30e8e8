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
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Sentinel {
    fn start(master_port: u16, extra_conf: &str) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().expect("temp dir");
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n{extra_conf}",
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
        let _ = &self.dir;
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
        Self::start_with(&[], "", |_| Vec::new())
    }

    /// Same, with extra arguments for both data nodes, extra lines for each
    /// sentinel's config, and the arguments that make the replica follow
    /// the master (given the master).
    pub fn start_with(
        node_args: &[&str],
        sentinel_conf: &str,
        replicaof: impl Fn(&RedisServer) -> Vec<String>,
    ) -> Self {
        // A replica syncs at once (the default waits 5 s for others).
        let mut node_args: Vec<&str> = node_args.to_vec();
        node_args.extend(["--repl-diskless-sync-delay", "0"]);
        let master = RedisServer::start_with(&node_args);
        let mut replica_args: Vec<String> = node_args.iter().map(|s| s.to_string()).collect();
        let follow = replicaof(&master);
        if follow.is_empty() {
            replica_args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                master.port.to_string(),
            ]);
        } else {
            replica_args.extend(follow);
        }
        let args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
        let replica = RedisServer::start_with(&args);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        let monitored = master.port;
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| {
                Sentinel::start(
                    monitored_port(&master, monitored, sentinel_conf),
                    sentinel_conf,
                )
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

/// The port the sentinels monitor: the TLS port when the sentinel config
/// sets `tls-replication` (it is then passed in `sentinel_conf` as a
/// `# monitor-port N` comment), else the plain one.
fn monitored_port(_master: &RedisServer, plain: u16, sentinel_conf: &str) -> u16 {
    sentinel_conf
        .lines()
        .find_map(|l| l.strip_prefix("# monitor-port "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(plain)
}
