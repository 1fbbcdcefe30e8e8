//! The policy compiled for the hot path: per tier and route, the limits
//! with their key parts and their shares (split, local fallback), so a
//! request only formats its keys.
//!
//! Shares come from [`crate::policy::shares`], the same functions the
//! policy's validation checks, so what `check-config` accepts is what runs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::Algorithm;
use crate::identity::{Identity, address_group};
use crate::policy::{FailurePolicy, Limit, Policy, RouteRule, Scope, shares};
use crate::store::Item;
use crate::store::keys;

/// The compiled limits of one request, in order: on the stack for a few.
pub(crate) type Limits<'a> = smallvec::SmallVec<[&'a CompiledLimit; 4]>;

/// A request's store items: on the stack for the usual few limits.
pub(crate) type Items = smallvec::SmallVec<[Item; 2]>;

/// A limit ready to be keyed.
#[derive(Debug, Clone)]
pub(crate) struct CompiledLimit {
    pub name: Arc<str>,
    /// The `<code>` end of its keys ([`keys::limit_code`]).
    key_code: String,
    pub scope: Scope,
    pub shadow: bool,
    /// The enforced algorithm (the tier's split share, if split).
    pub algorithm: Algorithm,
    /// The local fallback's share: 1 / expected_instances of it.
    pub local: Algorithm,
    /// The mode it asks for (its scope's default if unset; `None`: it
    /// follows the request's other limits).
    pub mode: Option<crate::policy::LeaseMode>,
    /// The unit it counts.
    pub unit: Arc<str>,
    /// Whether that unit is requests (charged the route rule's cost).
    pub requests: bool,
}

impl CompiledLimit {
    fn new(limit: &Limit, key_code: String, split: u32, instances: u32) -> Self {
        let algorithm = shares::split_share(limit, split);
        let local = shares::local_share(&algorithm, instances);
        Self {
            name: limit.name.as_str().into(),
            key_code,
            scope: limit.scope,
            shadow: limit.shadow,
            algorithm,
            local,
            mode: limit.effective_mode(),
            unit: limit.unit.as_str().into(),
            requests: limit.counts_requests(),
        }
    }
}

/// An identity-scoped key of one limit in one tier, cut around the
/// identity hash. Cut from what [`keys::identity_key`] builds, so the key
/// schema stays defined in one place.
#[derive(Debug)]
struct KeyFrame {
    /// Never reused in this process: names the frame in the key memo
    /// whatever reloads free and allocate.
    id: u64,
    head: String,
    tail: String,
}

/// The next [`KeyFrame::id`].
static FRAME_IDS: AtomicU64 = AtomicU64::new(1);

/// Slots of the per-thread key memo: enough for every limit of a tier
/// and its route (frames of one tier have consecutive ids).
const KEY_SLOTS: usize = 8;

/// One key the memo holds: the frame and identity hash it was built from.
#[derive(Default)]
struct KeySlot {
    frame: u64,
    hash: String,
    key: Option<Arc<str>>,
}

thread_local! {
    /// A client's decisions come in runs (a keep-alive connection, a retry
    /// loop): its keys are built once per run and shared, not formatted
    /// and allocated per decision. Holds hashes and keys only, which store
    /// key names carry anyway; never a raw key.
    static KEYS: RefCell<[KeySlot; KEY_SLOTS]> = RefCell::new(Default::default());
}

impl KeyFrame {
    fn new(prefix: &str, l: &CompiledLimit) -> Self {
        const MARK: &str = "\u{0}";
        let whole = keys::identity_key(prefix, MARK, None, &l.key_code);
        let (head, tail) = whole.split_once(MARK).unwrap_or((&whole, ""));
        Self {
            id: FRAME_IDS.fetch_add(1, Ordering::Relaxed),
            head: head.to_owned(),
            tail: tail.to_owned(),
        }
    }

    /// The key of `identity_hash`, from this thread's memo when its last
    /// key of this frame was for the same hash.
    fn key(&self, identity_hash: &str) -> Arc<str> {
        KEYS.try_with(|slots| {
            let Ok(mut slots) = slots.try_borrow_mut() else {
                return self.build(identity_hash);
            };
            let slot = &mut slots[self.id as usize % KEY_SLOTS];
            if slot.frame == self.id && slot.hash == identity_hash {
                if let Some(key) = &slot.key {
                    return key.clone();
                }
            }
            let key = self.build(identity_hash);
            slot.frame = self.id;
            slot.hash.clear();
            slot.hash.push_str(identity_hash);
            slot.key = Some(key.clone());
            key
        })
        .unwrap_or_else(|_| self.build(identity_hash))
    }

    /// The key of `identity_hash`, built.
    fn build(&self, identity_hash: &str) -> Arc<str> {
        let mut key =
            String::with_capacity(self.head.len() + identity_hash.len() + self.tail.len());
        key.push_str(&self.head);
        keys::push_identity(&mut key, identity_hash);
        key.push_str(&self.tail);
        key.into()
    }
}

#[derive(Debug)]
pub(crate) struct CompiledTier {
    pub name: Arc<str>,
    /// The key schema of this tier around the identity hash, per tier
    /// limit then per route limit (same order as `limits`, `route_limits`):
    /// a key is then one allocation of three parts.
    identity_keys: Vec<KeyFrame>,
    route_identity_keys: Vec<Vec<KeyFrame>>,
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

/// What names a limit in its keys: (tier for identity-scoped limits,
/// `<route>.<name>` or `<name>`, algorithm code).
type CodeInput = (Option<String>, String, &'static str);

fn code_input(tier: &str, limit: &Limit, route_tag: Option<&str>) -> CodeInput {
    (
        (limit.scope == Scope::Identity).then(|| tier.to_owned()),
        keys::limit_name(route_tag, &limit.name),
        keys::algorithm_code(&limit.algorithm),
    )
}

/// Every limit's key code, decided for the whole policy at once so that
/// two limits never share one ([`keys::limit_codes`]).
fn key_codes(policy: &Policy, tags: &[String]) -> HashMap<CodeInput, String> {
    let mut inputs = Vec::new();
    for t in &policy.tiers {
        for l in &t.limits {
            inputs.push(code_input(&t.name, l, None));
        }
        for (r, tag) in policy.routes.iter().zip(tags) {
            for l in r.limits.iter().filter(|l| l.applies_to(&t.name)) {
                inputs.push(code_input(&t.name, l, Some(tag)));
            }
        }
    }
    let codes = keys::limit_codes(
        inputs
            .iter()
            .map(|(t, n, a)| (t.as_deref(), n.as_str(), *a)),
    );
    inputs.into_iter().zip(codes).collect()
}

/// The whole policy, compiled.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// By name (ahash: looked up on every decision).
    pub tiers: HashMap<String, CompiledTier, ahash::RandomState>,
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
        let codes = key_codes(policy, &tags);
        let compile = |tier: &str, l: &Limit, route_tag: Option<&str>, split: u32| {
            let code = codes[&code_input(tier, l, route_tag)].clone();
            CompiledLimit::new(l, code, split, instances)
        };
        let tiers = policy
            .tiers
            .iter()
            .map(|t| {
                let split = t.split.max(1);
                let limits: Vec<CompiledLimit> = t
                    .limits
                    .iter()
                    .map(|l| compile(&t.name, l, None, split))
                    .collect();
                let route_limits: Vec<Vec<CompiledLimit>> = policy
                    .routes
                    .iter()
                    .zip(&tags)
                    .map(|(r, tag)| {
                        r.limits
                            .iter()
                            .filter(|l| l.applies_to(&t.name))
                            .map(|l| compile(&t.name, l, Some(tag), split))
                            .collect()
                    })
                    .collect();
                let frames = |ls: &[CompiledLimit]| -> Vec<KeyFrame> {
                    ls.iter()
                        .map(|l| KeyFrame::new(&policy.store.key_prefix, l))
                        .collect()
                };
                let identity_keys = frames(&limits);
                let route_identity_keys =
                    route_limits.iter().map(|ls: &Vec<_>| frames(ls)).collect();
                let tier = CompiledTier {
                    name: t.name.as_str().into(),
                    identity_keys,
                    route_identity_keys,
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
            .position(|r| r.rule.when.is_empty() && r.rule.matches(method, path))
    }

    /// The index of the first route rule matching a request, conditions
    /// on its `headers` and JSON `body` (if read) included.
    pub fn route_index_for(
        &self,
        method: &str,
        path: &str,
        headers: &http::HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.rule.matches_request(method, path, headers, body))
    }

    /// The items of one request and, beside them, the compiled limits they
    /// come from (same order).
    pub fn items<'a>(
        &self,
        tier: &'a CompiledTier,
        route: Option<usize>,
        identity: &Identity,
        local: bool,
    ) -> (Items, Limits<'a>) {
        let route_limits = route.map_or(&[][..], |i| &tier.route_limits[i][..]);
        let route_tag = route.map_or(keys::ANY_ROUTE, |i| self.routes[i].tag.as_str());
        let part = (tier.split > 1).then(|| rand::random_range(0..tier.split));
        let mut ip_hash = None;
        let limits: Limits<'a> = tier.limits.iter().chain(route_limits).collect();
        let route_frames = route.map_or(&[][..], |i| &tier.route_identity_keys[i][..]);
        let frames = tier.identity_keys.iter().chain(route_frames);
        let items = limits
            .iter()
            .zip(frames)
            .map(|(l, frame)| {
                let code = &l.key_code;
                let key = match l.scope {
                    Scope::Identity if part.is_none() => frame.key(identity.hash()),
                    Scope::Identity => {
                        keys::identity_key(&self.prefix, identity.hash(), part, code).into()
                    }
                    Scope::Ip => {
                        // An unknown address is one address: rotating keys
                        // must not buy fresh IP counters.
                        let h = ip_hash.get_or_insert_with(|| {
                            let group = identity.ip.map_or_else(
                                || "unknown".to_owned(),
                                |ip| address_group(ip, self.ipv6_prefix),
                            );
                            identity.address_hash(&group)
                        });
                        keys::ip_key(&self.prefix, h, code).into()
                    }
                    Scope::Route => keys::route_key(&self.prefix, route_tag, code).into(),
                };
                Item {
                    key,
                    algorithm: if local {
                        l.local.clone()
                    } else {
                        l.algorithm.clone()
                    },
                    shadow: l.shadow,
                    cost: None,
                    require_left: false,
                }
            })
            .collect();
        (items, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::IdentityKind;
    use crate::policy::{Limit, Tier};

    fn policy() -> Policy {
        let per_ip = |cap| Limit::token_bucket("per_ip", cap, 1.0).with_scope(Scope::Ip);
        Policy::builder()
            .tier(
                Tier::new("free")
                    .match_prefix("free_")
                    .limit(Limit::token_bucket("burst", 10, 1.0))
                    .limit(per_ip(5)),
            )
            .tier(
                Tier::new("pro")
                    .match_prefix("pro_")
                    .limit(Limit::token_bucket("burst", 10, 1.0))
                    .limit(per_ip(50)),
            )
            .tier(Tier::new("anonymous").limit(per_ip(5)))
            .route(
                RouteRule::new("POST", "/api/data").with_limit(Limit::fixed_window(
                    "writes",
                    2,
                    std::time::Duration::from_secs(60),
                )),
            )
            .route(
                RouteRule::new("GET", "/api/data")
                    .with_limit(Limit::token_bucket("writes", 100, 1.0))
                    .with_limit(Limit::token_bucket("all", 100, 1.0).with_scope(Scope::Route)),
            )
            .build()
            .unwrap()
    }

    fn keys_of(c: &Compiled, tier: &str, route: Option<usize>, id: &Identity) -> Vec<String> {
        let (items, _) = c.items(&c.tiers[tier], route, id, false);
        items.into_iter().map(|i| i.key.to_string()).collect()
    }

    #[test]
    fn identity_keys_are_the_ones_the_key_schema_builds() {
        let c = Compiled::new(&policy());
        let id = Identity::new(IdentityKind::ApiKey, "free_a");
        let get = keys_of(&c, "free", Some(1), &id);
        let free = &c.tiers["free"];
        assert_eq!(
            get[0],
            keys::identity_key("rw", id.hash(), None, &free.limits[0].key_code)
        );
        assert_eq!(
            get[2],
            keys::identity_key("rw", id.hash(), None, &free.route_limits[1][0].key_code)
        );
    }

    #[test]
    fn memoised_keys_are_the_keys_of_their_own_frame_and_identity() {
        // Two compiled policies alive at once (a reload), identities
        // alternating: every key is what the schema builds for it.
        let old = Compiled::new(&policy());
        let mut other = policy();
        other.store.key_prefix = "other".into();
        let new = Compiled::new(&other);
        let ids = [
            Identity::new(IdentityKind::ApiKey, "free_a"),
            Identity::new(IdentityKind::ApiKey, "free_b"),
        ];
        for round in 0..3 {
            for (c, prefix) in [(&old, "rw"), (&new, "other")] {
                for id in ids.iter().chain(ids.iter().rev()) {
                    let got = keys_of(c, "free", Some(1), id);
                    let free = &c.tiers["free"];
                    let want = [&free.limits[0], &free.route_limits[1][0]]
                        .map(|l| keys::identity_key(prefix, id.hash(), None, &l.key_code));
                    assert_eq!([&got[0], &got[2]], [&want[0], &want[1]], "round {round}");
                }
            }
        }
    }

    #[test]
    fn keys_carry_what_makes_a_counter_unique_and_nothing_else() {
        let c = Compiled::new(&policy());
        let ip = Some("203.0.113.9".parse().unwrap());
        let free = Identity::new(IdentityKind::ApiKey, "free_a").with_ip(ip);
        let pro = Identity::new(IdentityKind::Bearer, "pro_b").with_ip(ip);
        let post = keys_of(&c, "free", Some(0), &free);
        let get = keys_of(&c, "free", Some(1), &free);
        // Two rules on one path: their limits never share a key.
        assert_ne!(post[2], get[2]);
        // The IP counter is one whatever tier the key claims.
        assert_eq!(post[1], keys_of(&c, "pro", Some(0), &pro)[1]);
        assert!(!post[1].contains("free"));
        // The route ceiling is one for every tier.
        let pro_get = keys_of(&c, "pro", Some(1), &pro);
        assert_eq!(get[3], pro_get[3]);
        assert!(get[3].starts_with("rw:{rt:"));
        // Tiers never share an identity's counter, and nothing raw shows.
        assert_ne!(
            post[0],
            keys_of(
                &c,
                "pro",
                Some(0),
                &Identity::new(IdentityKind::ApiKey, "free_a")
            )[0]
        );
        for k in post.iter().chain(&get) {
            assert!(!k.contains("free") && !k.contains("burst"), "{k}");
            assert!(k.len() <= 30, "{k} fits Redis's 32-byte name allocation");
        }
    }
}
