//! Who is calling, and in which tier: the extractor and the resolver,
//! with the guarantees the limiter adds around them.

use std::sync::atomic::{AtomicBool, Ordering};

use http::request::Parts;

use super::{Limiter, PolicySnapshot};
use crate::identity::{Identity, IdentityError, client_ip, peer_ip};

/// Set once the missing-peer-address warning has been logged.
static WARNED_NO_PEER: AtomicBool = AtomicBool::new(false);
/// Set once the unknown-tier warning has been logged: a resolver's answer
/// may follow what a client sends, so a warning per request would let a
/// client flood the log.
static WARNED_UNKNOWN_TIER: AtomicBool = AtomicBool::new(false);

impl Limiter {
    /// The caller of a request under the policy in force now (see
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
    /// The caller of a request, as the layer identifies it: the extractor's
    /// answer, with the client IP attached when the extractor left it out
    /// (so IP-scoped limits hold whatever extractor is plugged in).
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
        Ok(identity)
    }

    /// The tier of `identity` calling with `request`: the resolver's answer
    /// if it names a known tier, else the key-prefix rule.
    pub fn resolve_tier(&self, identity: &Identity, request: &Parts) -> String {
        let live = self.live();
        match live.resolver.resolve(identity, request) {
            Some(t) if live.compiled.tiers.contains_key(&t) => t,
            Some(t) => {
                if WARNED_UNKNOWN_TIER.swap(true, Ordering::Relaxed) {
                    tracing::debug!(tier = %t, "tier resolver named an unknown tier; using the key-prefix rule");
                } else {
                    tracing::warn!(tier = %t, "tier resolver named an unknown tier; using the key-prefix rule (logged once; later ones at debug level)");
                }
                live.prefix_resolver.tier_of(identity)
            }
            None => live.prefix_resolver.tier_of(identity),
        }
    }
}
