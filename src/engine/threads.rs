//! The threads guests run on. Synchronous wasm calls run on the calling thread's native stack,
//! so guests need threads with stacks deeper than `MAX_WASM_STACK`; keeping them alive saves a
//! thread spawn (tens of microseconds) on every execution.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::GUEST_THREAD_STACK;
use crate::error::{Error, Result};

type Job = Box<dyn FnOnce() + Send>;

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
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
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
