//! Reloading the policy: [`Limiter::reload`] re-reads the file the limiter
//! was built from (the follower in `follow.rs` calls the same path when the
//! file changes or on SIGHUP), [`Limiter::replace_policy`] takes a policy
//! built in code. Either validates the new policy completely before anything
//! changes, so an invalid one never replaces a valid one: the old policy
//! keeps serving and the error (file, line, field) is logged, counted and
//! shown by [`Limiter::policy_status`].
//!
//! Settings that cannot change in a running process ([`RESTART_REQUIRED`])
//! keep their running values; a new value is reported as needing a
//! restart (log, `ratewatch_config_restart_required`, dashboard), never
//! half-applied.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use super::follow::Follow;
use super::live::Live;
use super::{Limiter, LimiterBuilder};
use crate::policy::{ConfigError, Policy, PolicyFile, PolicyVersion, read_policy_file};
use crate::telemetry::{metrics, unix_now};

/// The settings a reload cannot apply (they shape connections, breakers,
/// or background tasks built at start-up), as config fields.
pub(crate) const RESTART_REQUIRED: [&str; 9] = [
    "store.kind",
    "store.url",
    "store.nodes",
    "store.key_prefix",
    "store.max_entries",
    "resilience.breaker",
    "telemetry.flush_interval_ms",
    "telemetry.top_keys",
    "identity.hash_secret",
];

/// A hook applied to every policy read from the source file (the
/// `ratewatch` binary applies its environment overrides with it).
pub(crate) type Adjust = Arc<dyn Fn(Policy) -> Result<Policy, ConfigError> + Send + Sync>;

/// Where the limiter's policy came from, so a reload can read it again,
/// and how the file is followed.
#[derive(Clone, Default)]
pub(crate) struct Source {
    pub(super) path: Option<PathBuf>,
    adjust: Option<Adjust>,
    pub(super) follow: Follow,
    /// Reload on SIGHUP too.
    pub(super) sighup: bool,
    /// The file as read for the policy the limiter starts with, if the
    /// builder read it (so following starts from exactly those bytes).
    pub(super) initial: Option<PolicyFile>,
    /// The policy's text when it is held in memory rather than in a file
    /// (`path` then only names it): a reload reads its rule files again.
    pub(super) inline: Option<String>,
}

impl Source {
    /// The policy's text as it is now: the file read safely, or the text
    /// held in memory.
    pub(super) fn read(&self, path: &Path) -> Result<PolicyFile, crate::policy::ReadError> {
        match &self.inline {
            Some(text) => Ok(PolicyFile {
                text: text.clone(),
                fingerprint: crate::policy::Fingerprint::inline(text.len()),
            }),
            None => read_policy_file(path),
        }
    }
}

/// Why a reload did not apply a new policy. The old policy keeps serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The limiter was not built from a file: there is nothing to re-read
    /// (use [`Limiter::replace_policy`]).
    #[error("the policy was not loaded from a file; there is nothing to reload")]
    NoSource,
    /// The new policy is invalid (the error names file, line and field).
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// What a successful reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadOutcome {
    /// Whether the policy in force changed (an identical file changes
    /// nothing and keeps every counter and pinned snapshot as it was).
    pub changed: bool,
    /// The version in force after the reload.
    pub version: PolicyVersion,
    /// Settings whose new value waits for a restart (`store.kind`,
    /// `store.url`, `store.nodes`, `store.key_prefix`, `store.max_entries`,
    /// `resilience.breaker`,
    /// `telemetry.flush_interval_ms`, `telemetry.top_keys`).
    pub restart_required: Vec<String>,
}

/// One reload attempt, for the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadAttempt {
    /// When, in Unix seconds.
    pub at_unix: u64,
    /// Whether the new policy was accepted.
    pub ok: bool,
    /// Why not (file, line, field and what would be valid).
    pub error: Option<String>,
}

/// The policy in force and how its reloads went: what the dashboard and
/// `/api/ratelimit/status` show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyStatus {
    /// The file's `version`, or empty.
    pub version: String,
    /// The content hash of the policy in force.
    pub hash: String,
    /// The file reloads read, if any.
    pub source: Option<String>,
    /// When the policy in force was applied, in Unix seconds.
    pub applied_at_unix: u64,
    /// The latest reload attempt, if any.
    pub last_reload: Option<ReloadAttempt>,
    /// Settings changed in the source that wait for a restart.
    pub restart_required: Vec<String>,
    /// Reloads that applied (or confirmed) a policy.
    pub reloads_ok: u64,
    /// Reloads refused because the new policy was invalid.
    pub reloads_failed: u64,
}

/// The limiter's reload bookkeeping.
pub(crate) struct ReloadState {
    pub(super) source: Source,
    /// The source file's version and bytes behind the policy in force,
    /// once known: what the follower compares the file with.
    applied: Mutex<Option<PolicyFile>>,
    /// Held for a whole reload, so two reloads never interleave their
    /// compare and swap.
    status: Mutex<PolicyStatus>,
}

impl ReloadState {
    pub(crate) fn new(source: Source, version: &PolicyVersion) -> Self {
        Self {
            applied: Mutex::new(source.initial.clone()),
            status: Mutex::new(PolicyStatus {
                version: version.version.clone(),
                hash: version.hash.clone(),
                source: source.path.as_ref().map(|p| p.display().to_string()),
                applied_at_unix: unix_now(),
                last_reload: None,
                restart_required: Vec::new(),
                reloads_ok: 0,
                reloads_failed: 0,
            }),
            source,
        }
    }
}

impl ReloadState {
    /// The source file behind the policy in force, if known.
    pub(super) fn applied_file(&self) -> Option<PolicyFile> {
        self.applied.lock().clone()
    }

    pub(super) fn set_applied_file(&self, file: PolicyFile) {
        *self.applied.lock() = Some(file);
    }
}

/// Sets the policy metrics of a limiter that just started with `version`:
/// both reload results at zero, the info series at 1.
pub(crate) fn started(version: &PolicyVersion, limiter: Option<&str>) {
    metrics::describe_policy();
    metrics::init_policy_metrics(&version.version, &version.hash, limiter);
}

impl LimiterBuilder {
    /// Remembers the file the policy was read from, so [`Limiter::reload`]
    /// can read it again; the built limiter follows it unless
    /// [`LimiterBuilder::with_follow`] turns that off.
    pub fn with_source_file(mut self, path: impl AsRef<Path>) -> Self {
        self.source.path = Some(path.as_ref().to_path_buf());
        self
    }

    /// Takes the policy's TOML `text` as its source, named `name` in
    /// errors: a reload (and the follower) parses it again, reading the
    /// rule files of its `[rls] envoy_configs` as they are then. For a
    /// policy made in memory, such as the one of
    /// [`PeerEnv`](crate::policy::peer_env::PeerEnv).
    pub fn with_source_text(mut self, name: &str, text: &str) -> Self {
        self.source.path = Some(PathBuf::from(name));
        self.source.inline = Some(text.to_owned());
        self.source.initial = Some(PolicyFile {
            text: text.to_owned(),
            fingerprint: crate::policy::Fingerprint::inline(text.len()),
        });
        self
    }

    /// Passes every policy a reload reads from the source file through
    /// `adjust` (overrides from the environment, such as
    /// [`Policy::with_env`]); the result is validated again.
    pub fn with_policy_adjust(
        mut self,
        adjust: impl Fn(Policy) -> Result<Policy, ConfigError> + Send + Sync + 'static,
    ) -> Self {
        self.source.adjust = Some(Arc::new(adjust));
        self
    }
}

impl Limiter {
    /// Re-reads the policy file the limiter was built from and, if it is
    /// valid, swaps it in atomically: requests already in flight finish
    /// under the old policy, later ones run under the new. Counters of
    /// limits that keep their name, scope and algorithm carry on.
    ///
    /// The file is read once, whole, and exactly the bytes read are
    /// validated and applied. Only a regular file (or a symlink to one) of
    /// at most [`MAX_POLICY_FILE_BYTES`](crate::policy::MAX_POLICY_FILE_BYTES)
    /// is read; a FIFO or a device is refused without waiting on it, and a
    /// file that changed while it was read is refused as being written.
    /// Unlike the follower ([`Follow`]), this call does not wait for a
    /// freshly written file to settle: it applies what the file holds now.
    ///
    /// On error the old policy keeps serving; the error is logged, counted
    /// in `ratewatch_config_reloads_total{result="error"}` and shown in
    /// [`Limiter::policy_status`].
    ///
    /// It blocks for one bounded file read; from async code, call it in
    /// `spawn_blocking`.
    pub fn reload(&self) -> Result<ReloadOutcome, ReloadError> {
        let Some(path) = &self.inner.reload.source.path else {
            return Err(ReloadError::NoSource);
        };
        match self.inner.reload.source.read(path) {
            Ok(file) => self.reload_file(path, file),
            Err(e) => Err(self.refuse(e.error)),
        }
    }

    /// Validates the text of `file` (read from `path`) and applies it.
    pub(super) fn reload_file(
        &self,
        path: &Path,
        file: PolicyFile,
    ) -> Result<ReloadOutcome, ReloadError> {
        match self.parse_source(path, &file.text) {
            Ok(policy) => {
                let outcome = self.apply(policy);
                self.inner.reload.set_applied_file(file);
                Ok(outcome)
            }
            Err(e) => Err(self.refuse(e)),
        }
    }

    /// The policy `text` of the source file `path` says, adjusted and
    /// validated as a reload would apply it.
    pub(super) fn parse_source(&self, path: &Path, text: &str) -> Result<Policy, ConfigError> {
        let source = &self.inner.reload.source;
        let policy = Policy::from_toml_str(text, Some(&path.display().to_string()))?;
        let policy = match &source.adjust {
            Some(adjust) => {
                let policy = adjust(policy)?;
                policy.validate()?;
                policy
            }
            None => policy,
        };
        // A file without tiers limits nothing. Read while an editor or a
        // config map had it truncated (or emptied by mistake), it would
        // lift every limit at once: keep the policy in force.
        if policy.tiers.is_empty() && !self.policy().tiers.is_empty() {
            return Err(ConfigError::Invalid {
                file: Some(path.display().to_string()),
                line: None,
                field: "tiers".into(),
                message: "defines no tier, so it would limit nothing; a reload may not \
                          drop every tier of the policy in force (restart to serve an \
                          unlimited policy)"
                    .into(),
            });
        }
        Ok(policy)
    }

    /// Validates `policy` and, if it is valid, swaps it in as
    /// [`Limiter::reload`] does.
    pub fn replace_policy(&self, policy: Policy) -> Result<ReloadOutcome, ReloadError> {
        match policy.validate() {
            Ok(()) => Ok(self.apply(policy)),
            Err(e) => Err(self.refuse(e)),
        }
    }

    /// The policy in force, its version, and how reloads went.
    pub fn policy_status(&self) -> PolicyStatus {
        self.inner.reload.status.lock().clone()
    }

    fn apply(&self, policy: Policy) -> ReloadOutcome {
        let mut status = self.inner.reload.status.lock();
        let current = self.inner.live.load_full();
        let named = current.policy.telemetry.limiter_name.as_deref();
        let (policy, restart_required) = keep_restart_settings(&current.policy, policy);
        if !restart_required.is_empty() {
            tracing::warn!(
                settings = %restart_required.join(", "),
                "policy reload: these settings changed but need a restart; they keep their running values"
            );
        }
        let changed = policy != *current.policy;
        if changed {
            let fresh = fresh_counters(&current.policy, &policy);
            if !fresh.is_empty() {
                tracing::warn!(
                    limits = %fresh.join("; "),
                    "policy reload: these limits count from zero for every caller (a new name or algorithm is a new counter)"
                );
            }
            let live = Live::new(policy, &self.inner.plugins);
            // New tiers, routes and limits get their series at zero too.
            metrics::register_at_zero(&live.policy);
            let old = &current.version;
            let new = live.version.clone();
            metrics::record_policy_info(
                Some((&old.version, &old.hash)),
                (&new.version, &new.hash),
                named,
            );
            self.inner.telemetry.set_policy_version(&new);
            self.inner.live.store(Arc::new(live));
            tracing::info!(from = %old, to = %new, "policy reloaded");
            status.version = new.version;
            status.hash = new.hash;
            status.applied_at_unix = unix_now();
        } else {
            tracing::info!(version = %current.version, "policy reload: nothing changed");
        }
        status.last_reload = Some(ReloadAttempt {
            at_unix: unix_now(),
            ok: true,
            error: None,
        });
        status.reloads_ok += 1;
        status.restart_required = restart_required.clone();
        metrics::record_config_reload(true, named);
        metrics::record_restart_required(restart_required.len(), named);
        ReloadOutcome {
            changed,
            version: self.inner.live.load().version.clone(),
            restart_required,
        }
    }

    pub(super) fn refuse(&self, error: ConfigError) -> ReloadError {
        let mut status = self.inner.reload.status.lock();
        tracing::error!(error = %error, "policy reload failed; the previous policy keeps serving");
        status.last_reload = Some(ReloadAttempt {
            at_unix: unix_now(),
            ok: false,
            error: Some(error.to_string()),
        });
        status.reloads_failed += 1;
        let running = self.inner.live.load();
        metrics::record_config_reload(false, running.policy.telemetry.limiter_name.as_deref());
        ReloadError::Config(error)
    }
}

/// `new` with every [`RESTART_REQUIRED`] setting of `running`, and the
/// names of those that differed.
/// The limits of tiers in both policies that a reload starts from zero:
/// a name the tier did not have, or a name whose algorithm changed (a
/// counter's key carries both). Named so an operator sees that a reload
/// handed every caller a fresh quota there.
fn fresh_counters(running: &Policy, new: &Policy) -> Vec<String> {
    let mut fresh = Vec::new();
    for tier in &new.tiers {
        let Some(old) = running.tiers.iter().find(|t| t.name == tier.name) else {
            continue;
        };
        for limit in &tier.limits {
            match old.limits.iter().find(|l| l.name == limit.name) {
                None => fresh.push(format!("{}.{} (new)", tier.name, limit.name)),
                Some(was) if was.algorithm.kind() != limit.algorithm.kind() => fresh.push(format!(
                    "{}.{} ({} -> {})",
                    tier.name,
                    limit.name,
                    was.algorithm.kind(),
                    limit.algorithm.kind()
                )),
                Some(_) => {}
            }
        }
    }
    fresh
}

fn keep_restart_settings(running: &Policy, mut new: Policy) -> (Policy, Vec<String>) {
    let mut changed = Vec::new();
    let mut keep = |name: &str, differs: bool| {
        if differs {
            changed.push(name.to_owned());
        }
    };
    let (r, n) = (&running.store, &mut new.store);
    keep(RESTART_REQUIRED[0], r.kind != n.kind);
    keep(RESTART_REQUIRED[1], r.url != n.url);
    keep(RESTART_REQUIRED[2], r.nodes != n.nodes);
    keep(RESTART_REQUIRED[3], r.key_prefix != n.key_prefix);
    keep(RESTART_REQUIRED[4], r.max_entries != n.max_entries);
    n.kind = r.kind;
    n.max_entries = r.max_entries;
    n.url.clone_from(&r.url);
    n.nodes.clone_from(&r.nodes);
    n.key_prefix.clone_from(&r.key_prefix);
    keep(
        RESTART_REQUIRED[5],
        running.resilience.breaker != new.resilience.breaker,
    );
    new.resilience.breaker = running.resilience.breaker;
    let (r, n) = (&running.telemetry, &mut new.telemetry);
    keep(RESTART_REQUIRED[6], r.flush_interval != n.flush_interval);
    keep(RESTART_REQUIRED[7], r.top_keys != n.top_keys);
    n.flush_interval = r.flush_interval;
    n.top_keys = r.top_keys;
    // A new secret would rename every counter: a fresh quota for everyone.
    let (r, n) = (&running.identity, &mut new.identity);
    keep(
        RESTART_REQUIRED[8],
        r.hash_secret != n.hash_secret || r.hash_secret_file != n.hash_secret_file,
    );
    n.hash_secret.clone_from(&r.hash_secret);
    n.hash_secret_file.clone_from(&r.hash_secret_file);
    (new, changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Limit, StoreKind, Tier};

    fn policy(capacity: u64) -> Policy {
        Policy::builder()
            .tier(Tier::new("free").limit(Limit::token_bucket("burst", capacity, 1.0)))
            .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
            .build()
            .unwrap()
    }

    #[test]
    fn restart_settings_keep_their_running_values_and_are_named() {
        let running = policy(5);
        let mut new = policy(7);
        new.store.kind = StoreKind::Redis;
        new.store.url = Some("redis://127.0.0.1:1".into());
        new.store.key_prefix = "other".into();
        new.store.timeout = std::time::Duration::from_millis(9);
        new.telemetry.top_keys = 3;
        let (kept, changed) = keep_restart_settings(&running, new);
        assert_eq!(
            changed,
            [
                "store.kind",
                "store.url",
                "store.key_prefix",
                "telemetry.top_keys"
            ]
        );
        assert_eq!(kept.store.kind, StoreKind::Memory);
        assert_eq!(kept.store.url, None);
        assert_eq!(kept.store.key_prefix, "rw");
        assert_eq!(kept.telemetry.top_keys, running.telemetry.top_keys);
        // Live settings do apply.
        assert_eq!(kept.store.timeout, std::time::Duration::from_millis(9));
        assert_eq!(kept.tiers, policy(7).tiers);
    }

    #[test]
    fn a_renamed_limit_or_a_new_algorithm_is_named_as_counting_from_zero() {
        use crate::{Limit, Tier};
        let running = Policy::builder()
            .tier(
                Tier::new("free")
                    .limit(Limit::token_bucket("burst", 10, 1.0))
                    .limit(Limit::per_day("day", 100)),
            )
            .tier(Tier::new("anonymous").limit(Limit::per_day("day", 10)))
            .build()
            .unwrap();
        let new = Policy::builder()
            .tier(
                Tier::new("free")
                    .limit(Limit::gcra("burst", 1.0, 10))
                    .limit(Limit::per_day("daily", 100)),
            )
            .tier(Tier::new("anonymous").limit(Limit::per_day("day", 10)))
            .build()
            .unwrap();
        assert_eq!(
            super::fresh_counters(&running, &new),
            vec!["free.burst (token_bucket -> gcra)", "free.daily (new)"]
        );
        assert!(super::fresh_counters(&running, &running).is_empty());
    }

    #[test]
    fn an_unchanged_policy_needs_no_restart() {
        let (kept, changed) = keep_restart_settings(&policy(5), policy(5));
        assert!(changed.is_empty());
        assert_eq!(kept, policy(5));
    }
}
