//! Where a request's peer address comes from.
//!
//! Anonymous callers are limited by IP, and `X-Forwarded-For` is believed
//! only from trusted proxies, so the layer needs the address of the peer
//! that sent the request. It finds it, in this order, in the request's
//! extensions:
//!
//! 1. axum's `ConnectInfo<SocketAddr>` (serve with
//!    `into_make_service_with_connect_info::<SocketAddr>()`), or
//!    `MockConnectInfo` in tests;
//! 2. a plain `SocketAddr`, as a hyper or tower server can insert itself;
//! 3. a [`PeerAddr`] the app gives the layer
//!    ([`RateLimitLayer::with_peer_addr`](super::RateLimitLayer::with_peer_addr))
//!    for any other server, such as tonic's `TcpConnectInfo`.
//!
//! ```
//! use std::net::SocketAddr;
//! use ratewatch::layer::PeerAddr;
//! /// What a home-grown server records about a connection.
//! #[derive(Clone)]
//! struct Conn { remote: SocketAddr }
//! fn peer(ext: &http::Extensions) -> Option<SocketAddr> {
//!     ext.get::<Conn>().map(|c| c.remote)
//! }
//! let mut ext = http::Extensions::new();
//! ext.insert(Conn { remote: "192.0.2.7:5000".parse().unwrap() });
//! assert_eq!(peer.peer_addr(&ext), Some("192.0.2.7:5000".parse().unwrap()));
//! ```

use std::net::SocketAddr;

use http::Extensions;

/// Finds the peer address a server recorded in a request's extensions.
/// Any `Fn(&Extensions) -> Option<SocketAddr>` is one.
pub trait PeerAddr: Send + Sync + 'static {
    /// The address of the peer that sent a request with `extensions`,
    /// `None` when unknown.
    fn peer_addr(&self, extensions: &Extensions) -> Option<SocketAddr>;
}

impl<F> PeerAddr for F
where
    F: Fn(&Extensions) -> Option<SocketAddr> + Send + Sync + 'static,
{
    fn peer_addr(&self, extensions: &Extensions) -> Option<SocketAddr> {
        self(extensions)
    }
}

/// Headers by which a proxy names the client it forwards for.
pub const FORWARDING_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// Why a request does not come from a caller on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotLocal {
    /// The server recorded no peer address.
    UnknownPeer,
    /// The peer (or the client a trusted proxy named) is not loopback.
    Remote,
    /// A peer outside `trusted_proxies` forwarded the request for someone
    /// else (it sent `Forwarded`, `X-Forwarded-For` or `X-Real-IP`): a
    /// proxy on this host, not a local caller.
    UntrustedProxy,
    /// A trusted proxy did not name the client in `X-Forwarded-For`.
    ProxyNamedNoClient,
}

impl NotLocal {
    /// What the refusal says.
    pub fn reason(self) -> &'static str {
        match self {
            NotLocal::UnknownPeer => "the peer address is unknown",
            NotLocal::Remote => "the client is not on this host",
            NotLocal::UntrustedProxy => {
                "the request was forwarded (Forwarded, X-Forwarded-For or X-Real-IP) by a peer \
                 that is not in [identity] trusted_proxies"
            }
            NotLocal::ProxyNamedNoClient => {
                "the request came from a trusted proxy that did not say who the client is \
                 (no X-Forwarded-For)"
            }
        }
    }
}

/// Whether a request comes from a caller on this host: the one judgement
/// behind every endpoint that answers loopback callers only (the decision
/// endpoints, the dashboard).
///
/// A loopback peer that forwards the request for someone else is a proxy,
/// not a local caller, unless it is one of `trusted` proxies: then the
/// client it names in `X-Forwarded-For` is judged instead.
///
/// ```
/// use ratewatch::layer::{NotLocal, local_caller};
/// let mut h = http::HeaderMap::new();
/// let lo = Some("127.0.0.1".parse().unwrap());
/// assert_eq!(local_caller(&[], &h, lo), Ok(()));
/// h.insert("x-real-ip", "203.0.113.9".parse().unwrap());
/// assert_eq!(local_caller(&[], &h, lo), Err(NotLocal::UntrustedProxy));
/// ```
pub fn local_caller(
    trusted: &[crate::policy::IpNet],
    headers: &http::HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<(), NotLocal> {
    let peer = peer
        .map(|p| p.to_canonical())
        .ok_or(NotLocal::UnknownPeer)?;
    let via_trusted = crate::policy::settings_ip_in(trusted, peer);
    let forwarded = FORWARDING_HEADERS.iter().any(|h| headers.contains_key(*h));
    let client = if via_trusted {
        if !headers.contains_key("x-forwarded-for") {
            return Err(NotLocal::ProxyNamedNoClient);
        }
        crate::identity::client_ip(trusted, headers, Some(peer))
            .ok()
            .flatten()
            .ok_or(NotLocal::ProxyNamedNoClient)?
    } else if forwarded {
        return Err(NotLocal::UntrustedProxy);
    } else {
        peer
    };
    if client.to_canonical().is_loopback() {
        Ok(())
    } else {
        Err(NotLocal::Remote)
    }
}
