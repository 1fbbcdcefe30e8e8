//! Redis clients for `redis://` and `rediss://` URLs, made alike for the
//! stores and for the fleet view's sink.
//!
//! With the cargo feature `tls`, `rediss://` connects over rustls (ring
//! provider). It trusts the system's roots, or only the CAs of
//! `[store] tls_ca_file` when set, and presents `tls_cert_file` /
//! `tls_key_file` to servers that require client certificates. Without the
//! feature a `rediss://` URL is refused with a message naming the feature
//! (the config reader refuses it first, on its line).

use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::policy::TlsFiles;

/// Why no client could be made: an invalid URL, a TLS file that cannot be
/// read, or `rediss://` in a build without the feature `tls`.
#[derive(Debug, Clone)]
pub(crate) struct ClientError(pub(crate) String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ClientError> for redis::RedisError {
    fn from(e: ClientError) -> Self {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "cannot set up the Redis client",
            e.0,
        ))
    }
}

/// Whether `info` asks for TLS.
pub(crate) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

/// A client for `info`, with the TLS files applied when it is a TLS address.
pub(crate) fn client(
    info: impl IntoConnectionInfo,
    files: &TlsFiles,
) -> Result<redis::Client, ClientError> {
    let info = info
        .into_connection_info()
        .map_err(|e| ClientError(format!("invalid Redis URL: {e}")))?;
    if !is_tls(&info) {
        return redis::Client::open(info)
            .map_err(|e| ClientError(format!("invalid Redis URL: {e}")));
    }
    #[cfg(feature = "tls")]
    {
        install_provider();
        match certificates(files)? {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        }
        .map_err(|e| ClientError(format!("invalid TLS settings: {e}")))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = files;
        Err(no_tls())
    }
}

/// A cluster client builder for `nodes` that trusts (and presents) what
/// `files` name.
pub(crate) fn cluster_builder(
    nodes: Vec<String>,
    files: &TlsFiles,
) -> Result<redis::cluster::ClusterClientBuilder, ClientError> {
    #[cfg(feature = "tls")]
    {
        let builder = redis::cluster::ClusterClient::builder(nodes);
        install_provider();
        Ok(match certificates(files)? {
            Some(certs) => builder.certs(certs),
            None => builder,
        })
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = files;
        if nodes.iter().any(|n| n.starts_with("rediss://")) {
            return Err(no_tls());
        }
        Ok(redis::cluster::ClusterClient::builder(nodes))
    }
}

/// The error of a `rediss://` URL in a build without TLS.
#[cfg(not(feature = "tls"))]
fn no_tls() -> ClientError {
    ClientError("rediss:// (TLS) needs ratewatch built with the cargo feature `tls`".into())
}

/// The certificates of `files`, read now; `None` when no file is set (the
/// system's roots are trusted).
#[cfg(feature = "tls")]
fn certificates(files: &TlsFiles) -> Result<Option<redis::TlsCertificates>, ClientError> {
    if !files.is_set() {
        return Ok(None);
    }
    // Read like the policy file: a FIFO or a device named here must not
    // hang the start, nor a huge file exhaust memory.
    let read = |path: &std::path::Path, what: &str| {
        crate::policy::read_named_file(path, crate::policy::FileKind::TLS)
            .map(|f| f.bytes)
            .map_err(|e| ClientError(format!("cannot read {what}: {}", e.error)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_url_names_itself_to_the_store_and_to_the_sink() {
        let e = client("redis://[::1", &TlsFiles::default()).unwrap_err();
        assert!(e.0.starts_with("invalid Redis URL: "), "{e}");
        let store = crate::store::StoreError::from(e.clone());
        assert_eq!(store.to_string(), format!("store unreachable: {e}"));
        let sink = redis::RedisError::from(e.clone());
        assert_eq!(sink.kind(), redis::ErrorKind::InvalidClientConfig);
        assert!(sink.to_string().contains(&e.0), "{sink}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_tls_file_that_cannot_be_read_is_named_for_a_node_and_a_cluster() {
        let files = TlsFiles {
            ca_file: Some("/nonexistent/ratewatch-ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = client("rediss://127.0.0.1:6380", &files).unwrap_err();
        assert!(e.0.starts_with("cannot read tls_ca_file: "), "{e}");
        let e = cluster_builder(vec!["rediss://127.0.0.1:7000".into()], &files).unwrap_err();
        assert!(e.0.starts_with("cannot read tls_ca_file: "), "{e}");
        // A plain URL reads no file.
        assert!(client("redis://127.0.0.1:6379", &files).is_ok());
    }
}
