//! Pools of ready instances: made ahead of time by background threads, handed out once each.
//!
//! An instance that ran user code comes back only through [`Pool::put`], once its owner has
//! made it as a new one again (`engine::state::reset`); otherwise `take` removes it for good
//! and a refill thread replaces it. When the pool is empty the caller makes a fresh instance itself (the
//! pool-empty path), so exhaustion costs latency, never an error.
//!
//! Making comes first, polishing second: a refill thread makes instances (cheaply) until the
//! pool is full, and only then, with nothing left to make, polishes them (a runtime's optional,
//! costlier step that makes the first request on an instance faster). Under sustained load the
//! pool never fills, so no CPU goes to polish; between requests every ready instance gets it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::GUEST_THREAD_STACK;
use super::{EngineError, Result};

type Factory<T, E> = Box<dyn Fn() -> Result<T, E> + Send + Sync>;
/// A pool's optional work on its ready instances once it is full: their polish (see the module
/// docs).
pub type IdleWork<T, E = EngineError> = Box<dyn Fn(&mut T) -> Result<(), E> + Send + Sync>;

/// A ready instance, and whether it has been polished.
struct Item<T> {
    t: T,
    polished: bool,
}

/// A pool of ready `T`s for one runtime image.
pub struct Pool<T: Send + 'static, E: 'static = EngineError> {
    shared: Arc<Shared<T, E>>,
}

/// What the refill threads and `take` share under one lock.
struct Ready<T> {
    /// Polished items first: `take` pops the front, new items go to the back.
    items: VecDeque<Item<T>>,
    /// Instances taken out of `items` to be polished; they still count towards the target, so
    /// other refill threads do not make replacements for them.
    polishing: usize,
    /// Instances being made now (not counted: a failed make is not replaced by this count).
    making: usize,
}

impl<T> Ready<T> {
    /// Ready and being polished: what counts towards the target.
    fn counted(&self) -> usize {
        self.items.len() + self.polishing
    }
}

struct Shared<T, E> {
    name: String,
    ready: Mutex<Ready<T>>,
    wake: Condvar,
    /// Signalled when an item is made, for [`Pool::take_within`].
    made_one: Condvar,
    target: usize,
    factory: Factory<T, E>,
    polish: Option<IdleWork<T, E>>,
    stop: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    made: AtomicU64,
    recycled: AtomicU64,
    failures: AtomicU64,
}

/// Counters for `get_system_metrics`.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct PoolStats {
    pub name: String,
    pub ready: usize,
    /// Of the ready ones, how many are polished (see the module docs).
    pub polished: usize,
    pub target: usize,
    pub hits: u64,
    pub misses: u64,
    pub made: u64,
    /// Instances that served a request, were put back as they were made and are counted ready
    /// again (see `engine::state::reset`).
    pub recycled: u64,
    /// Never-run instances kept beside the pool to reset spent ones from (0 or 1).
    pub pristine: usize,
    pub failures: u64,
}

impl<T: Send + 'static, E: std::fmt::Display + Send + 'static> Pool<T, E> {
    /// Starts `refill_threads` threads that keep `target` instances ready, made by `factory`.
    /// A `target` of 0 makes a pool that is always empty (every take is a miss).
    /// `polish`, if given, is applied to each ready instance once the pool is full.
    pub fn new(
        name: &str,
        target: usize,
        refill_threads: usize,
        factory: impl Fn() -> Result<T, E> + Send + Sync + 'static,
        polish: Option<IdleWork<T, E>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            name: name.to_string(),
            ready: Mutex::new(Ready {
                items: VecDeque::with_capacity(target),
                polishing: 0,
                making: 0,
            }),
            wake: Condvar::new(),
            made_one: Condvar::new(),
            target,
            factory: Box::new(factory),
            polish,
            stop: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            made: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
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
                        super::threads::idle_priority();
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
        self.take_within(Duration::ZERO)
    }

    /// As [`Pool::take`], but when the pool is empty while an instance is being made, waits up
    /// to `wait` for it: for instances whose making costs a caller more than the wait (made
    /// beside it, they would contend for the same CPUs and page tables).
    pub fn take_within(&self, wait: Duration) -> Option<T> {
        let deadline = std::time::Instant::now() + wait;
        let mut ready = self.shared.ready.lock().unwrap();
        while ready.items.is_empty() && ready.making > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            ready = self.shared.made_one.wait_timeout(ready, left).unwrap().0;
        }
        let got = ready.items.pop_front();
        drop(ready);
        let counter = match got {
            Some(_) => &self.shared.hits,
            None => &self.shared.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        got.map(|i| i.t)
    }

    /// Wakes a refill thread if the pool is below its target (after the reply, on a guest
    /// thread).
    pub fn refill(&self) {
        let shared = self.shared.clone();
        crate::engine::threads::after_answer(move || shared.wake.notify_one());
    }

    /// Puts back `t`, an instance as ready as a made one (a spent one reset), if the pool is
    /// below its target; otherwise hands it back to be dropped.
    pub fn put(&self, t: T) -> Result<(), T> {
        let mut ready = self.shared.ready.lock().unwrap();
        if ready.counted() >= self.shared.target {
            return Err(t);
        }
        ready.items.push_back(Item { t, polished: false });
        let full = ready.counted() >= self.shared.target;
        drop(ready);
        self.shared.recycled.fetch_add(1, Ordering::Relaxed);
        self.shared.made_one.notify_all();
        // Full again: a refill thread polishes it (below the target it would make another).
        if full && self.shared.polish.is_some() {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Wakes a refill thread now (from a background thread, where nothing waits on a reply).
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// A ready instance, made now on the caller's thread when the pool is empty (the
    /// pool-empty path), so exhaustion costs latency, never an error.
    pub fn take_or_make(&self) -> Result<T, E> {
        match self.take() {
            Some(t) => Ok(t),
            None => (self.shared.factory)(),
        }
    }

    pub fn stats(&self) -> PoolStats {
        let s = &self.shared;
        let (ready, polished) = {
            let r = s.ready.lock().unwrap();
            (r.items.len(), r.items.iter().filter(|i| i.polished).count())
        };
        PoolStats {
            name: s.name.clone(),
            ready,
            polished,
            target: s.target,
            hits: s.hits.load(Ordering::Relaxed),
            misses: s.misses.load(Ordering::Relaxed),
            made: s.made.load(Ordering::Relaxed),
            recycled: s.recycled.load(Ordering::Relaxed),
            pristine: 0,
            failures: s.failures.load(Ordering::Relaxed),
        }
    }

    /// Blocks until the pool is full and, if it polishes, every instance is polished (or
    /// `timeout` passes); for benches and tests that want to measure the hit path.
    pub fn wait_full(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            let settled = {
                let r = self.shared.ready.lock().unwrap();
                r.items.len() >= self.shared.target
                    && (self.shared.polish.is_none() || r.items.iter().all(|i| i.polished))
            };
            if settled {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

impl<T: Send + 'static, E: 'static> Drop for Pool<T, E> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
    }
}

fn refill<T, E: std::fmt::Display>(s: Arc<Shared<T, E>>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        /// What a refill thread does next.
        enum Next<T> {
            Make,
            Polish(T),
        }
        let next = {
            let mut ready = s.ready.lock().unwrap();
            loop {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                if ready.counted() < s.target {
                    ready.making += 1;
                    break Next::Make;
                }
                // Full: polish the newest unpolished instance (they are at the back).
                if s.polish.is_some() && ready.items.back().is_some_and(|i| !i.polished) {
                    ready.polishing += 1;
                    break Next::Polish(ready.items.pop_back().expect("not empty").t);
                }
                ready = s.wake.wait(ready).unwrap();
            }
        };
        let (made, polished) = match next {
            Next::Make => ((s.factory)().map(|t| Item { t, polished: false }), false),
            Next::Polish(mut t) => {
                let polish = s.polish.as_ref().expect("polish is set");
                (polish(&mut t).map(|()| Item { t, polished: true }), true)
            }
        };
        match made {
            Ok(item) => {
                s.made
                    .fetch_add(u64::from(!item.polished), Ordering::Relaxed);
                let mut ready = s.ready.lock().unwrap();
                if polished {
                    ready.polishing -= 1;
                    ready.items.push_front(item);
                } else {
                    ready.making -= 1;
                    if ready.counted() < s.target {
                        ready.items.push_back(item);
                    }
                }
                drop(ready);
                s.made_one.notify_all();
                backoff = Duration::from_millis(100);
            }
            Err(e) => {
                // A failed polish loses that instance; the next round makes another.
                {
                    let mut ready = s.ready.lock().unwrap();
                    match polished {
                        true => ready.polishing -= 1,
                        false => ready.making -= 1,
                    }
                }
                s.made_one.notify_all();
                s.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("pool {}: could not ready an instance: {e}", s.name);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A take that finds the pool empty while an instance is being made waits for it; with
    /// nothing being made it does not wait.
    #[test]
    fn take_within_waits_for_an_instance_being_made() {
        let pool: Pool<u32> = Pool::new(
            "slow",
            1,
            1,
            || {
                std::thread::sleep(Duration::from_millis(100));
                Ok(7)
            },
            None,
        );
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(pool.take(), None, "still being made");
        assert_eq!(pool.take_within(Duration::from_secs(5)), Some(7));
        let empty: Pool<u32> = Pool::new("none", 0, 1, || Ok(1), None);
        let t = std::time::Instant::now();
        assert_eq!(empty.take_within(Duration::from_secs(5)), None);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    /// With several refill threads, instances out being polished still count towards the
    /// target: the others must not make replacements for them.
    #[test]
    fn polishing_never_overfills_the_pool() {
        let polish: IdleWork<u32> = Box::new(|_| {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        });
        let pool = Pool::new("test", 2, 3, || Ok(7u32), Some(polish));
        for round in 0..3 {
            assert!(
                pool.wait_full(Duration::from_secs(10)),
                "{:?}",
                pool.stats()
            );
            // Stragglers (a make or a polish that finishes late) would land by now.
            std::thread::sleep(Duration::from_millis(100));
            let stats = pool.stats();
            assert_eq!(
                (stats.ready, stats.polished),
                (2, 2),
                "round {round}: {stats:?}"
            );
            assert_eq!(pool.take(), Some(7));
            pool.refill();
        }
    }

    /// A failed polish loses that instance but not its place: the pool is made full again
    /// (were the instance still counted as being polished, it never would be).
    #[test]
    fn a_failed_polish_is_replaced() {
        let failed = Arc::new(AtomicBool::new(false));
        let f = failed.clone();
        let polish: IdleWork<u32> = Box::new(move |_| {
            if f.swap(true, Ordering::SeqCst) {
                Ok(())
            } else {
                Err(EngineError::Wasm("polish failed".into()))
            }
        });
        let pool = Pool::new("test", 2, 1, || Ok(7u32), Some(polish));
        assert!(
            pool.wait_full(Duration::from_secs(10)),
            "{:?}",
            pool.stats()
        );
        let stats = pool.stats();
        assert!(failed.load(Ordering::SeqCst));
        assert_eq!(
            (stats.ready, stats.polished, stats.failures),
            (2, 2, 1),
            "{stats:?}"
        );
        assert_eq!(stats.made, 3, "the lost instance was made again: {stats:?}");
    }
}
