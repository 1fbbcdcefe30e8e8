//! The crate's top-level error.

use crate::policy::ConfigError;
use crate::store::StoreError;

/// Why a limiter could not be built or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The policy is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An I/O error (binding a socket, ...).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
