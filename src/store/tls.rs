//! Redis clients for `redis://` and `rediss://` URLs.
//!
//! With the cargo feature `tls`, `rediss://` connects over rustls (ring
//! provider). It trusts the system's roots, or only the CAs of
//! `[store] tls_ca_file` when set, and presents `tls_cert_file` /
//! `tls_key_file` to servers that require client certificates. Without the
//! feature a `rediss://` URL is refused with a message naming the feature
//! (the config reader refuses it first, on its line).

use redis::{ConnectionInfo, IntoConnectionInfo};

use super::StoreError;
use crate::policy::TlsFiles;

/// Whether `info` asks for TLS.
pub(crate) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

/// A client for `info`, with the TLS files applied when it is a TLS address.
pub(crate) fn client(
    info: impl IntoConnectionInfo,
    files: &TlsFiles,
) -> Result<redis::Client, StoreError> {
    let info = info
        .into_connection_info()
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL: {e}")))?;
    if !is_tls(&info) {
        return redis::Client::open(info)
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL: {e}")));
    }
    #[cfg(feature = "tls")]
    {
        install_provider();
        match certificates(files)? {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        }
        .map_err(|e| StoreError::Unavailable(format!("invalid TLS settings: {e}")))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = files;
        Err(no_tls())
    }
}

/// [`client`] for code that speaks `RedisError` (the telemetry sink).
pub(crate) fn redis_client(url: &str, files: &TlsFiles) -> redis::RedisResult<redis::Client> {
    client(url, files).map_err(|e| config_error(&e))
}

/// A cluster client builder that trusts (and presents) what `files` name.
pub(crate) fn cluster_builder(
    nodes: Vec<String>,
    files: &TlsFiles,
) -> redis::RedisResult<redis::cluster::ClusterClientBuilder> {
    let builder = redis::cluster::ClusterClient::builder(nodes);
    #[cfg(feature = "tls")]
    {
        install_provider();
        match certificates(files).map_err(|e| config_error(&e))? {
            Some(certs) => Ok(builder.certs(certs)),
            None => Ok(builder),
        }
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = files;
        Ok(builder)
    }
}

fn config_error(e: &StoreError) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "cannot set up the Redis client",
        e.to_string(),
    ))
}

/// The error of a `rediss://` URL in a build without TLS.
#[cfg(not(feature = "tls"))]
pub(crate) fn no_tls() -> StoreError {
    StoreError::Unavailable(
        "rediss:// (TLS) needs ratewatch built with the cargo feature `tls`".into(),
    )
}

/// The certificates of `files`, read now; `None` when no file is set (the
/// system's roots are trusted).
#[cfg(feature = "tls")]
pub(crate) fn certificates(files: &TlsFiles) -> Result<Option<redis::TlsCertificates>, StoreError> {
    if !files.is_set() {
        return Ok(None);
    }
    // Read like the policy file: a FIFO or a device named here must not
    // hang the start, nor a huge file exhaust memory.
    let read = |path: &std::path::Path, what: &str| {
        crate::policy::read_named_file(path, crate::policy::FileKind::TLS)
            .map(|f| f.bytes)
            .map_err(|e| StoreError::Unavailable(format!("cannot read {what}: {}", e.error)))
    };
    let root_cert = files
        .ca_file
        .as_deref()
        .map(|p| read(p, "tls_ca_file"))
        .transpose()?;
    let client_tls = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "tls_cert_file")?,
            client_key: read(key, "tls_key_file")?,
        }),
        _ => None,
    };
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// Makes ring rustls's process-wide provider unless one is installed, so
/// a dependency enabling a second provider cannot make rustls refuse to
/// choose.
#[cfg(feature = "tls")]
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
