//! The library's typed errors. Each message says what went wrong and what to do about it.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Invalid language '{0}'. Language must be one of: python, javascript, bash, go")]
    UnknownLanguage(String),

    #[error("{0}")]
    LanguageNotAvailable(String),

    #[error("{0}")]
    InvalidArgument(String),

    #[error(
        "the {runtime} runtime is missing: {path} does not exist. Run ./fetch-runtimes.sh in the \
         wasmbox checkout (or point WASMBOX_RUNTIMES at a runtimes directory)"
    )]
    RuntimeMissing {
        runtime: &'static str,
        path: PathBuf,
    },

    #[error("the server is busy: {0}")]
    Busy(String),

    #[error("the client cancelled the call{0}")]
    Cancelled(&'static str),

    #[error("wasm engine error: {0}")]
    Engine(String),

    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),

    #[error(transparent)]
    File(#[from] crate::sandbox::fs::FsError),

    #[error("{0}")]
    Webhook(String),

    #[error(transparent)]
    Cloud(#[from] crate::cloud::CloudError),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
