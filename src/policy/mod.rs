//! The policy: tiers of limits, route rules, and the settings of every part.
//!
//! A [`Policy`] comes from a TOML file ([`Policy::from_toml_file`], whose
//! errors name the file, line and field) or from code:
//!
//! ```
//! use ratewatch::policy::{Limit, Policy, RouteRule, Tier};
//! let policy = Policy::builder()
//!     .tier(Tier::new("free").match_prefix("free_").limit(Limit::token_bucket("burst", 10, 0.33)))
//!     .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 5)))
//!     .route(RouteRule::new("POST", "/api/export").with_cost(5))
//!     .build()
//!     .unwrap();
//! assert_eq!(policy.tiers.len(), 2);
//! ```

mod builder;
mod config;
mod env;
mod lease;
mod limit;
pub mod peer_env;
pub mod rls;
mod route;
mod server;
mod settings;
pub mod shares;
mod tier;
mod version;

pub use builder::PolicyBuilder;
pub(crate) use builder::leasable;
pub use config::{ConfigError, MAX_POLICY_FILE_BYTES, MAX_RULE_FILE_BYTES, parse_duration};
pub(crate) use config::{
    FileKind, Fingerprint, PolicyFile, ReadError, expand_rule_entry, read_policy_file,
    read_secret_file, read_text_file,
};
// The store reads TLS files with it (feature `tls`).
#[allow(unused_imports)]
pub(crate) use config::read_named_file;
pub(crate) use env::hash_secret_from;
pub use env::{CONFIG_VAR, HASH_SECRET_VAR, REDIS_URL_VAR};
pub use lease::{LeaseMode, LeaseSettings};
pub use limit::{Limit, MAX_UNIT_LEN, REQUESTS, Scope, check_unit};
pub use route::{
    Condition, CostEstimate, DEFAULT_MAX_BODY_BYTES, EstimateSource, RouteRule, path_matches,
};
pub use server::{GRPC_SEND_BUFFER, ServerSettings};
pub use settings::{
    AnonymousMode, BreakerSettings, DEFAULT_IPV6_PREFIX, DEFAULT_MAX_ENTRIES, DEFAULT_REDIS_URL,
    DashboardSettings, FailurePolicy, HashSecret, IdentitySettings, IpNet, KeyDisplay,
    MAX_LIMITER_NAME, ResilienceSettings, StoreKind, StoreSettings, TelemetrySettings, TlsFiles,
    UnknownTier, UnmatchedKeys, canonical_net as settings_canonical_net, ip_in as settings_ip_in,
};
pub use tier::Tier;
pub use version::PolicyVersion;

/// A complete, validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Where counters live.
    pub store: StoreSettings,
    /// Timeout, breaker and failure policy.
    pub resilience: ResilienceSettings,
    /// How callers are identified and tiered.
    pub identity: IdentitySettings,
    /// Metrics and the fleet view.
    pub telemetry: TelemetrySettings,
    /// The built-in dashboard.
    pub dashboard: DashboardSettings,
    /// When hot keys are decided from pre-paid local leases.
    pub leases: LeaseSettings,
    /// Tiers, in the order prefixes are tried.
    pub tiers: Vec<Tier>,
    /// Route rules, first match wins.
    pub routes: Vec<RouteRule>,
    /// Share of every quota this deployment enforces (a region's share);
    /// 1.0 by default. Already applied to `tiers` and `routes`.
    pub partition: f64,
    /// The top-level `version = "..."` of the file (free text naming this
    /// revision of the policy), shown beside its content hash.
    pub version: Option<String>,
    /// `[rls]`: the descriptor domains of the decision service (empty by
    /// default).
    pub rls: rls::RlsSettings,
    /// `[server]`: the bounds of `ratewatch serve`'s listeners.
    pub server: ServerSettings,
}

impl Policy {
    /// Starts a policy in code.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }

    /// Checks the policy as [`PolicyBuilder::build`] does: a policy whose
    /// public fields were edited afterwards is checked again before use.
    pub fn validate(&self) -> Result<(), ConfigError> {
        builder::validate(self).map_err(|(field, message)| ConfigError::Invalid {
            file: None,
            line: None,
            field,
            message,
        })
    }

    /// The largest cost of a limited route (1 without routes): every share
    /// of a quota must still admit it.
    pub fn max_route_cost(&self) -> u64 {
        self.routes
            .iter()
            .filter(|r| !r.exempt)
            .map(|r| r.cost)
            .max()
            .unwrap_or(1)
    }

    /// The tier named `name`.
    pub fn tier(&self, name: &str) -> Option<&Tier> {
        self.tiers.iter().find(|t| t.name == name)
    }

    /// The first route rule matching a request.
    pub fn route_for(&self, method: &str, path: &str) -> Option<&RouteRule> {
        self.routes
            .iter()
            .find(|r| r.when.is_empty() && r.matches(method, path))
    }

    /// The tier for an API key or token: the first tier whose prefix it
    /// starts with, else the default tier.
    pub fn tier_for_key(&self, key: &str) -> &str {
        self.tiers
            .iter()
            .find(|t| {
                t.match_prefix
                    .as_deref()
                    .is_some_and(|p| key.starts_with(p))
            })
            .map_or(self.identity.default_tier.as_str(), |t| t.name.as_str())
    }
}
