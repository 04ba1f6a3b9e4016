//! Errors of writing and opening an install; every one names the file at fault.

use std::path::PathBuf;

use crate::error::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// A file the manifest lists is not there.
    #[error("{path}: missing (manifest.json lists it): the install is incomplete; convert again")]
    Missing { path: PathBuf },

    /// A file's size differs from the manifest (truncated or appended to).
    #[error("{path}: {actual} bytes but manifest.json says {expected}: the file is truncated or altered; convert again")]
    Size {
        path: PathBuf,
        actual: u64,
        expected: u64,
    },

    /// A file's SHA-256 differs from the manifest.
    #[error("{path}: SHA-256 {actual} differs from manifest.json's {expected}: the file is altered or corrupt; convert again")]
    Checksum {
        path: PathBuf,
        actual: String,
        expected: String,
    },

    /// The manifest itself is malformed or of another format version.
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },

    /// The destination of a convert already exists.
    #[error("{path}: already exists; choose a new directory (a convert never overwrites)")]
    Exists { path: PathBuf },

    /// Another convert is writing the same destination.
    #[error("{path}: another convert into this destination is running (it holds {lock}); wait for it, or choose another directory")]
    Locked { path: PathBuf, lock: PathBuf },

    /// The convert was cancelled before it finished; nothing was left behind.
    #[error("{path}: convert cancelled; nothing was written")]
    Cancelled { path: PathBuf },

    #[error(transparent)]
    Model(#[from] ModelError),
}

impl InstallError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> InstallError {
        let path = path.into();
        move |error| InstallError::Io { path, error }
    }
}

/// Install errors reach the engine as model errors (the engine's error wraps `ModelError`):
/// the message, which names the file, is kept whole.
impl From<InstallError> for ModelError {
    fn from(e: InstallError) -> Self {
        match e {
            InstallError::Model(m) => m,
            InstallError::Io { path, error } => ModelError::Io { path, error },
            other => {
                let message = other.to_string();
                let path = match other {
                    InstallError::Missing { path }
                    | InstallError::Size { path, .. }
                    | InstallError::Checksum { path, .. }
                    | InstallError::Manifest { path, .. }
                    | InstallError::Exists { path }
                    | InstallError::Locked { path, .. }
                    | InstallError::Cancelled { path } => path,
                    InstallError::Io { .. } | InstallError::Model(_) => {
                        unreachable!("handled above")
                    }
                };
                let prefix = format!("{}: ", path.display());
                let message = message.strip_prefix(&prefix).unwrap_or(&message).to_owned();
                ModelError::Index { path, message }
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, InstallError>;
