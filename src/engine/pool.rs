//! Pools of ready instances: made ahead of time by background threads, handed out once each.
//!
//! An instance that ran user code is never returned to a pool; `take` removes it for good and
//! wakes a refill thread. When the pool is empty the caller makes a fresh instance itself (the
//! pool-empty path), so exhaustion costs latency, never an error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::GUEST_THREAD_STACK;
use crate::error::Result;

type Factory<T> = Box<dyn Fn() -> Result<T> + Send + Sync>;

/// A pool of ready `T`s for one runtime image.
pub struct Pool<T: Send + 'static> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    name: String,
    ready: Mutex<VecDeque<T>>,
    wake: Condvar,
    target: usize,
    factory: Factory<T>,
    stop: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    made: AtomicU64,
    failures: AtomicU64,
}

/// Counters for `get_system_metrics`.
#[derive(Clone, Debug, Serialize)]
pub struct PoolStats {
    pub name: String,
    pub ready: usize,
    pub target: usize,
    pub hits: u64,
    pub misses: u64,
    pub made: u64,
    pub failures: u64,
}

impl<T: Send + 'static> Pool<T> {
    /// Starts `refill_threads` threads that keep `target` instances ready, made by `factory`.
    /// A `target` of 0 makes a pool that is always empty (every take is a miss).
    pub fn new(
        name: &str,
        target: usize,
        refill_threads: usize,
        factory: impl Fn() -> Result<T> + Send + Sync + 'static,
    ) -> Self {
        let shared = Arc::new(Shared {
            name: name.to_string(),
            ready: Mutex::new(VecDeque::with_capacity(target)),
            wake: Condvar::new(),
            target,
            factory: Box::new(factory),
            stop: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            made: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        });
        if target > 0 {
            for i in 0..refill_threads.max(1) {
                let s = shared.clone();
                // Refills run wasm (the warm-up turn), so they need guest-sized stacks.
                std::thread::Builder::new()
                    .name(format!("wasmbox-pool-{name}-{i}"))
                    .stack_size(GUEST_THREAD_STACK)
                    .spawn(move || {
                        super::threads::lower_priority();
                        refill(s)
                    })
                    .expect("spawning a pool refill thread");
            }
        }
        Self { shared }
    }

    /// A ready instance, or `None` when the pool is empty (counted as a miss).
    ///
    /// The refill is not started here: call [`Pool::refill`] once the request is answered, so
    /// the refill's page faults do not compete with the request's own.
    pub fn take(&self) -> Option<T> {
        let got = self.shared.ready.lock().unwrap().pop_front();
        match got {
            Some(t) => {
                self.shared.hits.fetch_add(1, Ordering::Relaxed);
                Some(t)
            }
            None => {
                self.shared.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Wakes a refill thread if the pool is below its target.
    pub fn refill(&self) {
        self.shared.wake.notify_one();
    }

    /// A ready instance, made now on the caller's thread when the pool is empty (the
    /// pool-empty path), so exhaustion costs latency, never an error.
    pub fn take_or_make(&self) -> Result<T> {
        match self.take() {
            Some(t) => Ok(t),
            None => (self.shared.factory)(),
        }
    }

    pub fn stats(&self) -> PoolStats {
        let s = &self.shared;
        PoolStats {
            name: s.name.clone(),
            ready: s.ready.lock().unwrap().len(),
            target: s.target,
            hits: s.hits.load(Ordering::Relaxed),
            misses: s.misses.load(Ordering::Relaxed),
            made: s.made.load(Ordering::Relaxed),
            failures: s.failures.load(Ordering::Relaxed),
        }
    }

    /// Blocks until the pool is full (or `timeout` passes); for benches and tests that want
    /// to measure the hit path.
    pub fn wait_full(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if self.shared.ready.lock().unwrap().len() >= self.shared.target {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

impl<T: Send + 'static> Drop for Pool<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
    }
}

fn refill<T>(s: Arc<Shared<T>>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        {
            let mut ready = s.ready.lock().unwrap();
            while ready.len() >= s.target && !s.stop.load(Ordering::Relaxed) {
                ready = s.wake.wait(ready).unwrap();
            }
        }
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        match (s.factory)() {
            Ok(t) => {
                s.made.fetch_add(1, Ordering::Relaxed);
                let mut ready = s.ready.lock().unwrap();
                if ready.len() < s.target {
                    ready.push_back(t);
                }
                backoff = Duration::from_millis(100);
            }
            Err(e) => {
                s.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("pool {}: could not make a ready instance: {e}", s.name);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
        // The pool may outlive its users only until they drop it.
        if Arc::strong_count(&s) == 1 {
            return;
        }
    }
}
