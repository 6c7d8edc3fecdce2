//! The threads guests run on. Synchronous wasm calls run on the calling thread's native stack,
//! so guests need threads with stacks deeper than `MAX_WASM_STACK`; keeping them alive saves a
//! thread spawn (tens of microseconds) on every execution.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::GUEST_THREAD_STACK;
use crate::error::{Error, Result};

type Job = Box<dyn FnOnce() + Send>;
type Deferred = Box<dyn FnOnce()>;

thread_local! {
    /// On a guest thread during a job: work to do once the job's result has been handed back.
    static AFTER_REPLY: RefCell<Option<Vec<Deferred>>> = const { RefCell::new(None) };
}

/// Runs `f` once the current guest job's result has been handed back (now, elsewhere). Waking
/// another thread (the reaper, a refill thread) costs the waker an inter-processor interrupt,
/// tens of microseconds on a VM whose other vCPU sleeps: after the reply it delays nobody.
pub fn after_reply(f: impl FnOnce() + 'static) {
    let f: Deferred = Box::new(f);
    let now = AFTER_REPLY.with_borrow_mut(|after| match after {
        Some(queue) => {
            queue.push(f);
            None
        }
        None => Some(f),
    });
    if let Some(f) = now {
        f();
    }
}

/// Drops spent sandboxes on a background thread: unmapping or resetting a guest's memory and
/// removing its scratch directories takes a millisecond or more that the caller should not wait
/// for. The queue is short: when teardown falls behind (sustained load), the caller drops inline,
/// so spent instances can never pile up and exhaust the allocator's slots.
pub fn drop_later<T: Send + 'static>(spent: T) {
    after_reply(move || hand_to_reaper(spent));
}

fn hand_to_reaper<T: Send + 'static>(spent: T) {
    const QUEUE: usize = 8;
    static REAPER: std::sync::OnceLock<Mutex<mpsc::SyncSender<Job>>> = std::sync::OnceLock::new();
    let tx = REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        std::thread::Builder::new()
            .name("wasmbox-reaper".into())
            .spawn(move || {
                lower_priority();
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .expect("spawning the reaper thread");
        Mutex::new(tx)
    });
    let job: Job = Box::new(move || drop(spent));
    let refused = tx.lock().unwrap().try_send(job);
    match refused {
        Ok(()) => {}
        Err(mpsc::TrySendError::Full(job)) | Err(mpsc::TrySendError::Disconnected(job)) => job(),
    }
}

/// Runs `f` to completion on a new thread with a guest's stack, for one-off wasm runs outside
/// the request path (building an image, calibrating instances).
pub fn on_guest_stack<R: Send>(what: &str, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(GUEST_THREAD_STACK)
            .spawn_scoped(scope, f)
            .map_err(|e| Error::Engine(format!("spawning the {what} thread: {e}")))?
            .join()
            .map_err(|_| Error::Engine(format!("the {what} thread panicked")))?
    })
}

/// Makes the calling thread yield the CPU to request threads: background work (refills,
/// teardown) must not delay an answer on a machine with few cores.
pub fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread; failure only leaves the priority as it was.
    #[cfg(target_os = "linux")]
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// A fixed set of guest threads fed from one queue.
pub struct GuestThreads {
    tx: Mutex<mpsc::Sender<Job>>,
}

impl GuestThreads {
    pub fn new(threads: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("wasmbox-guest-{i}"))
                .stack_size(GUEST_THREAD_STACK)
                .spawn(move || {
                    loop {
                        let job = match rx.lock().unwrap().recv() {
                            Ok(job) => job,
                            Err(_) => return, // the sender is gone: shutting down
                        };
                        // A host panic fails that one call (its result channel is dropped),
                        // never the thread.
                        AFTER_REPLY.set(Some(Vec::new()));
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                        for f in AFTER_REPLY.take().unwrap_or_default() {
                            let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
                        }
                    }
                })
                .expect("spawning a guest thread");
        }
        Self { tx: Mutex::new(tx) }
    }

    /// Runs `f` on a guest thread and waits for its result without blocking the async runtime.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.tx
            .lock()
            .unwrap()
            .send(job)
            .map_err(|_| Error::Busy("the guest threads have stopped".into()))?;
        rx.await.map_err(|_| {
            Error::Engine(
                "the execution failed inside wasmbox (a host panic); other calls are unaffected"
                    .into(),
            )
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
        let threads = GuestThreads::new(1);
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
            Ok(7)
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
}
