//! The policy compiled for the hot path: per tier and route, the limits
//! with their key parts and their shares (split, local fallback), so a
//! request only formats its keys.
//!
//! Shares come from [`crate::policy::shares`], the same functions the
//! policy's validation checks, so what `check-config` accepts is what runs.

use std::collections::HashMap;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::identity::{Identity, address_group};
use crate::policy::{FailurePolicy, Limit, Policy, RouteRule, Scope, shares};
use crate::store::Item;
use crate::store::keys::{self, hash_identity};

/// A limit ready to be keyed.
#[derive(Debug, Clone)]
pub(crate) struct CompiledLimit {
    pub name: Arc<str>,
    /// The `<name>:<alg>` end of its keys (route limits carry their route).
    key_suffix: (String, &'static str),
    pub scope: Scope,
    pub shadow: bool,
    /// The enforced algorithm (the tier's split share, if split).
    pub algorithm: Algorithm,
    /// The local fallback's share: 1 / expected_instances of it.
    pub local: Algorithm,
}

impl CompiledLimit {
    fn new(limit: &Limit, route_tag: Option<&str>, split: u32, instances: u32) -> Self {
        let algorithm = shares::split_share(limit, split);
        let local = shares::local_share(&algorithm, instances);
        Self {
            name: limit.name.as_str().into(),
            key_suffix: (
                keys::limit_name(route_tag, &limit.name),
                keys::algorithm_code(&limit.algorithm),
            ),
            scope: limit.scope,
            shadow: limit.shadow,
            algorithm,
            local,
        }
    }
}

#[derive(Debug)]
pub(crate) struct CompiledTier {
    pub name: Arc<str>,
    pub split: u32,
    pub limits: Vec<CompiledLimit>,
    /// Route limits keyed for this tier, by route index.
    pub route_limits: Vec<Vec<CompiledLimit>>,
}

#[derive(Debug)]
pub(crate) struct CompiledRoute {
    pub rule: RouteRule,
    pub label: Arc<str>,
    pub failure: FailurePolicy,
    /// The rule's tag in keys ([`keys::route_tags`] of method and pattern).
    tag: String,
}

/// The whole policy, compiled.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub tiers: HashMap<String, CompiledTier>,
    pub routes: Vec<CompiledRoute>,
    pub default_failure: FailurePolicy,
    pub prefix: String,
    pub any_route: Arc<str>,
    /// Bits of an IPv6 address that name one client.
    ipv6_prefix: u8,
}

impl Compiled {
    pub fn new(policy: &Policy) -> Self {
        let instances = policy.resilience.expected_instances.max(1);
        let tags = keys::route_tags(
            policy
                .routes
                .iter()
                .map(|r| (r.method.as_deref(), r.path.as_str())),
        );
        let tiers = policy
            .tiers
            .iter()
            .map(|t| {
                let split = t.split.max(1);
                let limits = t
                    .limits
                    .iter()
                    .map(|l| CompiledLimit::new(l, None, split, instances))
                    .collect();
                let route_limits = policy
                    .routes
                    .iter()
                    .zip(&tags)
                    .map(|(r, tag)| {
                        r.limits
                            .iter()
                            .map(|l| CompiledLimit::new(l, Some(tag), split, instances))
                            .collect()
                    })
                    .collect();
                let tier = CompiledTier {
                    name: t.name.as_str().into(),
                    split,
                    limits,
                    route_limits,
                };
                (t.name.clone(), tier)
            })
            .collect();
        let routes = policy
            .routes
            .iter()
            .zip(tags)
            .map(|(r, tag)| CompiledRoute {
                rule: r.clone(),
                label: r.label().into(),
                failure: r
                    .on_store_failure
                    .unwrap_or(policy.resilience.on_store_failure),
                tag,
            })
            .collect();
        Self {
            tiers,
            routes,
            default_failure: policy.resilience.on_store_failure,
            prefix: policy.store.key_prefix.clone(),
            any_route: "*".into(),
            ipv6_prefix: policy.identity.ipv6_prefix,
        }
    }

    /// The index of the first route rule matching a request.
    pub fn route_index(&self, method: &str, path: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.rule.matches(method, path))
    }

    /// The items of one request and, beside them, the compiled limits they
    /// come from (same order).
    pub fn items<'a>(
        &self,
        tier: &'a CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        local: bool,
    ) -> (Vec<Item>, Vec<&'a CompiledLimit>) {
        let route_limits = route.map_or(&[][..], |i| &tier.route_limits[i][..]);
        let route_tag = route.map_or(keys::ANY_ROUTE, |i| self.routes[i].tag.as_str());
        let part = (tier.split > 1).then(|| rand::random_range(0..tier.split));
        let mut ip_hash = None;
        let limits: Vec<&CompiledLimit> = tier.limits.iter().chain(route_limits).collect();
        let items = limits
            .iter()
            .map(|l| {
                let (name, alg) = (&l.key_suffix.0, l.key_suffix.1);
                let key = match l.scope {
                    Scope::Identity => keys::identity_key(
                        &self.prefix,
                        &tier.name,
                        identity.hash(),
                        part,
                        name,
                        alg,
                    ),
                    Scope::Ip => {
                        // An unknown address is one address: rotating keys
                        // must not buy fresh IP counters.
                        let h = ip_hash.get_or_insert_with(|| {
                            let group = identity.ip.map_or_else(
                                || "unknown".to_owned(),
                                |ip| address_group(ip, self.ipv6_prefix),
                            );
                            hash_identity("ip", &group)
                        });
                        keys::ip_key(&self.prefix, h, name, alg)
                    }
                    Scope::Route => keys::route_key(&self.prefix, route_tag, name, alg),
                };
                Item {
                    key,
                    algorithm: if local {
                        l.local.clone()
                    } else {
                        l.algorithm.clone()
                    },
                    shadow: l.shadow,
                }
            })
            .collect();
        (items, limits)
    }
}
