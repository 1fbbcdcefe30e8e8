//! The binary's side of envoyproxy/ratelimit's environment
//! ([`PeerEnv`]): read it when no policy file is given, say which of its
//! variables a policy file makes moot, and follow its rule files.

use std::time::Duration;

use ratewatch::policy::Policy;
use ratewatch::policy::peer_env::{PeerEnv, SOURCE_NAME};
use ratewatch::{Follow, LimiterBuilder};

/// The peer's settings, unless a policy file is given (then its
/// variables are ignored, with a warning naming them).
pub(crate) fn settings(
    policy_file: bool,
) -> Result<Option<PeerEnv>, ratewatch::policy::ConfigError> {
    if policy_file {
        let set = PeerEnv::triggers_set(|name| std::env::var(name).ok());
        if !set.is_empty() {
            tracing::warn!(
                variables = %set.join(", "),
                "a policy file is given, so envoyproxy/ratelimit's variables are ignored; \
                 the policy file's [store] and [rls] envoy_configs decide"
            );
        }
        return Ok(None);
    }
    let peer = PeerEnv::from_env()?;
    if let Some(p) = &peer {
        tracing::info!(
            rules = %p.rules_dir.display(),
            listen = %p.listen,
            grpc_listen = %p.grpc_listen,
            "serving envoyproxy/ratelimit's environment"
        );
    }
    Ok(peer)
}

/// The log filter of the peer's `LOG_LEVEL`, when its environment is in
/// use (read before the logger starts, so errors are left to `settings`).
pub(crate) fn log_filter() -> Option<String> {
    if std::env::var_os("RATEWATCH_CONFIG").is_some() {
        return None;
    }
    PeerEnv::from_env().ok().flatten()?.log_filter
}

/// Follows the peer's rule files as a policy file is followed.
pub(crate) fn follow(
    builder: LimiterBuilder,
    peer: &PeerEnv,
    poll_ms: u64,
    settle_ms: u64,
) -> LimiterBuilder {
    let follow =
        Follow::every(Duration::from_millis(poll_ms)).settle(Duration::from_millis(settle_ms));
    let builder = builder
        .with_source_text(SOURCE_NAME, &peer.policy_toml)
        .with_policy_adjust(Policy::with_env)
        .with_follow(follow);
    #[cfg(unix)]
    let builder = builder.reload_on_sighup();
    builder
}
