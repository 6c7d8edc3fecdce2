//! Epoch tickers that sleep while no guest runs.
//!
//! wasmtime interrupts a guest when its store's epoch deadline passes, and the epoch advances
//! only when a thread ticks it. Ticking every 10 ms forever woke an idle server ~100 times a
//! second per engine: a laptop's battery, a vCPU kept from sleeping. So a ticker pauses once no
//! guest armed with a deadline has run for [`IDLE_TICKS`], and the next guest to be armed
//! ([`Running::new`]) wakes it. Within that second nobody pays for a wake-up, so a stream of
//! calls never does; the first call after a quiet second pays one thread wake-up.
//! Pool refills and polish turns run without a deadline and are not counted.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::EPOCH_TICK;

/// Ticks without a running guest after which a ticker pauses (one second).
const IDLE_TICKS: u32 = 100;
/// How often a paused ticker checks whether its engine is gone.
const PAUSED_CHECK: Duration = Duration::from_secs(5);

/// Guests running with a deadline now (all engines).
static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// Guests ever started with a deadline: a guest that starts and ends between two ticks still
/// counts as activity.
static STARTED: AtomicU64 = AtomicU64::new(0);
/// Tickers paused now.
static PAUSED: AtomicUsize = AtomicUsize::new(0);
static WAKE: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

/// Held while a guest runs with a deadline: its engine's ticker keeps (or starts) ticking.
#[derive(Debug)]
pub struct Running(());

impl Running {
    pub fn new() -> Self {
        RUNNING.fetch_add(1, SeqCst);
        STARTED.fetch_add(1, SeqCst);
        // Paired with `pause`: it counts itself paused before it looks at RUNNING, and this
        // looks at PAUSED after counting the guest, so one of the two sees the other.
        if PAUSED.load(SeqCst) > 0 {
            let _lock = WAKE.0.lock().unwrap_or_else(|e| e.into_inner());
            WAKE.1.notify_all();
        }
        Running(())
    }
}

impl Default for Running {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, SeqCst);
    }
}

/// The ticker's loop; returns when the engine is dropped.
pub(super) fn tick(engine: wasmtime::EngineWeak) {
    let mut idle = 0;
    let mut seen = STARTED.load(SeqCst);
    loop {
        match engine.upgrade() {
            Some(e) => e.increment_epoch(),
            None => return,
        }
        std::thread::sleep(EPOCH_TICK);
        let started = STARTED.load(SeqCst);
        if RUNNING.load(SeqCst) == 0 && started == seen {
            idle += 1;
        } else {
            idle = 0;
            seen = started;
        }
        if idle >= IDLE_TICKS {
            if !pause(&engine) {
                return;
            }
            idle = 0;
            seen = STARTED.load(SeqCst);
        }
    }
}

/// Sleeps until a guest is armed. False if the engine went away meanwhile.
fn pause(engine: &wasmtime::EngineWeak) -> bool {
    let mut lock = WAKE.0.lock().unwrap_or_else(|e| e.into_inner());
    PAUSED.fetch_add(1, SeqCst);
    let mut alive = true;
    while RUNNING.load(SeqCst) == 0 {
        lock = WAKE
            .1
            .wait_timeout(lock, PAUSED_CHECK)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        if engine.upgrade().is_none() {
            alive = false;
            break;
        }
    }
    PAUSED.fetch_sub(1, SeqCst);
    alive
}
