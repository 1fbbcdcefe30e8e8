//! Tier resolution: which tier an identity belongs to.

use std::sync::Arc;

use super::Identity;
use crate::policy::Policy;

/// Names the tier of an identity. Implement it to read a JWT claim or look a
/// customer up; return `None` to fall back to the key-prefix rule.
#[async_trait::async_trait]
pub trait TierResolver: Send + Sync + 'static {
    /// The tier name for `identity`, or `None` for the default rule.
    async fn resolve(&self, identity: &Identity) -> Option<String>;
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
        if identity.is_anonymous() {
            self.policy.identity.anonymous_tier.clone()
        } else {
            self.policy.tier_for_key(identity.raw()).to_owned()
        }
    }
}

#[async_trait::async_trait]
impl TierResolver for PrefixResolver {
    async fn resolve(&self, identity: &Identity) -> Option<String> {
        Some(self.tier_of(identity))
    }
}
