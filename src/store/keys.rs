//! The key schema: `{prefix}:{<tier>:<identity-hash>}:<limit-name>`.
//!
//! The `{...}` hash tag holds the identity, so every limit of one client
//! shares a cluster slot (one script can touch them all) while different
//! clients spread over every shard. The identity is hashed first: a raw API
//! key never appears in a key name, and a client-chosen `{`, `}` or `:`
//! cannot move its slot or collide with another client's keys.
//!
//! ```
//! use ratewatch::store::keys;
//! let k = keys::identity_key("rw", "free", &keys::hash_identity("key", "free_a{b}:c"), None, "burst");
//! assert!(k.starts_with("rw:{free:") && k.ends_with("}:burst"));
//! assert!(!k.contains("free_a"));
//! ```

use sha2::{Digest, Sha256};

/// Hex characters of the identity hash kept in keys (96 bits).
const HASH_HEX: usize = 24;

/// Hashes an identity (its kind and raw value) to the hex string used in
/// keys, fleet stats and the dashboard's hashed view.
pub fn hash_identity(kind: &str, raw: &str) -> String {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    h.update([0]);
    h.update(raw.as_bytes());
    let digest = h.finalize();
    let mut out = String::with_capacity(HASH_HEX);
    for b in &digest[..HASH_HEX / 2] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The key of a limit scoped to an identity. `part` is the sub-identity
/// index of a split tier (`#k` inside the tag).
pub fn identity_key(
    prefix: &str,
    tier: &str,
    identity_hash: &str,
    part: Option<u32>,
    limit: &str,
) -> String {
    match part {
        Some(k) => format!("{prefix}:{{{tier}:{identity_hash}#{k}}}:{limit}"),
        None => format!("{prefix}:{{{tier}:{identity_hash}}}:{limit}"),
    }
}

/// The key of a limit scoped to the client IP (whatever key it presents).
pub fn ip_key(prefix: &str, tier: &str, ip_hash: &str, limit: &str) -> String {
    format!("{prefix}:{{ip:{ip_hash}}}:{tier}:{limit}")
}

/// The hash of a route pattern for [`route_key`], computed once per route.
pub fn hash_route(route_pattern: &str) -> String {
    hash_identity("route", route_pattern)
}

/// The key of a limit global to a route (one ceiling for every client);
/// `route_hash` is [`hash_route`] of the route's pattern.
pub fn route_key(prefix: &str, tier: &str, route_hash: &str, limit: &str) -> String {
    format!("{prefix}:{{route:{route_hash}}}:{tier}:{limit}")
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
        let k = identity_key("rw", "free", &a, None, "burst");
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
        let k0 = identity_key("rw", "pro", &h, Some(0), "burst");
        let k1 = identity_key("rw", "pro", &h, Some(1), "burst");
        assert_ne!(hash_tag(&k0), hash_tag(&k1));
    }
}
