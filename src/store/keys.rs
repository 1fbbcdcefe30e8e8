//! The key schema.
//!
//! ```text
//! {prefix}:{<identity>[#k]}:<code>   scope = "identity"
//! {prefix}:{ip:<address>}:<code>     scope = "ip"
//! {prefix}:{rt:<route>}:<code>       scope = "route"
//!
//! <identity>  the identity's 96-bit hash (the bits of [`hash_identity`]'s
//!             24 hex digits) in 16 base64url characters
//! <address>   the same for the address (or IPv6 prefix) of `scope = "ip"`
//! <route>     8 hex digits of the hash of the rule's method and pattern
//!             (`POST /api/export`), `*` outside every rule
//! <code>      5 base64url characters of the hash of what names the limit:
//!             its tier (identity scope only), its name (`<route>.<name>`
//!             for a limit a route rule adds) and its algorithm
//! ```
//!
//! The `{...}` hash tag holds what the counter counts, so every limit of one
//! client shares a cluster slot (one script can touch them all) while
//! different clients spread over every shard. Identities and addresses are
//! hashed first: a raw API key never appears in a key name, and a
//! client-chosen `{`, `}` or `:` cannot move its slot or collide with
//! another client's keys.
//!
//! Keys are short on purpose: Redis keeps a key name of up to 30 bytes in a
//! 32-byte allocation and a longer one in 48 or more, and the name is most of
//! what an identity costs (`rw:{<16>}:<5>` is 27 bytes).
//!
//! What makes a counter unique is in its key, and nothing else is:
//! - a route rule's limits carry the rule's method and pattern, so `GET` and
//!   `POST` rules on one path never share a counter;
//! - IP- and route-scoped keys carry no tier: an address, or a route, is one
//!   counter whatever tier its callers claim;
//! - the algorithm is part of the code, so a limit whose algorithm changes
//!   starts from a fresh counter instead of reading another shape of state;
//! - its parameters (window, limit, capacity, rate) are not: a reload that
//!   changes them keeps the key, and the algorithm reads the state under
//!   the new parameters without handing out quota (see
//!   [`crate::algorithm`], "Reloads");
//! - [`limit_codes`] lengthens every code of a policy in which two limits
//!   would share a short one.
//!
//! ```
//! use ratewatch::store::keys;
//! let id = keys::hash_identity("key", "free_a{b}:c");
//! let code = keys::limit_code(Some("free"), "burst", "tb");
//! let k = keys::identity_key("rw", &id, None, &code);
//! assert!(k.starts_with("rw:{") && k.len() == 27);
//! assert!(!k.contains("free"));
//! ```

use sha2::{Digest, Sha256};

use crate::algorithm::Algorithm;

/// Hex characters of the identity hash kept in keys (96 bits).
const HASH_HEX: usize = 24;

/// Hex characters of a route's tag inside keys (32 bits: a policy has a
/// handful of routes; see [`route_tags`] for what happens on a collision).
pub const ROUTE_TAG_HEX: usize = 8;

/// Hashes an identity (its kind and raw value) to the hex string used in
/// keys, fleet stats and the dashboard's hashed view, without a secret: the
/// scheme of a Redis deployment that configures no `hash_secret`
/// ([`IdentityKey::unkeyed`]). Anyone holding a key name can test guesses
/// against it offline; [`IdentityKey::hash_identity`] with a secret cannot
/// be reversed without the secret.
pub fn hash_identity(kind: &str, raw: &str) -> String {
    hex_hash(&[kind.as_bytes(), raw.as_bytes()], HASH_HEX)
}

/// The secret identity hashes are keyed with: HMAC-SHA256 over the
/// identity's kind and raw value, or, [`IdentityKey::unkeyed`], the plain
/// SHA-256 of [`hash_identity`]. Cheap to clone.
///
/// Every instance sharing a store must hold the same key, or each counts
/// the same caller under a different name (and so gives it its own quota).
///
/// ```
/// use ratewatch::store::keys::{IdentityKey, hash_identity};
/// let a = IdentityKey::new(b"a deployment secret of 32 bytes!");
/// let b = IdentityKey::new(b"another secret, another fleet...");
/// assert_ne!(a.hash_identity("key", "free_k"), b.hash_identity("key", "free_k"));
/// assert_eq!(a.hash_identity("key", "free_k"), a.clone().hash_identity("key", "free_k"));
/// assert_eq!(IdentityKey::unkeyed().hash_identity("key", "free_k"), hash_identity("key", "free_k"));
/// ```
#[derive(Clone)]
pub struct IdentityKey {
    /// 0 for the unkeyed scheme, else a fingerprint of the secret (never
    /// shown): tells whether an identity was hashed with this key.
    id: u64,
    /// SHA-256 states after the inner and outer padded key blocks.
    mac: Option<std::sync::Arc<(Sha256, Sha256)>>,
}

impl IdentityKey {
    /// HMAC-SHA256 keyed with `secret`.
    pub fn new(secret: &[u8]) -> Self {
        const BLOCK: usize = 64;
        let mut block = [0u8; BLOCK];
        if secret.len() > BLOCK {
            block[..32].copy_from_slice(&Sha256::digest(secret));
        } else {
            block[..secret.len()].copy_from_slice(secret);
        }
        let pad = |byte: u8| {
            let mut h = Sha256::new();
            h.update(block.map(|b| b ^ byte));
            h
        };
        let fingerprint = digest(&[b"ratewatch identity key id", secret]);
        let id = u64::from_le_bytes(fingerprint[..8].try_into().unwrap_or_default()).max(1);
        Self {
            id,
            mac: Some(std::sync::Arc::new((pad(0x36), pad(0x5c)))),
        }
    }

    /// A key from 32 random bytes: for a store no other process shares.
    pub fn random() -> Self {
        Self::new(&rand::random::<[u8; 32]>())
    }

    /// No secret: [`hash_identity`]'s plain SHA-256.
    pub fn unkeyed() -> Self {
        Self { id: 0, mac: None }
    }

    /// Whether a secret keys the hashes.
    pub fn is_keyed(&self) -> bool {
        self.mac.is_some()
    }

    /// Whether `self` and `other` hash every identity alike.
    pub fn same_as(&self, other: &IdentityKey) -> bool {
        self.id == other.id
    }

    /// Tells keys apart without showing the secret (0 for unkeyed): what a
    /// cache of hashes is keyed on.
    pub(crate) fn fingerprint(&self) -> u64 {
        self.id
    }

    /// The hex hash of an identity of `kind` (its hash class) with raw value
    /// `raw`: 24 hex digits, as [`hash_identity`] gives.
    pub fn hash_identity(&self, kind: &str, raw: &str) -> String {
        match &self.mac {
            None => hash_identity(kind, raw),
            Some(states) => hex_of(
                &self.mac_of(states, &[kind.as_bytes(), raw.as_bytes()]),
                HASH_HEX,
            ),
        }
    }

    fn mac_of(&self, states: &(Sha256, Sha256), parts: &[&[u8]]) -> [u8; 32] {
        let mut inner = states.0.clone();
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                inner.update([0]);
            }
            inner.update(p);
        }
        let mut outer = states.1.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }
}

impl std::fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret, nor its fingerprint.
        f.debug_struct("IdentityKey")
            .field("keyed", &self.is_keyed())
            .finish()
    }
}

impl PartialEq for IdentityKey {
    fn eq(&self, other: &Self) -> bool {
        self.same_as(other)
    }
}

impl Eq for IdentityKey {}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0]);
        }
        h.update(p);
    }
    h.finalize().into()
}

fn hex_hash(parts: &[&[u8]], len: usize) -> String {
    hex_of(&digest(parts), len)
}

fn hex_of(digest: &[u8; 32], len: usize) -> String {
    // By table, not `format!` per byte: this runs once per request.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(len + 1);
    for b in &digest[..len.div_ceil(2)] {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xf)] as char);
    }
    out.truncate(len);
    out
}

/// Characters of a limit's code in keys (30 bits).
pub const LIMIT_CODE_LEN: usize = 5;

/// Characters of a code when short ones would collide in a policy.
const LONG_CODE_LEN: usize = 16;

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Appends `bytes` in base64url without padding (whole groups of 3 bytes).
fn push_base64url(out: &mut String, bytes: &[u8]) {
    for chunk in bytes.chunks(3) {
        let mut n = 0u32;
        for (i, b) in chunk.iter().enumerate() {
            n |= u32::from(*b) << (16 - 8 * i);
        }
        for i in 0..=chunk.len() {
            out.push(BASE64URL[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
}

fn limit_code_of(tier: Option<&str>, name: &str, alg: &str, len: usize) -> String {
    let (scope, tier) = match tier {
        Some(t) => (&b"identity"[..], t),
        None => (&b"shared"[..], ""),
    };
    let digest = digest(&[
        b"limit",
        scope,
        tier.as_bytes(),
        name.as_bytes(),
        alg.as_bytes(),
    ]);
    let mut out = String::with_capacity(len + 4);
    push_base64url(&mut out, &digest[..len.div_ceil(4) * 3]);
    out.truncate(len);
    out
}

/// The `<code>` of a limit's keys: `tier` for an identity-scoped limit,
/// `None` for IP- and route-scoped ones (shared by every tier); `name` from
/// [`limit_name`], `alg` from [`algorithm_code`].
pub fn limit_code(tier: Option<&str>, name: &str, alg: &str) -> String {
    limit_code_of(tier, name, alg, LIMIT_CODE_LEN)
}

/// The codes of a policy's limits, given as (tier, name, alg) as for
/// [`limit_code`]: [`LIMIT_CODE_LEN`] characters each, or 16 for every
/// limit if two different limits would share a short code (a policy change
/// that causes this resets counters once; keeping limits apart matters
/// more). Equal inputs get equal codes.
pub fn limit_codes<'a>(
    limits: impl Iterator<Item = (Option<&'a str>, &'a str, &'a str)>,
) -> Vec<String> {
    codes_with_len(limits.collect(), LIMIT_CODE_LEN)
}

fn codes_with_len(limits: Vec<(Option<&str>, &str, &str)>, len: usize) -> Vec<String> {
    let short: Vec<String> = limits
        .iter()
        .map(|&(t, n, a)| limit_code_of(t, n, a, len))
        .collect();
    let mut seen = std::collections::HashMap::new();
    let collides = limits
        .iter()
        .zip(&short)
        .any(|(input, code)| *seen.entry(code.as_str()).or_insert(input) != input);
    if collides {
        limits
            .iter()
            .map(|&(t, n, a)| limit_code_of(t, n, a, LONG_CODE_LEN))
            .collect()
    } else {
        short
    }
}

/// Appends the dense form of a hash from [`hash_identity`]: its 96 bits in
/// 16 base64url characters. Anything else is appended as it is.
fn push_dense(out: &mut String, hex: &str) {
    // By table and one append: this runs for every key of every decision.
    const INVALID: u8 = 0xff;
    const NIBBLE: [u8; 256] = {
        let mut t = [INVALID; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            t[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    let digits = hex.as_bytes();
    if digits.len() != HASH_HEX {
        out.push_str(hex);
        return;
    }
    // The 96 bits, then 16 characters of 6 bits each.
    let mut bits: u128 = 0;
    let mut bad = 0u8;
    for &c in digits {
        let n = NIBBLE[usize::from(c)];
        bad |= n;
        bits = bits << 4 | u128::from(n & 0xf);
    }
    if bad & 0xf0 != 0 {
        out.push_str(hex);
        return;
    }
    let mut dense = [0u8; HASH_HEX * 4 / 6];
    for (i, c) in dense.iter_mut().enumerate() {
        *c = BASE64URL[((bits >> (90 - 6 * i)) & 63) as usize];
    }
    out.push_str(std::str::from_utf8(&dense).unwrap_or_default());
}

/// Appends `identity_hash` (from [`hash_identity`]) as [`identity_key`]
/// writes it inside the tag, for a caller that cuts keys around it.
pub fn push_identity(out: &mut String, identity_hash: &str) {
    push_dense(out, identity_hash);
}

/// The short code of an algorithm's state shape, part of a limit's code.
pub fn algorithm_code(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket { .. } => "tb",
        Algorithm::SlidingWindow { .. } => "sw",
        Algorithm::SlidingLog { .. } => "sl",
        Algorithm::FixedWindow { .. } => "fw",
        Algorithm::Gcra { .. } => "gc",
        Algorithm::LeakyBucket { .. } => "lb",
        Algorithm::Concurrency { .. } => "cc",
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

/// The key of a limit scoped to an identity: `identity_hash` from
/// [`hash_identity`], `part` the sub-identity index of a split tier (`#k`
/// inside the tag), `code` from [`limit_code`] with the tier.
pub fn identity_key(prefix: &str, identity_hash: &str, part: Option<u32>, code: &str) -> String {
    // Built in one allocation of the right size: every request makes one
    // per limit.
    let mut out = String::with_capacity(prefix.len() + 2 * HASH_HEX);
    out.push_str(prefix);
    out.push_str(":{");
    push_dense(&mut out, identity_hash);
    if let Some(k) = part {
        out.push('#');
        out.push_str(&k.to_string());
    }
    out.push_str("}:");
    out.push_str(code);
    out
}

/// The key of a limit scoped to the client address, whatever key or tier
/// it presents; `address_hash` is [`hash_identity`]`("ip", ...)` of the
/// address (or of its IPv6 prefix), `code` from [`limit_code`] without a
/// tier.
pub fn ip_key(prefix: &str, address_hash: &str, code: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 2 * HASH_HEX);
    out.push_str(prefix);
    out.push_str(":{ip:");
    push_dense(&mut out, address_hash);
    out.push_str("}:");
    out.push_str(code);
    out
}

/// The key of a limit global to a route (one ceiling for every client of
/// every tier); `route_tag` is the route's tag or [`ANY_ROUTE`], `code`
/// from [`limit_code`] without a tier.
pub fn route_key(prefix: &str, route_tag: &str, code: &str) -> String {
    [prefix, ":{rt:", route_tag, "}:", code].concat()
}

/// The key of a decision-service descriptor's limit: `domain_hash` is
/// [`hash_identity`]`("rls-domain", domain)` and is the hash tag, so every
/// descriptor of one domain (and so of one request) is on one cluster slot;
/// `descriptor_hash` is [`hash_identity`]`("rls", descriptor)`, `code`
/// from [`limit_code`] without a tier.
pub fn descriptor_key(
    prefix: &str,
    domain_hash: &str,
    descriptor_hash: &str,
    code: &str,
) -> String {
    let mut out = String::with_capacity(prefix.len() + 3 * HASH_HEX);
    out.push_str(prefix);
    out.push_str(":{rls:");
    push_dense(&mut out, domain_hash);
    out.push_str("}:");
    push_dense(&mut out, descriptor_hash);
    out.push(':');
    out.push_str(code);
    out
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

    fn code(tier: &str, name: &str) -> String {
        limit_code(Some(tier), name, "tb")
    }

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
        let k = identity_key("rw", &a, None, &code("free", "burst"));
        let tag = hash_tag(&k);
        assert_eq!(tag.len(), 16);
        assert!(
            tag.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_ne!(tag, hash_tag(&identity_key("rw", &b, None, "x")));
    }

    #[test]
    fn identity_hashes_are_the_lowercase_hex_sha256_prefix_fleet_stats_use() {
        // sha256(b"key\0free_k"), first 24 hex digits: the fleet view and
        // the dashboard's hashed view keep showing the same hashes.
        assert_eq!(hash_identity("key", "free_k"), "fd56fce8f54dd12e9c5b25af");
    }

    #[test]
    fn the_dense_form_is_the_hashs_bits_in_base64url() {
        // The form of every key already in Redis: hex digits to bytes,
        // then base64url of the bytes.
        let reference = |hex: &str| {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let mut out = String::new();
            push_base64url(&mut out, &bytes);
            out
        };
        for raw in ["", "free_k", "a{b}:c", "\u{1F600}"] {
            let h = hash_identity("key", raw);
            let mut dense = String::new();
            push_dense(&mut dense, &h);
            assert_eq!(dense, reference(&h));
            assert_eq!(dense.len(), 16);
        }
        let mut upper = String::new();
        push_dense(&mut upper, "0123456789ABCDEFabcdef00");
        assert_eq!(upper, reference("0123456789ABCDEFabcdef00"));
        for odd in [
            "0123456789abcdef0123456g",
            "short",
            "0123456789abcdef01234567ff",
        ] {
            let mut out = String::new();
            push_dense(&mut out, odd);
            assert_eq!(out, odd, "not a hash: appended as it is");
        }
    }

    #[test]
    fn keys_read_as_the_schema_says() {
        // The same 96 bits as the hex hash, in base64url.
        let h = "fd56fce8f54dd12e9c5b25af";
        assert_eq!(
            identity_key("rw", h, None, "AbCd_"),
            "rw:{_Vb86PVN0S6cWyWv}:AbCd_"
        );
        assert_eq!(
            identity_key("rw", h, Some(2), "AbCd_"),
            "rw:{_Vb86PVN0S6cWyWv#2}:AbCd_"
        );
        assert_eq!(ip_key("rw", h, "x"), "rw:{ip:_Vb86PVN0S6cWyWv}:x");
        assert_eq!(route_key("rw", "ef", "y"), "rw:{rt:ef}:y");
        // A hash that is not 24 hex digits is used as it is.
        assert_eq!(identity_key("rw", "ab", None, "c"), "rw:{ab}:c");
    }

    #[test]
    fn a_limit_code_names_tier_name_and_algorithm() {
        let c = code("free", "burst");
        assert_eq!(c.len(), LIMIT_CODE_LEN);
        assert_eq!(c, code("free", "burst"), "codes are stable");
        assert_ne!(c, code("pro", "burst"));
        assert_ne!(c, code("free", "minute"));
        assert_ne!(c, limit_code(Some("free"), "burst", "fw"));
        // IP- and route-scoped limits are shared by every tier.
        assert_ne!(c, limit_code(None, "burst", "tb"));
    }

    #[test]
    fn limits_whose_short_codes_collide_all_get_long_codes() {
        // One character (6 bits): among 20 names two collide for sure.
        let names: Vec<String> = (0..20).map(|i| format!("limit{i}")).collect();
        let inputs: Vec<_> = names
            .iter()
            .map(|n| (Some("free"), n.as_str(), "tb"))
            .collect();
        let codes = codes_with_len(inputs.clone(), 1);
        assert!(codes.iter().all(|c| c.len() == LONG_CODE_LEN));
        let distinct: std::collections::HashSet<_> = codes.iter().collect();
        assert_eq!(distinct.len(), 20);
        // Repeated inputs are one limit, not a collision.
        let same = codes_with_len(vec![inputs[0], inputs[0]], 1);
        assert_eq!(same[0].len(), 1);
        assert_eq!(same[0], same[1]);
        let policy = limit_codes(inputs.into_iter());
        assert!(policy.iter().all(|c| c.len() == LIMIT_CODE_LEN));
    }

    /// RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
    #[test]
    fn the_keyed_hash_is_hmac_sha256() {
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mac = |key: &[u8], data: &[u8]| {
            let k = IdentityKey::new(key);
            let states = k.mac.clone().unwrap();
            hex(&k.mac_of(&states, &[data]))
        };
        assert_eq!(
            mac(&[0x0b; 20], b"Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            mac(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            mac(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_keyed_hash_differs_per_secret_and_from_the_unkeyed_one() {
        let a = IdentityKey::new(b"secret-a-secret-a");
        let b = IdentityKey::new(b"secret-b-secret-b");
        let h = a.hash_identity("key", "free_k");
        assert_eq!(h.len(), HASH_HEX);
        assert_eq!(
            h,
            IdentityKey::new(b"secret-a-secret-a").hash_identity("key", "free_k")
        );
        assert_ne!(h, b.hash_identity("key", "free_k"));
        assert_ne!(h, hash_identity("key", "free_k"));
        assert!(a.same_as(&a.clone()) && !a.same_as(&b) && !a.same_as(&IdentityKey::unkeyed()));
        assert!(!format!("{a:?}").contains("secret"));
        // Kind and value stay apart under a key too.
        assert_ne!(
            a.hash_identity("key", "1.2.3.4"),
            a.hash_identity("ip", "1.2.3.4")
        );
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
        let k0 = identity_key("rw", &h, Some(0), "c");
        let k1 = identity_key("rw", &h, Some(1), "c");
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
        let key = |alg: &Algorithm| {
            identity_key(
                "rw",
                &h,
                None,
                &limit_code(Some("free"), "x", algorithm_code(alg)),
            )
        };
        assert_ne!(key(&tb), key(&fw));
    }

    #[test]
    fn keys_fit_the_32_byte_allocation_redis_gives_names_up_to_30_bytes() {
        let h = hash_identity("key", "free_k");
        let c = limit_code(Some("enterprise"), "1a2b3c4d.a_long_limit_name", "sw");
        assert_eq!(identity_key("rw", &h, None, &c).len(), 27);
        assert_eq!(identity_key("rw", &h, Some(7), &c).len(), 29);
        assert_eq!(ip_key("rw", &h, &c).len(), 30);
    }
}
