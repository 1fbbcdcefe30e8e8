//! `[server]`: how `ratewatch serve` holds its two listeners against slow,
//! idle and hostile clients. Every bound has a default, so a policy
//! without the section is safe as it is.
//!
//! The HTTP port (demo API, dashboard, `/v1/decide`, `/json`) closes a
//! connection whose request head has not arrived within
//! `header_read_timeout` (and fails a body that stalls as long), and a keep-alive connection idle for
//! `idle_timeout`; beyond `max_connections` open connections a new one is
//! closed at once. The gRPC port announces `grpc_max_concurrent_streams`
//! and its window, frame and header-list sizes in its HTTP/2 SETTINGS,
//! answers a request still running after `grpc_request_timeout` with
//! DEADLINE_EXCEEDED, and closes connections idle for `grpc_idle_timeout`
//! or beyond `grpc_max_connections`. What one gRPC connection may hold is
//! bounded by [`ServerSettings::grpc_connection_bytes`].
//!
//! With `tls_cert_file` and `tls_key_file` both ports serve TLS only
//! (the HTTP port offers ALPN `h2` and `http/1.1`, the gRPC port `h2`), and
//! with `tls_client_ca_file` they require a client certificate that CA
//! signed. The server follows the three files: a changed pair is used
//! for new connections, a bad one is logged and the old one kept.
//!
//! The section is read when the server starts: a reload does not rebind
//! ports or change the bounds of open listeners.
//!
//! ```
//! use ratewatch::policy::Policy;
//! let p = Policy::from_toml_str("[server]\nmax_connections = 100\n", None).unwrap();
//! assert_eq!(p.server.max_connections, 100);
//! assert_eq!(p.server.grpc_max_concurrent_streams, 100);
//! ```

use std::path::PathBuf;
use std::time::Duration;

/// `[server]`: the bounds of `ratewatch serve`'s listeners.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// HTTP port: the whole request head must arrive within this, from the
    /// connection's start or the request's first byte, and each part of a
    /// request body within this of the last (10 s).
    pub header_read_timeout: Duration,
    /// HTTP port: a connection with no request in flight for this long is
    /// closed (60 s).
    pub idle_timeout: Duration,
    /// HTTP port: most connections open at once; more are closed on
    /// arrival (4096).
    pub max_connections: usize,
    /// gRPC port: most connections open at once (1024).
    pub grpc_max_connections: usize,
    /// gRPC port: a connection with no stream open for this long is
    /// closed (300 s).
    pub grpc_idle_timeout: Duration,
    /// gRPC port: a request still running after this is answered
    /// DEADLINE_EXCEEDED and its stream freed (5 s).
    pub grpc_request_timeout: Duration,
    /// gRPC port: `SETTINGS_MAX_CONCURRENT_STREAMS` per connection (100).
    pub grpc_max_concurrent_streams: u32,
    /// gRPC port: the initial flow-control window of a stream, in bytes
    /// (65,535, HTTP/2's default).
    pub grpc_stream_window: u32,
    /// gRPC port: the flow-control window of a connection, in bytes
    /// (262,144): what a client may send before the server reads it.
    pub grpc_connection_window: u32,
    /// gRPC port: `SETTINGS_MAX_FRAME_SIZE` (16,384, HTTP/2's minimum).
    pub grpc_max_frame_size: u32,
    /// gRPC port: `SETTINGS_MAX_HEADER_LIST_SIZE`, in bytes (8,192).
    pub grpc_max_header_list_size: u32,
    /// Both ports: the certificate chain (PEM, leaf first) served over TLS;
    /// with [`tls_key_file`](Self::tls_key_file), the ports speak TLS only
    /// (none: plain text).
    pub tls_cert_file: Option<PathBuf>,
    /// Both ports: the private key (PEM: PKCS#8, PKCS#1 or SEC1) of
    /// [`tls_cert_file`](Self::tls_cert_file).
    pub tls_key_file: Option<PathBuf>,
    /// Both ports: require a client certificate signed by a CA of this PEM
    /// bundle (mutual TLS; none: no client certificate asked for).
    pub tls_client_ca_file: Option<PathBuf>,
    /// `/healthcheck` and gRPC health fail (500, NOT_SERVING) while the
    /// store is down: every shard's circuit breaker open (false: they
    /// fail only while draining). envoyproxy/ratelimit's
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`.
    pub healthcheck_store: bool,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            grpc_max_connections: 1024,
            grpc_idle_timeout: Duration::from_secs(300),
            grpc_request_timeout: Duration::from_secs(5),
            grpc_max_concurrent_streams: 100,
            grpc_stream_window: 65_535,
            grpc_connection_window: 262_144,
            grpc_max_frame_size: 16_384,
            grpc_max_header_list_size: 8_192,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            healthcheck_store: false,
        }
    }
}

/// Send buffer per gRPC stream, in bytes: an answer is a few hundred bytes.
pub const GRPC_SEND_BUFFER: u32 = 16 * 1024;

impl ServerSettings {
    /// The most request and answer bytes one gRPC connection can make the
    /// server hold: the connection window, plus a header list and a send
    /// buffer for each concurrent stream.
    pub fn grpc_connection_bytes(&self) -> u64 {
        u64::from(self.grpc_connection_window)
            + u64::from(self.grpc_max_concurrent_streams)
                * (u64::from(self.grpc_max_header_list_size) + u64::from(GRPC_SEND_BUFFER))
    }

    /// Whether the ports serve TLS: a certificate or a key is named (a
    /// lone one, or a client CA without them, is an error when the server
    /// starts and in `check-config`).
    pub fn tls(&self) -> bool {
        self.tls_cert_file.is_some() || self.tls_key_file.is_some()
    }
}
