//! The live policy: everything derived from a policy, as one immutable
//! generation behind an atomic pointer.
//!
//! A reload builds a whole new [`Live`] (policy, compiled tiers and
//! routes, tier resolver, identity extractor, version) off the hot path and
//! swaps it in with one atomic store. A request loads the pointer once
//! ([`crate::Limiter::snapshot`]) and is decided entirely under that
//! generation, from route matching to its headers: a [`RouteMatch`] carries
//! the generation it indexes, so it can never be read against another.
//! In-flight requests keep their generation alive until they finish.

use std::sync::Arc;

use super::compiled::Compiled;
use crate::identity::{
    HeaderExtractor, IdentityKey, KeyExtractor, PrefixResolver, PrincipalExtractor, ReadCaller,
    TierResolver,
};
use crate::policy::{HashSecret, Policy, PolicyVersion};

/// The parts an embedding app plugged in, and the identity hash key, which
/// outlive every reload (a new key would be a new counter per caller).
#[derive(Clone)]
pub(crate) struct Plugins {
    pub(crate) resolver: Option<Arc<dyn TierResolver>>,
    pub(crate) extractor: Option<Arc<dyn KeyExtractor>>,
    /// Reads the verified caller of `identity_from_extension`.
    pub(crate) principal: Option<ReadCaller>,
    pub(crate) key: IdentityKey,
    /// The `hash_secret` and `hash_secret_file` the key came from, so a
    /// reload that changes them can say it waits for a restart.
    pub(crate) key_source: (Option<HashSecret>, Option<std::path::PathBuf>),
}

/// One generation of the policy and everything derived from it.
pub(crate) struct Live {
    pub(crate) policy: Arc<Policy>,
    pub(crate) compiled: Compiled,
    /// The app's resolver, if it plugged one in.
    pub(crate) resolver: Option<Arc<dyn TierResolver>>,
    pub(crate) prefix_resolver: PrefixResolver,
    pub(crate) extractor: Arc<dyn KeyExtractor>,
    /// The deployment's identity hash key.
    pub(crate) key: IdentityKey,
    pub(crate) version: PolicyVersion,
}

impl Live {
    /// Derives every part from a validated `policy`.
    pub(crate) fn new(policy: Policy, plugins: &Plugins) -> Self {
        let policy = Arc::new(policy);
        let source = (
            policy.identity.hash_secret.clone(),
            policy.identity.hash_secret_file.clone(),
        );
        if source != plugins.key_source {
            tracing::warn!(
                "[identity] hash_secret or hash_secret_file changed: identity hashes keep the \
                 secret the limiter started with until a restart (a new secret resets every \
                 counter once)"
            );
        }
        let prefix_resolver = PrefixResolver::new(policy.clone());
        let headers = HeaderExtractor::new(policy.identity.clone()).with_key(plugins.key.clone());
        let extractor: Arc<dyn KeyExtractor> = match (&plugins.extractor, plugins.principal) {
            (Some(custom), _) => custom.clone(),
            (None, Some(read)) => Arc::new(PrincipalExtractor::reading(read, headers)),
            (None, None) => Arc::new(headers),
        };
        Self {
            compiled: Compiled::new(&policy),
            resolver: plugins.resolver.clone(),
            prefix_resolver,
            extractor,
            key: plugins.key.clone(),
            version: PolicyVersion::of(&policy),
            policy,
        }
    }
}

/// A matched route rule: an index into the routes of the generation that
/// matched it, which it keeps alive.
#[derive(Clone)]
pub struct RouteMatch {
    pub(crate) index: usize,
    pub(crate) live: Arc<Live>,
}

impl RouteMatch {
    /// The rule's pattern (its metric label).
    pub fn label(&self) -> &str {
        &self.live.compiled.routes[self.index].label
    }

    /// Whether the rule is exempt from limiting.
    pub fn is_exempt(&self) -> bool {
        self.live.compiled.routes[self.index].rule.exempt
    }

    /// The matched rule.
    pub fn rule(&self) -> &crate::policy::RouteRule {
        &self.live.compiled.routes[self.index].rule
    }
}

impl std::fmt::Debug for RouteMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMatch")
            .field("route", &self.label())
            .field("policy", &self.live.version.hash)
            .finish()
    }
}

impl PartialEq for RouteMatch {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index && Arc::ptr_eq(&self.live, &other.live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
version = "7"
[dashboard]
token = "secret-1"
[[tiers]]
name = "free"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]
"#;

    fn version_of(text: &str) -> PolicyVersion {
        PolicyVersion::of(&Policy::from_toml_str(text, None).unwrap())
    }

    #[test]
    fn the_hash_follows_the_rules_not_the_layout_the_version_or_the_token() {
        let base = version_of(FILE);
        assert_eq!(base.version, "7");
        assert_eq!(base.hash.len(), 12);
        let relaid = FILE.replace("[[tiers]]", "# a comment\n\n[[tiers]]");
        assert_eq!(version_of(&relaid), base);
        let renamed = version_of(&FILE.replace("version = \"7\"", "version = \"8\""));
        assert_eq!((renamed.version.as_str(), &renamed.hash), ("8", &base.hash));
        let token = version_of(&FILE.replace("secret-1", "secret-2"));
        assert_eq!(token.hash, base.hash);
        let tighter = version_of(&FILE.replace("capacity = 10", "capacity = 9"));
        assert_ne!(tighter.hash, base.hash);
    }
}
