//! Who is calling, and in which tier: the extractor and the resolver,
//! with the guarantees the limiter adds around them.
//!
//! [`PolicySnapshot::caller`] is the one place a request becomes a caller;
//! the layer and [`Limiter::status_handler`] both ask it, so the status
//! reports what the layer decides. Its rules:
//!
//! - the identity is the extractor's (a verified caller with
//!   `identity_from_extension`, else the credential headers or the client
//!   address), hashed with the deployment's key;
//! - its tier is the one the identity carries (a verified caller's plan),
//!   else the app's resolver's answer, else the key-prefix rule;
//! - a tier the policy does not define is counted in
//!   `ratewatch_unknown_tier_total` and refused (403) or replaced by the
//!   declared `[identity] unknown_tier`, never silently the default tier;
//! - a key or token (a credential nobody verified) that the resolver puts
//!   in the anonymous tier is the anonymous caller at its client address,
//!   not a caller of its own, and one that matches no tier follows
//!   `[identity] unmatched_keys`.

use std::sync::atomic::{AtomicBool, Ordering};

use http::request::Parts;

use super::{Limiter, PolicySnapshot};
use crate::identity::{Caller, Identity, IdentityError, IdentityKind, client_ip, peer_ip};
use crate::policy::{AnonymousMode, UnknownTier, UnmatchedKeys};
use crate::telemetry::metrics;

/// Set once the missing-peer-address warning has been logged.
static WARNED_NO_PEER: AtomicBool = AtomicBool::new(false);
/// Set once the unknown-tier warning has been logged: a resolver's answer
/// may follow what a client sends, so a warning per request would let a
/// client flood the log.
static WARNED_UNKNOWN_TIER: AtomicBool = AtomicBool::new(false);

impl Limiter {
    /// The caller of a request under the policy in force now (see
    /// [`PolicySnapshot::caller`]).
    pub fn caller(&self, request: &Parts) -> Result<Caller, IdentityError> {
        self.snapshot().caller(request)
    }

    /// The identity of a request under the policy in force now (see
    /// [`PolicySnapshot::identify`]).
    pub fn identify(&self, request: &Parts) -> Result<Identity, IdentityError> {
        self.snapshot().identify(request)
    }

    /// The tier of `identity` calling with `request`, under the policy in
    /// force now (see [`PolicySnapshot::resolve_tier`]).
    pub fn resolve_tier(&self, identity: &Identity, request: &Parts) -> String {
        self.snapshot().resolve_tier(identity, request)
    }
}

impl PolicySnapshot {
    /// The caller of a request, identity and tier, as the layer decides it
    /// (the rules are in this module's docs). An error is the request's
    /// answer: 400 (malformed, conflicting credentials), 401 (a key is
    /// required) or 403 (a tier the policy does not define).
    pub fn caller(&self, request: &Parts) -> Result<Caller, IdentityError> {
        let identity = self.identify(request)?;
        self.caller_of(identity, request)
    }

    /// The caller `identity` counts as, by the rules of
    /// [`PolicySnapshot::caller`] (tier, `anonymous_tier`,
    /// `[identity] unmatched_keys`) but with the identity given rather
    /// than extracted: a key the decision service was sent in a body or a
    /// descriptor is judged as a header's would be.
    pub fn caller_of(&self, identity: Identity, request: &Parts) -> Result<Caller, IdentityError> {
        let (tier, matched) = self.tier_of(&identity, request)?;
        let settings = &self.live().policy.identity;
        // Only header credentials: a verified caller, or a custom
        // extractor's identity, is the app's own word.
        if matches!(identity.kind(), IdentityKind::ApiKey | IdentityKind::Bearer) {
            let to_anonymous = tier == settings.anonymous_tier
                || (!matched && settings.unmatched_keys == UnmatchedKeys::Anonymous);
            if to_anonymous {
                return self.anonymous(identity.ip);
            }
            if !matched && settings.unmatched_keys == UnmatchedKeys::Reject {
                return Err(IdentityError::Missing);
            }
        }
        Ok(Caller { identity, tier })
    }

    /// The anonymous caller at `ip`, or a 401 where anonymous callers are
    /// rejected.
    fn anonymous(&self, ip: Option<std::net::IpAddr>) -> Result<Caller, IdentityError> {
        let live = self.live();
        let settings = &live.policy.identity;
        if settings.anonymous == AnonymousMode::Reject {
            return Err(IdentityError::Missing);
        }
        Ok(Caller {
            identity: Identity::from_ip_keyed(ip, settings.ipv6_prefix, &live.key),
            tier: settings.anonymous_tier.clone(),
        })
    }

    /// The identity of a request, as the layer identifies it: the
    /// extractor's answer, with the client IP attached when the extractor
    /// left it out (so IP-scoped limits hold whatever extractor is plugged
    /// in), hashed with the deployment's key. It is the credential the
    /// request presents; [`PolicySnapshot::caller`] decides what it counts
    /// as.
    ///
    /// A server that gives the router no peer addresses (axum's
    /// `into_make_service_with_connect_info::<SocketAddr>()`) cannot tell
    /// anonymous callers apart: they would share one bucket. That is logged
    /// as a warning, once per process.
    pub fn identify(&self, request: &Parts) -> Result<Identity, IdentityError> {
        let live = self.live();
        let mut identity = live.extractor.extract(request)?;
        if identity.ip.is_none() {
            let peer = peer_ip(&request.extensions);
            if peer.is_none() && !WARNED_NO_PEER.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "requests carry no peer address: serve the router with \
                     `into_make_service_with_connect_info::<SocketAddr>()`, or anonymous \
                     callers share one bucket and IP-scoped limits cannot tell clients apart"
                );
            }
            identity.ip = client_ip(
                &live.policy.identity.trusted_proxies,
                &request.headers,
                peer,
            )?;
        }
        Ok(match identity.with_key(&live.key) {
            std::borrow::Cow::Borrowed(_) => identity,
            std::borrow::Cow::Owned(keyed) => keyed,
        })
    }

    /// The tier of `identity` calling with `request`, as
    /// [`PolicySnapshot::caller`] names it. Where `caller` would refuse an
    /// unknown tier, this answers `default_tier`: use `caller` to decide.
    pub fn resolve_tier(&self, identity: &Identity, request: &Parts) -> String {
        self.tier_of(identity, request)
            .map_or_else(|_| self.policy().identity.default_tier.clone(), |(t, _)| t)
    }

    /// The tier, and whether anything named it (`false`: a key matching
    /// no prefix, given `default_tier`).
    fn tier_of(
        &self,
        identity: &Identity,
        request: &Parts,
    ) -> Result<(String, bool), IdentityError> {
        let live = self.live();
        if live.compiled.tiers.is_empty() {
            // A policy without tiers limits nothing, whatever names a tier.
            return Ok((live.policy.identity.default_tier.clone(), true));
        }
        let named = match (identity.tier(), &live.resolver) {
            (Some(t), _) => Some((t.to_owned(), "identity")),
            (None, Some(resolver)) => resolver.resolve(identity, request).map(|t| (t, "resolver")),
            (None, None) => None,
        };
        match named {
            Some((t, _)) if live.compiled.tiers.contains_key(&t) => Ok((t, true)),
            Some((t, source)) => self.unknown_tier(&t, source).map(|t| (t, true)),
            None => Ok(match live.prefix_resolver.matched(identity) {
                Some(t) => (t.to_owned(), true),
                None => (live.policy.identity.default_tier.clone(), false),
            }),
        }
    }

    /// A tier name the policy does not define: counted, logged once, then
    /// refused or replaced as `[identity] unknown_tier` says.
    fn unknown_tier(&self, tier: &str, source: &'static str) -> Result<String, IdentityError> {
        metrics::record_unknown_tier(source);
        let setting = &self.live().policy.identity.unknown_tier;
        let then = match setting {
            UnknownTier::Reject => "refusing the request (403)".to_owned(),
            UnknownTier::Tier(t) => format!("deciding in the declared unknown_tier \"{t}\""),
        };
        // The name may follow what a client sent: cut it, and log once.
        let shown: String = tier.chars().take(64).collect();
        if WARNED_UNKNOWN_TIER.swap(true, Ordering::Relaxed) {
            tracing::debug!(tier = %shown, source, "a tier the policy does not define; {then}");
        } else {
            tracing::warn!(
                tier = %shown,
                source,
                "a tier the policy does not define; {then} (logged once; later ones at debug \
                 level, all counted in ratewatch_unknown_tier_total)"
            );
        }
        match setting {
            UnknownTier::Reject => Err(IdentityError::UnknownTier),
            UnknownTier::Tier(t) => Ok(t.clone()),
        }
    }
}
