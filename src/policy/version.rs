//! A policy's version: the name its file gives and a hash of its content,
//! shown in metrics, the fleet view and reload reports.

use sha2::{Digest, Sha256};

use super::Policy;

/// A policy's identity: the optional `version` the file names and a hash
/// of its content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyVersion {
    /// The top-level `version = "..."` of the file, or empty.
    pub version: String,
    /// 12 hex digits of the SHA-256 of the policy as applied (comments and
    /// layout do not change it; the dashboard token is left out).
    pub hash: String,
}

impl PolicyVersion {
    /// The version of `policy`.
    pub fn of(policy: &Policy) -> Self {
        let mut canonical = policy.clone();
        // A metric label must not help anyone guess the dashboard token.
        canonical.dashboard.token = canonical.dashboard.token.map(|_| String::new());
        canonical.version = None;
        let digest = Sha256::digest(format!("{canonical:?}").as_bytes());
        let hash = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        Self {
            version: policy.version.clone().unwrap_or_default(),
            hash,
        }
    }
}

impl std::fmt::Display for PolicyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.version.is_empty() {
            write!(f, "#{}", self.hash)
        } else {
            write!(f, "{} (#{})", self.version, self.hash)
        }
    }
}
