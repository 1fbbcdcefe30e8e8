//! The `[server]` section. A missing key keeps its default; every bound is
//! checked against what HTTP/2 and the operating system allow.

use super::reader::{Result, Table};
use crate::policy::ServerSettings;

const KEYS: [&str; 15] = [
    "header_read_timeout_ms",
    "idle_timeout_ms",
    "max_connections",
    "grpc_max_connections",
    "grpc_idle_timeout_ms",
    "grpc_request_timeout_ms",
    "grpc_max_concurrent_streams",
    "grpc_stream_window",
    "grpc_connection_window",
    "grpc_max_frame_size",
    "grpc_max_header_list_size",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "healthcheck_store",
];

/// Ten days: longer than any timeout meant to bound a client.
const MAX_TIMEOUT_MS: u64 = 864_000_000;

/// HTTP/2's largest flow-control window (2^31 - 1).
const MAX_WINDOW: u64 = (1 << 31) - 1;

pub(super) fn server(t: Option<Table<'_>>) -> Result<ServerSettings> {
    let mut s = ServerSettings::default();
    let Some(t) = t else { return Ok(s) };
    t.only(&KEYS, "[server]")?;
    let millis = |key: &str| -> Result<Option<std::time::Duration>> {
        Ok(t.uint(key, 1, MAX_TIMEOUT_MS)?
            .map(std::time::Duration::from_millis))
    };
    if let Some(d) = millis("header_read_timeout_ms")? {
        s.header_read_timeout = d;
    }
    if let Some(d) = millis("idle_timeout_ms")? {
        s.idle_timeout = d;
    }
    if let Some(d) = millis("grpc_idle_timeout_ms")? {
        s.grpc_idle_timeout = d;
    }
    if let Some(d) = millis("grpc_request_timeout_ms")? {
        s.grpc_request_timeout = d;
    }
    if let Some(n) = t.uint("max_connections", 1, 1_000_000)? {
        s.max_connections = n as usize;
    }
    if let Some(n) = t.uint("grpc_max_connections", 1, 1_000_000)? {
        s.grpc_max_connections = n as usize;
    }
    if let Some(n) = t.uint("grpc_max_concurrent_streams", 1, 10_000)? {
        s.grpc_max_concurrent_streams = n as u32;
    }
    if let Some(n) = t.uint("grpc_stream_window", 65_535, MAX_WINDOW)? {
        s.grpc_stream_window = n as u32;
    }
    if let Some(n) = t.uint("grpc_connection_window", 65_535, MAX_WINDOW)? {
        s.grpc_connection_window = n as u32;
    }
    // HTTP/2 (RFC 9113, 6.5.2): from 2^14 to 2^24 - 1.
    if let Some(n) = t.uint("grpc_max_frame_size", 16_384, 16_777_215)? {
        s.grpc_max_frame_size = n as u32;
    }
    if let Some(n) = t.uint("grpc_max_header_list_size", 1024, 1 << 20)? {
        s.grpc_max_header_list_size = n as u32;
    }
    if let Some(b) = t.bool("healthcheck_store")? {
        s.healthcheck_store = b;
    }
    s.tls_cert_file = t.str("tls_cert_file")?.map(Into::into);
    s.tls_key_file = t.str("tls_key_file")?.map(Into::into);
    s.tls_client_ca_file = t.str("tls_client_ca_file")?.map(Into::into);
    match (&s.tls_cert_file, &s.tls_key_file) {
        (Some(_), None) => {
            return Err(t.error_at(
                "tls_cert_file",
                "needs `tls_key_file`, the certificate's private key, beside it",
            ));
        }
        (None, Some(_)) => {
            return Err(t.error_at(
                "tls_key_file",
                "needs `tls_cert_file`, the certificate chain it is the key of, beside it",
            ));
        }
        (None, None) if s.tls_client_ca_file.is_some() => {
            return Err(t.error_at(
                "tls_client_ca_file",
                "asks clients for certificates, which needs TLS: set `tls_cert_file` and `tls_key_file` too",
            ));
        }
        _ => {}
    }
    Ok(s)
}
