//! The guest the state tests share: a small image with data, mutable globals of each kind and
//! an immutable one, built as real images are (wizer, then the globals exported), and the two
//! ways instances get their memory.

use std::ops::Range;
use std::sync::OnceLock;

use wasmtime::{Config, Engine, Instance, Memory, Module, Store, WasmParams, WasmResults};

use super::pages::{PAGE, Scan};
use super::{Copied, InstanceState, capture, capture_full, copy, restore};
use crate::engine::{EngineError as Error, Result};

/// 4 wasm pages, 64 host pages. After the warm-up the image holds data in host pages 0, 1
/// and 16; the rest of the initial memory is zero.
pub(super) const GUEST: &str = r#"(module
    (memory (export "memory") 4)
    (global $g (mut i32) (i32.const 0))
    (global $h (mut i64) (i64.const 0))
    (global $f (mut f64) (f64.const 0))
    (global $k i32 (i32.const 7))
    (data (i32.const 0) "image page 0")
    (data (i32.const 65536) "image page 16")
    (func (export "warm")
        (i32.store (i32.const 4096) (i32.const 0x5eed))
        (global.set $g (i32.const 1))
        (global.set $h (i64.const -1)))
    (func (export "store") (param i32 i32) (i32.store (local.get 0) (local.get 1)))
    (func (export "load") (param i32) (result i32) (i32.load (local.get 0)))
    (func (export "set") (param i32 i64 f64)
        (global.set $g (local.get 0))
        (global.set $h (local.get 1))
        (global.set $f (local.get 2)))
    (func (export "g") (result i32) (global.get $g))
    (func (export "h") (result i64) (global.get $h))
    (func (export "f") (result f64) (global.get $f))
    (func (export "k") (result i32) (global.get $k))
    (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0))))"#;

pub(super) const P: i32 = PAGE as i32;

fn engine_err(e: wasmtime::Error) -> Error {
    Error::Wasm(format!("{e:#}"))
}

/// `wat` snapshotted after its export `warm` ran, as images are.
pub(super) fn build_image(wat: &str) -> Vec<u8> {
    let engine = Engine::default();
    let wasm = wat::parse_str(wat).unwrap();
    crate::engine::preinit::build(&engine, &wasm, "test image", |module| {
        let mut store = Store::new(module.engine(), ());
        let instance = Instance::new(&mut store, module, &[]).map_err(engine_err)?;
        instance
            .get_typed_func::<(), ()>(&mut store, "warm")
            .and_then(|f| f.call(&mut store, ()))
            .map_err(engine_err)?;
        Ok::<_, Error>((store, instance))
    })
    .unwrap()
}

pub(super) fn image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(GUEST))
}

/// The ways instances get their memory: on demand from a compiled file (as cached images
/// are loaded), and from the pooling allocator's slots, the image in memory (a memfd).
pub(super) fn setups(wasm: &[u8]) -> Vec<(&'static str, Module)> {
    let mut config = Config::new();
    config.memory_init_cow(true);
    let engine = Engine::new(&config).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let compiled = Module::new(&engine, wasm).unwrap().serialize().unwrap();
    std::fs::write(file.path(), compiled).unwrap();
    // SAFETY: a file this test just wrote from the same engine.
    let from_file = unsafe { Module::deserialize_file(&engine, file.path()) }.unwrap();

    let mut pool = wasmtime::PoolingAllocationConfig::new();
    pool.total_core_instances(8)
        .total_memories(8)
        .total_tables(8)
        .max_memory_size(64 << 20);
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    let pooled = Engine::new(&config).unwrap();
    vec![
        ("on demand, from a file", from_file),
        ("pooled, in memory", Module::new(&pooled, wasm).unwrap()),
    ]
}

pub(super) struct Guest {
    pub(super) store: Store<()>,
    pub(super) instance: Instance,
    pub(super) memory: Memory,
}

impl Guest {
    pub(super) fn new(module: &Module) -> Self {
        let mut store = Store::new(module.engine(), ());
        let instance = Instance::new(&mut store, module, &[]).unwrap();
        let memory = instance.get_memory(&mut store, "memory").unwrap();
        Self {
            store,
            instance,
            memory,
        }
    }

    pub(super) fn call<P: WasmParams, R: WasmResults>(&mut self, name: &str, params: P) -> R {
        self.instance
            .get_typed_func::<P, R>(&mut self.store, name)
            .unwrap()
            .call(&mut self.store, params)
            .unwrap()
    }

    pub(super) fn load(&mut self, at: i32) -> i32 {
        self.call("load", at)
    }

    pub(super) fn store(&mut self, at: i32, value: i32) {
        self.call::<_, ()>("store", (at, value))
    }

    pub(super) fn capture(&mut self, scan: Scan) -> Result<InstanceState> {
        match scan {
            Scan::Pagemap => capture(&mut self.store, &self.instance, self.memory),
            Scan::Full => capture_full(&mut self.store, &self.instance, self.memory),
        }
    }

    pub(super) fn restore(&mut self, state: &InstanceState) -> Result<()> {
        restore(&mut self.store, &self.instance, self.memory, state, &[])
    }

    /// [`copy`] from this instance into `to`.
    pub(super) fn copy_to(&mut self, to: &mut Guest, ahead: &[Range<u64>]) -> Result<Copied> {
        copy(
            &mut self.store,
            &self.instance,
            self.memory,
            &mut to.store,
            &to.instance,
            to.memory,
            ahead,
        )
    }
}

pub(super) fn word(text: &[u8]) -> i32 {
    i32::from_le_bytes(text[..4].try_into().unwrap())
}
