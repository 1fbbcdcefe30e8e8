//! Every file a policy names (its envoyproxy/ratelimit YAML files, the
//! hash secret file, the TLS CA file) is read like the policy file itself:
//! a FIFO, a device, a directory or an oversized file is refused by name,
//! at once, by `check-config` and by the real server, which keeps serving
//! and still stops on SIGTERM. A large YAML file loads in bounded time.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ratewatch::policy::Policy;
use support::Ratewatch;

const EDGE_YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 60\n";

/// A generous bound for anything that must not wait at all.
const PROMPT: Duration = Duration::from_secs(20);

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Runs the binary with `args`, killing it after `within`: its exit code
/// (`None` if it had to be killed) and its output.
fn run(args: &[&str], within: Duration) -> (Option<i32>, String) {
    let out = tempfile::NamedTempFile::new().expect("output file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .args(args)
        .env("RUST_LOG", "off")
        .stdout(Stdio::from(out.reopen().expect("reopen")))
        .stderr(Stdio::from(out.reopen().expect("reopen")))
        .spawn()
        .expect("start ratewatch");
    let deadline = Instant::now() + within;
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        code,
        std::fs::read_to_string(out.path()).unwrap_or_default(),
    )
}

/// A policy directory whose `ratewatch.toml` holds `toml`.
fn policy(toml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ratewatch.toml");
    std::fs::write(&path, toml).expect("write policy");
    (dir, path)
}

fn check(path: &Path) -> (Option<i32>, String) {
    run(&["check-config", path.to_str().unwrap()], PROMPT)
}

fn assert_refused(path: &Path, names: &str, why: &str) {
    let (code, out) = check(path);
    assert_eq!(code, Some(2), "check-config did not refuse promptly: {out}");
    assert!(out.contains(names), "names {names}: {out}");
    assert!(out.contains(why), "says {why}: {out}");
}

#[test]
fn check_config_refuses_a_yaml_fifo_or_device_at_once_by_name_even_through_a_glob() {
    let (dir, path) = policy("[rls]\nenvoy_configs = [\"edge.yaml\"]\n");
    let yaml = dir.path().join("edge.yaml");
    mkfifo(&yaml);
    assert_refused(&path, "edge.yaml", "not a regular file");

    std::fs::write(&path, "[rls]\nenvoy_configs = [\"/dev/zero\"]\n").unwrap();
    assert_refused(&path, "/dev/zero", "not a regular file");

    // A glob that picks the FIFO is refused too, not skipped.
    std::fs::write(&path, "[rls]\nenvoy_configs = [\"*.yaml\"]\n").unwrap();
    assert_refused(&path, "edge.yaml", "not a regular file");
}

#[test]
fn check_config_refuses_an_oversized_yaml_naming_the_cap() {
    let (dir, path) = policy("[rls]\nenvoy_configs = [\"edge.yaml\"]\n");
    let mut text = EDGE_YAML.to_owned();
    let pad = "#".repeat(1023) + "\n";
    while (text.len() as u64) <= ratewatch::policy::MAX_RULE_FILE_BYTES {
        text.push_str(&pad);
    }
    std::fs::write(dir.path().join("edge.yaml"), text).unwrap();
    assert_refused(&path, "edge.yaml", "larger than 16777216 bytes");
}

#[test]
fn check_config_refuses_a_hash_secret_file_or_tls_ca_file_serve_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("secret");
    mkfifo(&fifo);
    let path = dir.path().join("ratewatch.toml");
    let tiers = "[[tiers]]\nname = \"free\"\nunlimited = true\n[[tiers]]\nname = \"anonymous\"\nunlimited = true\n";
    for (setting, file) in [
        ("[identity]\nhash_secret_file", fifo.display().to_string()),
        ("[identity]\nhash_secret_file", "/dev/zero".to_owned()),
        (
            "[identity]\nhash_secret_file",
            dir.path().display().to_string(),
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"rediss://127.0.0.1:1\"\ntls_ca_file",
            fifo.display().to_string(),
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"rediss://127.0.0.1:1\"\ntls_ca_file",
            "/dev/zero".to_owned(),
        ),
    ] {
        std::fs::write(&path, format!("{setting} = \"{file}\"\n{tiers}")).unwrap();
        assert_refused(&path, &file, "not a regular file");
    }
    // And a secret file too short to be one, as the server says.
    let short = dir.path().join("short");
    std::fs::write(&short, "short\n").unwrap();
    std::fs::write(
        &path,
        format!(
            "[identity]\nhash_secret_file = \"{}\"\n{tiers}",
            short.display()
        ),
    )
    .unwrap();
    assert_refused(&path, "identity.hash_secret_file", "at least 16 bytes");
}

#[test]
fn serve_refuses_to_start_on_a_yaml_fifo_device_oversized_file_or_empty_directory_at_once() {
    let (dir, path) = policy("");
    mkfifo(&dir.path().join("fifo.yaml"));
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let big = dir.path().join("big.yaml");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(ratewatch::policy::MAX_RULE_FILE_BYTES + 1)
        .unwrap();
    for (entry, why) in [
        ("fifo.yaml", "not a regular file"),
        ("/dev/zero", "not a regular file"),
        ("big.yaml", "larger than"),
        ("empty", "without any *.yaml"),
    ] {
        std::fs::write(&path, format!("[rls]\nenvoy_configs = [\"{entry}\"]\n")).unwrap();
        let port = support::free_port().to_string();
        let (code, out) = run(
            &[
                "serve",
                "--config",
                path.to_str().unwrap(),
                "--listen",
                &format!("127.0.0.1:{port}"),
            ],
            PROMPT,
        );
        assert_eq!(
            code,
            Some(2),
            "serve did not refuse {entry} promptly: {out}"
        );
        assert!(out.contains(entry) && out.contains(why), "{entry}: {out}");
    }
}

#[test]
fn a_yaml_swapped_for_a_fifo_is_refused_and_sigterm_still_stops_the_server() {
    let (dir, path) = policy("version = \"1\"\n[rls]\nenvoy_configs = [\"edge.yaml\"]\n");
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, EDGE_YAML).unwrap();
    let server = Ratewatch::start_logged(
        "serve",
        Some(&path),
        &[],
        &["--reload-poll-ms", "50", "--reload-settle-ms", "100"],
    );
    // A FIFO renamed over the YAML, and the policy edited so that even a
    // server following only the policy file reloads.
    let fifo = dir.path().join("swap.fifo");
    mkfifo(&fifo);
    std::fs::rename(&fifo, &yaml).unwrap();
    std::fs::write(
        &path,
        "version = \"2\"\n[rls]\nenvoy_configs = [\"edge.yaml\"]\n",
    )
    .unwrap();
    let deadline = Instant::now() + PROMPT;
    while !server.log().contains("not a regular file") {
        assert!(
            Instant::now() < deadline,
            "the reload never refused the FIFO: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.log().contains("edge.yaml"), "{}", server.log());
    let health = http_get::status(&format!("{}/health", server.url()));
    assert_eq!(health, Some(200), "the server keeps serving");
    let started = Instant::now();
    server.stop();
    assert!(
        started.elapsed() < PROMPT,
        "SIGTERM took {:?}",
        started.elapsed()
    );
}

/// A tiny blocking GET: the status code, or `None`.
mod http_get {
    pub fn status(url: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let rest = url.strip_prefix("http://")?;
        let (host, path) = rest.split_once('/')?;
        let mut s = std::net::TcpStream::connect(host).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .ok()?;
        write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    }
}

#[test]
fn a_yaml_of_several_megabytes_loads_in_bounded_time() {
    // Over a hundred thousand descriptors at one level: a check of each
    // against every earlier one took many minutes.
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::from("domain: big\ndescriptors:\n");
    let mut i = 0;
    while yaml.len() < 3 * 1024 * 1024 {
        yaml.push_str(&format!("  - {{key: k, value: v{i}}}\n"));
        i += 1;
    }
    yaml.push_str(
        "  - key: k\n    value: last\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
    );
    std::fs::write(dir.path().join("big.yaml"), &yaml).unwrap();
    let path = dir.path().join("ratewatch.toml");
    std::fs::write(&path, "[rls]\nenvoy_configs = [\"big.yaml\"]\n").unwrap();
    let started = Instant::now();
    let policy = Policy::from_toml_file(&path).expect("loads");
    let took = started.elapsed();
    let big = policy.rls.domains.domain("big").unwrap();
    assert!(big.find(&[("k", "last")]).is_some());
    assert!(big.find(&[("k", "v0")]).is_none());
    assert!(i > 100_000, "{i} descriptors");
    // Linear loading takes seconds unoptimised on a loaded machine.
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

#[test]
fn aliases_that_expand_a_small_yaml_into_millions_of_nodes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..8 {
        let prev = format!("*a{}", i - 1);
        yaml.push_str(&format!(
            "a{i}: &a{i} [{}]\n",
            [prev.as_str(); 10].join(", ")
        ));
    }
    yaml.push_str("domain: bomb\n");
    std::fs::write(dir.path().join("bomb.yaml"), &yaml).unwrap();
    let path = dir.path().join("ratewatch.toml");
    std::fs::write(&path, "[rls]\nenvoy_configs = [\"bomb.yaml\"]\n").unwrap();
    let started = Instant::now();
    let err = Policy::from_toml_file(&path).unwrap_err().to_string();
    assert!(err.contains("bomb.yaml") && err.contains("nodes"), "{err}");
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
}
