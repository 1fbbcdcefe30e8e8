//! The `[rls]` section as loaded.

use std::path::PathBuf;

use super::DomainSet;

/// What a decision service answers while the store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RlsFailure {
    /// Answer OK (counted as a fallback).
    #[default]
    Open,
    /// Answer OVER_LIMIT.
    Closed,
    /// Answer gRPC UNAVAILABLE (HTTP 503), so the caller's own failure
    /// setting (Envoy's `failure_mode_deny`) decides.
    Unavailable,
    /// Decide in process with every quota divided by
    /// `[resilience] expected_instances`.
    Local,
}

impl RlsFailure {
    /// The config spellings, for parsing and messages.
    pub const CHOICES: [(&'static str, RlsFailure); 4] = [
        ("open", RlsFailure::Open),
        ("closed", RlsFailure::Closed),
        ("unavailable", RlsFailure::Unavailable),
        ("local", RlsFailure::Local),
    ];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RlsFailure::Open => "open",
            RlsFailure::Closed => "closed",
            RlsFailure::Unavailable => "unavailable",
            RlsFailure::Local => "local",
        }
    }

    /// The same choice as the middleware's failure policy.
    pub fn from_policy(p: crate::policy::FailurePolicy) -> Self {
        match p {
            crate::policy::FailurePolicy::Open => RlsFailure::Open,
            crate::policy::FailurePolicy::Closed => RlsFailure::Closed,
            crate::policy::FailurePolicy::Local => RlsFailure::Local,
        }
    }
}

/// What a decision service's answer carries for the client's response
/// (`response_headers_to_add`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RlsHeaders {
    /// Nothing, as envoyproxy/ratelimit sends by default: Envoy builds
    /// its own `X-RateLimit-*` from the statuses when asked to.
    #[default]
    None,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`.
    Ietf,
}

impl RlsHeaders {
    /// The config spellings, for parsing and messages.
    pub const CHOICES: [(&'static str, RlsHeaders); 2] =
        [("none", RlsHeaders::None), ("ietf", RlsHeaders::Ietf)];
}

/// `[rls]` of a policy, with every domain loaded (YAML and native).
///
/// Its `Debug` output hides the token: policies are printed to logs and
/// hashed into a metric label (the policy version's hash).
#[derive(Clone, PartialEq)]
pub struct RlsSettings {
    /// Every domain, by name.
    pub domains: DomainSet,
    /// What to answer while the store is unreachable: `[rls]
    /// on_store_failure`, else `[resilience] on_store_failure`.
    pub on_store_failure: RlsFailure,
    /// A bearer token the HTTP endpoints require from non-loopback callers.
    pub token: Option<String>,
    /// `[rls] response_headers`: what answers carry for the client.
    pub response_headers: RlsHeaders,
    /// The envoyproxy/ratelimit YAML files loaded, in load order,
    /// resolved against the policy file's directory: part of the policy,
    /// so a reload re-reads them and a follower watches them.
    pub envoy_configs: Vec<PathBuf>,
    /// The `envoy_configs` entries as written (files, directories, globs),
    /// resolved against the policy file's directory: a follower lists them
    /// again to see files added and removed.
    pub envoy_config_entries: Vec<PathBuf>,
    /// `[rls] near_limit_ratio` (envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`):
    /// an allowed descriptor whose used share of its limit is at least
    /// this after the charge counts as near its limit; in `(0, 1]`.
    pub near_limit_ratio: f64,
    /// `[rls] detailed_metric_top_k`: how many request values of one
    /// `detailed_metric` / `value_to_metric` rule get per-value series of
    /// their own; every other value is counted under one `_other` series.
    pub detailed_metric_top_k: usize,
    /// `[rls] response_dynamic_metadata` (envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA`): answers carry `dynamic_metadata` with
    /// the request's domain and descriptors and the `metadata` of the rules
    /// whose descriptors passed.
    pub response_dynamic_metadata: bool,
}

impl RlsSettings {
    /// The default `near_limit_ratio`, as envoyproxy/ratelimit's.
    pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;
    /// The default `detailed_metric_top_k`.
    pub const DEFAULT_DETAILED_METRIC_TOP_K: usize = 100;
    /// The largest `detailed_metric_top_k` accepted.
    pub const MAX_DETAILED_METRIC_TOP_K: usize = 1000;
}

impl Default for RlsSettings {
    fn default() -> Self {
        Self {
            domains: DomainSet::default(),
            on_store_failure: RlsFailure::default(),
            token: None,
            response_headers: RlsHeaders::default(),
            envoy_configs: Vec::new(),
            envoy_config_entries: Vec::new(),
            near_limit_ratio: Self::DEFAULT_NEAR_LIMIT_RATIO,
            detailed_metric_top_k: Self::DEFAULT_DETAILED_METRIC_TOP_K,
            response_dynamic_metadata: false,
        }
    }
}

impl std::fmt::Debug for RlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsSettings")
            .field("domains", &self.domains)
            .field("on_store_failure", &self.on_store_failure)
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .field("response_headers", &self.response_headers)
            .field("envoy_configs", &self.envoy_configs)
            .field("envoy_config_entries", &self.envoy_config_entries)
            .field("near_limit_ratio", &self.near_limit_ratio)
            .field("detailed_metric_top_k", &self.detailed_metric_top_k)
            .field("response_dynamic_metadata", &self.response_dynamic_metadata)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_token() {
        let s = RlsSettings {
            token: Some("s3cret-token-of-the-edge".into()),
            ..RlsSettings::default()
        };
        let text = format!("{s:?}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("<hidden>"), "{text}");
    }
}
