//! How a limit is decided: every request in the store (`exact`), from a
//! pre-paid local lease (`leased`), or exact until the key runs hot
//! (`auto`); and the `[leases]` tuning. The lease machinery itself lives in
//! [`crate::lease`].

use std::time::Duration;

/// How the requests of a limit (or of a route) are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LeaseMode {
    /// One store call per request (what a request none of whose limits
    /// has a mode gets).
    #[default]
    Exact,
    /// Pre-paid leases whenever the store supports them.
    Leased,
    /// Exact until the key's decision rate crosses
    /// `[leases] enter_per_second`, leased until it drops below
    /// `exit_per_second` (the default for `scope = "route"` limits).
    Auto,
}

impl LeaseMode {
    /// The config spellings, for parsing and messages.
    pub const CHOICES: [(&'static str, LeaseMode); 3] = [
        ("exact", LeaseMode::Exact),
        ("leased", LeaseMode::Leased),
        ("auto", LeaseMode::Auto),
    ];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Exact => "exact",
            LeaseMode::Leased => "leased",
            LeaseMode::Auto => "auto",
        }
    }

    /// The mode of one request: a route's `mode` decides for all its
    /// limits. Otherwise the limits that have a mode (set, or `auto` by
    /// default for `scope = "route"`) decide: any `exact` makes the request
    /// exact (all limits are decided together, and a round trip is paid
    /// anyway), then any `leased` makes it leased, then `auto`. Limits
    /// without a mode follow the others; a request none of whose limits has
    /// one is exact.
    pub fn of_request(
        route: Option<LeaseMode>,
        limits: impl IntoIterator<Item = Option<LeaseMode>>,
    ) -> Self {
        if let Some(m) = route {
            return m;
        }
        let mut out = None;
        for m in limits.into_iter().flatten() {
            match m {
                LeaseMode::Exact => return LeaseMode::Exact,
                LeaseMode::Leased => out = Some(LeaseMode::Leased),
                LeaseMode::Auto => {
                    out.get_or_insert(LeaseMode::Auto);
                }
            }
        }
        out.unwrap_or(LeaseMode::Exact)
    }
}

/// `[leases]`: when keys go into lease mode and how big leases are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseSettings {
    /// An `auto` key enters lease mode at this many decisions per second on
    /// one instance.
    pub enter_per_second: f64,
    /// An `auto` key leaves lease mode below this rate (below
    /// `enter_per_second`: the gap is the hysteresis).
    pub exit_per_second: f64,
    /// A lease is sized to last this long at the observed rate.
    pub renew: Duration,
    /// A lease is never valid longer than this (nor past the end of the
    /// window it was charged to).
    pub ttl: Duration,
    /// The largest lease, as a share of the smallest quota among the
    /// request's limits divided by `[resilience] expected_instances`.
    pub max_share: f64,
    /// Most keys one instance tracks for auto mode and leases.
    pub max_keys: usize,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            enter_per_second: 50.0,
            exit_per_second: 20.0,
            renew: Duration::from_millis(100),
            ttl: Duration::from_secs(1),
            max_share: 0.25,
            max_keys: 10_000,
        }
    }
}

impl LeaseSettings {
    /// Why the settings are invalid, as `(field, message)`.
    pub fn check(&self) -> Option<(&'static str, String)> {
        if !(self.enter_per_second.is_finite() && self.enter_per_second > 0.0) {
            return Some(("leases.enter_per_second", "must be a positive rate".into()));
        }
        if !(self.exit_per_second >= 0.0 && self.exit_per_second < self.enter_per_second) {
            return Some((
                "leases.exit_per_second",
                format!(
                    "must be at least 0 and below enter_per_second ({}), so a key at a steady rate does not flap",
                    self.enter_per_second
                ),
            ));
        }
        if !(self.max_share > 0.0 && self.max_share <= 1.0) {
            return Some((
                "leases.max_share",
                format!("must be above 0 and at most 1, got {}", self.max_share),
            ));
        }
        if self.renew.is_zero() || self.ttl < self.renew {
            return Some((
                "leases.ttl_ms",
                "must be at least renew_ms, and renew_ms above 0".into(),
            ));
        }
        None
    }
}
