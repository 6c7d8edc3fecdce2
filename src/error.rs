//! The library's error type, composed of each layer's own.

use crate::cloud::CloudError;
use crate::engine::EngineError;
use crate::lang::LangError;
use crate::sandbox::SandboxError;
use crate::sandbox::fs::FsError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The library's error: each layer's own, composed. Each message says what went wrong and what
/// to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Lang(#[from] LangError),

    #[error(transparent)]
    Sandbox(#[from] SandboxError),

    #[error(transparent)]
    File(#[from] FsError),

    #[error(transparent)]
    Snapshot(#[from] crate::sandbox::snapshots::SnapshotError),

    #[error("{0}")]
    Webhook(String),

    #[error(transparent)]
    Cloud(#[from] CloudError),

    #[error(transparent)]
    Package(#[from] crate::packages::PackageError),

    #[error("the client cancelled the call{0}")]
    Cancelled(&'static str),
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        Error::Lang(e.into())
    }
}

impl Error {
    pub fn wasm(msg: impl Into<String>) -> Self {
        EngineError::Wasm(msg.into()).into()
    }

    pub fn busy(msg: impl Into<String>) -> Self {
        EngineError::Busy(msg.into()).into()
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        LangError::InvalidArgument(msg.into()).into()
    }

    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        EngineError::io(path, source).into()
    }
}
