//! The key schema.
//!
//! ```text
//! {prefix}:{<tier>:<identity-hash>[#k]}:<name>:<alg>   scope = "identity"
//! {prefix}:{ip:<address-hash>}:<name>:<alg>            scope = "ip"
//! {prefix}:{rt:<route>}:<name>:<alg>                   scope = "route"
//!
//! <name>  the limit's name for a tier's limit, `<route>.<name>` for a limit
//!         a route rule adds
//! <route> 8 hex digits of the hash of the rule's method and pattern
//!         (`POST /api/export`), `*` outside every rule
//! <alg>   the state shape: tb, sw, sl, fw, gc (GCRA), lb
//! ```
//!
//! The `{...}` hash tag holds what the counter counts, so every limit of one
//! client shares a cluster slot (one script can touch them all) while
//! different clients spread over every shard. Identities and addresses are
//! hashed first: a raw API key never appears in a key name, and a
//! client-chosen `{`, `}` or `:` cannot move its slot or collide with
//! another client's keys.
//!
//! What makes a counter unique is in its key, and nothing else is:
//! - a route rule's limits carry the rule's method and pattern, so `GET` and
//!   `POST` rules on one path never share a counter;
//! - IP- and route-scoped keys carry no tier: an address, or a route, is one
//!   counter whatever tier its callers claim;
//! - the algorithm code ends every key, so a limit whose algorithm changes
//!   starts from a fresh counter instead of reading another shape of state.
//!
//! ```
//! use ratewatch::store::keys;
//! let id = keys::hash_identity("key", "free_a{b}:c");
//! let k = keys::identity_key("rw", "free", &id, None, "burst", "tb");
//! assert!(k.starts_with("rw:{free:") && k.ends_with("}:burst:tb"));
//! assert!(!k.contains("free_a"));
//! ```

use sha2::{Digest, Sha256};

use crate::algorithm::Algorithm;

/// Hex characters of the identity hash kept in keys (96 bits).
const HASH_HEX: usize = 24;

/// Hex characters of a route's tag inside keys (32 bits: a policy has a
/// handful of routes; see [`route_tags`] for what happens on a collision).
pub const ROUTE_TAG_HEX: usize = 8;

/// Hashes an identity (its kind and raw value) to the hex string used in
/// keys, fleet stats and the dashboard's hashed view.
pub fn hash_identity(kind: &str, raw: &str) -> String {
    hex_hash(&[kind.as_bytes(), raw.as_bytes()], HASH_HEX)
}

fn hex_hash(parts: &[&[u8]], len: usize) -> String {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0]);
        }
        h.update(p);
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(len);
    for b in &digest[..len.div_ceil(2)] {
        out.push_str(&format!("{b:02x}"));
    }
    out.truncate(len);
    out
}

/// The short code of an algorithm's state shape, the last part of a key.
pub fn algorithm_code(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket { .. } => "tb",
        Algorithm::SlidingWindow { .. } => "sw",
        Algorithm::SlidingLog { .. } => "sl",
        Algorithm::FixedWindow { .. } => "fw",
        Algorithm::Gcra { .. } => "gc",
        Algorithm::LeakyBucket { .. } => "lb",
    }
}

/// The full-length tag of a route rule: the hash of its method (`*` for
/// any) and pattern. Keys use its first [`ROUTE_TAG_HEX`] digits.
pub fn hash_route(method: Option<&str>, pattern: &str) -> String {
    hex_hash(
        &[
            b"route",
            method.unwrap_or("*").as_bytes(),
            pattern.as_bytes(),
        ],
        64,
    )
}

/// The tags of `routes` (method, pattern) as keys use them: the first
/// [`ROUTE_TAG_HEX`] digits of [`hash_route`], or the whole hash for every
/// route if two short tags would collide (a policy change that causes this
/// resets route counters once; keeping distinct rules apart matters more).
pub fn route_tags<'a>(routes: impl Iterator<Item = (Option<&'a str>, &'a str)>) -> Vec<String> {
    let full: Vec<String> = routes.map(|(m, p)| hash_route(m, p)).collect();
    let short: Vec<&str> = full.iter().map(|h| &h[..ROUTE_TAG_HEX]).collect();
    let mut seen = std::collections::HashSet::new();
    if short.iter().all(|s| seen.insert(*s)) {
        short.into_iter().map(str::to_owned).collect()
    } else {
        full
    }
}

/// The tag standing for "no route rule matched" in route-scoped keys.
pub const ANY_ROUTE: &str = "*";

/// The `<name>` part of a key: the limit's name, prefixed by its route's tag
/// when a route rule declares it.
pub fn limit_name(route_tag: Option<&str>, limit: &str) -> String {
    match route_tag {
        Some(r) => format!("{r}.{limit}"),
        None => limit.to_owned(),
    }
}

/// The key of a limit scoped to an identity. `part` is the sub-identity
/// index of a split tier (`#k` inside the tag); `name` comes from
/// [`limit_name`], `alg` from [`algorithm_code`].
pub fn identity_key(
    prefix: &str,
    tier: &str,
    identity_hash: &str,
    part: Option<u32>,
    name: &str,
    alg: &str,
) -> String {
    match part {
        Some(k) => format!("{prefix}:{{{tier}:{identity_hash}#{k}}}:{name}:{alg}"),
        None => format!("{prefix}:{{{tier}:{identity_hash}}}:{name}:{alg}"),
    }
}

/// The key of a limit scoped to the client address, whatever key or tier
/// it presents; `address_hash` is [`hash_identity`]`("ip", ...)` of the
/// address (or of its IPv6 prefix).
pub fn ip_key(prefix: &str, address_hash: &str, name: &str, alg: &str) -> String {
    format!("{prefix}:{{ip:{address_hash}}}:{name}:{alg}")
}

/// The key of a limit global to a route (one ceiling for every client of
/// every tier); `route_tag` is the route's tag or [`ANY_ROUTE`].
pub fn route_key(prefix: &str, route_tag: &str, name: &str, alg: &str) -> String {
    format!("{prefix}:{{rt:{route_tag}}}:{name}:{alg}")
}

/// The hash tag of a key: the part between the first `{` and the next `}`.
pub fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_identities_cannot_move_their_slot_or_collide() {
        let a = hash_identity("key", "free_{x}");
        let b = hash_identity("key", "free_}x{");
        let c = hash_identity("key", &"j".repeat(10_000));
        for h in [&a, &b, &c] {
            assert_eq!(h.len(), HASH_HEX);
            assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        }
        assert_ne!(a, b);
        let k = identity_key("rw", "free", &a, None, "burst", "tb");
        assert_eq!(hash_tag(&k), format!("free:{a}"));
    }

    #[test]
    fn identity_kinds_do_not_share_counters() {
        assert_ne!(
            hash_identity("key", "1.2.3.4"),
            hash_identity("ip", "1.2.3.4")
        );
    }

    #[test]
    fn split_identities_get_distinct_tags() {
        let h = hash_identity("key", "k");
        let k0 = identity_key("rw", "pro", &h, Some(0), "burst", "tb");
        let k1 = identity_key("rw", "pro", &h, Some(1), "burst", "tb");
        assert_ne!(hash_tag(&k0), hash_tag(&k1));
    }

    #[test]
    fn two_rules_on_one_path_get_distinct_tags() {
        let tags = route_tags(
            [
                (Some("GET"), "/api/data"),
                (Some("POST"), "/api/data"),
                (None, "/api/data"),
            ]
            .into_iter(),
        );
        assert_eq!(tags.len(), 3);
        assert!(tags.iter().all(|t| t.len() == ROUTE_TAG_HEX));
        assert!(tags[0] != tags[1] && tags[1] != tags[2] && tags[0] != tags[2]);
    }

    #[test]
    fn a_changed_algorithm_gets_a_fresh_key() {
        let h = hash_identity("key", "k");
        let tb = Algorithm::TokenBucket {
            capacity: 1,
            refill_per_second: 1.0,
        };
        let fw = Algorithm::FixedWindow {
            limit: 1,
            window_us: 1_000_000,
        };
        assert_ne!(
            identity_key("rw", "free", &h, None, "x", algorithm_code(&tb)),
            identity_key("rw", "free", &h, None, "x", algorithm_code(&fw))
        );
    }

    #[test]
    fn an_identity_key_stays_short() {
        let h = hash_identity("key", "free_k");
        // rw:{free:<24>}:minute:sw
        assert_eq!(
            identity_key("rw", "free", &h, None, "minute", "sw").len(),
            3 + 1 + 5 + 24 + 1 + 1 + 6 + 3
        );
    }
}
