//! Everything wasmtime: one engine for every runtime, its epoch ticker, the module cache and the
//! per-execution limits.

pub mod cache;
pub mod cpu;
pub mod disk;
pub mod epoch;
mod error;
pub mod globals;
pub mod limits;
pub mod pool;
pub mod prefault;
pub mod preinit;
pub mod progress;
pub mod state;
pub mod threads;

use std::time::Duration;

use wasmtime::{Config, Engine, Strategy};

use EngineError as Error;
pub use error::{EngineError, Result};

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
///
/// With `pooled_instances` > 0 the engine uses wasmtime's pooling allocator with that many
/// slots: instance memories are reused and reset with `madvise` instead of being mapped and
/// unmapped per sandbox, which takes the process-wide mmap write lock and stalls every other
/// guest's page faults. Each slot reserves (not commits) `max_memory` of address space.
///
/// Slots keep nothing resident (`linear_memory_keep_resident` stays 0): wasmtime 48's in-place
/// reset (`PAGEMAP_SCAN`) skips dirty pages that were swapped out, so they would keep the last
/// guest's data, and stops after 32 regions. With 50.0.1's complete scan backported to try it,
/// the kernel reports every present private page (not only those the last guest wrote), and
/// keeping 16 MiB made teardown 6x slower and latency worse for no throughput gain.
pub fn build_engine(pooled_instances: u32, max_memory: usize) -> Result<Engine> {
    let mut config = base_config(Strategy::Cranelift);
    if pooled_instances > 0 {
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        // A memory slot each for an instance's linear memory and for its GC heap, which the
        // pooling allocator also takes from the memory pool: CPython's stores get one (its
        // wasm exceptions live there), so a Python instance holds two memory slots.
        // A guest that writes files or polls descriptors gets a second core instance (no memory
        // or table of its own): the module that forwards to wasmtime-wasi (`lang/wasi/mod.rs`).
        pool.total_core_instances(pooled_instances.saturating_mul(2))
            .total_memories(pooled_instances.saturating_mul(2))
            .total_tables(pooled_instances)
            .total_gc_heaps(pooled_instances)
            // CPython's function table has 47157 entries.
            .table_elements(1 << 16)
            // CPython's instance context (one funcref per table entry) is over 1 MiB.
            .max_core_instance_size(8 << 20)
            .max_memory_size(max_memory);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    }
    let engine = Engine::new(&config).map_err(|e| Error::Wasm(format!("{e:#}")))?;
    start_epoch_ticker(&engine);
    Ok(engine)
}

/// An engine for code that runs once (an image's warm-up) or is only compiled (the image): the
/// production settings, so what it compiles loads into the production engine, with no epoch
/// ticker, so its stores never time out. `functions` is Cranelift's incremental cache.
pub(crate) fn image_engine(functions: std::sync::Arc<dyn wasmtime::CacheStore>) -> Result<Engine> {
    let mut config = base_config(Strategy::Cranelift);
    config
        .enable_incremental_compilation(functions)
        .map_err(|e| Error::Wasm(format!("{e:#}")))?;
    Engine::new(&config).map_err(|e| Error::Wasm(format!("{e:#}")))
}

/// An engine with the given compiler and otherwise the same settings (epochs, wasm stack, CoW),
/// allocating on demand. `Strategy::Winch` is the fast baseline compiler used for Go snippets
/// (about 10x faster to compile than Cranelift, somewhat slower code); it does not support the
/// exception-handling proposal, which only CPython needs, so that is on for Cranelift only.
pub fn build_engine_with(strategy: Strategy) -> Result<Engine> {
    let engine = Engine::new(&base_config(strategy)).map_err(|e| Error::Wasm(format!("{e:#}")))?;
    start_epoch_ticker(&engine);
    Ok(engine)
}

fn base_config(strategy: Strategy) -> Config {
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
    config
}

fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasmbox-epoch".into())
        .spawn(move || epoch::tick(weak))
        .expect("spawning the epoch ticker thread");
}

/// Epoch ticks for a deadline, rounded up, plus one so a deadline never fires early.
pub fn deadline_ticks(timeout: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    (timeout.as_nanos().div_ceil(tick) as u64).saturating_add(1)
}
