//! Everything wasmtime: one engine for every runtime, its epoch ticker, the module cache and the
//! per-execution limits.

pub mod cache;
pub mod limits;

use std::time::Duration;

use wasmtime::{Config, Engine, Strategy};

use crate::error::{Error, Result};

/// Deepest wasm stack a guest may use. CPython's C recursion needs more than the 512 KiB default
/// for some libraries; 8 MiB is the reference host's setting.
pub const MAX_WASM_STACK: usize = 8 << 20;

/// Native stack of the threads that run guests. Synchronous calls run wasm on the calling
/// thread's stack, so it must hold `MAX_WASM_STACK` plus the host frames around it.
pub const GUEST_THREAD_STACK: usize = 32 << 20;

/// How often the epoch advances; deadlines are counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Builds the engine shared by every runtime and starts its epoch ticker.
///
/// The ticker holds only a weak reference and ends when the last clone of the engine is dropped.
pub fn build_engine() -> Result<Engine> {
    build_engine_with(Strategy::Cranelift)
}

/// An engine with the given compiler and otherwise the same settings (epochs, wasm stack, CoW).
/// `Strategy::Winch` is the fast baseline compiler used for Go snippets (about 10x faster to
/// compile than Cranelift, somewhat slower code); it does not support the exception-handling
/// proposal, which only CPython needs, so that is on for Cranelift only.
pub fn build_engine_with(strategy: Strategy) -> Result<Engine> {
    let mut config = Config::new();
    config.strategy(strategy);
    // CPython for WASI is built with the exception-handling proposal.
    config.wasm_exceptions(!matches!(strategy, Strategy::Winch));
    // Deadlines: a guest loop is interrupted when its store's epoch deadline passes.
    config.epoch_interruption(true);
    config.max_wasm_stack(MAX_WASM_STACK);
    // wasmtime refuses max_wasm_stack above async_stack_size, even for sync-only hosts.
    config.async_stack_size(MAX_WASM_STACK + (1 << 20));
    // Instances map their initial memory copy-on-write from the compiled image.
    config.memory_init_cow(true);
    let engine = Engine::new(&config).map_err(|e| Error::Engine(format!("{e:#}")))?;
    start_epoch_ticker(&engine);
    Ok(engine)
}

fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasmbox-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}

/// Epoch ticks for a deadline, rounded up, plus one so a deadline never fires early.
pub fn deadline_ticks(timeout: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    (timeout.as_nanos().div_ceil(tick) as u64).saturating_add(1)
}
