//! Who is calling, and which tier they belong to.
//!
//! A [`KeyExtractor`] turns a request into an [`Identity`] (API key header,
//! `Authorization: Bearer`, or client IP for anonymous callers); a
//! [`TierResolver`] names its tier. Both are small traits so an app can
//! plug in its own (a JWT claim, a database lookup).
//!
//! ```
//! use ratewatch::identity::{Identity, IdentityKind};
//! let id = Identity::new(IdentityKind::ApiKey, "free_secret_key_1234");
//! assert!(!format!("{id:?}").contains("secret"));
//! ```

mod extract;
mod hash_cache;
mod principal;
mod resolve;
mod secret;

use std::fmt::Write as _;
use std::net::IpAddr;

pub use extract::{HeaderExtractor, IdentityError, KeyExtractor, client_ip, peer_ip};
pub use principal::{Principal, PrincipalExtractor, VerifiedCaller};
pub(crate) use principal::{ReadCaller, principal_reader};
pub use resolve::{PrefixResolver, TierResolver};
pub(crate) use secret::deployment_key;

use crate::policy::KeyDisplay;
pub use crate::store::keys::IdentityKey;

/// How an identity was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdentityKind {
    /// The API key header.
    ApiKey,
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The client IP (anonymous callers).
    Ip,
    /// Set by a custom extractor.
    Custom,
}

impl IdentityKind {
    /// A short name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityKind::ApiKey => "key",
            IdentityKind::Bearer => "bearer",
            IdentityKind::Ip => "ip",
            IdentityKind::Custom => "custom",
        }
    }

    /// The class mixed into the identity hash. An API key and a Bearer
    /// token are one class: the same secret is one identity whichever
    /// header carried it, or a client could spend its quota twice.
    pub fn hash_class(self) -> &'static str {
        match self {
            IdentityKind::ApiKey | IdentityKind::Bearer => "key",
            IdentityKind::Ip => "ip",
            IdentityKind::Custom => "custom",
        }
    }
}

pub use crate::policy::DEFAULT_IPV6_PREFIX;

/// The address group an IP counts in: an IPv4 address (IPv4-mapped IPv6
/// included) is itself; an IPv6 address is its network of `ipv6_prefix`
/// bits (`2001:db8:1:2::/64`), since one host usually holds a whole /64
/// and would otherwise get a fresh quota per address.
pub fn address_group(ip: IpAddr, ipv6_prefix: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let bits = ipv6_prefix.min(128);
            if bits == 128 {
                return v6.to_string();
            }
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits))
            };
            let net = std::net::Ipv6Addr::from(u128::from(v6) & mask);
            format!("{net}/{bits}")
        }
    }
}

/// The caller of one request as the limiter decides it
/// ([`crate::PolicySnapshot::caller`]): who, and in which tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The identity whose counters the request is charged to.
    pub identity: Identity,
    /// The tier it is decided in.
    pub tier: String,
}

/// A caller. The raw value never reaches a key name, a label or a log:
/// `Debug` prints the masked form, stores see [`Identity::hash`].
///
/// The hash is keyed with an [`IdentityKey`]: [`Identity::new`] uses none,
/// and a limiter re-hashes an identity with its deployment's key before it
/// decides, so the key names and the dashboard's forms of every front end
/// (the layer, [`crate::Limiter::check`]) agree.
#[derive(Clone)]
pub struct Identity {
    kind: IdentityKind,
    raw: String,
    hash: String,
    key: IdentityKey,
    tier: Option<String>,
    /// The client IP, when known (for IP-scoped limits).
    pub ip: Option<IpAddr>,
    /// A name the app gave the caller for people to read (not a secret,
    /// not part of who it is).
    display_name: Option<std::sync::Arc<str>>,
}

/// Two identities are the same caller whatever display name they carry.
impl PartialEq for Identity {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.raw == other.raw
            && self.hash == other.hash
            && self.key == other.key
            && self.tier == other.tier
            && self.ip == other.ip
    }
}

impl Eq for Identity {}

/// Longest display name kept, in characters ([`Identity::with_display_name`]).
pub const MAX_DISPLAY_NAME: usize = 64;

/// Longest raw identity shown with `key_display = "raw"`, in characters: a
/// longer one (a client may send a 64 KiB descriptor value) is cut and
/// ends in its hash, so the fleet view's top-K stays small and two long
/// keys with one head stay apart.
pub const MAX_RAW_DISPLAY: usize = 128;

impl Identity {
    /// An identity of `kind` with raw value `raw`, hashed without a key
    /// (a limiter keys it before deciding).
    pub fn new(kind: IdentityKind, raw: impl Into<String>) -> Self {
        Self::keyed(kind, raw, &IdentityKey::unkeyed())
    }

    /// An identity of `kind` with raw value `raw`, hashed with `key`.
    pub fn keyed(kind: IdentityKind, raw: impl Into<String>, key: &IdentityKey) -> Self {
        let raw = raw.into();
        let hash = hash_cache::hash_identity(key, kind.hash_class(), &raw);
        Self {
            kind,
            raw,
            hash,
            key: key.clone(),
            tier: None,
            ip: None,
            display_name: None,
        }
    }

    /// The identity hashed with `key`: borrowed when it already is.
    pub fn with_key(&self, key: &IdentityKey) -> std::borrow::Cow<'_, Identity> {
        if self.key.same_as(key) {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut id = self.clone();
        id.hash = hash_cache::hash_identity(key, self.kind.hash_class(), &self.raw);
        id.key = key.clone();
        std::borrow::Cow::Owned(id)
    }

    /// The hash of a client address group (`scope = "ip"` keys), with the
    /// same key as this identity's.
    pub fn address_hash(&self, group: &str) -> String {
        hash_cache::hash_identity(&self.key, IdentityKind::Ip.hash_class(), group)
    }

    /// The identity with the tier its extractor verified (an auth layer's
    /// plan): the limiter decides in that tier, if the policy defines it.
    pub fn with_tier(mut self, tier: impl Into<String>) -> Self {
        self.tier = Some(tier.into());
        self
    }

    /// The tier its extractor verified, if any.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// An anonymous caller known by IP (or `unknown` when the server
    /// was not given peer addresses), IPv6 grouped by
    /// [`DEFAULT_IPV6_PREFIX`].
    pub fn from_ip(ip: Option<IpAddr>) -> Self {
        Self::from_ip_grouped(ip, DEFAULT_IPV6_PREFIX)
    }

    /// An anonymous caller known by the [`address_group`] of its IP: every
    /// address of one IPv6 network of `ipv6_prefix` bits is one caller.
    pub fn from_ip_grouped(ip: Option<IpAddr>, ipv6_prefix: u8) -> Self {
        Self::from_ip_keyed(ip, ipv6_prefix, &IdentityKey::unkeyed())
    }

    /// [`Identity::from_ip_grouped`], hashed with `key`.
    pub fn from_ip_keyed(ip: Option<IpAddr>, ipv6_prefix: u8, key: &IdentityKey) -> Self {
        let ip = ip.map(|ip| ip.to_canonical());
        let raw = ip.map_or_else(|| "unknown".to_owned(), |ip| address_group(ip, ipv6_prefix));
        let mut id = Self::keyed(IdentityKind::Ip, raw, key);
        id.ip = ip;
        id
    }

    /// Attaches the client IP (kept in canonical form: an IPv4-mapped IPv6
    /// address is its IPv4 address).
    pub fn with_ip(mut self, ip: Option<IpAddr>) -> Self {
        self.ip = ip.map(|ip| ip.to_canonical());
        self
    }

    /// How the identity was established.
    pub fn kind(&self) -> IdentityKind {
        self.kind
    }

    /// The raw key, token or IP. Handle with care: never log it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The hex hash used in store keys.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Whether the caller presented no key.
    pub fn is_anonymous(&self) -> bool {
        self.kind == IdentityKind::Ip
    }

    /// Gives the caller a name people can act on (a customer id from the
    /// auth layer), shown on the dashboard beside the masked identity. It
    /// must not be a secret: it is kept in the fleet view as given. Control
    /// characters are removed, surrounding space trimmed, and at most
    /// [`MAX_DISPLAY_NAME`] characters kept; an empty name is none. It is
    /// never a metric label and never part of a store key.
    pub fn with_display_name(mut self, name: &str) -> Self {
        let clean: String = name
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>()
            .trim()
            .chars()
            .take(MAX_DISPLAY_NAME)
            .collect();
        self.display_name = (!clean.is_empty()).then(|| clean.into());
        self
    }

    /// The display name the app gave the caller, if any.
    pub fn display_name(&self) -> Option<&str> {
        self.display_name.as_deref()
    }

    /// The form shown on the dashboard and kept in the fleet view.
    pub fn display(&self, mode: KeyDisplay) -> String {
        match mode {
            KeyDisplay::Raw if self.raw.chars().count() <= MAX_RAW_DISPLAY => self.raw.clone(),
            KeyDisplay::Raw => {
                let tail = &self.hash[self.hash.len() - 8..];
                let head: String = self.raw.chars().take(MAX_RAW_DISPLAY - 9).collect();
                format!("{head}…{tail}")
            }
            KeyDisplay::Hashed => self.hash.clone(),
            KeyDisplay::Masked => self.masked(),
        }
    }

    /// `free_tk…0c4e9f3a`: a short prefix of the key (at most a third of it,
    /// at most 7 characters) and the end of its hash. IPs show their
    /// network part only (`203.0.113.…0c4e9f3a`).
    pub fn masked(&self) -> String {
        // Eight hex digits (32 bits) of the hash keep thousands of keys with
        // one prefix apart in the top-blocked list.
        let tail = &self.hash[self.hash.len() - 8..];
        // One allocation: every decision's event carries this form.
        let mut out = String::with_capacity(24 + tail.len());
        match (self.kind, self.ip) {
            (IdentityKind::Ip, Some(IpAddr::V4(v4))) => {
                let o = v4.octets();
                let _ = write!(out, "{}.{}.{}.", o[0], o[1], o[2]);
            }
            (IdentityKind::Ip, Some(IpAddr::V6(v6))) => {
                let s = v6.segments();
                let _ = write!(out, "{:x}:{:x}:", s[0], s[1]);
            }
            _ => {
                let n = (self.raw.chars().count() / 3).min(7);
                out.extend(self.raw.chars().take(n));
            }
        }
        out.push('…');
        out.push_str(tail);
        out
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("kind", &self.kind)
            .field("masked", &self.masked())
            .field("display_name", &self.display_name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_display_is_bounded_and_long_keys_stay_apart() {
        let short = Identity::new(IdentityKind::Custom, "edge:api_key=k1");
        assert_eq!(short.display(KeyDisplay::Raw), "edge:api_key=k1");
        let long_a = Identity::new(IdentityKind::Custom, "a".repeat(65_536));
        let long_b = Identity::new(IdentityKind::Custom, format!("{}b", "a".repeat(65_535)));
        let (a, b) = (
            long_a.display(KeyDisplay::Raw),
            long_b.display(KeyDisplay::Raw),
        );
        assert_eq!(a.chars().count(), MAX_RAW_DISPLAY);
        assert_eq!(b.chars().count(), MAX_RAW_DISPLAY);
        assert_ne!(
            a, b,
            "two long keys with one head are told apart by their hash"
        );
    }

    #[test]
    fn masked_forms_show_a_short_head_and_the_end_of_the_hash() {
        let key = Identity::new(IdentityKind::ApiKey, "free_abcdefghijklmnop");
        assert_eq!(key.masked(), "free_ab…98bab1ba");
        let v4 = Identity::from_ip(Some("203.0.113.9".parse().unwrap()));
        assert_eq!(v4.masked(), "203.0.113.…b53cdada");
        let v6 = Identity::from_ip(Some("2001:db8:1:2::7".parse().unwrap()));
        assert_eq!(v6.masked(), "2001:db8:…e2987ca8");
        assert_eq!(
            Identity::new(IdentityKind::Bearer, "ab").masked(),
            format!(
                "…{}",
                &Identity::new(IdentityKind::Bearer, "ab").hash()[16..]
            )
        );
    }
}
