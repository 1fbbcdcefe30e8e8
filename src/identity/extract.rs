//! Extracting an identity from request headers and the peer address.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::{Extensions, HeaderMap, header};

use super::{Identity, IdentityKey, IdentityKind};
use crate::policy::{AnonymousMode, IdentitySettings, settings_ip_in};

/// Why a request has no usable identity. Each maps to a clear response:
/// 400 for a malformed or oversized value or for two different
/// credentials, 401 when keys are required, 403 when the caller's tier is
/// one the policy does not define.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// A header that identifies callers is malformed or too long.
    #[error("malformed {header}: {reason}")]
    Malformed {
        /// The header at fault.
        header: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No key, and anonymous callers are rejected.
    #[error("an API key is required")]
    Missing,
    /// Two different credentials in one request (the API key header and a
    /// Bearer token, or one of them repeated with different values): which
    /// one is the caller would be a guess, and whatever ratewatch chose,
    /// an app or a proxy reading the other would disagree with it.
    #[error("{}", conflict_message(first, second))]
    Conflict {
        /// The header of the first credential.
        first: String,
        /// The header of the other one (the same header when it repeats).
        second: String,
    },
    /// The tier the caller was resolved to is not defined by the policy
    /// (`[identity] unknown_tier = "reject"`).
    #[error("the caller's tier is not configured on this service")]
    UnknownTier,
}

fn conflict_message(first: &str, second: &str) -> String {
    if first == second {
        format!(
            "conflicting credentials: {first} is repeated with different values; send one credential"
        )
    } else {
        format!(
            "conflicting credentials: {first} and {second} carry different values; send one credential"
        )
    }
}

impl IdentityError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> http::StatusCode {
        match self {
            IdentityError::Malformed { .. } | IdentityError::Conflict { .. } => {
                http::StatusCode::BAD_REQUEST
            }
            IdentityError::Missing => http::StatusCode::UNAUTHORIZED,
            IdentityError::UnknownTier => http::StatusCode::FORBIDDEN,
        }
    }

    /// The `error` field of ratewatch's JSON answer: `bad_identity`,
    /// `conflicting_credentials`, `api_key_required`, `unknown_tier`.
    pub fn code(&self) -> &'static str {
        match self {
            IdentityError::Malformed { .. } => "bad_identity",
            IdentityError::Conflict { .. } => "conflicting_credentials",
            IdentityError::Missing => "api_key_required",
            IdentityError::UnknownTier => "unknown_tier",
        }
    }
}

/// Turns a request into an identity. It sees the request's method, URI,
/// headers and extensions (where `ConnectInfo<SocketAddr>` carries the
/// peer address).
///
/// An identity returned without an IP ([`Identity::ip`]) gets the client
/// IP the limiter finds itself (trusted proxies applied), so IP-scoped
/// limits keep working with a custom extractor.
///
/// ```
/// use http::request::Parts;
/// use ratewatch::identity::{Identity, IdentityError, IdentityKind, KeyExtractor};
/// /// The tenant id an auth layer put into the extensions.
/// #[derive(Clone)]
/// struct Tenant(String);
/// struct TenantExtractor;
/// impl KeyExtractor for TenantExtractor {
///     fn extract(&self, request: &Parts) -> Result<Identity, IdentityError> {
///         let tenant = request.extensions.get::<Tenant>().ok_or(IdentityError::Missing)?;
///         Ok(Identity::new(IdentityKind::Custom, tenant.0.clone()))
///     }
/// }
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The caller of a request, or why it has none.
    fn extract(&self, request: &http::request::Parts) -> Result<Identity, IdentityError>;
}

/// The default extractor: the API key header or `Authorization: Bearer`,
/// else the client IP (`X-Forwarded-For` only from trusted proxies).
///
/// One credential per request: two different ones (the key header and a
/// Bearer token, or either repeated with different values) are a 400
/// ([`IdentityError::Conflict`]), never "the first one wins". The same
/// secret sent twice is one credential.
#[derive(Debug, Clone)]
pub struct HeaderExtractor {
    settings: IdentitySettings,
    api_key_header: http::HeaderName,
    key: IdentityKey,
}

impl HeaderExtractor {
    /// An extractor following `settings`, hashing without a key (a limiter
    /// builds its own with the deployment's key).
    pub fn new(settings: IdentitySettings) -> Self {
        let api_key_header = http::HeaderName::from_bytes(settings.api_key_header.as_bytes())
            .unwrap_or_else(|_| http::HeaderName::from_static("x-api-key"));
        Self {
            settings,
            api_key_header,
            key: IdentityKey::unkeyed(),
        }
    }

    /// The extractor hashing identities with `key`.
    pub fn with_key(mut self, key: IdentityKey) -> Self {
        self.key = key;
        self
    }

    /// The settings it follows.
    pub fn settings(&self) -> &IdentitySettings {
        &self.settings
    }

    /// The key identities are hashed with.
    pub(crate) fn key(&self) -> &IdentityKey {
        &self.key
    }

    /// The caller of a request with `headers` from `peer`.
    pub fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Identity, IdentityError> {
        let ip = self.client_ip(headers, peer)?;
        match self.credential(headers)? {
            Some((kind, secret)) => Ok(Identity::keyed(kind, secret, &self.key).with_ip(ip)),
            None => self.anonymous(ip),
        }
    }

    /// The caller without a credential, as `[identity] anonymous` says:
    /// known by its address, or refused.
    pub fn anonymous(&self, ip: Option<IpAddr>) -> Result<Identity, IdentityError> {
        match self.settings.anonymous {
            AnonymousMode::Reject => Err(IdentityError::Missing),
            AnonymousMode::Ip => Ok(Identity::from_ip_keyed(
                ip,
                self.settings.ipv6_prefix,
                &self.key,
            )),
        }
    }

    /// The one credential `headers` carry (the API key header, or a Bearer
    /// token when `bearer` is on), `None` without one.
    ///
    /// Every value of both headers is read, so a credential cannot hide
    /// behind another: values that differ are [`IdentityError::Conflict`].
    /// With `bearer` on, `Authorization` fields that differ conflict
    /// whatever their scheme (the field is a singleton; a proxy or the app
    /// may read either one).
    pub fn credential<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Result<Option<(IdentityKind, &'h str)>, IdentityError> {
        let key_name = self.api_key_header.as_str();
        let conflict = |first: &str, second: &str| IdentityError::Conflict {
            first: first.to_owned(),
            second: second.to_owned(),
        };
        let mut key: Option<&str> = None;
        for value in headers.get_all(&self.api_key_header) {
            let v = self.token_chars(value.as_bytes(), "api key header")?;
            match key {
                Some(k) if k != v => return Err(conflict(key_name, key_name)),
                _ => key = Some(v),
            }
        }
        let mut token: Option<&str> = None;
        if self.settings.bearer {
            let mut fields = headers.get_all(header::AUTHORIZATION).iter();
            if let Some(first) = fields.next() {
                if fields.any(|other| other != first) {
                    return Err(conflict("authorization", "authorization"));
                }
                if let Some(t) = bearer_token(first.as_bytes()) {
                    token = Some(self.token_chars(t, "authorization")?);
                }
            }
        }
        Ok(match (key, token) {
            (Some(k), Some(t)) if k != t => return Err(conflict(key_name, "authorization")),
            (Some(k), _) => Some((IdentityKind::ApiKey, k)),
            (None, Some(t)) => Some((IdentityKind::Bearer, t)),
            (None, None) => None,
        })
    }

    fn token_chars<'a>(&self, v: &'a [u8], header: &'static str) -> Result<&'a str, IdentityError> {
        let bad = |reason| IdentityError::Malformed { header, reason };
        if v.is_empty() {
            return Err(bad("empty value"));
        }
        if v.len() > self.settings.max_key_len {
            return Err(bad("value too long"));
        }
        if !v.iter().all(|b| b.is_ascii_graphic()) {
            return Err(bad("only visible ASCII characters are allowed"));
        }
        std::str::from_utf8(v).map_err(|_| bad("not ASCII"))
    }

    /// The client IP: see [`client_ip`].
    pub fn client_ip(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Option<IpAddr>, IdentityError> {
        client_ip(&self.settings.trusted_proxies, headers, peer)
    }
}

/// The client IP: the peer, or, when the peer is one of `trusted` proxies,
/// the rightmost `X-Forwarded-For` hop that is not itself a trusted proxy.
/// `None` when the peer is unknown.
///
/// Addresses are canonical: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
/// what a dual-stack `[::]` listener reports for IPv4 peers) is the IPv4
/// address, for the trusted-proxy test and for the answer alike.
pub fn client_ip(
    trusted: &[crate::policy::IpNet],
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Option<IpAddr>, IdentityError> {
    let Some(peer) = peer.map(|p| p.to_canonical()) else {
        return Ok(None);
    };
    if !settings_ip_in(trusted, peer) {
        return Ok(Some(peer));
    }
    let mut client = peer;
    let bad = |reason| IdentityError::Malformed {
        header: "x-forwarded-for",
        reason,
    };
    let mut total = 0;
    for value in headers.get_all("x-forwarded-for").iter().rev() {
        total += value.len();
        if total > 4096 {
            return Err(bad("value too long"));
        }
        let s = value.to_str().map_err(|_| bad("not ASCII"))?;
        for hop in s.rsplit(',') {
            let hop = hop.trim();
            let ip = parse_hop(hop).ok_or(bad("not a list of IP addresses"))?;
            client = ip;
            if !settings_ip_in(trusted, ip) {
                return Ok(Some(client));
            }
        }
    }
    Ok(Some(client))
}

fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .map(|ip| ip.to_canonical())
}

/// The token of an `Authorization: Bearer <token>` value; `None` for other
/// schemes (a Basic credential is not a rate-limit identity).
fn bearer_token(v: &[u8]) -> Option<&[u8]> {
    let scheme = b"bearer";
    if v.len() < scheme.len() || !v[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return None;
    }
    let rest = &v[scheme.len()..];
    match rest.first() {
        None => Some(rest),
        Some(b' ') => Some(rest.trim_ascii()),
        Some(_) => None,
    }
}

/// The peer address a server recorded for a request: axum's `ConnectInfo`
/// from `into_make_service_with_connect_info`, else a plain `SocketAddr`
/// (as a hyper or tower server may insert, and where the layer leaves what
/// a [`PeerAddr`](crate::layer::PeerAddr) found), else `MockConnectInfo`
/// in tests; in canonical form (an IPv4-mapped IPv6 peer is its IPv4
/// address).
pub fn peer_ip(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| extensions.get::<SocketAddr>().map(SocketAddr::ip))
        .or_else(|| {
            extensions
                .get::<axum::extract::connect_info::MockConnectInfo<SocketAddr>>()
                .map(|m| m.0.ip())
        })
        .map(|ip| ip.to_canonical())
}

impl KeyExtractor for HeaderExtractor {
    fn extract(&self, request: &http::request::Parts) -> Result<Identity, IdentityError> {
        self.identify(&request.headers, peer_ip(&request.extensions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// An extractor behind a proxy on loopback.
    fn ex() -> HeaderExtractor {
        HeaderExtractor::new(IdentitySettings {
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            ..IdentitySettings::default()
        })
    }

    #[test]
    fn by_default_no_proxy_is_trusted() {
        let h = headers(&[("x-forwarded-for", b"203.0.113.9")]);
        let id = HeaderExtractor::new(IdentitySettings::default())
            .identify(&h, Some("127.0.0.1".parse().unwrap()))
            .unwrap();
        assert_eq!(id.ip, Some("127.0.0.1".parse().unwrap()));
    }

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn two_different_credentials_conflict_and_none_of_them_wins() {
        let conflict = |pairs: &[(&str, &[u8])]| ex().identify(&headers(pairs), None).unwrap_err();
        let e = conflict(&[("x-api-key", b"free_k1"), ("authorization", b"Bearer t")]);
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        assert_eq!(e.code(), "conflicting_credentials");
        assert!(e.to_string().contains("x-api-key and authorization"), "{e}");
        let e = conflict(&[("x-api-key", b"free_a"), ("x-api-key", b"free_b")]);
        assert!(e.to_string().contains("x-api-key is repeated"), "{e}");
        let e = conflict(&[
            ("authorization", b"Bearer a"),
            ("authorization", b"Basic b"),
        ]);
        assert!(e.to_string().contains("authorization is repeated"), "{e}");
        // One secret, sent twice or in both headers, is one credential.
        for pairs in [
            &[("x-api-key", &b"free_k1"[..]), ("x-api-key", b"free_k1")][..],
            &[
                ("x-api-key", b"free_k1"),
                ("authorization", b"Bearer free_k1"),
            ],
            &[
                ("authorization", b"Bearer free_k1"),
                ("authorization", b"Bearer free_k1"),
            ],
        ] {
            let id = ex().identify(&headers(pairs), None).unwrap();
            assert_eq!(id.raw(), "free_k1");
        }
        // With `bearer` off, Authorization is not a credential at all.
        let no_bearer = HeaderExtractor::new(IdentitySettings {
            bearer: false,
            ..IdentitySettings::default()
        });
        let h = headers(&[("x-api-key", b"free_k1"), ("authorization", b"Bearer t")]);
        assert_eq!(no_bearer.identify(&h, None).unwrap().raw(), "free_k1");
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_basic_is_ignored() {
        let id = ex()
            .identify(&headers(&[("authorization", b"bEaReR tok")]), None)
            .unwrap();
        assert_eq!((id.kind(), id.raw()), (IdentityKind::Bearer, "tok"));
        let id = ex()
            .identify(&headers(&[("authorization", b"Basic abc")]), None)
            .unwrap();
        assert!(id.is_anonymous());
    }

    #[test]
    fn oversized_and_malformed_values_are_errors_not_panics() {
        let long = vec![b'a'; 10_000];
        for h in [
            headers(&[("x-api-key", &long)]),
            headers(&[("x-api-key", b"")]),
            headers(&[("x-api-key", b"has space")]),
            headers(&[("x-api-key", b"caf\xc3\xa9")]),
            headers(&[("authorization", b"Bearer")]),
        ] {
            let err = ex().identify(&h, None).unwrap_err();
            assert_eq!(err.status(), http::StatusCode::BAD_REQUEST, "{h:?}");
        }
    }

    #[test]
    fn forwarded_for_is_honoured_only_from_trusted_proxies() {
        let h = headers(&[("x-forwarded-for", b"203.0.113.9, 127.0.0.1")]);
        let via_proxy = ex()
            .identify(&h, Some("127.0.0.1".parse().unwrap()))
            .unwrap();
        assert_eq!(via_proxy.ip, Some("203.0.113.9".parse().unwrap()));
        let direct = ex()
            .identify(&h, Some("198.51.100.7".parse().unwrap()))
            .unwrap();
        assert_eq!(direct.ip, Some("198.51.100.7".parse().unwrap()));
    }

    #[test]
    fn garbage_forwarded_for_from_a_trusted_proxy_is_a_400() {
        let h = headers(&[("x-forwarded-for", b"not-an-ip")]);
        let err = ex()
            .identify(&h, Some("127.0.0.1".parse().unwrap()))
            .unwrap_err();
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn one_secret_is_one_identity_whichever_header_carried_it() {
        let by_header = ex()
            .identify(&headers(&[("x-api-key", b"free_secret")]), None)
            .unwrap();
        let by_bearer = ex()
            .identify(&headers(&[("authorization", b"Bearer free_secret")]), None)
            .unwrap();
        assert_eq!(by_header.hash(), by_bearer.hash());
    }

    #[test]
    fn an_ipv4_mapped_peer_is_its_ipv4_address_for_proxies_and_identity() {
        let h = headers(&[("x-forwarded-for", b"::ffff:203.0.113.9")]);
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let id = ex().identify(&h, Some(mapped)).unwrap();
        assert_eq!(id.ip, Some("203.0.113.9".parse().unwrap()));
        let plain = ex()
            .identify(&HeaderMap::new(), Some("203.0.113.9".parse().unwrap()))
            .unwrap();
        assert_eq!(id.hash(), plain.hash());
        let direct = ex()
            .identify(
                &HeaderMap::new(),
                Some("::ffff:198.51.100.7".parse().unwrap()),
            )
            .unwrap();
        assert_eq!(direct.ip, Some("198.51.100.7".parse().unwrap()));
    }

    #[test]
    fn ipv6_clients_of_one_prefix_are_one_anonymous_identity() {
        let a = ex()
            .identify(&HeaderMap::new(), Some("2001:db8:1:2::1".parse().unwrap()))
            .unwrap();
        let b = ex()
            .identify(
                &HeaderMap::new(),
                Some("2001:db8:1:2:ffff:1:2:3".parse().unwrap()),
            )
            .unwrap();
        let other = ex()
            .identify(&HeaderMap::new(), Some("2001:db8:1:3::1".parse().unwrap()))
            .unwrap();
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), other.hash());
        let exact = HeaderExtractor::new(IdentitySettings {
            ipv6_prefix: 128,
            ..Default::default()
        });
        let a = exact
            .identify(&HeaderMap::new(), Some("2001:db8:1:2::1".parse().unwrap()))
            .unwrap();
        let b = exact
            .identify(&HeaderMap::new(), Some("2001:db8:1:2::2".parse().unwrap()))
            .unwrap();
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn anonymous_reject_mode_answers_401() {
        let settings = IdentitySettings {
            anonymous: AnonymousMode::Reject,
            ..Default::default()
        };
        let err = HeaderExtractor::new(settings)
            .identify(&HeaderMap::new(), None)
            .unwrap_err();
        assert_eq!(err.status(), http::StatusCode::UNAUTHORIZED);
    }
}
