//! The engine layer's errors: compiling, instantiating and running wasm, and host resources.

use std::path::{Path, PathBuf};

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("wasm engine error: {0}")]
    Wasm(String),

    #[error("the server is busy: {0}")]
    Busy(String),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl EngineError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        EngineError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
