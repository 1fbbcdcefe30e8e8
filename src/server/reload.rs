//! What reloads the `ratewatch` server's policy: SIGHUP, and a change of
//! the policy file's content (polled, so it works on every filesystem and
//! through the symlink swaps of mounted config maps, and debounced: a new
//! content is applied once it held still for one more poll, so a
//! half-written file is not read). A policy file is small: it is read with
//! a plain blocking read.

use std::path::PathBuf;
use std::time::Duration;

use crate::Limiter;

/// Starts reloading `limiter`'s policy on SIGHUP and, unless `poll` is
/// zero, when its source file's content changes. Call it before serving,
/// so a SIGHUP can never hit the default action (exit) once the server is
/// reachable.
pub fn spawn_reloader(
    limiter: Limiter,
    file: Option<PathBuf>,
    poll: Duration,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        let mut applied = match &file {
            Some(f) => std::fs::read(f).ok(),
            None => None,
        };
        let mut pending: Option<Vec<u8>> = None;
        let mut tick = tokio::time::interval(if poll.is_zero() {
            Duration::from_secs(3600)
        } else {
            poll
        });
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            #[cfg(unix)]
            let hup = hangup.recv();
            #[cfg(not(unix))]
            let hup = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = hup => {
                    tracing::info!("SIGHUP: reloading the policy");
                    if let Some(f) = &file {
                        applied = std::fs::read(f).ok();
                        pending = None;
                    }
                    reload(&limiter).await;
                }
                _ = tick.tick(), if !poll.is_zero() && file.is_some() => {
                    let Some(f) = &file else { continue };
                    // A file missing for a moment (replaced by a rename) is
                    // looked at again on the next poll.
                    let Ok(now) = std::fs::read(f) else { continue };
                    if applied.as_ref() == Some(&now) {
                        pending = None;
                    } else if pending.as_ref() == Some(&now) {
                        tracing::info!(file = %f.display(), "policy file changed: reloading");
                        applied = Some(now);
                        pending = None;
                        reload(&limiter).await;
                    } else {
                        pending = Some(now);
                    }
                }
            }
        }
    }))
}

/// One reload off the async threads (it reads a file); its outcome is
/// logged and counted by the limiter.
async fn reload(limiter: &Limiter) {
    let l = limiter.clone();
    match tokio::task::spawn_blocking(move || l.reload()).await {
        Ok(Err(crate::ReloadError::NoSource)) => {
            tracing::warn!("no policy file to reload (serving the built-in policy)");
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "policy reload did not finish"),
    }
}
