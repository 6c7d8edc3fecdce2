//! Pre-initialised images: a module instantiated once, warmed up (e.g. Python with pandas
//! imported), and snapshotted with wasmtime-wizer into a new module whose memory already holds
//! that state. Instances of the image start where the warm-up ended, copy-on-write.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use wasmtime::{Engine, Instance, Module, Store, Val};
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

use super::cache::with_progress;
use super::{EngineError as Error, Result};

/// What [`build`] makes of wizer's output, in every image cache key: a change to it must not
/// reuse images built before. 2: mutable globals exported (`engine::globals`).
pub const IMAGE_FORMAT: &str = "wasmbox-image-format-2";

/// [`build`] on an engine of the production settings, and the snapshot compiled for the
/// production engine (a `.cwasm`, as `Engine::precompile_module` writes).
///
/// The image and the instrumented module the warm-up ran hold the same function bodies (wizer
/// changes data, globals and exports), so the warm-up's compile fills Cranelift's incremental
/// cache and the image's takes each function from it: CPython is compiled once, not twice.
pub fn build_compiled<T: Send + 'static, E: From<Error>>(
    wasm: &[u8],
    label: &str,
    warm: impl FnOnce(&Module) -> Result<(Store<T>, Instance), E>,
) -> Result<Vec<u8>, E> {
    let (compiled, reuse) = compile_once(wasm, label, warm)?;
    tracing::info!(
        "{label}: {} functions compiled for the warm-up ({} MiB kept); the image took {} of its {} \
         from them",
        reuse.warm_up,
        reuse.kept >> 20,
        reuse.reused,
        reuse.image,
    );
    Ok(compiled)
}

/// How much of an image's compile the warm-up's saved, in distinct functions (counting lookups
/// would not do: identical bodies compiled in parallel each miss, or one hits the other's entry).
#[derive(Debug)]
struct Reuse {
    warm_up: usize,
    image: usize,
    /// The image's functions found among the warm-up's.
    reused: usize,
    /// Bytes the cache held for the image's compile.
    kept: usize,
}

fn compile_once<T: Send + 'static, E: From<Error>>(
    wasm: &[u8],
    label: &str,
    warm: impl FnOnce(&Module) -> Result<(Store<T>, Instance), E>,
) -> Result<(Vec<u8>, Reuse), E> {
    let functions = Arc::new(Functions::default());
    let engine = super::image_engine(functions.clone())?;
    let image = build(&engine, wasm, label, warm)?;
    let warm_up = functions.take_asked();
    let kept = functions.bytes();
    let compiled = with_progress(label, image.len(), || engine.precompile_module(&image))
        .map_err(|e| Error::Wasm(format!("compiling {label}: {e:#}")))?;
    let asked = functions.take_asked();
    let reuse = Reuse {
        warm_up: warm_up.len(),
        image: asked.len(),
        reused: asked.intersection(&warm_up).count(),
        kept,
    };
    Ok((compiled, reuse))
}

/// Cranelift's incremental cache for one image build, in memory: it lives as long as the build.
#[derive(Debug, Default)]
struct Functions {
    compiled: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    /// The keys looked up since the last [`Functions::take_asked`].
    asked: Mutex<HashSet<Vec<u8>>>,
}

impl Functions {
    fn bytes(&self) -> usize {
        let compiled = self.compiled.lock().unwrap();
        compiled.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    fn take_asked(&self) -> HashSet<Vec<u8>> {
        std::mem::take(&mut self.asked.lock().unwrap())
    }
}

impl wasmtime::CacheStore for Functions {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.asked.lock().unwrap().insert(key.to_vec());
        self.compiled
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        self.compiled.lock().unwrap().insert(key.to_vec(), value);
        true
    }
}

/// Instruments `wasm`, lets `warm` instantiate and run it on `engine`, and returns the snapshot
/// with its mutable globals exported, so sessions' state can be captured and restored.
///
/// `warm` gets the instrumented module and must return the store and instance after the
/// warm-up. It must use the production imports and the production preopen layout: the guest's
/// libc bakes its preopen table into the snapshot.
pub fn build<T: Send + 'static, E: From<Error>>(
    engine: &Engine,
    wasm: &[u8],
    label: &str,
    warm: impl FnOnce(&Module) -> Result<(Store<T>, Instance), E>,
) -> Result<Vec<u8>, E> {
    let wizer = Wizer::new();
    let (cx, instrumented) = wizer
        .instrument(wasm)
        .map_err(|e| Error::Wasm(format!("instrumenting {label}: {e:#}")))?;
    let module = with_progress(
        &format!("{label} (warm-up build)"),
        instrumented.len(),
        || Module::new(engine, &instrumented),
    )
    .map_err(|e| Error::Wasm(format!("compiling instrumented {label}: {e:#}")))?;
    drop(instrumented);
    super::progress::stage(&format!("{label}: warming up"));
    let (mut store, instance) = warm(&module)?;
    tracing::info!("{label}: warm-up done; taking the snapshot");
    super::progress::stage(&format!("{label}: warm-up done; taking the snapshot"));
    // The snapshot reads memories and globals without running wasm: a current-thread runtime
    // is enough to drive wizer's async API.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| Error::Wasm(format!("snapshot runtime: {e}")))?;
    rt.block_on(wizer.snapshot(
        &cx,
        &mut Live {
            store: &mut store,
            instance,
        },
    ))
    .map_err(|e| Error::Wasm(format!("snapshotting {label}: {e:#}")))
    .and_then(|image| super::globals::export_globals(&image))
    .map_err(E::from)
}

/// The warmed instance as wizer reads it. wizer has this too, behind a feature that turns on
/// wasmtime's cache, threads and WIT parser; these few lines keep them out of the build.
struct Live<'a, T: 'static> {
    store: &'a mut Store<T>,
    instance: Instance,
}

impl<T: Send> InstanceState for Live<'_, T> {
    async fn global_get(&mut self, name: &str, _: ValType) -> SnapshotVal {
        let global = self
            .instance
            .get_global(&mut *self.store, name)
            .expect("wizer names an exported global");
        match global.get(&mut *self.store) {
            Val::I32(x) => SnapshotVal::I32(x),
            Val::I64(x) => SnapshotVal::I64(x),
            Val::F32(x) => SnapshotVal::F32(x),
            Val::F64(x) => SnapshotVal::F64(x),
            Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            v => panic!("a global wizer cannot snapshot: {v:?}"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let memory = self
            .instance
            .get_memory(&mut *self.store, name)
            .expect("wizer names an exported memory");
        contents(memory.data(&*self.store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST: &str = r#"(module
        (memory (export "memory") 1)
        (global $n (mut i32) (i32.const 0))
        (func (export "warm")
            (global.set $n (i32.const 7))
            (i32.store (i32.const 64) (i32.const 42))
            (drop (memory.grow (i32.const 1))))
        (func (export "n") (result i32) (global.get $n))
        (func (export "at") (param i32) (result i32) (i32.load (local.get 0))))"#;

    fn warmed(module: &Module) -> Result<(Store<()>, Instance)> {
        let err = |e: wasmtime::Error| Error::Wasm(format!("{e:#}"));
        let mut store = Store::new(module.engine(), ());
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = Instance::new(&mut store, module, &[]).map_err(err)?;
        instance
            .get_typed_func::<(), ()>(&mut store, "warm")
            .and_then(|f| f.call(&mut store, ()))
            .map_err(err)?;
        Ok((store, instance))
    }

    #[test]
    fn the_image_takes_every_function_from_the_warm_up_and_loads_into_production_engines() {
        let wasm = wat::parse_str(GUEST).unwrap();
        let (compiled, reuse) = compile_once(&wasm, "test image", warmed).unwrap();
        // Nearly all the warm-up's functions, not all: Cranelift's key for a body can differ
        // between two compiles of it (one of these 11 in some runs).
        assert!(reuse.warm_up > 0, "{reuse:?}");
        assert!(reuse.reused * 10 >= reuse.warm_up * 9, "{reuse:?}");
        assert!(reuse.reused <= reuse.image, "{reuse:?}");
        for engine in [
            super::super::build_engine(0, 64 << 20).unwrap(),
            super::super::build_engine(2, 64 << 20).unwrap(),
        ] {
            // SAFETY: bytes `Engine::precompile_module` just wrote, for these settings.
            let module = unsafe { Module::deserialize(&engine, &compiled) }
                .expect("a production engine loads the image");
            let mut store = Store::new(&engine, ());
            store.set_epoch_deadline(u64::MAX / 2);
            let instance = Instance::new(&mut store, &module, &[]).unwrap();
            let n = instance.get_typed_func::<(), i32>(&mut store, "n").unwrap();
            let at = instance
                .get_typed_func::<i32, i32>(&mut store, "at")
                .unwrap();
            assert_eq!(n.call(&mut store, ()).unwrap(), 7, "the warm-up's globals");
            assert_eq!(at.call(&mut store, 64).unwrap(), 42, "the warm-up's memory");
        }
    }
}
