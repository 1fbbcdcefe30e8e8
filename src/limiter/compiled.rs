//! The policy compiled for the hot path: per tier and route, the limits
//! with their key parts and their scaled (split, local fallback) forms,
//! so a request only formats its keys.

use std::collections::HashMap;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::identity::Identity;
use crate::policy::{FailurePolicy, Limit, Policy, RouteRule, Scope};
use crate::store::Item;
use crate::store::keys::{self, hash_identity};

/// A limit ready to be keyed.
#[derive(Debug, Clone)]
pub(crate) struct CompiledLimit {
    pub name: Arc<str>,
    /// The name inside the key (route limits carry their route).
    key_name: String,
    pub scope: Scope,
    pub shadow: bool,
    /// The enforced algorithm (already divided by the tier's split).
    pub algorithm: Algorithm,
    /// The local fallback's share: 1 / expected_instances of it.
    pub local: Algorithm,
}

impl CompiledLimit {
    /// `min_quota` is the largest route cost: no share may drop below it.
    fn new(limit: &Limit, key_name: String, split: u32, instances: u32, min_quota: u64) -> Self {
        // Only identity keys are split into sub-identities; IP and route
        // keys stay whole, and so do their quotas.
        let algorithm = if split > 1 && limit.scope == Scope::Identity {
            limit
                .algorithm
                .scaled_keeping(1.0 / split as f64, min_quota)
        } else {
            limit.algorithm.clone()
        };
        let local = algorithm.scaled_keeping(1.0 / instances as f64, min_quota);
        Self {
            name: limit.name.as_str().into(),
            key_name,
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
    /// [`keys::hash_route`] of the pattern, for route-wide keys.
    hash: String,
}

/// The whole policy, compiled.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub tiers: HashMap<String, CompiledTier>,
    pub routes: Vec<CompiledRoute>,
    pub default_failure: FailurePolicy,
    pub prefix: String,
    pub any_route: Arc<str>,
    /// [`keys::hash_route`] of `*`, for route-wide limits outside any rule.
    any_route_hash: String,
}

impl Compiled {
    pub fn new(policy: &Policy) -> Self {
        let instances = policy.resilience.expected_instances.max(1);
        let min_quota = policy.max_route_cost();
        let route_tag = |r: &RouteRule| keys::hash_route(&r.path)[..8].to_owned();
        let tiers = policy
            .tiers
            .iter()
            .map(|t| {
                let split = t.split.max(1);
                let limits = t
                    .limits
                    .iter()
                    .map(|l| CompiledLimit::new(l, l.name.clone(), split, instances, min_quota))
                    .collect();
                let route_limits = policy
                    .routes
                    .iter()
                    .map(|r| {
                        let tag = route_tag(r);
                        r.limits
                            .iter()
                            .map(|l| {
                                CompiledLimit::new(
                                    l,
                                    format!("r{tag}.{}", l.name),
                                    split,
                                    instances,
                                    r.cost,
                                )
                            })
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
            .map(|r| CompiledRoute {
                rule: r.clone(),
                label: r.label().into(),
                failure: r
                    .on_store_failure
                    .unwrap_or(policy.resilience.on_store_failure),
                hash: keys::hash_route(&r.path),
            })
            .collect();
        Self {
            tiers,
            routes,
            default_failure: policy.resilience.on_store_failure,
            prefix: policy.store.key_prefix.clone(),
            any_route: "*".into(),
            any_route_hash: keys::hash_route("*"),
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
        let route_hash = route.map_or(self.any_route_hash.as_str(), |i| {
            self.routes[i].hash.as_str()
        });
        let part = (tier.split > 1).then(|| rand::random_range(0..tier.split));
        let mut ip_hash = None;
        let limits: Vec<&CompiledLimit> = tier.limits.iter().chain(route_limits).collect();
        let items = limits
            .iter()
            .map(|l| {
                let key = match l.scope {
                    Scope::Identity => keys::identity_key(
                        &self.prefix,
                        &tier.name,
                        identity.hash(),
                        part,
                        &l.key_name,
                    ),
                    Scope::Ip => {
                        let h = ip_hash.get_or_insert_with(|| match identity.ip {
                            Some(ip) => hash_identity("ip", &ip.to_string()),
                            None => identity.hash().to_owned(),
                        });
                        keys::ip_key(&self.prefix, &tier.name, h, &l.key_name)
                    }
                    Scope::Route => {
                        keys::route_key(&self.prefix, &tier.name, route_hash, &l.key_name)
                    }
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
