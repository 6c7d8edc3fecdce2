//! Pre-initialised images: a module instantiated once, warmed up (e.g. Python with pandas
//! imported), and snapshotted with wasmtime-wizer into a new module whose memory already holds
//! that state. Instances of the image start where the warm-up ended, copy-on-write.

use wasmtime::{Engine, Instance, Module, Store};
use wasmtime_wizer::{WasmtimeWizer, Wizer};

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
        &mut WasmtimeWizer {
            store: &mut store,
            instance,
        },
    ))
    .map_err(|e| Error::Wasm(format!("snapshotting {label}: {e:#}")))
    .and_then(|image| super::globals::export_globals(&image))
    .map_err(E::from)
}
