//! Paced load on real servers, and per-window accounting of what it got.
//!
//! Each request is stamped with the wall clock (the clock Redis `TIME`
//! reads on this machine) when it was sent and when its answer came, so a
//! window's admissions can be counted without guessing on which side of a
//! boundary a request was decided: one fully inside a window was decided in
//! it; one that straddles a boundary may belong to either.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Microseconds since the Unix epoch, now.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// One request and its answer.
#[derive(Debug, Clone)]
pub struct Shot {
    /// Which target it went to.
    pub target: usize,
    /// Which of the keys it sent (see [`hammer_keys`]).
    pub key: usize,
    /// When it was sent and answered, µs since the epoch.
    pub sent: u64,
    pub answered: u64,
    /// HTTP status; 0 if no answer came (see `error`).
    pub status: u16,
    /// Why no answer came, when `status` is 0: the client's own error
    /// (a refused or reset connection, its 10 s timeout on a starved
    /// machine), not a decision.
    pub error: Option<String>,
}

/// Sends GET `path` with header `x-api-key: key` to every target at
/// `per_target` requests per second, each request on its own task so a slow
/// answer never slows the pace, from now until `until` (µs since the
/// epoch). A target whose flag in `stop` is set gets nothing more.
pub async fn hammer(
    targets: Vec<String>,
    path: &str,
    key: &str,
    per_target: f64,
    until: u64,
    stop: Vec<Arc<AtomicBool>>,
) -> Vec<Shot> {
    hammer_keys(targets, path, &[key.to_owned()], per_target, until, stop).await
}

/// Like [`hammer`], each target sending `keys` in turn (many identities on
/// one route).
pub async fn hammer_keys(
    targets: Vec<String>,
    path: &str,
    keys: &[String],
    per_target: f64,
    until: u64,
    stop: Vec<Arc<AtomicBool>>,
) -> Vec<Shot> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let shots = Arc::new(Mutex::new(Vec::new()));
    let mut pacers = Vec::new();
    for (target, base) in targets.into_iter().enumerate() {
        let (client, shots, stop) = (client.clone(), shots.clone(), stop[target].clone());
        let url = format!("{base}{path}");
        let keys = keys.to_vec();
        pacers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_target));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut inflight = Vec::new();
            // Targets start at different keys, so every key reaches all.
            let mut turn = target;
            while unix_us() < until && !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let k = turn % keys.len();
                turn += 1;
                let (client, shots, url, key) =
                    (client.clone(), shots.clone(), url.clone(), keys[k].clone());
                inflight.push(tokio::spawn(async move {
                    let sent = unix_us();
                    let (status, error) =
                        match client.get(&url).header("x-api-key", &key).send().await {
                            Ok(r) => (r.status().as_u16(), None),
                            Err(e) => (0, Some(format!("{e:?}"))),
                        };
                    shots.lock().push(Shot {
                        target,
                        key: k,
                        sent,
                        answered: unix_us(),
                        status,
                        error,
                    });
                }));
            }
            for t in inflight {
                let _ = t.await;
            }
        }));
    }
    for p in pacers {
        p.await.expect("pacer");
    }
    let mut v = shots.lock().clone();
    v.sort_by_key(|s| s.sent);
    v
}

/// Counts of one window `[start, start + len)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    pub start: u64,
    /// Admitted requests sent and answered inside the window: decided in
    /// it for sure (a lower bound of its admissions).
    pub admitted_inside: usize,
    /// Admitted requests whose send-to-answer span touches the window (an
    /// upper bound of its admissions).
    pub admitted_touching: usize,
    /// 429s sent and answered inside the window.
    pub refused_inside: usize,
    /// Requests of any answer sent and answered inside the window: what
    /// the load really asked of it, however fast the machine could send.
    pub asked_inside: usize,
    /// HTTP answers other than 200 and 429 touching the window.
    pub other: usize,
    /// Requests touching the window that got no answer (status 0): they
    /// may have been admitted, so they count in `admitted_touching` too.
    pub unanswered: usize,
}

/// Checks each window's admissions against its limit and what it was
/// asked, never against how much load the machine managed to send: never
/// more than `limit` admitted inside a window, and a refusal only once
/// `limit - slack` were admitted (`slack` the units leases may hold
/// charged and unspent; a refusal means the store counted `limit`, however
/// few requests were sent). A window asked for more than `limit` therefore
/// refused the rest. Returns how many windows were asked for more than
/// `limit` (logged: how hard the load pressed on this machine).
pub fn admitted_against_asked(ws: &[Window], limit: usize, slack: usize) -> usize {
    for w in ws {
        assert!(
            w.admitted_inside <= limit,
            "window at {} admitted {} of {} asked > {limit}: {ws:#?}",
            w.start,
            w.admitted_inside,
            w.asked_inside
        );
        if w.refused_inside > 0 {
            assert!(
                w.admitted_touching + slack >= limit,
                "window at {} refused {} while only {} of {} asked were admitted \
                 (bound {limit} - {slack}): {ws:#?}",
                w.start,
                w.refused_inside,
                w.admitted_touching,
                w.asked_inside
            );
        }
    }
    let pressed = ws.iter().filter(|w| w.asked_inside > limit).count();
    eprintln!(
        "{pressed} of {} windows were asked for more than {limit}",
        ws.len()
    );
    pressed
}

/// The counts of `n` windows of `len` µs from `first`.
pub fn windows(shots: &[Shot], first: u64, len: u64, n: usize) -> Vec<Window> {
    (0..n)
        .map(|i| {
            let start = first + i as u64 * len;
            let end = start + len;
            let mut w = Window {
                start,
                ..Window::default()
            };
            for s in shots {
                let inside = s.sent >= start && s.answered < end;
                let touching = s.sent < end && s.answered >= start;
                w.asked_inside += usize::from(inside);
                match s.status {
                    200 if inside => {
                        w.admitted_inside += 1;
                        w.admitted_touching += 1;
                    }
                    200 if touching => w.admitted_touching += 1,
                    429 if inside => w.refused_inside += 1,
                    429 => {}
                    0 if touching => {
                        w.unanswered += 1;
                        w.admitted_touching += 1;
                    }
                    _ if touching => w.other += 1,
                    _ => {}
                }
            }
            w
        })
        .collect()
}

/// Every shot answered with neither 200 nor 429, with what it got: the
/// status, or the client's error when no answer came.
pub fn odd_answers(shots: &[Shot]) -> Vec<String> {
    shots
        .iter()
        .filter(|s| s.status != 200 && s.status != 429)
        .map(|s| match &s.error {
            Some(e) => format!("key {} to target {}: no answer: {e}", s.key, s.target),
            None => format!("key {} to target {}: HTTP {}", s.key, s.target, s.status),
        })
        .collect()
}
