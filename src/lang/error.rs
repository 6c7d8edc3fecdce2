//! The language layer's errors: what a caller asked for that a runtime cannot do, over the
//! engine's own.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

    /// Worded when shown: a setup running in this process (a `serve` that sets itself up)
    /// changes what the user should do.
    #[error(
        "the {runtime} runtime is missing: {path} does not exist. {}",
        missing_hint()
    )]
    RuntimeMissing {
        runtime: &'static str,
        path: PathBuf,
    },

    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// How a setup running in this process says how far it got (see [`set_setup_note`]).
static SETUP_NOTE: OnceLock<fn() -> Option<String>> = OnceLock::new();

/// Handed over by a setup when it starts in this process: its note (how far it got, or why it
/// failed; `None` when none runs) words a missing runtime's error instead of the plain hint.
pub fn set_setup_note(note: fn() -> Option<String>) {
    let _ = SETUP_NOTE.set(note);
}

fn missing_hint() -> String {
    SETUP_NOTE.get().and_then(|note| note()).unwrap_or_else(|| {
        "Run `wasmbox setup` (or ./fetch-runtimes.sh in a checkout), or point WASMBOX_RUNTIMES \
         at a runtimes directory"
            .into()
    })
}

impl LangError {
    pub fn wasm(msg: impl Into<String>) -> Self {
        EngineError::Wasm(msg.into()).into()
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        EngineError::io(path, source).into()
    }
}
