//! In-flight slots a request holds, and the renewals that keep them.
//!
//! An admitted request with in-flight limits holds its slots as a
//! [`Slot`] inside its [`Decision`](super::Decision). The slots go back
//! when the last clone of it is dropped: the layer keeps it in the
//! response body until the body ends, so a streamed body holds its slot to
//! the end, and a request or response dropped on the way (a client that
//! went away) gives it back at once.
//!
//! A release never blocks a drop: the memory store gives the slot back in
//! process (a map update under a short lock, no I/O); any other store is
//! asked from a spawned task. A release the store does not take (Redis
//! down) is counted and the slot comes back after its hold timeout.
//!
//! While a slot is held, one task per limiter looks every [`TICK`] for
//! holders due for renewal (a third of their hold timeout after they were
//! taken or last renewed) and renews them, one store call per holder (per
//! slot on a cluster), all due ones at once. A failed renewal is counted
//! (`ratewatch_inflight_renewals_failed_total`) and logged once until
//! renewals succeed again, not once per request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::algorithm::Algorithm;
use crate::store::{Item, Store};
use crate::telemetry::inflight;

/// How often the renewal task looks for holders due. A third of the
/// shortest hold timeout (1 s) is 333 ms, so a holder is renewed at most
/// `TICK` late, well before its deadline.
const TICK: Duration = Duration::from_millis(100);

/// The in-flight slots one admitted request holds. Cheap to clone; the
/// slots go back to the store when the last clone is dropped.
#[derive(Clone)]
pub struct Slot {
    held: Arc<Held>,
}

impl Slot {
    /// The names of the in-flight limits this slot holds a place in.
    pub fn limits(&self) -> &[Arc<str>] {
        &self.held.limits
    }
}

impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.held, &other.held)
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("limits", &self.held.limits)
            .finish()
    }
}

struct Held {
    store: Arc<dyn Store>,
    items: Vec<Item>,
    holder: String,
    shard: Arc<str>,
    tier: Arc<str>,
    limits: Vec<Arc<str>>,
    /// The limiter's name, for the slots gauge's `limiter` label.
    limiter: Option<Arc<str>>,
    book: Weak<Slots>,
    runtime: Option<tokio::runtime::Handle>,
    /// When this holder is next due for renewal.
    due: Mutex<tokio::time::Instant>,
}

impl Held {
    /// Its key among the limiter's holders: its address, unique while it
    /// is in the book (it leaves the book before its memory is freed).
    fn key(&self) -> usize {
        self as *const Held as usize
    }

    fn hold(&self) -> Duration {
        let us = self
            .items
            .iter()
            .filter_map(|i| match i.algorithm {
                Algorithm::Concurrency { hold_us, .. } => Some(hold_us),
                _ => None,
            })
            .min()
            .unwrap_or(crate::algorithm::DEFAULT_HOLD_US);
        Duration::from_micros(us)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for l in &self.limits {
            inflight::slots(&self.tier, l, self.limiter.as_ref(), -1.0);
        }
        if let Some(book) = self.book.upgrade() {
            book.held.lock().remove(&self.key());
        }
        let items = std::mem::take(&mut self.items);
        let holder = std::mem::take(&mut self.holder);
        if let Some(done) = self.store.release_sync(&items, &holder) {
            if done.is_err() {
                inflight::release_failed(&self.shard);
            }
            return;
        }
        let Some(rt) = self.runtime.take() else {
            // No runtime to ask the store from: the slot comes back after
            // its hold timeout.
            inflight::release_failed(&self.shard);
            return;
        };
        let store = self.store.clone();
        let shard = self.shard.clone();
        // Counted until done, so a shutdown can wait for it.
        let book = self.book.upgrade();
        if let Some(b) = &book {
            b.releasing.fetch_add(1, Ordering::AcqRel);
        }
        rt.spawn(async move {
            if let Err(e) = store.release(&items, &holder).await {
                inflight::release_failed(&shard);
                tracing::debug!(%shard, error = %e, "in-flight release failed; the slot comes back after its hold timeout");
            }
            if let Some(b) = book
                && b.releasing.fetch_sub(1, Ordering::AcqRel) == 1
            {
                b.released.notify_waiters();
            }
        });
    }
}

/// Every slot this limiter holds, for the renewals.
#[derive(Default)]
pub(super) struct Slots {
    held: Mutex<HashMap<usize, Weak<Held>, ahash::RandomState>>,
    renewing: AtomicBool,
    warned: AtomicBool,
    /// Releases spawned and not done yet.
    releasing: AtomicUsize,
    /// Told when the last release spawned is done.
    released: tokio::sync::Notify,
}

impl Slots {
    /// A [`Slot`] for `holder`'s place in `items` (the in-flight items the
    /// decision took) on `store`, renewed from now on.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        items: Vec<Item>,
        limits: Vec<Arc<str>>,
        holder: String,
        shard: Arc<str>,
        tier: Arc<str>,
        limiter: Option<Arc<str>>,
    ) -> Slot {
        for l in &limits {
            inflight::slots(&tier, l, limiter.as_ref(), 1.0);
        }
        let runtime = tokio::runtime::Handle::try_current().ok();
        let mut held = Held {
            store,
            items,
            holder,
            shard,
            tier,
            limits,
            limiter,
            book: Arc::downgrade(self),
            runtime: runtime.clone(),
            due: Mutex::new(tokio::time::Instant::now()),
        };
        let third = held.hold() / 3;
        *held.due.get_mut() += third;
        let held = Arc::new(held);
        self.held.lock().insert(held.key(), Arc::downgrade(&held));
        if let Some(rt) = runtime
            && !self.renewing.swap(true, Ordering::AcqRel)
        {
            rt.spawn(renew_forever(Renewing(Arc::downgrade(self))));
        }
        Slot { held }
    }

    /// Waits, at most `within`, for the releases spawned so far: a
    /// process that exits right after its last response would otherwise
    /// leave those slots held until their hold timeout.
    pub(super) async fn released(&self, within: Duration) {
        let all_done = async {
            loop {
                let done = self.released.notified();
                if self.releasing.load(Ordering::Acquire) == 0 {
                    return;
                }
                done.await;
            }
        };
        let _ = tokio::time::timeout(within, all_done).await;
    }

    /// Slots due for renewal now; each is due again a third of its hold
    /// timeout later.
    fn due(&self) -> Vec<Arc<Held>> {
        let now = tokio::time::Instant::now();
        let held: Vec<Arc<Held>> = self
            .held
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        held.into_iter()
            .filter(|h| {
                let mut due = h.due.lock();
                if *due > now {
                    return false;
                }
                *due = now + h.hold() / 3;
                true
            })
            .collect()
    }

    /// Renews every slot due.
    async fn renew_due(&self) {
        let held = self.due();
        if held.is_empty() {
            return;
        }
        let renewals = held.iter().map(|h| async move {
            let failed = match h.store.renew(&h.items, &h.holder).await {
                Ok(gone) => gone,
                Err(e) => {
                    tracing::debug!(shard = %h.shard, error = %e, "in-flight renewal failed");
                    h.items.len() as u64
                }
            };
            if failed > 0 {
                inflight::renewals_failed(&h.shard, failed);
            }
            failed
        });
        let failed: u64 = futures_util::future::join_all(renewals)
            .await
            .into_iter()
            .sum();
        if failed == 0 {
            self.warned.store(false, Ordering::Release);
        } else if !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                failed,
                "in-flight renewals failed; slots not renewed come back after their hold timeout (logged once until renewals succeed again)"
            );
        }
    }
}

/// Lets the next slot taken start a renewal task when this one ends
/// (dropped with its runtime, or a panic): without it a limiter that
/// outlives the runtime of its first slot never renews again.
struct Renewing(Weak<Slots>);

impl Drop for Renewing {
    fn drop(&mut self) {
        if let Some(slots) = self.0.upgrade() {
            slots.renewing.store(false, Ordering::Release);
        }
    }
}

/// Renews the slots of `renewing` until the limiter is gone. The guard is
/// an argument, not a local, so it goes with the task even if the task is
/// dropped before it ever ran.
async fn renew_forever(renewing: Renewing) {
    let slots = renewing.0.clone();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(slots) = slots.upgrade() else {
            return;
        };
        slots.renew_due().await;
    }
}

/// The in-flight slots a decision on the wire may take for its holder,
/// given back unless the decision's answer arrives.
///
/// A script Redis runs after the caller stopped waiting (the caller's
/// future was dropped: a client gone; or the decision budget ran out)
/// takes a slot no [`Slot`] holds: nothing renews it or gives it back, and
/// it would be held until its hold timeout. Left armed, this asks the
/// store to give it back (idempotent: a holder never added is no-op). On
/// one connection the release is queued behind the decision, so it runs
/// after the slot was taken.
pub(super) struct Unseen<'a> {
    store: &'a Arc<dyn Store>,
    items: &'a [Item],
    holder: Option<&'a str>,
}

impl<'a> Unseen<'a> {
    /// Armed for `holder`'s slots in `items` (none without a holder).
    pub(super) fn new(
        store: &'a Arc<dyn Store>,
        items: &'a [Item],
        holder: Option<&'a str>,
    ) -> Self {
        Self {
            store,
            items,
            holder,
        }
    }

    /// The answer arrived (or no call was made): a slot taken is held by
    /// the [`Slot`] of the decision, not given back here.
    pub(super) fn seen(mut self) {
        self.holder = None;
    }
}

impl Drop for Unseen<'_> {
    fn drop(&mut self) {
        let Some(holder) = self.holder.take() else {
            return;
        };
        let items: Vec<Item> = self
            .items
            .iter()
            .filter(|i| i.algorithm.is_concurrency())
            .cloned()
            .collect();
        let Some(first) = items.first() else {
            return;
        };
        let shard = self.store.shard_for(&first.key);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            inflight::release_failed(&shard);
            return;
        };
        let store = self.store.clone();
        let holder = holder.to_owned();
        rt.spawn(async move {
            if let Err(e) = store.release(&items, &holder).await {
                inflight::release_failed(&shard);
                tracing::debug!(%shard, error = %e, "in-flight release of an unanswered decision failed; the slot comes back after its hold timeout");
            }
        });
    }
}
