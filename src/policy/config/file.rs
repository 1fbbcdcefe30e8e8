//! Reading every file a policy names safely: the policy itself, its
//! envoyproxy/ratelimit YAML files, TLS certificates and secrets. Only a
//! regular file (symlinks followed, as mounted config maps and secrets use
//! them), at most a cap that depends on what the file is
//! ([`FileKind`]), never blocking on a FIFO or a device, and only if the
//! file held still while it was read.
//!
//! The path is looked at (`stat`) before it is opened, so a FIFO, a socket
//! or `/dev/zero` is refused without an `open(2)` that could wait for a
//! writer forever. The open itself is non-blocking (a FIFO swapped in
//! between the look and the open then fails instead of waiting), and the
//! opened file is looked at again. Reading stops one byte past the cap,
//! so memory stays bounded whatever the path holds.

use std::io::Read;
use std::path::Path;
use std::time::SystemTime;

use super::ConfigError;
use crate::policy::{HashSecret, Policy};

/// The largest policy file read: 1 MiB. A policy is a few kilobytes; a
/// larger file is refused (and a reload keeps the policy in force).
pub const MAX_POLICY_FILE_BYTES: u64 = 1024 * 1024;

/// The largest envoyproxy/ratelimit YAML file read: 16 MiB, room for tens
/// of thousands of descriptors.
pub const MAX_RULE_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The largest TLS certificate or key file read: 1 MiB (a CA bundle of
/// every public root is about 200 KiB).
pub(crate) const MAX_TLS_FILE_BYTES: u64 = 1024 * 1024;

/// The largest secret file read: a secret is a line.
pub(crate) const MAX_SECRET_FILE_BYTES: u64 = 4096;

/// What a file is to the policy: how it is named in messages and how
/// large it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileKind {
    /// "a policy", "an envoyproxy/ratelimit YAML file", ...
    pub(crate) what: &'static str,
    /// The most bytes it may hold.
    pub(crate) cap: u64,
}

impl FileKind {
    /// The TOML policy.
    pub(crate) const POLICY: FileKind = FileKind {
        what: "a policy file",
        cap: MAX_POLICY_FILE_BYTES,
    };
    /// An envoyproxy/ratelimit YAML file.
    pub(crate) const RULES: FileKind = FileKind {
        what: "an envoyproxy/ratelimit YAML file",
        cap: MAX_RULE_FILE_BYTES,
    };
    /// A PEM certificate or key.
    pub(crate) const TLS: FileKind = FileKind {
        what: "a TLS certificate or key file",
        cap: MAX_TLS_FILE_BYTES,
    };
    /// A secret (`hash_secret_file`).
    pub(crate) const SECRET: FileKind = FileKind {
        what: "a secret file",
        cap: MAX_SECRET_FILE_BYTES,
    };
}

/// What identifies one version of a file without reading it: the file
/// (device and inode where the platform has them), its length and its
/// modification time. A rename over the file or a symlink swap changes the
/// inode; an edit in place changes the length or the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    dev: u64,
    ino: u64,
    pub(crate) len: u64,
    pub(crate) modified: Option<SystemTime>,
    pub(crate) regular: bool,
}

impl Fingerprint {
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let (dev, ino) = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        #[cfg(not(unix))]
        let (dev, ino) = (0, 0);
        Self {
            dev,
            ino,
            len: meta.len(),
            modified: meta.modified().ok(),
            regular: meta.is_file(),
        }
    }

    /// The fingerprint of a policy held in memory (it never changes).
    pub(crate) fn inline(len: usize) -> Self {
        Self {
            dev: 0,
            ino: 0,
            len: len as u64,
            modified: None,
            regular: true,
        }
    }

    /// The fingerprint of what `path` names now (symlinks followed), with
    /// one `stat`: cheap enough to poll.
    pub(crate) fn stat(path: &Path) -> std::io::Result<Self> {
        std::fs::metadata(path).map(|m| Self::of(&m))
    }
}

/// A policy file's text and the version of the file it came from.
#[derive(Debug, Clone)]
pub(crate) struct PolicyFile {
    pub(crate) text: String,
    pub(crate) fingerprint: Fingerprint,
}

/// A named file's bytes and the version of the file they came from.
#[derive(Debug, Clone)]
pub(crate) struct NamedFile {
    pub(crate) bytes: Vec<u8>,
    pub(crate) fingerprint: Fingerprint,
}

/// Why a file was not read.
#[derive(Debug)]
pub(crate) struct ReadError {
    /// What to report (names the file).
    pub(crate) error: ConfigError,
    /// The file changed while it was read: it is being written, and a
    /// later read may succeed.
    pub(crate) changed: bool,
}

impl From<ConfigError> for ReadError {
    fn from(error: ConfigError) -> Self {
        Self {
            error,
            changed: false,
        }
    }
}

/// Reads the policy file `path` whole as text, or says why not (naming
/// the file): [`read_named_file`] with [`FileKind::POLICY`].
pub(crate) fn read_policy_file(path: &Path) -> Result<PolicyFile, ReadError> {
    let (text, fingerprint) = read_text_file(path, FileKind::POLICY)?;
    Ok(PolicyFile { text, fingerprint })
}

/// [`read_named_file`], as UTF-8 text.
pub(crate) fn read_text_file(
    path: &Path,
    kind: FileKind,
) -> Result<(String, Fingerprint), ReadError> {
    let read = read_named_file(path, kind)?;
    let text = String::from_utf8(read.bytes).map_err(|e| {
        invalid(
            path,
            format!(
                "is not UTF-8 text (at byte {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    Ok((text, read.fingerprint))
}

/// Reads `path` whole, or says why not (naming the file): the one way
/// every file a policy names is read. Blocking, but bounded: never waits
/// on a FIFO or device, reads at most `kind.cap` + 1 bytes. A file that
/// changed while it was read (another length or time after than before,
/// or fewer bytes than its length) is refused: it was being written.
pub(crate) fn read_named_file(path: &Path, kind: FileKind) -> Result<NamedFile, ReadError> {
    let file = path.display().to_string();
    let io = |source: std::io::Error| ConfigError::Io {
        file: file.clone(),
        source,
    };
    let before = Fingerprint::stat(path).map_err(io)?;
    check_kind(&before, kind).map_err(|m| invalid(path, m))?;
    let opened = open_nonblocking(path).map_err(io)?;
    let at_open = Fingerprint::of(&opened.metadata().map_err(io)?);
    // The path may have been swapped between the look and the open.
    check_kind(&at_open, kind).map_err(|m| invalid(path, m))?;
    let mut bytes = Vec::with_capacity(at_open.len.min(kind.cap) as usize + 1);
    (&opened)
        .take(kind.cap + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > kind.cap {
        return Err(invalid(path, too_large(kind)).into());
    }
    let after = Fingerprint::of(&opened.metadata().map_err(io)?);
    if after != at_open || bytes.len() as u64 != after.len {
        return Err(ReadError {
            changed: true,
            error: invalid(
                path,
                format!(
                    "changed while it was read ({} bytes read, {} bytes long now): it is being \
                     written; write the file elsewhere and rename it over this one",
                    bytes.len(),
                    after.len
                ),
            ),
        });
    }
    Ok(NamedFile {
        bytes,
        fingerprint: after,
    })
}

fn invalid(path: &Path, message: String) -> ConfigError {
    ConfigError::Invalid {
        file: Some(path.display().to_string()),
        line: None,
        field: String::new(),
        message,
    }
}

/// Refuses anything but a regular file of at most the cap.
fn check_kind(f: &Fingerprint, kind: FileKind) -> Result<(), String> {
    if !f.regular {
        return Err(format!(
            "is not a regular file (a FIFO, a device, a socket or a directory); \
             {} must be a regular file or a symlink to one",
            kind.what
        ));
    }
    if f.len > kind.cap {
        return Err(too_large(kind));
    }
    Ok(())
}

fn too_large(kind: FileKind) -> String {
    format!(
        "is larger than {} bytes, the most {} may hold",
        kind.cap, kind.what
    )
}

/// Reads a secret file (`[identity] hash_secret_file`): its text,
/// trimmed, must be a secret of at least [`HashSecret::MIN_LEN`] bytes.
/// Errors name the file and `field`.
pub(crate) fn read_secret_file(path: &Path, field: &str) -> Result<HashSecret, ConfigError> {
    let named = |message: String| ConfigError::Invalid {
        file: Some(path.display().to_string()),
        line: None,
        field: field.into(),
        message,
    };
    let read = read_named_file(path, FileKind::SECRET).map_err(|e| match e.error {
        ConfigError::Invalid { message, .. } => named(message),
        ConfigError::Io { source, .. } => named(format!("cannot be read: {source}")),
    })?;
    let text = String::from_utf8(read.bytes)
        .map_err(|_| named("is not UTF-8 text; it should hold the secret alone".into()))?;
    HashSecret::new(&text).ok_or_else(|| {
        named(format!(
            "must hold a secret of at least {} bytes; generate one with `openssl rand -hex 32`",
            HashSecret::MIN_LEN
        ))
    })
}

impl Policy {
    /// Reads every file the policy names besides itself and its YAML
    /// files (which loading read already): `[identity] hash_secret_file`
    /// and the `[store]` TLS files, with the reader and the checks the
    /// server starts with. `ratewatch check-config` calls it, so a file
    /// the server would refuse (or wait on) is refused there too.
    ///
    /// Blocking, but bounded: no file is waited on, none is read past its
    /// cap.
    pub fn check_named_files(&self) -> Result<(), ConfigError> {
        if self.identity.hash_secret.is_none() {
            if let Some(path) = &self.identity.hash_secret_file {
                read_secret_file(path, "identity.hash_secret_file")?;
            }
        }
        let tls = &self.store.tls;
        for (path, field) in [
            (&tls.ca_file, "store.tls_ca_file"),
            (&tls.cert_file, "store.tls_cert_file"),
            (&tls.key_file, "store.tls_key_file"),
        ] {
            let Some(path) = path else { continue };
            read_named_file(path, FileKind::TLS).map_err(|e| match e.error {
                ConfigError::Invalid { file, message, .. } => ConfigError::Invalid {
                    file,
                    line: None,
                    field: field.into(),
                    message,
                },
                ConfigError::Io { source, .. } => ConfigError::Invalid {
                    file: Some(path.display().to_string()),
                    line: None,
                    field: field.into(),
                    message: format!("cannot be read: {source}"),
                },
            })?;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO with no writer returns at once instead of
    // waiting; on a regular file it changes nothing.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_whole_with_its_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, "version = \"1\"\n").unwrap();
        let read = read_policy_file(&path).unwrap();
        assert_eq!(read.text, "version = \"1\"\n");
        assert_eq!(read.fingerprint, Fingerprint::stat(&path).unwrap());
    }

    #[test]
    fn a_directory_and_an_oversized_file_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_policy_file(dir.path()).unwrap_err().error.to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_POLICY_FILE_BYTES as usize + 1]).unwrap();
        let err = read_policy_file(&big).unwrap_err().error.to_string();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
        assert!(err.contains("big.toml"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn dev_zero_is_refused_without_reading() {
        let err = read_policy_file(Path::new("/dev/zero"))
            .unwrap_err()
            .error
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
