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
mod resolve;

use std::net::IpAddr;

pub use extract::{HeaderExtractor, IdentityError, KeyExtractor, client_ip, peer_ip};
pub use resolve::{PrefixResolver, TierResolver};

use crate::policy::KeyDisplay;
use crate::store::keys::hash_identity;

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
    /// A short name, mixed into the identity hash.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityKind::ApiKey => "key",
            IdentityKind::Bearer => "bearer",
            IdentityKind::Ip => "ip",
            IdentityKind::Custom => "custom",
        }
    }
}

/// A caller. The raw value never reaches a key name, a label or a log:
/// `Debug` prints the masked form, stores see [`Identity::hash`].
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    kind: IdentityKind,
    raw: String,
    hash: String,
    /// The client IP, when known (for IP-scoped limits).
    pub ip: Option<IpAddr>,
}

impl Identity {
    /// An identity of `kind` with raw value `raw`.
    pub fn new(kind: IdentityKind, raw: impl Into<String>) -> Self {
        let raw = raw.into();
        let hash = hash_identity(kind.as_str(), &raw);
        Self {
            kind,
            raw,
            hash,
            ip: None,
        }
    }

    /// An anonymous caller known by IP (or `unknown` when the server
    /// was not given peer addresses).
    pub fn from_ip(ip: Option<IpAddr>) -> Self {
        let raw = ip.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        let mut id = Self::new(IdentityKind::Ip, raw);
        id.ip = ip;
        id
    }

    /// Attaches the client IP.
    pub fn with_ip(mut self, ip: Option<IpAddr>) -> Self {
        self.ip = ip;
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

    /// The form shown on the dashboard and kept in the fleet view.
    pub fn display(&self, mode: KeyDisplay) -> String {
        match mode {
            KeyDisplay::Raw => self.raw.clone(),
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
        let head: String = match (self.kind, self.ip) {
            (IdentityKind::Ip, Some(IpAddr::V4(v4))) => {
                let o = v4.octets();
                format!("{}.{}.{}.", o[0], o[1], o[2])
            }
            (IdentityKind::Ip, Some(IpAddr::V6(v6))) => {
                let s = v6.segments();
                format!("{:x}:{:x}:", s[0], s[1])
            }
            _ => {
                let n = (self.raw.chars().count() / 3).min(7);
                self.raw.chars().take(n).collect()
            }
        };
        format!("{head}…{tail}")
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("kind", &self.kind)
            .field("masked", &self.masked())
            .finish()
    }
}
