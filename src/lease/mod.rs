//! Pre-paid leases: hot keys decided locally, with no overshoot.
//!
//! A key (all limits of one kind of request: same identity, tier and
//! route) in lease mode takes a slice of its quota from the store in one
//! atomic call: the decide script with `cost = n` charges every limit of
//! the request `n` units at once, all or nothing, on the store's clock. The
//! instance then spends those units locally, with no I/O, and gives back
//! what is unused (the refund script) when the key leaves lease mode, when
//! a lease's TTL ends while its window is still open, and when the limiter
//! shuts down. Renewal happens in the background when the lease runs below
//! half of its last take, and tops the lease up within one window.
//!
//! Which requests are leased is the policy's `mode`:
//!
//! ```
//! use ratewatch::policy::{LeaseMode, Limit, Scope};
//! use std::time::Duration;
//! let ceiling = Limit::fixed_window("all", 50_000, Duration::from_secs(1)).with_scope(Scope::Route);
//! let mine = Limit::token_bucket("burst", 100, 10.0);
//! // A route-wide ceiling is `auto`; the tier's limit follows it.
//! let mode = LeaseMode::of_request(None, [ceiling.effective_mode(), mine.effective_mode()]);
//! assert_eq!(mode, LeaseMode::Auto);
//! ```
//!
//! ## Bounds (N instances, `cap` the largest lease of a key)
//!
//! - **Overshoot: 0 while the store answers.** Every unit spent locally was
//!   charged first; the sum of outstanding leases is part of what the
//!   limits admitted. A lease is valid until its TTL or the end of the
//!   first window it was charged to, whichever is sooner, measured from
//!   before the take was sent, so it is never spent in a later window.
//! - **False refusals: at most `N × cap` units per window.** A request is
//!   refused only by the store (or by a remembered store refusal, until its
//!   retry time); at that point at most one lease per instance, `cap` each,
//!   is charged and unspent. A limit that several leased keys share (a
//!   route-wide ceiling above per-identity limits) can carry one lease per
//!   such key per instance: for it, `N ×` the sum of their caps.
//! - **A dead holder** strands at most `cap` units per key: they are
//!   consumed, and come back when the window rolls (the lease never
//!   outlives it) or, for a bucket, within one TTL of refill (`cap` is at
//!   most what the bucket refills in one TTL).
//! - **The tail:** when a take leaves less than `N × cap` units, leases
//!   shrink to what is left divided by `2N` until the lease expires; once
//!   that is under one request's cost, or a take cannot be had, the key is
//!   decided per request until the lease expires.
//! - **Store down:** a held lease is spent (it is paid for); after that
//!   the route's failure policy answers.
//!
//! The memory and Sentinel stores decide exactly: they report
//! [`Store::leases`](crate::store::Store::leases) `false`.

mod entry;
mod sizing;
mod sketch;
mod table;

pub use entry::Transition;
pub(crate) use entry::{Label, Step};
pub(crate) use table::{GiveBack, Leases, Request};

/// A key served from a lease, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HotKey {
    /// The identity in display form (masked by default).
    pub identity: String,
    /// The tier.
    pub tier: String,
    /// The route rule's pattern, or `*`.
    pub route: String,
    /// Units of the lease held on this instance now.
    pub units: u64,
    /// Decisions per second on this instance (decayed estimate).
    pub rate: f64,
}
