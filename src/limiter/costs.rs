//! [`Costs`]: what one request costs in each unit its limits count.
//!
//! A limit counts one unit ([`Limit::unit`](crate::Limit::unit)):
//! `requests` by default, or another such as `tokens`. One decision
//! charges every limit the request's cost in that limit's unit, in one
//! atomic store call, all or nothing:
//!
//! - a limit of a unit the costs name is charged that many units;
//! - a `requests` limit the costs say nothing of is charged the route
//!   rule's cost (1 without a rule);
//! - a limit of any other unit the costs say nothing of, or name at 0, is
//!   checked without charge: it passes only while at least one unit is
//!   left, so "check now, charge the tokens later" (settle them with
//!   [`Reservation::settle_costs`](crate::Reservation::settle_costs)) is
//!   refused once the budget is used up;
//! - an in-flight limit takes one slot (none when the requests cost is 0).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use ratewatch::{Costs, Limit, Limiter, Policy, Tier};
//! use ratewatch::identity::{Identity, IdentityKind};
//! let policy = Policy::builder()
//!     .tier(
//!         Tier::new("free")
//!             .limit(Limit::per_minute("rpm", 10))
//!             .limit(Limit::per_minute("tpm", 1000).unit("tokens")),
//!     )
//!     .tier(Tier::new("anonymous").limit(Limit::per_minute("rpm", 1)))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::new(policy).await.unwrap();
//! let caller = Identity::new(IdentityKind::ApiKey, "k");
//! let d = limiter.check_costs(&caller, "free", None, &Costs::new().with("tokens", 600)).await;
//! assert!(d.allowed);
//! // 400 tokens left: a request for 600 is refused, and charges no request.
//! let d = limiter.check_costs(&caller, "free", None, &Costs::new().with("tokens", 600)).await;
//! assert!(!d.allowed);
//! assert_eq!(d.refused_by().unwrap().name.as_ref(), "tpm");
//! assert_eq!(d.limits[0].remaining, Some(9.0));
//! # });
//! ```

use std::borrow::Cow;

use smallvec::SmallVec;

use crate::policy::REQUESTS;

/// A request's cost per unit: unit name -> units. Small and cheap: a few
/// units live inline, and a unit named by a `&'static str` is not copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    units: SmallVec<[(Cow<'static, str>, u64); 2]>,
}

impl Costs {
    /// No cost named: every `requests` limit is charged the route rule's
    /// cost, every other limit is checked without charge.
    pub fn new() -> Self {
        Self::default()
    }

    /// `n` requests (the cost of the single-cost APIs).
    pub fn requests(n: u64) -> Self {
        Self::new().with(REQUESTS, n)
    }

    /// These costs with `unit` costing `n` (replacing what it cost).
    pub fn with(mut self, unit: impl Into<Cow<'static, str>>, n: u64) -> Self {
        self.set(unit, n);
        self
    }

    /// Sets `unit` to cost `n`.
    pub fn set(&mut self, unit: impl Into<Cow<'static, str>>, n: u64) {
        let unit = unit.into();
        match self.units.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, c)) => *c = n,
            None => self.units.push((unit, n)),
        }
    }

    /// Adds `n` to what `unit` costs (saturating).
    pub fn add(&mut self, unit: impl Into<Cow<'static, str>>, n: u64) {
        let unit = unit.into();
        match self.units.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, c)) => *c = c.saturating_add(n),
            None => self.units.push((unit, n)),
        }
    }

    /// What `unit` costs, if named.
    pub fn get(&self, unit: &str) -> Option<u64> {
        self.units.iter().find(|(u, _)| u == unit).map(|(_, n)| *n)
    }

    /// Every unit named, in the order first named.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.units.iter().map(|(u, n)| (u.as_ref(), *n))
    }

    /// Whether no unit is named.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

impl From<u64> for Costs {
    /// `n` requests.
    fn from(n: u64) -> Self {
        Self::requests(n)
    }
}

impl<U: Into<Cow<'static, str>>> FromIterator<(U, u64)> for Costs {
    fn from_iter<I: IntoIterator<Item = (U, u64)>>(iter: I) -> Self {
        let mut costs = Costs::new();
        for (u, n) in iter {
            costs.set(u, n);
        }
        costs
    }
}

/// The `requests` unit as a shared name (a clone is a reference count).
pub(crate) fn requests_unit() -> std::sync::Arc<str> {
    static UNIT: std::sync::OnceLock<std::sync::Arc<str>> = std::sync::OnceLock::new();
    UNIT.get_or_init(|| REQUESTS.into()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_named_twice_keeps_its_last_cost_and_adds_saturate() {
        let mut c = Costs::new().with("tokens", 5).with("tokens", 7);
        assert_eq!(c.get("tokens"), Some(7));
        assert_eq!(c.get(REQUESTS), None);
        c.add("tokens", u64::MAX);
        assert_eq!(c.get("tokens"), Some(u64::MAX));
        assert_eq!(Costs::from(3).get("requests"), Some(3));
        assert_eq!(c.iter().count(), 1);
    }
}
