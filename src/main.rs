//! `ratewatch`: serve the limiter, run the demo, or check a config file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ratewatch::policy::Policy;
use ratewatch::{Follow, Limiter, server};

mod envoy_env;

/// The policy served when no `--config` is given: the memory store.
const DEFAULT_CONFIG: &str = include_str!("../ratewatch.toml");

#[derive(Parser)]
#[command(
    name = "ratewatch",
    version,
    about = "Observable rate limiting for web services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the demo API behind the limiter, with /metrics and /dashboard.
    Serve(ServeArgs),
    /// Serve, and send built-in traffic through the limiter so the dashboard fills.
    Demo(ServeArgs),
    /// Validate a policy file; errors name the field and the line.
    CheckConfig {
        /// The TOML policy.
        file: PathBuf,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Policy file (default: the built-in policy on the memory store).
    #[arg(long, env = "RATEWATCH_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080, or HOST:PORT in
    /// envoyproxy/ratelimit's environment].
    #[arg(long, env = "RATEWATCH_LISTEN")]
    listen: Option<SocketAddr>,
    /// Serve Envoy's rate limit service (gRPC, h2c) and gRPC health on this
    /// address (off unless given).
    #[arg(long, env = "RATEWATCH_GRPC_LISTEN")]
    grpc_listen: Option<SocketAddr>,
    /// Serve the dashboard, /metrics and the demo API on this address; the
    /// --listen port then serves only the decision service and health.
    #[arg(long, env = "RATEWATCH_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// How often the policy file is checked for changes (one stat), in
    /// milliseconds (0: reload on SIGHUP only).
    #[arg(long, env = "RATEWATCH_RELOAD_POLL_MS", default_value_t = 1000)]
    reload_poll_ms: u64,
    /// How long a changed policy file must hold still before it is
    /// applied, in milliseconds (SIGHUP waits for it too).
    #[arg(long, env = "RATEWATCH_RELOAD_SETTLE_MS", default_value_t = 500)]
    reload_settle_ms: u64,
    /// After SIGTERM, how long both ports keep serving while /ready fails,
    /// in milliseconds, before they close.
    #[arg(long, env = "RATEWATCH_DRAIN_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(..=3_600_000))]
    drain_ms: u64,
    /// Most connections open at once on the HTTP port (overrides
    /// `[server] max_connections`).
    #[arg(long, env = "RATEWATCH_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: Option<u64>,
    /// HTTP port: the request head must arrive within this many
    /// milliseconds (overrides `[server] header_read_timeout_ms`).
    #[arg(long, env = "RATEWATCH_HEADER_READ_TIMEOUT_MS",
          value_parser = clap::value_parser!(u64).range(1..=864_000_000))]
    header_read_timeout_ms: Option<u64>,
    /// HTTP port: a keep-alive connection idle this many milliseconds is
    /// closed (overrides `[server] idle_timeout_ms`).
    #[arg(long, env = "RATEWATCH_IDLE_TIMEOUT_MS",
          value_parser = clap::value_parser!(u64).range(1..=864_000_000))]
    idle_timeout_ms: Option<u64>,
    /// Serve TLS on the HTTP and gRPC ports with this certificate chain
    /// (PEM, leaf first; overrides `[server] tls_cert_file`).
    #[arg(long, env = "RATEWATCH_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert (overrides `[server]
    /// tls_key_file`).
    #[arg(long, env = "RATEWATCH_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA of this PEM bundle
    /// (mutual TLS; overrides `[server] tls_client_ca_file`).
    #[arg(long, env = "RATEWATCH_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
}

impl ServeArgs {
    /// The command line's overrides of `[server]`, applied to the policy
    /// at start and at every reload.
    fn server_overrides(&self) -> impl Fn(Policy) -> Policy + Send + Sync + 'static {
        let (max, header, idle) = (
            self.max_connections,
            self.header_read_timeout_ms,
            self.idle_timeout_ms,
        );
        let (cert, key, client_ca) = (
            self.tls_cert.clone(),
            self.tls_key.clone(),
            self.tls_client_ca.clone(),
        );
        move |mut p: Policy| {
            if let (Some(c), Some(k)) = (&cert, &key) {
                p.server.tls_cert_file = Some(c.clone());
                p.server.tls_key_file = Some(k.clone());
            }
            if let Some(ca) = &client_ca {
                p.server.tls_client_ca_file = Some(ca.clone());
            }
            if let Some(n) = max {
                p.server.max_connections = n as usize;
            }
            if let Some(ms) = header {
                p.server.header_read_timeout = Duration::from_millis(ms);
            }
            if let Some(ms) = idle {
                p.server.idle_timeout = Duration::from_millis(ms);
            }
            p
        }
    }
}

/// `RATEWATCH_LOG_FORMAT=json`: every log line one JSON object.
const LOG_FORMAT_VAR: &str = "RATEWATCH_LOG_FORMAT";

fn main() -> ExitCode {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    // envoyproxy/ratelimit's `LOG_FORMAT` is honoured when ratewatch's own
    // variable is not set, so a Deployment that keeps its environment keeps
    // its JSON logs.
    let json = std::env::var(LOG_FORMAT_VAR)
        .or_else(|_| std::env::var("LOG_FORMAT"))
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("json"));
    // Colours only on a terminal (and not under NO_COLOR): a log file or a
    // collector gets no escape sequences.
    let ansi = !json
        && std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let output = if json {
        fmt.json()
            .flatten_event(true)
            .with_current_span(false)
            .boxed()
    } else {
        fmt.boxed()
    };
    // The Redis client library's warnings are held to one line per node
    // per interval: a lost cluster node otherwise writes hundreds a second.
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                envoy_env::log_filter()
                    .unwrap_or_else(|| "info,ratewatch=info".into())
                    .into()
            }),
        )
        .with(output.with_filter(ratewatch::server::ClientLogGate::default().json(json)))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Serve(args) => run(args, false, json),
        Command::Demo(args) => run(args, true, json),
    }
}

/// Validates `file` exactly as `serve` would load it (environment overrides
/// included, and every file it names read as `serve` reads them), so a
/// policy it accepts is one `serve` starts with.
fn check_config(file: &std::path::Path) -> ExitCode {
    let checked = load_policy(Some(file)).and_then(|p| {
        p.check_named_files()?;
        server::check_tls(&p.server)?;
        Ok(p)
    });
    match checked {
        Ok(p) => {
            println!(
                "{}: ok ({} tiers, {} routes)",
                file.display(),
                p.tiers.len(),
                p.routes.len()
            );
            // Descriptor domains limit on their own (an envoyproxy/ratelimit
            // migration has no tiers at all).
            if p.tiers.is_empty() && p.rls.domains.is_empty() {
                eprintln!("{}: warning: {NO_TIERS}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// What a policy without tiers means, said by `check-config` and `serve`:
/// an empty file is valid, and easy to deploy by mistake.
const NO_TIERS: &str = "the policy defines no tier, so it limits nothing: every request passes";

fn load_policy(config: Option<&std::path::Path>) -> Result<Policy, ratewatch::policy::ConfigError> {
    let policy = match config {
        Some(path) => Policy::from_toml_file(path)?,
        None => Policy::from_toml_str(DEFAULT_CONFIG, Some("<built-in ratewatch.toml>"))?,
    };
    policy.with_env()
}

/// Raises the soft limit of open files to the hard limit, so the
/// connection caps of `[server]` (not the operating system's default of
/// 1024 descriptors) decide when connections are refused; warns when the
/// caps exceed what the limit allows.
#[cfg(unix)]
// `rlim_t` is u64 on Linux, not on every Unix.
#[allow(clippy::unnecessary_cast)]
fn raise_open_file_limit(bounds: &ratewatch::policy::ServerSettings, grpc: bool, admin: bool) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    // Descriptors beside the connections: Redis, the policy files, logs.
    const RESERVE: u64 = 256;
    let wanted = bounds.max_connections as u64
        + if grpc {
            bounds.grpc_max_connections as u64
        } else {
            0
        }
        + if admin {
            bounds.max_connections as u64
        } else {
            0
        }
        + RESERVE;
    if lim.rlim_cur != libc::RLIM_INFINITY && (lim.rlim_cur as u64) < wanted {
        tracing::warn!(
            open_files = lim.rlim_cur as u64,
            wanted,
            "the open-file limit is below the connection caps of [server] (max_connections per HTTP listener, grpc_max_connections) + {RESERVE}: \
             connections beyond it are refused by the operating system; raise `ulimit -n` or lower the caps"
        );
    }
}

/// Says why `serve` cannot go on: a log line in the JSON format, else the
/// message alone (as `check-config` prints it).
fn fail(json: bool, message: impl std::fmt::Display) {
    if json {
        tracing::error!("{message}");
    } else {
        eprintln!("{message}");
    }
}

fn run(args: ServeArgs, demo: bool, json: bool) -> ExitCode {
    // envoyproxy/ratelimit's environment, when no policy file is given.
    let peer = match envoy_env::settings(args.config.is_some()) {
        Ok(p) => p,
        Err(e) => {
            fail(json, e);
            return ExitCode::from(2);
        }
    };
    let overrides = args.server_overrides();
    let loaded = match &peer {
        Some(p) => p.policy().and_then(Policy::with_env),
        None => load_policy(args.config.as_deref()),
    };
    let policy = match loaded {
        Ok(p) => overrides(p),
        Err(e) => {
            fail(json, e);
            return ExitCode::from(2);
        }
    };
    // The TLS files are read now, so a bad one stops the start with its
    // name (as a policy error does), before any port is bound.
    if let Err(e) = server::check_tls(&policy.server) {
        fail(json, e);
        return ExitCode::from(2);
    }
    let listen = args
        .listen
        .or(peer.as_ref().map(|p| p.listen))
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)));
    let grpc_listen = args.grpc_listen.or(peer.as_ref().map(|p| p.grpc_listen));
    if policy.tiers.is_empty() && policy.rls.domains.is_empty() {
        tracing::warn!("{NO_TIERS}");
    }
    #[cfg(unix)]
    raise_open_file_limit(
        &policy.server,
        grpc_listen.is_some(),
        args.admin_listen.is_some(),
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            fail(json, format_args!("cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let mut builder = Limiter::builder(policy);
        if let Some(file) = &args.config {
            // The environment's overrides apply to every reload too, so a
            // reload does not report them as changed settings. The library
            // follows the file and, installed before the server listens,
            // answers SIGHUP (whose default action would end the process).
            let follow = Follow::every(Duration::from_millis(args.reload_poll_ms))
                .settle(Duration::from_millis(args.reload_settle_ms));
            builder = builder
                .with_source_file(file)
                .with_policy_adjust(move |p| p.with_env().map(&overrides))
                .with_follow(follow);
            #[cfg(unix)]
            {
                builder = builder.reload_on_sighup();
            }
        } else if let Some(p) = &peer {
            builder = envoy_env::follow(builder, p, args.reload_poll_ms, args.reload_settle_ms);
        }
        let limiter = builder.build().await?;
        #[cfg(unix)]
        if args.config.is_none() && peer.is_none() {
            // No file to reload, but a SIGHUP must not end the server.
            let mut hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
            tokio::spawn(async move {
                while hangup.recv().await.is_some() {
                    tracing::warn!(
                        "SIGHUP: no policy file to reload (serving the built-in policy)"
                    );
                }
            });
        }
        let traffic = demo.then(|| server::spawn_demo_traffic(server::app(limiter.clone())));
        let options = server::ServeOptions {
            listen,
            grpc: grpc_listen,
            drain: Duration::from_millis(args.drain_ms),
            admin: args.admin_listen,
        };
        let served = server::run(limiter, options).await;
        if let Some(t) = traffic {
            t.abort();
        }
        served.map_err(ratewatch::Error::from)
    });
    // Nothing left may hold the exit back (a task stuck on a frozen store).
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fail(json, format_args!("ratewatch: {e}"));
            ExitCode::FAILURE
        }
    }
}
