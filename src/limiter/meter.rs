//! [`Meter`] and [`Usage`]: how a handler tells the layer what a request
//! really used, so that it is settled after the response.
//!
//! The layer (with [`RateLimitLayer::with_cost`](crate::RateLimitLayer::with_cost))
//! puts a [`Meter`] into the extensions of every request it lets through
//! (one with nothing reserved, as when the failure policy answered,
//! settles nothing). A handler calls [`Meter::record`] or [`Meter::add`] (from a
//! streamed body too: a clone lives as long as the stream), and/or puts a
//! [`Usage`] into its response's extensions, which the layer records when
//! the response head comes back. When the last clone of the meter drops
//! (the layer holds one until the response head, a handler's live as long
//! as it keeps them) the request is settled in the background: nothing
//! recorded, nothing settled.
//!
//! A request whose client disconnects is dropped with its handler, so its
//! meter drops too and what was recorded by then is settled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::Costs;
use super::reserve::Reservation;

/// What a request really used, in its reservation's primary unit
/// ([`Reservation::primary_unit`]: requests unless its limits count
/// another unit, such as tokens): a handler puts it into its response's
/// extensions, and the layer records it in the request's [`Meter`] when
/// the response head comes back (replacing what was recorded before).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage(pub u64);

/// What a request really used, per unit: [`Usage`] for several units. A
/// unit it does not name keeps what was recorded (or reserved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitUsage(pub Costs);

/// The running usage of one admitted request, settled when the last clone
/// drops. Cheap to clone; every clone counts into the same total.
#[derive(Debug, Clone)]
pub struct Meter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    reservation: Mutex<Option<Reservation>>,
    /// The reservation's primary unit, what `actual` counts.
    primary: Arc<str>,
    actual: AtomicU64,
    recorded: AtomicBool,
    /// What was recorded in the other units.
    others: Mutex<Costs>,
    /// Give the whole reservation back if nothing is recorded by the end.
    refund_unrecorded: AtomicBool,
}

impl Meter {
    /// A meter settling `reservation` when its last clone drops.
    pub fn new(reservation: Reservation) -> Self {
        Self {
            inner: Arc::new(Inner {
                primary: reservation.primary_unit().into(),
                reservation: Mutex::new(Some(reservation)),
                actual: AtomicU64::new(0),
                recorded: AtomicBool::new(false),
                others: Mutex::default(),
                refund_unrecorded: AtomicBool::new(false),
            }),
        }
    }

    /// A meter with nothing to settle: the request passed without a
    /// reservation (the failure policy answered, or no limit applies), and
    /// its handler still finds a meter to record into.
    pub(crate) fn detached() -> Self {
        Self {
            inner: Arc::new(Inner {
                reservation: Mutex::new(None),
                primary: super::costs::requests_unit(),
                actual: AtomicU64::new(0),
                recorded: AtomicBool::new(false),
                others: Mutex::default(),
                refund_unrecorded: AtomicBool::new(false),
            }),
        }
    }

    /// Units the request's decision reserved (charged up front; 0 when
    /// nothing was).
    pub fn reserved(&self) -> u64 {
        self.inner
            .reservation
            .lock()
            .as_ref()
            .map_or(0, Reservation::reserved)
    }

    /// Sets the request's actual usage to `units` (replacing what was
    /// recorded or added before).
    pub fn record(&self, units: u64) {
        self.inner.actual.store(units, Ordering::Relaxed);
        self.inner.recorded.store(true, Ordering::Release);
    }

    /// Adds `units` to the request's actual usage (saturating at
    /// `u64::MAX`): for a stream that counts as it goes.
    pub fn add(&self, units: u64) {
        let _ = self
            .inner
            .actual
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(units))
            });
        self.inner.recorded.store(true, Ordering::Release);
    }

    /// The usage recorded so far, `None` if nothing was.
    pub fn actual(&self) -> Option<u64> {
        self.inner
            .recorded
            .load(Ordering::Acquire)
            .then(|| self.inner.actual.load(Ordering::Relaxed))
    }

    /// The unit [`Meter::record`] and [`Meter::add`] count in (the
    /// reservation's primary unit; `requests` with nothing reserved).
    pub fn primary_unit(&self) -> &str {
        &self.inner.primary
    }

    /// Sets the request's actual usage in `unit` to `units`.
    pub fn record_unit(&self, unit: &str, units: u64) {
        if unit == &*self.inner.primary {
            self.record(units);
        } else {
            self.inner.others.lock().set(unit.to_owned(), units);
        }
    }

    /// Adds `units` to the request's actual usage in `unit` (saturating).
    pub fn add_unit(&self, unit: &str, units: u64) {
        if unit == &*self.inner.primary {
            self.add(units);
        } else {
            self.inner.others.lock().add(unit.to_owned(), units);
        }
    }

    /// Records every unit `used` names ([`Meter::record_unit`]).
    pub fn record_costs(&self, used: &Costs) {
        for (unit, n) in used.iter() {
            self.record_unit(unit, n);
        }
    }

    /// Whether any usage was recorded, in any unit.
    pub fn is_recorded(&self) -> bool {
        self.inner.recorded.load(Ordering::Acquire) || !self.inner.others.lock().is_empty()
    }

    /// Gives the whole reservation back, in every unit, when the last clone
    /// drops with nothing recorded (a request refused downstream used
    /// nothing); what is recorded by then is settled as usual. The layer
    /// calls it for a response of status 400 or more on a route with
    /// [`refund_on_error`](crate::RouteRule::refund_on_error).
    pub fn refund_unless_recorded(&self) {
        self.inner.refund_unrecorded.store(true, Ordering::Release);
    }

    /// The usage recorded so far in every unit (empty if nothing was).
    pub fn actual_costs(&self) -> Costs {
        let mut used = self.inner.others.lock().clone();
        if let Some(n) = self.actual() {
            used.set(self.inner.primary.to_string(), n);
        }
        used
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let mut used = std::mem::take(self.others.get_mut());
        if *self.recorded.get_mut() {
            used.set(self.primary.to_string(), *self.actual.get_mut());
        }
        let cancel = used.is_empty() && *self.refund_unrecorded.get_mut();
        if used.is_empty() && !cancel {
            return;
        }
        let Some(reservation) = self.reservation.get_mut().take() else {
            return;
        };
        if cancel {
            used = reservation
                .reserved_costs()
                .iter()
                .map(|(u, _)| (u.to_owned(), 0))
                .collect();
        }
        // Settling waits on the store: it goes on in the background, never
        // holding up the response (or a drop on a thread without a
        // runtime, where it cannot run and counts as failed).
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { reservation.settle_costs(&used).await });
            }
            Err(_) => {
                crate::telemetry::cost::settled(&reservation.tier, &reservation.route, "failed", 0);
            }
        }
    }
}
