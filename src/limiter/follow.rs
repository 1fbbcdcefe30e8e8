//! Following the policy file: a limiter built from a file
//! ([`Limiter::from_config_file`], or a builder given
//! [`LimiterBuilder::with_source_file`]) reloads it when it changes, by
//! default, in the library alone.
//!
//! How it watches: every poll interval (1 s by default) it `stat`s the
//! file, following symlinks, and compares the file's identity (device,
//! inode), length and modification time with those of the version in
//! force. That one `stat` a second is all a quiet file costs. It sees an
//! edit in place, a rename over the file (atomic replace), and the
//! `..data` symlink swap of a Kubernetes ConfigMap, on every filesystem
//! (no inotify, which misses the swap and is absent on some mounts).
//!
//! The envoyproxy/ratelimit YAML files of `[rls] envoy_configs` are
//! followed the same way: each poll lists the entries' directories and
//! globs again and `stat`s every file they name, so an edit, a new file,
//! a removed file or a ConfigMap swap of any of them reloads the policy,
//! even when the policy file itself is unchanged. A policy file that is
//! gone is logged once; the policy in force stays until it is back.
//!
//! What it applies: only files that held still. A change is read once it
//! is settled: every file's modification time lies at least the settle
//! interval (500 ms by default) in the past, or the same versions were
//! seen that long ago. It is read off the async runtime with the safe reader
//! of [`Policy::from_toml_file`] (regular files only, at most
//! [`MAX_POLICY_FILE_BYTES`](crate::policy::MAX_POLICY_FILE_BYTES), no
//! wait on a FIFO or device, refused if it changed during the read), and
//! the bytes read are the bytes validated and applied: nothing reads the
//! file a second time. SIGHUP ([`LimiterBuilder::reload_on_sighup`])
//! forces a reload of an unchanged file too, under the same rules: a
//! SIGHUP during a slow rewrite waits until the writer has finished.
//!
//! A version that failed (invalid, not a regular file, too large) is
//! refused once, counted and logged; the follower then waits for the
//! next change instead of refusing it again every poll.
//!
//! The follower holds the limiter weakly and stops when the last clone of
//! the limiter is dropped or [`Limiter::shutdown`] is called: it never
//! keeps a limiter, or a runtime's worker, busy.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use super::{Inner, Limiter, LimiterBuilder};
use crate::policy::{Fingerprint, expand_rule_entry};

/// How a limiter built from a file follows it: how often it looks, and
/// how long a changed file must hold still before it is applied.
///
/// ```
/// use std::time::Duration;
/// use ratewatch::Follow;
/// let follow = Follow::every(Duration::from_millis(200)).settle(Duration::from_millis(100));
/// assert_eq!(follow.poll(), Some(Duration::from_millis(200)));
/// assert_eq!(Follow::off().poll(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    poll: Option<Duration>,
    settle: Duration,
}

impl Follow {
    /// The default poll interval: one `stat` of the file a second.
    pub const DEFAULT_POLL: Duration = Duration::from_secs(1);
    /// The default settle interval: a changed file is applied once it has
    /// not changed for half a second.
    pub const DEFAULT_SETTLE: Duration = Duration::from_millis(500);

    /// Looks at the file every `poll` (zero: never, as [`Follow::off`]).
    pub fn every(poll: Duration) -> Self {
        Self {
            poll: (!poll.is_zero()).then_some(poll),
            settle: Self::DEFAULT_SETTLE,
        }
    }

    /// Does not follow the file: reloads happen on [`Limiter::reload`]
    /// (and on SIGHUP if [`LimiterBuilder::reload_on_sighup`] asked for it).
    pub fn off() -> Self {
        Self {
            poll: None,
            settle: Self::DEFAULT_SETTLE,
        }
    }

    /// Applies a changed file only once it has held still for `settle`.
    pub fn settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The poll interval, or `None` when following is off.
    pub fn poll(&self) -> Option<Duration> {
        self.poll
    }

    /// The settle interval.
    pub fn settle_interval(&self) -> Duration {
        self.settle
    }
}

impl Default for Follow {
    fn default() -> Self {
        Self::every(Self::DEFAULT_POLL)
    }
}

impl LimiterBuilder {
    /// How the limiter follows its source file ([`Follow::default`]: a
    /// `stat` a second, applied once settled for 500 ms).
    /// `with_follow(Follow::off())` turns following off.
    pub fn with_follow(mut self, follow: Follow) -> Self {
        self.source.follow = follow;
        self
    }

    /// Also reloads the source file on SIGHUP (an unchanged file too),
    /// once it is settled. The handler is installed when the limiter is
    /// built, so a SIGHUP can no longer end the process from then on.
    #[cfg(unix)]
    pub fn reload_on_sighup(mut self) -> Self {
        self.source.sighup = true;
        self
    }
}

/// Stops the follower when the limiter goes away.
#[derive(Default)]
pub(super) struct FollowerHandle(Mutex<Option<tokio::task::AbortHandle>>);

impl FollowerHandle {
    pub(super) fn stop(&self) {
        if let Some(task) = self.0.lock().take() {
            task.abort();
        }
    }
}

impl Drop for FollowerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts following `limiter`'s source file, if it has one and following
/// or SIGHUP is on. Must run inside a tokio runtime.
pub(super) fn start(limiter: &Limiter) -> std::io::Result<()> {
    let source = &limiter.inner.reload.source;
    let Some(path) = source.path.clone() else {
        return Ok(());
    };
    let follow = source.follow;
    #[cfg(unix)]
    let hangup = if source.sighup {
        Some(tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::hangup(),
        )?)
    } else {
        None
    };
    #[cfg(not(unix))]
    let hangup: Option<()> = None;
    if follow.poll.is_none() && hangup.is_none() {
        return Ok(());
    }
    let watch = Watch {
        path,
        follow,
        rules_in_force: None,
        refused: None,
        candidate: None,
        forced: false,
        missing_since: None,
    };
    let task = tokio::spawn(run(Arc::downgrade(&limiter.inner), watch, hangup));
    *limiter.inner.follower.0.lock() = Some(task.abort_handle());
    Ok(())
}

/// The follower's view of the watched files.
struct Watch {
    /// The policy file.
    path: PathBuf,
    follow: Follow,
    /// The rule files behind the policy in force, as they were when read.
    rules_in_force: Option<Rules>,
    /// The versions last refused: not read again until they change.
    refused: Option<Seen>,
    /// Changed versions not yet applied, and when first seen so.
    candidate: Option<(Seen, Instant)>,
    /// A SIGHUP asked for a reload not yet done.
    forced: bool,
    /// Since when the policy file is missing, and whether that was logged.
    missing_since: Option<(Instant, bool)>,
}

/// The YAML files the `[rls] envoy_configs` entries name now (directories
/// and globs listed again), each with its version (`None`: gone), or why
/// an entry names none.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rules {
    files: Vec<(PathBuf, Option<Fingerprint>)>,
    error: Option<String>,
}

/// One look at everything the policy is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    policy: Option<Fingerprint>,
    rules: Rules,
}

impl Seen {
    fn fingerprints(&self) -> impl Iterator<Item = &Fingerprint> {
        self.policy
            .iter()
            .chain(self.rules.files.iter().filter_map(|(_, f)| f.as_ref()))
    }
}

/// Stats the policy file (unless the policy is held in memory) and lists
/// and stats the rule files of `entries`. Blocking (a `stat` per file, a
/// `readdir` per directory).
fn look(path: &Path, inline: Option<usize>, entries: &[PathBuf]) -> Seen {
    let mut rules = Rules {
        files: Vec::new(),
        error: None,
    };
    for entry in entries {
        match expand_rule_entry(entry) {
            Ok(files) => {
                for f in files {
                    let fp = Fingerprint::stat(&f).ok();
                    rules.files.push((f, fp));
                }
            }
            Err(e) => {
                rules
                    .error
                    .get_or_insert(format!("{}: {e}", entry.display()));
            }
        }
    }
    Seen {
        policy: match inline {
            Some(len) => Some(Fingerprint::inline(len)),
            None => Fingerprint::stat(path).ok(),
        },
        rules,
    }
}

/// The entries of the policy in force, to look at.
fn entries_of(limiter: &Limiter) -> Vec<PathBuf> {
    limiter.policy().rls.envoy_config_entries.clone()
}

/// The length of the policy's text when it is held in memory.
fn inline_of(limiter: &Limiter) -> Option<usize> {
    limiter.inner.reload.source.inline.as_ref().map(String::len)
}

#[cfg(unix)]
type Hangup = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hangup = ();

async fn run(limiter: Weak<Inner>, mut watch: Watch, mut hangup: Option<Hangup>) {
    if let Some(inner) = limiter.upgrade() {
        baseline(Limiter { inner }, &mut watch).await;
    }
    loop {
        // While a change waits to settle (or a SIGHUP for its file), look
        // again soon; otherwise at the poll interval, or only on SIGHUP.
        let pending = watch.forced || watch.candidate.is_some();
        let retry =
            (watch.follow.settle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let wait = match (pending, watch.follow.poll) {
            (true, Some(poll)) => Some(poll.min(retry)),
            (true, None) => Some(retry),
            (false, poll) => poll,
        };
        let sleep = async {
            match wait {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            signalled = hangup_recv(&mut hangup) => {
                if signalled {
                    tracing::info!("SIGHUP: reloading the policy");
                    watch.forced = true;
                    watch.candidate = None;
                } else {
                    hangup = None;
                }
            }
        }
        let Some(inner) = limiter.upgrade() else {
            return;
        };
        step(Limiter { inner }, &mut watch).await;
    }
}

#[cfg(unix)]
async fn hangup_recv(hangup: &mut Option<Hangup>) -> bool {
    match hangup {
        Some(h) => h.recv().await.is_some(),
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn hangup_recv(_: &mut Option<Hangup>) -> bool {
    std::future::pending().await
}

/// Records the files as they are now as the version in force, unless they
/// say something else than the policy the limiter was built with (they
/// changed between that read and this one): then the first poll applies
/// them.
async fn baseline(limiter: Limiter, watch: &mut Watch) {
    let path = watch.path.clone();
    let known = limiter.inner.reload.applied_file().is_some();
    let result = tokio::task::spawn_blocking(move || {
        let before = look(&path, inline_of(&limiter), &entries_of(&limiter));
        if known {
            return Some(before.rules);
        }
        let file = limiter.inner.reload.source.read(&path).ok()?;
        let same = limiter
            .parse_source(&path, &file.text)
            .is_ok_and(|p| p == *limiter.policy());
        let after = look(&path, inline_of(&limiter), &entries_of(&limiter));
        if same && after == before {
            limiter.inner.reload.set_applied_file(file);
            return Some(before.rules);
        }
        None
    })
    .await;
    if let Ok(rules) = result {
        watch.rules_in_force = rules;
    }
}

/// One look at the files: apply a settled change, or wait for it.
async fn step(limiter: Limiter, watch: &mut Watch) {
    let path = watch.path.clone();
    let entries = entries_of(&limiter);
    let inline = inline_of(&limiter);
    let Ok(now) = tokio::task::spawn_blocking(move || look(&path, inline, &entries)).await else {
        return;
    };
    if !watch.forced && !missing(&now, watch) {
        return;
    }
    let in_force = limiter.inner.reload.applied_file().map(|f| f.fingerprint);
    if !watch.forced {
        let unchanged = now.policy.is_some()
            && now.policy == in_force
            && watch.rules_in_force.as_ref() == Some(&now.rules);
        if unchanged || watch.refused.as_ref() == Some(&now) {
            watch.candidate = None;
            return;
        }
    }
    if !settled(&now, watch) {
        return;
    }
    let path = watch.path.clone();
    let forced = watch.forced;
    let rules_in_force = watch.rules_in_force.clone();
    let seen = now.clone();
    let attempt = tokio::task::spawn_blocking(move || {
        attempt(&limiter, &path, &seen, rules_in_force.as_ref(), forced)
    })
    .await;
    match attempt {
        Ok(Attempt::Unsettled) => watch.candidate = None,
        Ok(Attempt::Applied) => {
            watch.rules_in_force = Some(now.rules);
            watch.refused = None;
            watch.candidate = None;
            watch.forced = false;
        }
        Ok(Attempt::Refused) => {
            watch.refused = Some(now);
            watch.candidate = None;
            watch.forced = false;
        }
        Err(e) => tracing::error!(error = %e, "policy reload did not finish"),
    }
}

/// Whether the policy file is there to be read. A file missing for a
/// moment (between an unlink and a rename) is looked at again on the next
/// poll; one missing for the settle interval is logged, once: the policy
/// in force stays until a file is back.
fn missing(now: &Seen, watch: &mut Watch) -> bool {
    if now.policy.is_some() {
        if let Some((_, true)) = watch.missing_since.take() {
            tracing::info!(file = %watch.path.display(), "the policy file is back");
        }
        return true;
    }
    let since = watch.missing_since.get_or_insert((Instant::now(), false));
    if !since.1 && since.0.elapsed() >= watch.follow.settle {
        since.1 = true;
        tracing::warn!(
            file = %watch.path.display(),
            "the policy file is gone (deleted, or not readable); the policy in force stays \
             until it is back"
        );
    }
    false
}

/// Whether the version `now` has held still for the settle interval: every
/// file's modification time is that old, or it was already seen that long
/// ago.
fn settled(now: &Seen, watch: &mut Watch) -> bool {
    let settle = watch.follow.settle;
    let old_enough = now.fingerprints().all(|f| {
        f.modified
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age >= settle)
    }) && now.rules.files.iter().all(|(_, f)| f.is_some());
    if old_enough {
        return true;
    }
    match &watch.candidate {
        Some((seen, since)) if seen == now => since.elapsed() >= settle,
        _ => {
            watch.candidate = Some((now.clone(), Instant::now()));
            false
        }
    }
}

enum Attempt {
    /// The file changed since it was looked at, or during the read.
    Unsettled,
    /// Applied, or found identical to the policy in force.
    Applied,
    /// Refused; the policy in force stays.
    Refused,
}

/// Reads the policy file once and applies exactly what was read, with
/// the rule files it names read as they are now. Blocking.
fn attempt(
    limiter: &Limiter,
    path: &Path,
    seen: &Seen,
    rules_in_force: Option<&Rules>,
    forced: bool,
) -> Attempt {
    let file = match limiter.inner.reload.source.read(path) {
        Ok(file) => file,
        Err(e) if e.changed => return Attempt::Unsettled,
        Err(e) => {
            limiter.refuse(e.error);
            return Attempt::Refused;
        }
    };
    if seen.policy.is_some_and(|f| f != file.fingerprint) {
        return Attempt::Unsettled;
    }
    let same_text = limiter
        .inner
        .reload
        .applied_file()
        .is_some_and(|f| f.text == file.text);
    let same_rules = rules_in_force == Some(&seen.rules);
    if same_text && same_rules && !forced {
        // Touched, or rewritten with the same bytes: nothing to apply.
        limiter.inner.reload.set_applied_file(file);
        return Attempt::Applied;
    }
    if !forced {
        if same_text {
            tracing::info!(file = %path.display(), "rule files changed: reloading");
        } else {
            tracing::info!(file = %path.display(), "policy file changed: reloading");
        }
    }
    match limiter.reload_file(path, file) {
        Ok(_) => Attempt::Applied,
        Err(_) => Attempt::Refused,
    }
}
