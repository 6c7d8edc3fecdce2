//! Why an install failed, worded for the caller: each names what to do instead.

use super::resolver::MAX_RESOLVED;
use super::{HOPX_ROUTE, PYTHON_BUNDLED};

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(
        "{0:?} is not a package requirement (PEP 508, e.g. 'name', 'name==1.2', 'name>=1'): {1}"
    )]
    BadRequirement(String, String),
    #[error("package {name:?} not found {where_}; check the name (PyPI's spelling){offline}")]
    NotFound {
        name: String,
        where_: String,
        offline: &'static str,
    },
    #[error("no version of {name} matches {spec} (found: {found})")]
    NoMatch {
        name: String,
        spec: String,
        found: String,
    },
    #[error(
        "{name} has no pure-Python wheel (py3-none-any){which}: it needs compiled code, which wasmbox's Python on WebAssembly cannot load, so it was not installed. Bundled (compiled for WebAssembly) besides the standard library: {PYTHON_BUNDLED}. {HOPX_ROUTE}"
    )]
    Compiled { name: String, which: String },
    #[error(
        "{what}: SHA-256 mismatch (expected {expected}, got {got}); refused, nothing installed"
    )]
    Hash {
        what: String,
        expected: String,
        got: String,
    },
    #[error("{wheel} is not a wheel wasmbox can install: {why}")]
    BadWheel { wheel: String, why: String },
    #[error(
        "{name} {version} is bundled with wasmbox's Python and is never shadowed; {spec} asks for another version"
    )]
    Bundled {
        name: String,
        version: String,
        spec: String,
    },
    #[error("{name}: {have} is chosen already, and {want} asks for another version")]
    Conflict {
        name: String,
        have: String,
        want: String,
    },
    #[error("this install needs more than {MAX_RESOLVED} packages; install fewer at a time")]
    TooMany,
    #[error("the package index: {0}")]
    Index(String),
    #[error("the package store: {0}")]
    Io(String),
}

impl From<std::io::Error> for PackageError {
    fn from(e: std::io::Error) -> Self {
        PackageError::Io(e.to_string())
    }
}
