//! An instance's interpreter state, captured and restored into a fresh instance of its image:
//! what pausing a session to disk, forking and snapshotting it are made of (#24).
//!
//! The state is the linear memory and the mutable globals (tables do not change at run time;
//! wizer assumes the same), which images export for this (`engine::globals`). Instances start
//! copy-on-write from the image, so only the pages an instance made private can differ from a
//! fresh one's: `/proc/self/pagemap` names them (`pages`), and only those are saved
//! ([`capture()`]). A restore writes them over a fresh instance of the same image
//! ([`restore()`], or [`copy`] straight from a live one); between processes the state travels
//! as a file (`format`).
//!
//! This module holds what the others share: the state itself and its global values.

use std::collections::BTreeMap;
use std::ops::Range;

use wasmtime::{V128, Val, ValType};

mod capture;
#[cfg(test)]
mod fixture;
mod format;
mod pages;
mod reset;
mod restore;

pub use capture::{capture, capture_full};
pub use format::{StateError, StateKey};
pub use reset::{Pristine, Reset};
pub use restore::{Copied, copy, restore};

use pages::count;

/// A mutable global's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalValue {
    I32(i32),
    I64(i64),
    /// Bits, so a NaN round-trips exactly.
    F32(u32),
    F64(u64),
    V128(u128),
}

impl GlobalValue {
    fn from_val(val: &Val) -> Option<Self> {
        Some(match *val {
            Val::I32(v) => Self::I32(v),
            Val::I64(v) => Self::I64(v),
            Val::F32(v) => Self::F32(v),
            Val::F64(v) => Self::F64(v),
            Val::V128(v) => Self::V128(v.as_u128()),
            _ => return None,
        })
    }

    fn to_val(self) -> Val {
        match self {
            Self::I32(v) => Val::I32(v),
            Self::I64(v) => Val::I64(v),
            Self::F32(v) => Val::F32(v),
            Self::F64(v) => Val::F64(v),
            Self::V128(v) => Val::V128(V128::from(v)),
        }
    }

    fn fits(self, ty: &ValType) -> bool {
        matches!(
            (self, ty),
            (Self::I32(_), ValType::I32)
                | (Self::I64(_), ValType::I64)
                | (Self::F32(_), ValType::F32)
                | (Self::F64(_), ValType::F64)
                | (Self::V128(_), ValType::V128)
        )
    }
}

/// What an instance holds that its image does not.
#[derive(Clone, PartialEq, Eq)]
pub struct InstanceState {
    page_size: u64,
    memory_pages: u64,
    /// Saved host pages as runs of page indices; their bytes back to back in `data`.
    runs: Vec<Range<u64>>,
    data: Vec<u8>,
    /// Host pages, within the image's initial memory, that read as zero here. Nothing to copy,
    /// but the image may hold data there: a restore zeroes those that do not read as zero.
    zeros: Vec<Range<u64>>,
    /// By index in the global index space, ascending.
    globals: Vec<(u32, GlobalValue)>,
    /// A monotonic-clock reading (nanoseconds) the caller took with the state, carried as is.
    pub clock_ns: u64,
    /// Free-form facts for the caller, carried as is. Small: a key or value over 1 MiB would
    /// make the file unreadable.
    pub meta: BTreeMap<String, String>,
}

impl std::fmt::Debug for InstanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceState")
            .field("memory_pages", &self.memory_pages)
            .field("saved_pages", &self.saved_pages())
            .field("zero_pages", &self.zero_pages())
            .field("globals", &self.globals)
            .field("clock_ns", &self.clock_ns)
            .field("meta", &self.meta)
            .finish()
    }
}

impl InstanceState {
    /// The linear memory's size, in wasm pages.
    pub fn memory_pages(&self) -> u64 {
        self.memory_pages
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_pages * self.page_size
    }

    /// Host pages whose bytes are saved.
    pub fn saved_pages(&self) -> u64 {
        count(&self.runs)
    }

    /// Host pages saved as zero-filled (no bytes).
    pub fn zero_pages(&self) -> u64 {
        count(&self.zeros)
    }

    /// The saved host pages, as runs of page indices.
    pub fn runs(&self) -> &[Range<u64>] {
        &self.runs
    }

    pub fn saved_bytes(&self) -> usize {
        self.data.len()
    }

    pub fn globals(&self) -> &[(u32, GlobalValue)] {
        &self.globals
    }
}
