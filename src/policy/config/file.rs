//! Reading a policy file safely: only a regular file (symlinks followed,
//! as mounted config maps use them), at most [`MAX_POLICY_FILE_BYTES`],
//! never blocking on a FIFO or a device, and only if the file held still
//! while it was read.
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

/// The largest policy file read: 1 MiB. A policy is a few kilobytes; a
/// larger file is refused (and a reload keeps the policy in force).
pub const MAX_POLICY_FILE_BYTES: u64 = 1024 * 1024;

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

/// Why a policy file was not read.
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

/// Reads `path` whole, or says why not (naming the file). Blocking, but
/// bounded: never waits on a FIFO or device, reads at most
/// [`MAX_POLICY_FILE_BYTES`] + 1 bytes. A file that changed while it was
/// read (another length or time after than before, or fewer bytes than
/// its length) is refused: it was being written.
pub(crate) fn read_policy_file(path: &Path) -> Result<PolicyFile, ReadError> {
    let file = path.display().to_string();
    let io = |source: std::io::Error| ConfigError::Io {
        file: file.clone(),
        source,
    };
    let invalid = |message: String| ConfigError::Invalid {
        file: Some(file.clone()),
        line: None,
        field: String::new(),
        message,
    };
    let before = Fingerprint::stat(path).map_err(io)?;
    check_kind(&before).map_err(invalid)?;
    let opened = open_nonblocking(path).map_err(io)?;
    let at_open = Fingerprint::of(&opened.metadata().map_err(io)?);
    // The path may have been swapped between the look and the open.
    check_kind(&at_open).map_err(invalid)?;
    let mut bytes = Vec::with_capacity(at_open.len.min(MAX_POLICY_FILE_BYTES) as usize + 1);
    (&opened)
        .take(MAX_POLICY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_POLICY_FILE_BYTES {
        return Err(invalid(too_large()).into());
    }
    let after = Fingerprint::of(&opened.metadata().map_err(io)?);
    if after != at_open || bytes.len() as u64 != after.len {
        return Err(ReadError {
            changed: true,
            error: invalid(format!(
                "changed while it was read ({} bytes read, {} bytes long now): it is being \
             written; write the policy to a temporary file and rename it over this one",
                bytes.len(),
                after.len
            )),
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        invalid(format!(
            "is not UTF-8 text (at byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    Ok(PolicyFile {
        text,
        fingerprint: after,
    })
}

/// Refuses anything but a regular file of at most the cap.
fn check_kind(f: &Fingerprint) -> Result<(), String> {
    if !f.regular {
        return Err(
            "is not a regular file (a FIFO, a device, a socket or a directory); \
                    a policy must be a regular file or a symlink to one"
                .into(),
        );
    }
    if f.len > MAX_POLICY_FILE_BYTES {
        return Err(too_large());
    }
    Ok(())
}

fn too_large() -> String {
    format!("is larger than {MAX_POLICY_FILE_BYTES} bytes, the most a policy file may hold")
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
