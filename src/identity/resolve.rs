//! Tier resolution: which tier an identity belongs to.

use std::sync::Arc;

use http::request::Parts;

use super::Identity;
use crate::policy::Policy;

/// Names the tier of a request's caller. Implement it to read a plan that
/// an auth layer put into the request's extensions (a JWT claim, a
/// customer record); return `None` to fall back to the key-prefix rule.
///
/// It is synchronous on purpose: it runs on every request, so a lookup
/// that needs I/O belongs in the auth layer before it (which can cache),
/// with its answer left in the extensions for the resolver to read.
///
/// ```
/// use http::request::Parts;
/// use ratewatch::{Identity, TierResolver};
/// #[derive(Clone)]
/// struct Plan(&'static str); // set by an auth layer
/// struct PlanResolver;
/// impl TierResolver for PlanResolver {
///     fn resolve(&self, _: &Identity, request: &Parts) -> Option<String> {
///         request.extensions.get::<Plan>().map(|p| p.0.to_owned())
///     }
/// }
/// ```
pub trait TierResolver: Send + Sync + 'static {
    /// The tier name for `identity` calling with `request` (its method,
    /// URI, headers and extensions), or `None` for the default rule.
    fn resolve(&self, identity: &Identity, request: &Parts) -> Option<String>;
}

/// The default rule: anonymous callers get `anonymous_tier`, keys the first
/// tier whose `match_prefix` they start with, else `default_tier`.
#[derive(Debug, Clone)]
pub struct PrefixResolver {
    policy: Arc<Policy>,
}

impl PrefixResolver {
    /// The rule of `policy`.
    pub fn new(policy: Arc<Policy>) -> Self {
        Self { policy }
    }

    /// The tier name, synchronously.
    pub fn tier_of(&self, identity: &Identity) -> String {
        self.matched(identity)
            .unwrap_or(&self.policy.identity.default_tier)
            .to_owned()
    }

    /// The tier the rule names: the anonymous tier for anonymous callers,
    /// the first tier whose prefix a key starts with, `None` for a key that
    /// matches no prefix (the caller of `default_tier`).
    pub fn matched(&self, identity: &Identity) -> Option<&str> {
        if identity.is_anonymous() {
            return Some(&self.policy.identity.anonymous_tier);
        }
        let raw = identity.raw();
        self.policy
            .tiers
            .iter()
            .find(|t| {
                t.match_prefix
                    .as_deref()
                    .is_some_and(|p| raw.starts_with(p))
            })
            .map(|t| t.name.as_str())
    }
}

impl TierResolver for PrefixResolver {
    fn resolve(&self, identity: &Identity, _: &Parts) -> Option<String> {
        Some(self.tier_of(identity))
    }
}
