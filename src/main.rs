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
    /// How often the policy file is checked for changes (one stat), in
    /// milliseconds (0: reload on SIGHUP only).
    #[arg(long, env = "RATEWATCH_RELOAD_POLL_MS", default_value_t = 1000)]
    reload_poll_ms: u64,
    /// How long a changed policy file must hold still before it is
    /// applied, in milliseconds (SIGHUP waits for it too).
    #[arg(long, env = "RATEWATCH_RELOAD_SETTLE_MS", default_value_t = 500)]
    reload_settle_ms: u64,
}

fn main() -> ExitCode {
    use tracing_subscriber::prelude::*;
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
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(ratewatch::server::ClientLogGate::default()),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Serve(args) => run(args, false),
        Command::Demo(args) => run(args, true),
    }
}

/// Validates `file` exactly as `serve` would load it (environment overrides
/// included, and every file it names read as `serve` reads them), so a
/// policy it accepts is one `serve` starts with.
fn check_config(file: &std::path::Path) -> ExitCode {
    let checked = load_policy(Some(file)).and_then(|p| p.check_named_files().map(|()| p));
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

fn run(args: ServeArgs, demo: bool) -> ExitCode {
    // envoyproxy/ratelimit's environment, when no policy file is given.
    let peer = match envoy_env::settings(args.config.is_some()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let loaded = match &peer {
        Some(p) => p.policy().and_then(Policy::with_env),
        None => load_policy(args.config.as_deref()),
    };
    let policy = match loaded {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let listen = args
        .listen
        .or(peer.as_ref().map(|p| p.listen))
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)));
    let grpc_listen = args.grpc_listen.or(peer.as_ref().map(|p| p.grpc_listen));
    if policy.tiers.is_empty() && policy.rls.domains.is_empty() {
        tracing::warn!("{NO_TIERS}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
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
                .with_policy_adjust(Policy::with_env)
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
        let served = server::serve(limiter.clone(), listen, grpc_listen).await;
        if let Some(t) = traffic {
            t.abort();
        }
        limiter.shutdown().await;
        served.map_err(ratewatch::Error::from)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ratewatch: {e}");
            ExitCode::FAILURE
        }
    }
}
