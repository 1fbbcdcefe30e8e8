//! Real servers for integration tests: `redis-server` single nodes and a
//! 3-master Redis Cluster on free loopback ports, each in its own temporary
//! directory, killed when dropped.
#![allow(dead_code)]

pub mod cluster;
pub mod envoy;
pub mod hammer;
pub mod sentinel;
pub mod tls;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A store key of the limiter's shape for `limit` of the API key
/// `identity` in tier `free`, under prefix `rw`. Stores treat keys as
/// opaque; the algorithm code the limiter appends is `test` here.
pub fn identity_key(identity: &str, limit: &str) -> String {
    use ratewatch::store::keys;
    keys::identity_key(
        "rw",
        &keys::hash_identity("key", identity),
        None,
        &keys::limit_code(Some("free"), limit, "test"),
    )
}

/// The key the limiter gives `limit` of the API key `identity` in tier
/// `free` under prefix `rw`, algorithm code included: what a real
/// deployment stores, byte for byte.
pub fn limiter_key(
    identity: &str,
    limit: &str,
    algorithm: &ratewatch::algorithm::Algorithm,
) -> String {
    use ratewatch::store::keys;
    keys::identity_key(
        "rw",
        &keys::hash_identity("key", identity),
        None,
        &keys::limit_code(Some("free"), limit, keys::algorithm_code(algorithm)),
    )
}

/// Decides `items` at `cost` on `store`, panicking on a store error.
pub async fn consume(
    store: &dyn ratewatch::store::Store,
    items: &[ratewatch::store::Item],
    cost: u64,
) -> ratewatch::store::StoreDecision {
    let batch = ratewatch::store::Batch::consume(items, cost);
    store.decide(&batch).await.expect("the store decides")
}

/// Peeks at `items` on `store`, panicking on a store error.
pub async fn peek(
    store: &dyn ratewatch::store::Store,
    items: &[ratewatch::store::Item],
) -> ratewatch::store::StoreDecision {
    let batch = ratewatch::store::Batch::peek(items);
    store.decide(&batch).await.expect("the store peeks")
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    // Cluster nodes also bind port + 10000; keep both in range.
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = l.local_addr().expect("local addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn require(binary: &str) -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(binary);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{binary}` is not installed: the Redis tests start real servers. \
         Install it with `apt-get install redis-server` (or run `.ci/run`, which installs it)."
    );
}

/// Runs `redis-cli -p port args...` and returns its stdout.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(require("redis-cli"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The count a window counter holds at `key` on the server at `port`,
/// decoded from its record (`lua/common.lua`: a fixed window's 12 bytes, a
/// sliding window's 18 or 24, or the layouts before them), or `None` when
/// the key holds no window counter.
#[allow(dead_code)]
pub fn window_count(port: u16, key: &str) -> Option<u64> {
    const DECODE: &str = "local v = redis.pcall('GET', KEYS[1]) \
        if type(v) ~= 'string' then return nil end \
        local n, s, c = #v, nil, nil \
        if n == 12 then s, c = struct.unpack('>I7I5', v) \
        elseif n == 18 or n == 11 then s, c = struct.unpack('>I7I2I2', v) \
        elseif n == 24 or n == 17 then s, c = struct.unpack('>I7I5I5', v) end \
        return c";
    redis_cli(port, &["EVAL", DECODE, "1", key])
        .trim()
        .parse()
        .ok()
}

/// One `redis-server` process.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone node on a free port and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a standalone node on `port`.
    pub fn start_on(port: u16) -> Self {
        let mut s = Self {
            port,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            extra: Vec::new(),
        };
        s.spawn();
        s
    }

    /// Starts a node with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let mut s = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new(require("redis-server"))
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--enable-debug-command", "local"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        wait_for_ping(self.port);
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:port`, the shard label of decisions it serves.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs a redis-cli command against it.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// Calls of one command since the last `CONFIG RESETSTAT`, from
    /// `INFO commandstats` (`evalsha`, `eval`, `script|load` ...).
    pub fn command_calls(&self, command: &str) -> u64 {
        command_calls(self.port, command)
    }

    /// SIGKILL: the process dies without a word.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty: scripts and keys are gone).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the process freezes; connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// Calls of `command` on the node at `port` from `INFO commandstats`.
pub fn command_calls(port: u16, command: &str) -> u64 {
    let info = redis_cli(port, &["INFO", "commandstats"]);
    let needle = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn wait_for_ping(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if redis_cli(port, &["PING"]).trim() == "PONG" {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("redis-server on port {port} did not answer PING within 10 s");
}

/// A Redis Cluster of three masters (no replicas) on one machine.
pub struct RedisCluster {
    /// The masters.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled nodes, creates the cluster and waits for
    /// `cluster_state:ok` on every node.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
        let out = Command::new(require("redis-cli"))
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while !n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not reach state ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    /// `redis://127.0.0.1:port` of every master.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The master serving `key`.
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let out = self.nodes[0].cli(&["CLUSTER", "KEYSLOT", key]);
        let slot: u16 = out
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        let slots = self.nodes[0].cli(&["CLUSTER", "SLOTS"]);
        // redis-cli prints CLUSTER SLOTS flat: start, end, ip, port, id, ...
        let lines: Vec<&str> = slots.lines().map(str::trim).collect();
        let mut i = 0;
        while i + 3 < lines.len() {
            if let (Ok(start), Ok(end)) = (lines[i].parse::<u16>(), lines[i + 1].parse::<u16>()) {
                if (start..=end).contains(&slot) {
                    let port: u16 = lines[i + 3].parse().expect("port");
                    return self
                        .nodes
                        .iter()
                        .find(|n| n.port == port)
                        .expect("slot owner is one of our nodes");
                }
                i += 2;
            } else {
                i += 1;
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// Total calls of `command` over every master.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.command_calls(command)).sum()
    }
}

// ---------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------

/// One `prometheus` server on a free loopback port, scraping its targets and
/// evaluating its rule files every second, with its TSDB in a temporary
/// directory. Killed when dropped.
pub struct Prometheus {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`host:port`, path `/metrics`)
    /// as job `ratewatch`, with `rule_files` loaded, and waits until it is
    /// ready.
    pub fn start(targets: &[String], rule_files: &[PathBuf]) -> Self {
        let binary = require("prometheus");
        let dir = tempfile::tempdir().expect("temp dir");
        let quoted = |items: Vec<String>| {
            items
                .iter()
                .map(|s| format!("'{s}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: ratewatch\n    metrics_path: /metrics\n    \
             static_configs:\n      - targets: [{}]\n",
            quoted(rule_files.iter().map(|p| p.display().to_string()).collect()),
            quoted(targets.to_vec()),
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Self {
            port,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_status(port, "/-/ready") != Some(200) {
            assert!(
                Instant::now() < deadline,
                "prometheus on port {port} was not ready within 20 s; its log:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What Prometheus logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes a policy for a test to a temporary `ratewatch.toml` (removed
/// when dropped). Lines are numbered from the first line of `text`.
pub fn policy_file(text: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::Builder::new()
        .prefix("ratewatch-")
        .suffix(".toml")
        .tempfile()
        .expect("temp policy file");
    f.write_all(text.as_bytes()).expect("write the policy");
    f
}

/// Runs `ratewatch check-config FILE`: its exit code and what it printed
/// (stdout, then stderr).
pub fn check_config(file: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .arg("check-config")
        .arg(file)
        .env("RUST_LOG", "off")
        .output()
        .expect("run ratewatch check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The status code of `GET path` on 127.0.0.1:port, or `None` if nothing
/// answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

// ---------------------------------------------------------------------------

/// A `ratewatch` process (the crate's own binary) on a free loopback port,
/// killed when dropped.
pub struct Ratewatch {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Child,
    /// Its stderr (the log), when started with [`Ratewatch::start_logged`].
    log: Option<tempfile::NamedTempFile>,
}

impl Ratewatch {
    /// Runs `ratewatch <command> --config <config>` with `env` set, and
    /// waits until it listens.
    pub fn start(command: &str, config: Option<&Path>, env: &[(&str, &str)]) -> Self {
        Self::start_on("127.0.0.1", command, config, env)
    }

    /// Like [`Ratewatch::start`], listening on `host` (`"[::]"` for a
    /// dual-stack listener, which sees IPv4 peers as `::ffff:a.b.c.d`);
    /// clients still reach it on 127.0.0.1.
    pub fn start_on(
        host: &str,
        command: &str,
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(host, command, config, env, &[], None)
    }

    /// Like [`Ratewatch::start`], with extra arguments, keeping its log
    /// (`RUST_LOG=info`) for [`Ratewatch::log`].
    pub fn start_logged(
        command: &str,
        config: Option<&Path>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let log = tempfile::NamedTempFile::new().expect("log file");
        Self::spawn("127.0.0.1", command, config, env, args, Some(log))
    }

    fn spawn(
        host: &str,
        command: &str,
        config: Option<&Path>,
        env: &[(&str, &str)],
        args: &[&str],
        log: Option<tempfile::NamedTempFile>,
    ) -> Self {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ratewatch"));
        cmd.arg(command);
        // A machine's own REDIS_URL or PORT must not turn a test's server
        // into one of envoyproxy/ratelimit's environment.
        for var in ratewatch::policy::peer_env::TRIGGERS {
            cmd.env_remove(var);
        }
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        let stderr = match &log {
            Some(f) => Stdio::from(f.reopen().expect("reopen log")),
            None => Stdio::null(),
        };
        cmd.args(["--listen", &format!("{host}:{port}")])
            .args(args)
            .env("RUST_LOG", if log.is_some() { "info" } else { "warn" })
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().expect("start ratewatch");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "ratewatch did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { port, child, log }
    }

    /// What it logged so far (empty unless started with
    /// [`Ratewatch::start_logged`]).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f.path()).ok())
            .unwrap_or_default()
    }

    /// Sends it `signal` (`HUP`, `TERM` ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:port`, as a scrape target.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `within` for the process to exit: its exit status, or
    /// `None` if it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then waits for the graceful shutdown (which flushes telemetry).
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Ratewatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// Alert rules, Prometheus queries and headless Chromium, for the drills.
// ---------------------------------------------------------------------------

/// `dashboards/alerts.yml` of this checkout.
pub fn alerts_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/alerts.yml")
}

/// `(alert name, expr)` of every rule in `alerts.yml` (a line reader: the
/// file is ours; `expr:` is one line or a `|` block).
pub fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(alerts_file()).expect("alerts.yml");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut alert = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if let Some(name) = line.strip_prefix("- alert:") {
            alert = name.trim().to_string();
        } else if let Some(rest) = line.strip_prefix("expr:") {
            let rest = rest.trim();
            if rest == "|" || rest == "|-" {
                let indent = lines[i].len() - line.len();
                let mut block = Vec::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                out.push((alert.clone(), block.join("\n")));
            } else {
                out.push((alert.clone(), rest.to_string()));
            }
        }
        i += 1;
    }
    out
}

/// The expressions of the rules named `alert` (one per severity).
pub fn alert_expr(alert: &str) -> Vec<String> {
    let found: Vec<String> = alert_rules()
        .into_iter()
        .filter(|(a, _)| a == alert)
        .map(|(_, e)| e)
        .collect();
    assert!(!found.is_empty(), "no alert {alert} in alerts.yml");
    found
}

impl Prometheus {
    /// The result vector of an instant query (`data.result`), panicking
    /// if Prometheus refuses the expression.
    pub async fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let v: serde_json::Value = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url()))
            .query(&[("query", expr)])
            .send()
            .await
            .expect("prometheus answers")
            .json()
            .await
            .expect("json");
        assert_eq!(v["status"], "success", "{expr}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

/// The installed Chromium binary.
pub fn chromium() -> &'static str {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("chromium is not installed: `apt-get install chromium` (or run .ci/test.sh)")
}

fn chromium_command(virtual_ms: u64) -> (Command, tempfile::TempDir) {
    let profile = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!("--virtual-time-budget={virtual_ms}"))
    .arg(format!("--user-data-dir={}", profile.path().display()));
    (cmd, profile)
}

/// The DOM of `url` after its scripts ran for `virtual_ms` of virtual
/// time, and what the page logged.
pub fn dump_dom(url: &str, virtual_ms: u64) -> (String, String) {
    let (mut cmd, _profile) = chromium_command(virtual_ms);
    let out = cmd
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A `width`x`height` PNG of `url` after its scripts ran.
pub fn screenshot(url: &str, file: &Path, width: u32, height: u32) {
    let (mut cmd, _profile) = chromium_command(3_000);
    let out = cmd
        .arg(format!("--screenshot={}", file.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        file.is_file(),
        "chromium took no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `GET url` as JSON; `None` when the server cannot be reached or does not
/// answer JSON (for [`eventually`] loops; `.expect` it elsewhere).
pub async fn get_json(client: &reqwest::Client, url: &str) -> Option<serde_json::Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}

/// Polls `probe` every 50 ms until it returns `Some`, for at most
/// `within`; panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
