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
