//! Pre-initialised images: a module instantiated once, warmed up (e.g. Python with pandas
//! imported), and snapshotted with wasmtime-wizer into a new module whose memory already holds
//! that state. Instances of the image start where the warm-up ended, copy-on-write.

use wasmtime::{Engine, Instance, Module, Store, Val};
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

use super::cache::with_progress;
use super::{EngineError as Error, Result};

/// What [`build`] makes of wizer's output, in every image cache key: a change to it must not
/// reuse images built before. 2: mutable globals exported (`engine::globals`).
pub const IMAGE_FORMAT: &str = "wasmbox-image-format-2";

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
