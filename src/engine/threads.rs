//! The threads guests run on. Synchronous wasm calls run on the calling thread's native stack,
//! so guests need threads with stacks deeper than `MAX_WASM_STACK`; keeping them alive saves a
//! thread spawn (tens of microseconds) on every execution.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::GUEST_THREAD_STACK;
use super::{EngineError as Error, Result};

type Job = Box<dyn FnOnce() + Send>;
type Deferred = Box<dyn FnOnce() + Send>;

thread_local! {
    /// On a guest thread during a job: work to do once the job's result has been handed back,
    /// each piece with whether it may wait for the settling time ([`after_answer`]).
    static AFTER_REPLY: RefCell<Option<Vec<(bool, Deferred)>>> = const { RefCell::new(None) };
}

/// Runs `f` once the current guest job's result has been handed back (now, elsewhere). Waking
/// another thread (the reaper, a refill thread) costs the waker an inter-processor interrupt,
/// tens of microseconds on a VM whose other vCPU sleeps: after the reply it delays nobody.
pub fn after_reply(f: impl FnOnce() + Send + 'static) {
    defer(false, Box::new(f));
}

/// As [`after_reply`], and later still where [`settle_after_reply`] says so: for work that only
/// readies the next call (a pool refill), never for work that frees what a limit counts (a
/// spent instance's slot), which must not wait in an unbounded queue.
pub fn after_answer(f: impl FnOnce() + Send + 'static) {
    defer(true, Box::new(f));
}

fn defer(settles: bool, f: Deferred) {
    let now = AFTER_REPLY.with_borrow_mut(|after| match after {
        Some(queue) => {
            queue.push((settles, f));
            None
        }
        None => Some(f),
    });
    if let Some(f) = now {
        f();
    }
}

/// How long after a job's result its [`after_reply`] work waits, in microseconds (0: none).
static SETTLE_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Holds every job's [`after_answer`] work for `settle` after its result: for a server whose
/// client runs on the same machine and reads the answer meanwhile (stdio; the official Python
/// SDK parses and checks an answer for about a millisecond). A new instance made or an old one
/// unmapped in that time competes with the client for the CPUs: on 2 cores a one-shot's round
/// trip took 7-12% longer.
pub fn settle_after_reply(settle: std::time::Duration) {
    SETTLE_US.store(
        settle.as_micros() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Runs a job's deferred work: now, or (what may settle, where settling is on) on the
/// settling thread once the settling time is over.
fn run_after(after: Vec<(bool, Deferred)>) {
    let settle = SETTLE_US.load(std::sync::atomic::Ordering::Relaxed);
    let (later, now): (Vec<_>, Vec<_>) = after.into_iter().partition(|(s, _)| *s && settle > 0);
    run_all(now.into_iter().map(|(_, f)| f).collect());
    let after: Vec<Deferred> = later.into_iter().map(|(_, f)| f).collect();
    if after.is_empty() {
        return;
    }
    type Held = (std::time::Instant, Vec<Deferred>);
    static SETTLING: std::sync::OnceLock<Mutex<mpsc::Sender<Held>>> = std::sync::OnceLock::new();
    let tx = SETTLING.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Held>();
        std::thread::Builder::new()
            .name("wasmbox-settle".into())
            .spawn(move || {
                // Held in the order they came, each due `settle` after its job ended.
                while let Ok((due, after)) = rx.recv() {
                    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
                    run_all(after);
                }
            })
            .expect("spawning the settling thread");
        Mutex::new(tx)
    });
    let due = std::time::Instant::now() + std::time::Duration::from_micros(settle);
    if let Err(mpsc::SendError((_, after))) = tx.lock().unwrap().send((due, after)) {
        run_all(after);
    }
}

/// Runs deferred work; a panic in one piece fails only that piece.
fn run_all(after: Vec<Deferred>) {
    for f in after {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
    }
}

/// Drops spent sandboxes on a background thread: unmapping or resetting a guest's memory and
/// removing its scratch directories takes a millisecond or more that the caller should not wait
/// for. The queue is short: when teardown falls behind (sustained load), the caller drops inline,
/// so spent instances can never pile up and exhaust the allocator's slots. That bound is also
/// what lets teardown wait out the settling time ([`settle_after_reply`]): at most the queue's
/// length of spent instances are ever held for it.
pub fn drop_later<T: Send + 'static>(spent: T) {
    reap_later(move || drop(spent));
}

/// As [`drop_later`], for work on a spent instance that ends in its drop or its reuse (a
/// recycled one-shot instance, `lang::image_runtime`): on the reaper, or inline when its queue
/// is full. The reaper has a guest's stack, as readying an instance may run wasm.
pub fn reap_later(job: impl FnOnce() + Send + 'static) {
    after_reply(move || hand_to_reaper(Box::new(job)));
}

fn hand_to_reaper(job: Job) {
    const QUEUE: usize = 8;
    type Spent = (std::time::Instant, Job);
    static REAPER: std::sync::OnceLock<Mutex<mpsc::SyncSender<Spent>>> = std::sync::OnceLock::new();
    let tx = REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel::<Spent>(QUEUE);
        std::thread::Builder::new()
            .name("wasmbox-reaper".into())
            .stack_size(GUEST_THREAD_STACK)
            .spawn(move || {
                idle_priority();
                while let Ok((due, job)) = rx.recv() {
                    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
                    job();
                }
            })
            .expect("spawning the reaper thread");
        Mutex::new(tx)
    });
    let settle = SETTLE_US.load(std::sync::atomic::Ordering::Relaxed);
    let due = std::time::Instant::now() + std::time::Duration::from_micros(settle);
    let refused = tx.lock().unwrap().try_send((due, job));
    match refused {
        Ok(()) => {}
        Err(mpsc::TrySendError::Full((_, job)))
        | Err(mpsc::TrySendError::Disconnected((_, job))) => job(),
    }
}

/// Runs `f` to completion on a new thread with a guest's stack, for one-off wasm runs outside
/// the request path (building an image, calibrating instances).
pub fn on_guest_stack<R: Send, E: From<Error> + Send>(
    what: &str,
    f: impl FnOnce() -> Result<R, E> + Send,
) -> Result<R, E> {
    // A runtime's load runs some of its stages here: they are reported as the caller's.
    let stages = super::progress::stage_reporter();
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(GUEST_THREAD_STACK)
            .spawn_scoped(scope, || super::progress::with_stages(stages, f))
            .map_err(|e| Error::Wasm(format!("spawning the {what} thread: {e}")))?
            .join()
            .map_err(|_| E::from(Error::Wasm(format!("the {what} thread panicked"))))?
    })
}

pub use crate::platform::process::{idle_priority, lower_priority};

/// Guest threads, started as needed up to a cap. A job goes to the thread that went idle last:
/// its stack and the CPU it last ran on are the likeliest to be warm, and no other thread is
/// woken (with one shared queue, each job went to the thread idle longest, and the taker woke
/// the next waiter). There are more threads than CPU slots ([`super::cpu`]): a guest waiting in
/// a sleep keeps its thread but not its slot.
pub struct GuestThreads {
    hub: Arc<Hub>,
}

struct Hub {
    state: Mutex<HubState>,
}

struct HubState {
    /// Idle threads, the one idle shortest last.
    idle: Vec<Arc<Slot>>,
    /// Jobs waiting for a thread (all threads busy).
    backlog: std::collections::VecDeque<Job>,
    /// Threads started, and the most there may be.
    started: usize,
    max: usize,
    closed: bool,
}

/// One idle thread's mailbox.
#[derive(Default)]
struct Slot {
    job: Mutex<Option<Job>>,
    ready: std::sync::Condvar,
}

impl Hub {
    /// The next job for the thread owning `slot`, waiting for one; `None` once closed.
    fn next(&self, slot: &Arc<Slot>) -> Option<Job> {
        {
            let mut st = self.state.lock().unwrap();
            if let Some(job) = st.backlog.pop_front() {
                return Some(job);
            }
            if st.closed {
                return None;
            }
            st.idle.push(slot.clone());
        }
        let mut job = slot.job.lock().unwrap();
        loop {
            if let Some(job) = job.take() {
                return Some(job);
            }
            if self.state.lock().unwrap().closed {
                return None;
            }
            job = slot.ready.wait(job).unwrap();
        }
    }

    fn submit(self: &Arc<Self>, job: Job) -> Result<()> {
        let slot = {
            let mut st = self.state.lock().unwrap();
            if st.closed {
                return Err(Error::Busy("the guest threads have stopped".into()));
            }
            match st.idle.pop() {
                Some(slot) => slot,
                None if st.started < st.max => {
                    st.started += 1;
                    let i = st.started - 1;
                    drop(st);
                    return spawn(self.clone(), i, Some(job));
                }
                None => {
                    st.backlog.push_back(job);
                    return Ok(());
                }
            }
        };
        *slot.job.lock().unwrap() = Some(job);
        slot.ready.notify_one();
        Ok(())
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        let idle = {
            let mut st = self.hub.state.lock().unwrap();
            st.closed = true;
            std::mem::take(&mut st.idle)
        };
        for slot in idle {
            // Under the slot's lock, so the wake cannot fall between its check and its wait.
            let _job = slot.job.lock().unwrap();
            slot.ready.notify_one();
        }
    }
}

/// Starts guest thread `i`, with a first job if there is one.
fn spawn(hub: Arc<Hub>, i: usize, first: Option<Job>) -> Result<()> {
    let counted = hub.clone();
    std::thread::Builder::new()
        .name(format!("wasmbox-guest-{i}"))
        .stack_size(GUEST_THREAD_STACK)
        .spawn(move || {
            let slot = Arc::new(Slot::default());
            let mut next = first;
            while let Some(job) = next.take().or_else(|| hub.next(&slot)) {
                // A host panic fails that one call (its result channel is dropped), never the
                // thread.
                AFTER_REPLY.set(Some(Vec::new()));
                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                run_after(AFTER_REPLY.take().unwrap_or_default());
            }
        })
        .map(drop)
        .map_err(|e| {
            counted.state.lock().unwrap().started -= 1;
            Error::Busy(format!("starting a guest thread: {e}"))
        })
}

impl GuestThreads {
    /// `threads` started now, up to `max` as calls need them.
    pub fn new(threads: usize, max: usize) -> Self {
        let threads = threads.max(1);
        let hub = Arc::new(Hub {
            state: Mutex::new(HubState {
                idle: Vec::with_capacity(threads),
                backlog: std::collections::VecDeque::new(),
                started: threads,
                max: max.max(threads),
                closed: false,
            }),
        });
        for i in 0..threads {
            spawn(hub.clone(), i, None).expect("spawning a guest thread");
        }
        Self { hub }
    }

    /// Runs `f` on a guest thread and waits for its result without blocking the async runtime.
    pub async fn run<T: Send + 'static, E: From<Error> + Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.hub.submit(job)?;
        rx.await.map_err(|_| {
            E::from(Error::Wasm(
                "the execution failed inside wasmbox (a host panic); other calls are unaffected"
                    .into(),
            ))
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn after_reply_runs_now_off_guest_threads() {
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        after_reply(move || r.store(true, Ordering::SeqCst));
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn after_reply_on_a_guest_thread_runs_once_the_result_is_back() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let threads = GuestThreads::new(1, 1);
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        // The deferred work waits for the test to let it go: the result must arrive first.
        let got = rt.block_on(threads.run(move || {
            after_reply(move || {
                // Were it run before the reply, this would hold the reply back and then set the
                // flag the test checks on receipt.
                let _ = gate_rx.recv_timeout(Duration::from_secs(2));
                r.store(true, Ordering::SeqCst);
            });
            Ok::<_, Error>(7)
        }));
        assert_eq!(got.unwrap(), 7);
        assert!(
            !ran.load(Ordering::SeqCst),
            "deferred work ran before the reply"
        );
        gate_tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ran.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(ran.load(Ordering::SeqCst), "deferred work never ran");
    }

    /// More jobs than threads: the extra ones wait in the backlog and all run; the thread that
    /// went idle last takes the next job.
    #[test]
    fn jobs_beyond_the_threads_wait_and_the_last_idle_thread_goes_first() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let threads = Arc::new(GuestThreads::new(2, 2));
        let names = rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..6u64 {
                let threads = threads.clone();
                tasks.push(tokio::spawn(async move {
                    threads
                        .run(move || {
                            std::thread::sleep(Duration::from_millis(20));
                            Ok::<_, Error>(i)
                        })
                        .await
                }));
            }
            let mut got = Vec::new();
            for t in tasks {
                got.push(t.await.unwrap().unwrap());
            }
            got
        });
        assert_eq!(names, (0..6).collect::<Vec<_>>());
        // Quiet now: two sequential jobs land on the same thread.
        let name = || {
            Ok::<_, Error>(
                std::thread::current()
                    .name()
                    .unwrap_or_default()
                    .to_string(),
            )
        };
        let idle = || threads.hub.state.lock().unwrap().idle.len();
        // Each thread reports idle after handing its result back: wait for both (no fixed
        // sleep, which a loaded machine can outlast).
        let all_idle = || {
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while idle() < 2 {
                assert!(std::time::Instant::now() < until, "threads never went idle");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        all_idle();
        let a = rt.block_on(threads.run(name)).unwrap();
        all_idle();
        let b = rt.block_on(threads.run(name)).unwrap();
        assert_eq!(a, b);
        assert!(a.starts_with("wasmbox-guest-"), "{a}");
    }
}
