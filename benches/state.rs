//! What an instance's state costs to capture, save and restore (`engine::state`), run with
//! `cargo bench --bench state`: a 64 MiB memory with 1 MiB written (pseudo-random bytes, which
//! compress as little as anything), the written pages together and one in 16, for instances
//! loaded from a compiled file and from the pooling allocator's slots. Measured: the pagemap
//! read alone, the capture by the pagemap and by reading every page, encoding and decoding the
//! file, a fresh instance, and the restore into one.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use wasmbox::engine::EngineError;
use wasmbox::engine::state::{self, InstanceState, StateKey};
use wasmtime::{Config, Engine, Instance, Memory, Module, Store};

/// Host pages: what the state saves.
const PAGE: usize = 4096;

/// 1,024 wasm pages (64 MiB), all written by the warm-up, so the image holds every page.
const GUEST: &str = r#"(module
    (memory (export "memory") 1024)
    (global $sp (mut i32) (i32.const 0))
    (func (export "warm")
        (memory.fill (i32.const 0) (i32.const 0xab) (i32.const 0x4000000))
        (global.set $sp (i32.const 1)))
    (func (export "load") (param i32) (result i32) (i32.load (local.get 0))))"#;

/// Host pages the instance writes: 1 MiB.
const WRITTEN: usize = 256;

fn engine_err(e: wasmtime::Error) -> EngineError {
    EngineError::Wasm(format!("{e:#}"))
}

/// The guest snapshotted after its `warm` ran, as images are.
fn build_image() -> Vec<u8> {
    let engine = Engine::default();
    let wasm = wat::parse_str(GUEST).unwrap();
    wasmbox::engine::preinit::build(&engine, &wasm, "bench image", |module| {
        let mut store = Store::new(module.engine(), ());
        let instance = Instance::new(&mut store, module, &[]).map_err(engine_err)?;
        instance
            .get_typed_func::<(), ()>(&mut store, "warm")
            .and_then(|f| f.call(&mut store, ()))
            .map_err(engine_err)?;
        Ok::<_, EngineError>((store, instance))
    })
    .unwrap()
}

/// The ways instances get their memory: on demand from a compiled file (as cached images are
/// loaded), and from the pooling allocator's slots, the image in memory (a memfd).
fn setups(wasm: &[u8]) -> Vec<(&'static str, Module)> {
    let mut config = Config::new();
    config.memory_init_cow(true);
    let engine = Engine::new(&config).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let compiled = Module::new(&engine, wasm).unwrap().serialize().unwrap();
    std::fs::write(file.path(), compiled).unwrap();
    // SAFETY: a file this bench just wrote from the same engine.
    let from_file = unsafe { Module::deserialize_file(&engine, file.path()) }.unwrap();

    let mut pool = wasmtime::PoolingAllocationConfig::new();
    pool.total_core_instances(8)
        .total_memories(8)
        .total_tables(8)
        .max_memory_size(64 << 20);
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    let pooled = Engine::new(&config).unwrap();
    vec![
        ("from_file", from_file),
        ("pooled", Module::new(&pooled, wasm).unwrap()),
    ]
}

struct Guest {
    store: Store<()>,
    instance: Instance,
    memory: Memory,
}

impl Guest {
    fn new(module: &Module) -> Self {
        let mut store = Store::new(module.engine(), ());
        let instance = Instance::new(&mut store, module, &[]).unwrap();
        let memory = instance.get_memory(&mut store, "memory").unwrap();
        Self {
            store,
            instance,
            memory,
        }
    }

    fn load(&mut self, at: usize) -> i32 {
        self.instance
            .get_typed_func::<i32, i32>(&mut self.store, "load")
            .unwrap()
            .call(&mut self.store, at as i32)
            .unwrap()
    }

    fn capture(&mut self) -> InstanceState {
        state::capture(&mut self.store, &self.instance, self.memory).unwrap()
    }
}

/// An instance with [`WRITTEN`] pages written, one every `stride` pages: pseudo-random bytes
/// (xorshift), each page's index at byte 8.
fn written(module: &Module, stride: usize) -> Guest {
    let mut a = Guest::new(module);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mem = a.memory.data_mut(&mut a.store);
    for i in 0..WRITTEN {
        let page = &mut mem[i * stride * PAGE..][..PAGE];
        for w in page.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        page[8..12].copy_from_slice(&(i as i32).to_le_bytes());
    }
    a
}

fn state(c: &mut Criterion) {
    let image = build_image();
    let key = StateKey::new("bench image", "bench");
    for (label, module) in setups(&image) {
        for (layout, stride) in [("contiguous", 1), ("every_16th_page", 16)] {
            let mut a = written(&module, stride);
            let saved = a.capture();
            assert_eq!(saved.saved_pages(), WRITTEN as u64, "the pages written");
            // Every page the image holds is not zero, so the full scan saves them all.
            let full = state::capture_full(&mut a.store, &a.instance, a.memory).unwrap();
            let bytes = saved.encode(&key);
            eprintln!(
                "{label}, {layout}: {} pages saved ({} by the full scan), a {} KiB file",
                saved.saved_pages(),
                full.saved_pages(),
                bytes.len() >> 10
            );

            let mut g = c.benchmark_group(format!("state/{label}/{layout}"));
            g.sample_size(20);
            g.bench_function("pagemap", |b| {
                let mem = a.memory.data(&a.store);
                b.iter(|| wasmbox::engine::prefault::pagemap(mem.as_ptr(), mem.len() / PAGE))
            });
            g.bench_function("capture", |b| b.iter_with_large_drop(|| a.capture()));
            g.bench_function("capture_full_scan", |b| {
                b.iter_with_large_drop(|| {
                    state::capture_full(&mut a.store, &a.instance, a.memory).unwrap()
                })
            });
            g.bench_function("encode", |b| b.iter_with_large_drop(|| saved.encode(&key)));
            g.bench_function("decode", |b| {
                b.iter_with_large_drop(|| InstanceState::decode(&bytes, &key).unwrap())
            });
            g.bench_function("instantiate", |b| {
                b.iter_batched(|| (), |()| Guest::new(&module), BatchSize::PerIteration)
            });
            g.bench_function("restore", |b| {
                b.iter_batched(
                    || Guest::new(&module),
                    |mut fresh| {
                        state::restore(
                            &mut fresh.store,
                            &fresh.instance,
                            fresh.memory,
                            &saved,
                            &[],
                        )
                        .unwrap();
                        fresh
                    },
                    BatchSize::PerIteration,
                )
            });
            g.finish();

            let mut back = Guest::new(&module);
            let decoded = InstanceState::decode(&bytes, &key).unwrap();
            state::restore(&mut back.store, &back.instance, back.memory, &decoded, &[]).unwrap();
            let last = (WRITTEN - 1) * stride * PAGE + 8;
            assert_eq!(
                back.load(last),
                WRITTEN as i32 - 1,
                "the last page restored"
            );
        }
    }
}

criterion_group!(benches, state);
criterion_main!(benches);
