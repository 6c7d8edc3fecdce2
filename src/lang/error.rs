//! The language layer's errors: what a caller asked for that a runtime cannot do, over the
//! engine's own.

use std::path::{Path, PathBuf};

use crate::engine::EngineError;

pub type Result<T, E = LangError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum LangError {
    #[error("Invalid language '{0}'. Language must be one of: python, javascript, bash, go")]
    UnknownLanguage(String),

    #[error("{0}")]
    LanguageNotAvailable(String),

    #[error("{0}")]
    InvalidArgument(String),

    #[error(
        "the {runtime} runtime is missing: {path} does not exist. Run `wasmbox setup` (or \
         ./fetch-runtimes.sh in a checkout), or point WASMBOX_RUNTIMES at a runtimes directory"
    )]
    RuntimeMissing {
        runtime: &'static str,
        path: PathBuf,
    },

    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl LangError {
    pub fn wasm(msg: impl Into<String>) -> Self {
        EngineError::Wasm(msg.into()).into()
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        EngineError::io(path, source).into()
    }
}
