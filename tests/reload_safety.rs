//! A policy is applied only whole and only as validated: a file cut short,
//! a FIFO or `/dev/zero` at the policy path, and a SIGHUP in the middle of
//! a slow rewrite never lift a limit nor stall the server; a limiter built
//! from a file follows it (a ConfigMap's `..data` symlink swap included)
//! in the library, and stops following when told or dropped.
#![cfg(target_os = "linux")]

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratewatch::identity::IdentityKind;
use ratewatch::{Follow, Identity, Limiter, Policy};

/// A policy laid out like the shipped `ratewatch.toml`: a keyed tier, the
/// anonymous tier last, then the routes (an export that fails closed).
fn policy(version: &str, anonymous_burst: u64) -> String {
    format!(
        r#"version = "{version}"

[store]
kind = "memory"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  {{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 0.001 }},
  {{ name = "minute", algorithm = "sliding_window", limit = 200, window = "60s" }},
]

[[tiers]]
name = "anonymous"
limits = [
  {{ name = "burst", algorithm = "token_bucket", capacity = {anonymous_burst}, refill_per_second = 0.001 }},
]

[[routes]]
method = "POST"
path = "/api/export"
cost = 2
on_store_failure = "closed"
"#
    )
}

/// `text` cut right after the last tier's `name` line, as a non-atomic
/// write or a full disk leaves it: the tier's limits, the routes and the
/// fail-closed export rule are gone, and what is left parses.
fn truncated(text: &str) -> String {
    let at = text
        .find("name = \"anonymous\"\n")
        .expect("the anonymous tier");
    text[..at + "name = \"anonymous\"\n".len()].to_owned()
}

/// Allowed requests of `n` anonymous ones from one IP.
async fn anonymous_allowed(limiter: &Limiter, ip: &str, n: usize) -> usize {
    let caller = Identity::new(IdentityKind::Ip, ip);
    let mut allowed = 0;
    for _ in 0..n {
        if limiter.check(&caller, "anonymous", None).await.allowed {
            allowed += 1;
        }
    }
    allowed
}

#[tokio::test]
async fn a_truncated_policy_is_refused_and_the_old_limits_hold() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    let full = policy("a", 3);
    std::fs::write(&file, &full).unwrap();
    let limiter = Limiter::from_config_file(&file).await.unwrap();
    let cut = truncated(&full);
    std::fs::write(&file, &cut).unwrap();
    let err = limiter
        .reload()
        .expect_err("a tier cut before its limits is refused");
    let message = err.to_string();
    assert!(message.contains("tiers[1].limits"), "{message}");
    assert!(message.contains("ratewatch.toml"), "{message}");
    // The anonymous limit of the policy in force still holds: 3 of 20.
    assert_eq!(anonymous_allowed(&limiter, "192.0.2.7", 20).await, 3);
    let status = limiter.policy_status();
    assert!(status.reloads_failed >= 1, "{status:?}");
    assert_eq!(status.version, "a");
    let last = status.last_reload.expect("the attempt is shown");
    assert!(!last.ok);
    // The routes survive too: the export still fails closed at cost 2.
    let policy = limiter.policy();
    let export = &policy.routes[0];
    assert_eq!((export.path.as_str(), export.cost), ("/api/export", 2));
    assert_eq!(
        export.on_store_failure,
        Some(ratewatch::policy::FailurePolicy::Closed)
    );
}

#[test]
fn a_tier_without_limits_is_a_config_error_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cut.toml");
    let cut = truncated(&policy("a", 3));
    std::fs::write(&file, &cut).unwrap();
    let err = Policy::from_toml_file(&file).expect_err("a tier without limits");
    assert_eq!(err.field(), Some("tiers[1].limits"), "{err}");
    let tier_lines: Vec<usize> = cut
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with("[[tiers]]") || l.starts_with("name = \"anonymous\""))
        .map(|(i, _)| i + 1)
        .collect();
    let line = err.line().expect("a line");
    assert!(
        tier_lines[1..].contains(&line),
        "line {line} is not the anonymous tier's ({tier_lines:?}): {err}"
    );
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}:{line}:", file.display())),
        "{shown}"
    );
    assert!(shown.contains("unlimited = true"), "{shown}");

    // Saying so explicitly is accepted, and contradicting limits are not.
    let unlimited = cut.replace(
        "name = \"anonymous\"\n",
        "name = \"anonymous\"\nunlimited = true\n",
    );
    let p = Policy::from_toml_str(&unlimited, Some("unlimited.toml")).expect("declared unlimited");
    assert!(p.tiers[1].unlimited && p.tiers[1].limits.is_empty());
    let both = policy("a", 3).replace(
        "name = \"anonymous\"\n",
        "name = \"anonymous\"\nunlimited = true\n",
    );
    let err = Policy::from_toml_str(&both, Some("both.toml")).expect_err("limits and unlimited");
    assert_eq!(err.field(), Some("tiers[1].unlimited"), "{err}");
}

#[test]
fn check_config_rejects_the_truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, truncated(&policy("a", 3))).unwrap();
    let (code, out) = support::check_config(&file);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("tiers[1].limits"), "{out}");
    assert!(out.contains(&file.display().to_string()), "{out}");
}

// ---------------------------------------------------------------------------
// The real binary.
// ---------------------------------------------------------------------------

/// `ratewatch serve --config FILE` on a free port, killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(config: &Path, args: &[&str]) -> Self {
        let port = support::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ratewatch");
        let server = Self { child, port };
        wait_for(
            Duration::from_secs(20),
            "the server answers /health",
            || (server.get("/health")?.0 == 200).then_some(()),
        );
        server
    }

    /// `GET path` over HTTP/1.0: status and body, or `None` if nothing
    /// answered within two seconds.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.get(9..12)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Some((status, body))
    }

    /// The value of one series of `/metrics`, 0 if absent.
    fn metric(&self, series: &str) -> f64 {
        let (_, text) = self.get("/metrics").expect("/metrics answers");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    fn reloads(&self, result: &str) -> f64 {
        self.metric(&format!(
            "ratewatch_config_reloads_total{{result=\"{result}\"}}"
        ))
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal}");
    }

    /// Resident memory in KiB, from /proc.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// SIGTERM, and whether it exited within `within`.
    fn terminates_within(&mut self, within: Duration) -> bool {
        self.signal("TERM");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.child.try_wait().expect("try_wait").is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `probe` every 50 ms until it answers, for at most `within`.
fn wait_for<T>(within: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success());
}

/// /health answers ten times in a row, each within the client's bound.
fn keeps_answering(server: &Server, while_: &str) {
    for _ in 0..10 {
        assert_eq!(
            server.get("/health").map(|(s, _)| s),
            Some(200),
            "/health stopped answering {while_}"
        );
    }
}

#[test]
fn a_fifo_or_dev_zero_at_the_policy_path_never_stalls_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, policy("a", 3)).unwrap();
    let mut server = Server::start(
        &file,
        &["--reload-poll-ms", "100", "--reload-settle-ms", "100"],
    );
    let before = server.rss_kib();

    // A FIFO nobody writes: opening it for reading would wait forever.
    std::fs::remove_file(&file).unwrap();
    mkfifo(&file);
    wait_for(Duration::from_secs(20), "the FIFO is refused", || {
        (server.reloads("error") >= 1.0).then_some(())
    });
    keeps_answering(&server, "with a FIFO at the policy path");
    server.signal("HUP");
    wait_for(
        Duration::from_secs(20),
        "SIGHUP refuses the FIFO too",
        || (server.reloads("error") >= 2.0).then_some(()),
    );
    keeps_answering(&server, "after a SIGHUP with a FIFO at the policy path");

    // /dev/zero never ends: reading it whole would take all memory.
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
    wait_for(Duration::from_secs(20), "/dev/zero is refused", || {
        (server.reloads("error") >= 3.0).then_some(())
    });
    server.signal("HUP");
    wait_for(
        Duration::from_secs(20),
        "SIGHUP refuses /dev/zero too",
        || (server.reloads("error") >= 4.0).then_some(()),
    );
    keeps_answering(&server, "with /dev/zero at the policy path");
    let after = server.rss_kib();
    assert!(
        after < before + 64 * 1024,
        "memory grew from {before} KiB to {after} KiB"
    );
    assert_eq!(server.reloads("ok"), 0.0);
    // The policy in force still limits: 3 anonymous requests, then 429.
    let statuses: Vec<u16> = (0..5)
        .map(|_| server.get("/api/users").expect("answers").0)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);

    // And a FIFO again, then SIGTERM: the server still stops.
    std::fs::remove_file(&file).unwrap();
    mkfifo(&file);
    server.signal("HUP");
    assert!(
        server.terminates_within(Duration::from_secs(15)),
        "SIGTERM did not stop the server with a FIFO at the policy path"
    );
}

/// The hash of `text`'s policy, as `ratewatch_policy_info` labels it.
fn hash_of(text: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let policy = Policy::from_toml_str(text, None).unwrap();
        let limiter = Limiter::new(policy).await.unwrap();
        let hash = limiter.policy_status().hash;
        limiter.shutdown().await;
        hash
    })
}

#[test]
fn a_sighup_during_a_slow_rewrite_never_applies_the_half() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, policy("a", 3)).unwrap();
    // SIGHUP only: the reload it starts is the only one that can happen.
    let server = Server::start(
        &file,
        &["--reload-poll-ms", "0", "--reload-settle-ms", "1000"],
    );
    // The new policy, with more tiers so that many of its prefixes parse.
    let mut next = policy("b", 30);
    for tier in ["bronze", "silver", "gold"] {
        next.push_str(&format!(
            "\n[[tiers]]\nname = \"{tier}\"\nmatch_prefix = \"{tier}_\"\nlimits = [\n  \
             {{ name = \"burst\", algorithm = \"token_bucket\", capacity = 10, refill_per_second = 1 }},\n]\n"
        ));
    }
    let expected = hash_of(&next);
    let lines: Vec<String> = next.lines().map(|l| format!("{l}\n")).collect();
    let written = Arc::new(AtomicUsize::new(0));
    // A writer that rewrites the file in place, a line every 30 ms (a
    // slow disk, a copy over the network), never pausing near the settle
    // interval.
    let writer = {
        let (file, lines, written) = (file.clone(), lines.clone(), written.clone());
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(&file).unwrap();
            for line in &lines {
                f.write_all(line.as_bytes()).unwrap();
                written.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(30));
            }
        })
    };
    wait_for(Duration::from_secs(20), "half the file is written", || {
        (written.load(Ordering::SeqCst) >= lines.len() / 2).then_some(())
    });
    server.signal("HUP");
    writer.join().unwrap();
    let info = format!("ratewatch_policy_info{{version=\"b\",hash=\"{expected}\"}}");
    wait_for(
        Duration::from_secs(30),
        "the whole new file applies once written",
        || (server.metric(&info) == 1.0).then_some(()),
    );
    assert_eq!(
        (server.reloads("ok"), server.reloads("error")),
        (1.0, 0.0),
        "exactly one reload, of the whole file"
    );
}

// ---------------------------------------------------------------------------
// Following the file in the library.
// ---------------------------------------------------------------------------

/// A ConfigMap volume as the kubelet lays it out: the file is a symlink
/// into `..data`, itself a symlink to a timestamped directory; an update
/// writes a new directory and renames a new `..data` link over the old.
struct ConfigMapDir {
    root: tempfile::TempDir,
    generation: usize,
}

impl ConfigMapDir {
    fn new(text: &str) -> Self {
        let mut dir = Self {
            root: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        dir.update(text);
        std::os::unix::fs::symlink("..data/ratewatch.toml", dir.file()).unwrap();
        dir
    }

    fn file(&self) -> PathBuf {
        self.root.path().join("ratewatch.toml")
    }

    fn update(&mut self, text: &str) {
        self.generation += 1;
        let name = format!("..2026_12_01_{}", self.generation);
        let data = self.root.path().join(&name);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("ratewatch.toml"), text).unwrap();
        let tmp = self.root.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.path().join("..data")).unwrap();
        if self.generation > 1 {
            let old = format!("..2026_12_01_{}", self.generation - 1);
            std::fs::remove_dir_all(self.root.path().join(old)).unwrap();
        }
    }
}

#[tokio::test]
async fn a_configmap_symlink_swap_is_followed_by_a_limiter_built_from_the_file() {
    let mut dir = ConfigMapDir::new(&policy("a", 3));
    let limiter = Limiter::from_config_file(dir.file()).await.unwrap();
    assert_eq!(anonymous_allowed(&limiter, "192.0.2.1", 10).await, 3);
    dir.update(&policy("b", 30));
    support::eventually(Duration::from_secs(20), "the swap applies b", || {
        let version = limiter.policy_status().version;
        async move { (version == "b").then_some(()) }
    })
    .await;
    // The new limit decides.
    assert_eq!(anonymous_allowed(&limiter, "192.0.2.2", 40).await, 30);
    assert_eq!(limiter.policy_status().reloads_ok, 1);
    // An atomic replace (rename over the file's target) is followed too.
    let target = std::fs::canonicalize(dir.file()).unwrap();
    let tmp = target.with_extension("tmp");
    std::fs::write(&tmp, policy("c", 30)).unwrap();
    std::fs::rename(&tmp, &target).unwrap();
    support::eventually(Duration::from_secs(20), "the rename applies c", || {
        let version = limiter.policy_status().version;
        async move { (version == "c").then_some(()) }
    })
    .await;
    limiter.shutdown().await;
}

#[tokio::test]
async fn following_can_be_turned_off_and_stops_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, policy("a", 3)).unwrap();
    let quick = Follow::every(Duration::from_millis(20)).settle(Duration::from_millis(20));
    let followed = Limiter::builder_from_file(&file)
        .await
        .unwrap()
        .with_follow(quick)
        .build()
        .await
        .unwrap();
    let off = Limiter::builder_from_file(&file)
        .await
        .unwrap()
        .with_follow(Follow::off())
        .build()
        .await
        .unwrap();
    let stopped = Limiter::builder_from_file(&file)
        .await
        .unwrap()
        .with_follow(quick)
        .build()
        .await
        .unwrap();
    stopped.shutdown().await;
    std::fs::write(&file, policy("b", 30)).unwrap();
    support::eventually(
        Duration::from_secs(20),
        "the followed limiter applies b",
        || {
            let version = followed.policy_status().version;
            async move { (version == "b").then_some(()) }
        },
    )
    .await;
    // Let the followed one poll some more times, so the others had every
    // chance to see the file too.
    let seen = followed.policy_status().applied_at_unix;
    std::fs::write(&file, policy("c", 30)).unwrap();
    support::eventually(
        Duration::from_secs(20),
        "the followed limiter applies c",
        || {
            let version = followed.policy_status().version;
            async move { (version == "c").then_some(()) }
        },
    )
    .await;
    assert!(followed.policy_status().applied_at_unix >= seen);
    for limiter in [&off, &stopped] {
        let status = limiter.policy_status();
        assert_eq!((status.version.as_str(), status.reloads_ok), ("a", 0));
    }
    // Off means off for the file only: an explicit reload still applies.
    assert!(off.reload().unwrap().changed);
    assert_eq!(off.policy_status().version, "c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_limiter_leaves_no_follower_running() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    // The limiter's other tasks end at their next tick once it is gone:
    // the telemetry flush (here hourly) and the memory store's sweep
    // (every 10 s). The follower polls hourly too: only stopping with the
    // limiter can end it within the bound below.
    let text = format!(
        "{}\n[telemetry]\nflush_interval_ms = 3600000\n",
        policy("a", 3)
    );
    std::fs::write(&file, text).unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let limiter = Limiter::builder_from_file(&file)
        .await
        .unwrap()
        .with_follow(Follow::every(Duration::from_secs(3600)))
        .build()
        .await
        .unwrap();
    let running = metrics.num_alive_tasks();
    drop(limiter);
    support::eventually(
        Duration::from_secs(5),
        "the follower ends with its limiter",
        || {
            let alive = metrics.num_alive_tasks();
            async move { (alive < running).then_some(()) }
        },
    )
    .await;
}
