//! Taking an instance's state: its mutable globals, and the pages its memory holds that a
//! fresh instance of its image would not. `pages` finds the candidates; this decides which are
//! kept (their bytes, as zero, or left to what growing gives) and refuses an instance whose
//! state cannot be taken whole.

use std::collections::BTreeMap;
use std::ops::Range;

use wasmtime::{AsContextMut, Global, Instance, Memory, Mutability};

use super::pages::{PAGE, Scan, byte_range, count, is_zero, push_page, scan_pages};
use super::{GlobalValue, InstanceState};
use crate::engine::globals::{MEMORY_EXPORT, parse_global_export_name};
use crate::engine::{EngineError as Error, Result};

/// Captures `instance`'s state: `memory` (its only linear memory) and its exported
/// `wasmbox:global:N` globals. A global holding a reference cannot be captured. Without the
/// pagemap (not Linux, or refused) every page is read and each one not zero is saved: slower
/// and bigger, but as exact.
pub fn capture(
    store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
) -> Result<InstanceState> {
    capture_with(store, instance, memory, Scan::Pagemap, None)
}

/// [`capture`] as it is without the pagemap, every page read: the fallback, taken on purpose
/// (the `state` bench measures it against the pagemap's way).
pub fn capture_full(
    store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
) -> Result<InstanceState> {
    capture_with(store, instance, memory, Scan::Full, None)
}

/// With `mapped` given, the pages to save are found and named but their bytes are not copied
/// (the state's `data` stays empty): [`copy`](super::copy) reads them from the memory itself.
/// The image's pages the instance has mapped go to `mapped`.
pub(super) fn capture_with(
    mut store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
    scan: Scan,
    mapped: Option<&mut Vec<Range<u64>>>,
) -> Result<InstanceState> {
    let keep = mapped.is_none();
    let mut store = store.as_context_mut();
    rewritten(&mut store, instance, memory, "capture")?;
    let mut globals = Vec::new();
    for (index, global) in exported_globals(&mut store, instance) {
        if global.ty(&store).mutability() == Mutability::Const {
            continue;
        }
        let value = GlobalValue::from_val(&global.get(&mut store)).ok_or_else(|| {
            Error::Wasm(format!("cannot capture: global {index} holds a reference"))
        })?;
        globals.push((index, value));
    }

    let page_size = memory.page_size(&store);
    let memory_pages = memory.size(&store);
    let initial = memory.ty(&store).minimum().saturating_mul(page_size);
    let mem = memory.data(&store);
    let pages = mem.len().div_ceil(PAGE) as u64;
    let private = match scan {
        Scan::Pagemap => scan_pages(mem)
            .inspect_err(|e| {
                tracing::warn!("capturing an instance without the pagemap (reading all): {e}")
            })
            .ok()
            .map(|(own, image)| {
                if let Some(m) = mapped {
                    *m = image;
                }
                own
            }),
        Scan::Full => None,
    };
    let mut state = InstanceState {
        page_size,
        memory_pages,
        runs: Vec::new(),
        data: Vec::new(),
        zeros: Vec::new(),
        globals,
        clock_ns: 0,
        meta: BTreeMap::new(),
    };
    if let (Some(runs), false) = (&private, keep) {
        // A copy takes every private page as it is: testing which are zero would read them all
        // once more, and a zero page copied is as exact as one zeroed.
        state.runs = runs.clone();
        return Ok(state);
    }
    let candidates = private.unwrap_or_else(|| std::iter::once(0..pages).collect());
    if keep {
        state.data.reserve(count(&candidates) as usize * PAGE);
    }
    let len = mem.len() as u64;
    for page in candidates.into_iter().flatten() {
        let bytes = &mem[byte_range(&(page..page + 1), len)];
        if !is_zero(bytes) {
            push_page(&mut state.runs, page);
            if keep {
                state.data.extend_from_slice(bytes);
            }
        } else if page * (PAGE as u64) < initial {
            push_page(&mut state.zeros, page);
        }
        // A zero page past the image's initial size is what growing a fresh instance gives.
    }
    Ok(state)
}

/// Refuses an instance of a module `engine::globals` has not rewritten (its mutable globals,
/// unexported, would be left out), and a memory that is not the instance's memory 0.
pub(super) fn rewritten(
    mut store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
    verb: &str,
) -> Result<()> {
    let Some(ours) = instance.get_memory(&mut store, MEMORY_EXPORT) else {
        return Err(Error::Wasm(format!(
            "cannot {verb}: the instance's module does not export its globals (not an image \
             built by engine::preinit::build)"
        )));
    };
    if ours.data_ptr(&store) != memory.data_ptr(&store) {
        return Err(Error::Wasm(format!(
            "cannot {verb}: the memory given is not the instance's memory 0"
        )));
    }
    Ok(())
}

/// The instance's `wasmbox:global:N` exports, by index.
pub(super) fn exported_globals(
    mut store: impl AsContextMut,
    instance: &Instance,
) -> Vec<(u32, Global)> {
    let mut globals: Vec<(u32, Global)> = instance
        .exports(&mut store)
        .filter_map(|e| Some((parse_global_export_name(e.name())?, e.into_global()?)))
        .collect();
    globals.sort_by_key(|g| g.0);
    globals
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::fixture::{Guest, P, image, setups};
    use wasmtime::{Engine, Module};

    #[test]
    fn the_image_exports_its_mutable_globals_and_memory() {
        let engine = Engine::default();
        let module = Module::new(&engine, image()).unwrap();
        let names: Vec<&str> = module.exports().map(|e| e.name()).collect();
        for name in [
            "wasmbox:global:0",
            "wasmbox:global:1",
            "wasmbox:global:2",
            "wasmbox:memory",
        ] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        assert!(!names.contains(&"wasmbox:global:3"), "$k is immutable");
    }

    #[test]
    fn only_pages_the_instance_wrote_are_saved() {
        for (label, module) in setups(image()) {
            let mut a = Guest::new(&module);
            // Reads: the image's data, a zero page within the image, a page it left zero.
            for at in [0, 2 * P, 16 * P, 40 * P] {
                a.load(at);
            }
            let fresh = a.capture(Scan::Pagemap).unwrap();
            assert_eq!(
                fresh.saved_pages(),
                0,
                "{label}: a fresh instance differs in nothing"
            );
            assert_eq!(fresh.saved_bytes(), 0, "{label}");

            a.store(8, 1); // page 0
            a.store(30 * P, 5); // page 30
            a.store(31 * P, 0); // page 31: written, but still zero
            let state = a.capture(Scan::Pagemap).unwrap();
            assert_eq!(state.runs, [0..1, 30..31], "{label}");
            assert_eq!(state.saved_pages(), 2, "{label}");
            assert_eq!(state.saved_bytes(), 2 * PAGE, "{label}");
            assert!(
                state.zero_pages() <= 2,
                "{label}: at most the zero pages read or written (31, 40): {state:?}"
            );
            assert_eq!(
                &state.data[..12],
                b"image pa\x01\0\0\0",
                "{label}: this instance's page"
            );

            // Without the pagemap every page is read: those not zero are saved, and the zero
            // pages (the image might hold data there) are listed.
            let full = a.capture(Scan::Full).unwrap();
            assert_eq!(full.runs, [0..2, 16..17, 30..31], "{label}");
            assert_eq!(full.zero_pages(), 64 - 4, "{label}");
            let mut b = Guest::new(&module);
            b.store(4096, 9); // a page the state has as the image's, changed here
            b.restore(&full).unwrap();
            assert_eq!((b.load(8), b.load(4096), b.load(30 * P)), (1, 0x5eed, 5));
        }
    }

    #[test]
    fn a_global_holding_a_reference_cannot_be_captured() {
        // wizer refuses such modules, so the rewrite alone.
        let wasm = wat::parse_str(
            r#"(module
                (memory (export "memory") 1)
                (global $n (mut i32) (i32.const 0))
                (global $r (mut externref) (ref.null extern)))"#,
        )
        .unwrap();
        let wasm = crate::engine::globals::export_globals(&wasm).unwrap();
        let (_, module) = setups(&wasm).remove(0);
        let err = Guest::new(&module)
            .capture(Scan::Pagemap)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot capture: global 1 holds a reference"),
            "{err}"
        );
    }
}
