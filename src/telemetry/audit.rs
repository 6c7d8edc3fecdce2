//! The audit log: one JSON line per tool call in `<data dir>/audit.jsonl`.

use std::sync::atomic::{AtomicU64, Ordering};

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Lines dropped because the writer fell behind (the `seq` gaps show where).
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}
