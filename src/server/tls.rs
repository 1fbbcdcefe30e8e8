//! TLS on the server's ports (`[server] tls_cert_file`, `tls_key_file`,
//! `tls_client_ca_file`), over rustls with the ring provider.
//!
//! The files are read with the reader of every file a policy names
//! (regular files only, capped, never blocking) and followed: every
//! [`TLS_POLL`] each is looked at (one `stat`, symlinks followed, so a
//! Kubernetes `..data` swap is seen), and when one changed the three are
//! read again and new connections get the new certificate. A pair that
//! does not load is logged (naming the file) and the one in use kept;
//! connections already open keep the certificate they started with.
//!
//! The HTTP port offers ALPN `h2` and `http/1.1`, the gRPC port `h2`. A
//! client that sends no ClientHello holds its connection no longer than
//! the header read timeout (the handshake runs inside it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

use crate::policy::{ConfigError, FileKind, Fingerprint, ServerSettings, read_named_file};

/// How often the certificate, key and client CA files are looked at.
pub const TLS_POLL: Duration = Duration::from_secs(1);

/// Which port a connection arrived on: what it may negotiate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Port {
    /// HTTP/2 or HTTP/1.1.
    Http,
    /// HTTP/2 only.
    Grpc,
}

/// The files TLS is served from.
#[derive(Clone, Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

impl Files {
    /// The files `settings` names; `None` without TLS; an error when a
    /// certificate comes without its key (or the reverse), or a client CA
    /// without either.
    fn of(settings: &ServerSettings) -> Result<Option<Files>, ConfigError> {
        match (&settings.tls_cert_file, &settings.tls_key_file) {
            (Some(cert), Some(key)) => Ok(Some(Files {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: settings.tls_client_ca_file.clone(),
            })),
            (Some(_), None) => Err(invalid(
                None,
                "server.tls_cert_file",
                "needs `tls_key_file` (--tls-key, RATEWATCH_TLS_KEY), the certificate's private key, beside it",
            )),
            (None, Some(_)) => Err(invalid(
                None,
                "server.tls_key_file",
                "needs `tls_cert_file` (--tls-cert, RATEWATCH_TLS_CERT), the certificate chain it is the key of, beside it",
            )),
            (None, None) if settings.tls_client_ca_file.is_some() => Err(invalid(
                None,
                "server.tls_client_ca_file",
                "asks clients for certificates, which needs TLS: set `tls_cert_file` and `tls_key_file` too",
            )),
            (None, None) => Ok(None),
        }
    }

    /// What each file is now (`None`: cannot be looked at).
    fn fingerprints(&self) -> [Option<Fingerprint>; 3] {
        let stat = |p: &Path| Fingerprint::stat(p).ok();
        [
            stat(&self.cert),
            stat(&self.key),
            self.client_ca.as_deref().and_then(stat),
        ]
    }
}

fn invalid(file: Option<&Path>, field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        file: file.map(|f| f.display().to_string()),
        line: None,
        field: field.into(),
        message: message.into(),
    }
}

/// Reads `path` as every named file is read; errors name it and `field`.
fn read(path: &Path, field: &str) -> Result<Vec<u8>, ConfigError> {
    read_named_file(path, FileKind::TLS)
        .map(|f| f.bytes)
        .map_err(|e| match e.error {
            ConfigError::Invalid { file, message, .. } => ConfigError::Invalid {
                file,
                line: None,
                field: field.into(),
                message,
            },
            ConfigError::Io { source, .. } => {
                invalid(Some(path), field, format!("cannot be read: {source}"))
            }
        })
}

fn certificates(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = read(path, field)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            invalid(
                Some(path),
                field,
                format!("is not a PEM certificate file: {e}"),
            )
        })?;
    if certs.is_empty() {
        return Err(invalid(
            Some(path),
            field,
            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
        ));
    }
    Ok(certs)
}

/// The configurations of the two ports, built from the files.
struct Configs {
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks the files, and builds both ports' configurations.
fn load(files: &Files) -> Result<Configs, ConfigError> {
    let (cert_field, key_field, ca_field) = (
        "server.tls_cert_file",
        "server.tls_key_file",
        "server.tls_client_ca_file",
    );
    let chain = certificates(&files.cert, cert_field)?;
    let key_bytes = read(&files.key, key_field)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        invalid(
            Some(&files.key),
            key_field,
            format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(None, cert_field, format!("cannot set up TLS: {e}")))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path, ca_field)? {
                roots.add(cert).map_err(|e| {
                    invalid(
                        Some(path),
                        ca_field,
                        format!("holds an unusable CA certificate: {e}"),
                    )
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| {
                    invalid(Some(path), ca_field, format!("cannot verify clients: {e}"))
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut http = builder.with_single_cert(chain, key).map_err(|e| {
        invalid(
            Some(&files.key),
            key_field,
            format!(
                "is not a usable key for the certificate in {}: {e}",
                files.cert.display()
            ),
        )
    })?;
    let mut grpc = http.clone();
    http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    grpc.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Configs {
        http: Arc::new(http),
        grpc: Arc::new(grpc),
    })
}

/// Checks the TLS files of `settings` as `ratewatch serve` loads them: a
/// certificate and its key both named or neither, each file readable
/// (regular, capped, never waited on), PEM, and the key the
/// certificate's. Errors name the file and the `[server]` key.
/// `ratewatch check-config` calls it.
pub fn check_tls(settings: &ServerSettings) -> Result<(), ConfigError> {
    match Files::of(settings)? {
        Some(files) => load(&files).map(drop),
        None => Ok(()),
    }
}

/// TLS as served now: the configurations new connections get, and the
/// version of the files they came from.
pub(super) struct LiveTls {
    files: Files,
    http: ArcSwap<ServerConfig>,
    grpc: ArcSwap<ServerConfig>,
    seen: Mutex<[Option<Fingerprint>; 3]>,
}

impl LiveTls {
    /// Loads what `settings` names; `None` without TLS.
    pub(super) fn load(settings: &ServerSettings) -> Result<Option<Arc<LiveTls>>, ConfigError> {
        let Some(files) = Files::of(settings)? else {
            return Ok(None);
        };
        let seen = files.fingerprints();
        let configs = load(&files)?;
        Ok(Some(Arc::new(LiveTls {
            files,
            http: ArcSwap::new(configs.http),
            grpc: ArcSwap::new(configs.grpc),
            seen: Mutex::new(seen),
        })))
    }

    /// The TLS handshake of a new connection on `port`.
    pub(super) async fn accept(
        &self,
        port: Port,
        stream: TcpStream,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let config = match port {
            Port::Http => self.http.load_full(),
            Port::Grpc => self.grpc.load_full(),
        };
        tokio_rustls::TlsAcceptor::from(config).accept(stream).await
    }

    /// Loads the files again if one changed since last looked at; a pair
    /// that does not load is logged and the one in use kept (and tried
    /// again only once a file changes again).
    fn refresh(&self) {
        let now = self.files.fingerprints();
        {
            let mut seen = self.seen.lock();
            if *seen == now {
                return;
            }
            *seen = now;
        }
        match load(&self.files) {
            Ok(c) => {
                self.http.store(c.http);
                self.grpc.store(c.grpc);
                tracing::info!(
                    cert = %self.files.cert.display(),
                    "TLS certificate reloaded: new connections get it"
                );
            }
            Err(e) => tracing::error!(
                error = %e,
                "TLS files changed but do not load; new connections keep the certificate in use"
            ),
        }
    }

    /// Follows the files every [`TLS_POLL`] until `stop`.
    pub(super) async fn follow(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut every = tokio::time::interval(TLS_POLL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = super::listener::stopped(&mut stop) => return,
                _ = every.tick() => {}
            }
            // Reading is blocking (bounded); off the runtime's threads.
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.refresh()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_certificate_key_or_client_ca_is_an_error_naming_it() {
        let with = |cert: bool, key: bool, ca: bool| ServerSettings {
            tls_cert_file: cert.then(|| "c.pem".into()),
            tls_key_file: key.then(|| "k.pem".into()),
            tls_client_ca_file: ca.then(|| "ca.pem".into()),
            ..ServerSettings::default()
        };
        for (s, field) in [
            (with(true, false, false), "server.tls_cert_file"),
            (with(false, true, true), "server.tls_key_file"),
            (with(false, false, true), "server.tls_client_ca_file"),
        ] {
            let e = Files::of(&s).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
        }
        assert!(Files::of(&with(false, false, false)).unwrap().is_none());
        assert!(Files::of(&with(true, true, true)).unwrap().is_some());
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let s = ServerSettings {
            tls_cert_file: Some("/nonexistent/ratewatch-cert.pem".into()),
            tls_key_file: Some("/nonexistent/ratewatch-key.pem".into()),
            ..ServerSettings::default()
        };
        let e = check_tls(&s).unwrap_err().to_string();
        assert!(e.contains("ratewatch-cert.pem"), "{e}");
    }
}
