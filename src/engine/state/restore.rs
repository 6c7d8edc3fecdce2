//! Putting a state into a fresh instance of its image: from the state's own bytes (a restore)
//! or straight from another instance's memory (a fork's copy). Everything is checked against
//! the instance before anything changes, so a state that does not fit leaves the instance as
//! it was.

use std::ops::Range;

use wasmtime::{AsContextMut, Instance, Memory, Mutability};

use super::InstanceState;
use super::capture::{capture_with, exported_globals, rewritten};
use super::pages::{Scan, byte_range, is_zero, without};
use crate::engine::{EngineError as Error, Result};

/// From this many bytes, a restore writes pages on two threads.
const PARALLEL_BYTES: usize = 2 << 20;

/// Makes a fresh instance of the image `state` was captured from hold that state: grows its
/// memory to the saved size, writes the saved pages and sets the globals. The instance must be
/// as instantiated, not run (its memory may have been grown, up to the state's size, and its
/// pages faulted in: what a fresh instance reads is unchanged); pages not in the state are
/// left as they are. `ahead` names host pages already made the instance's own (faulted in
/// ahead of time), which need no fault here; a page named wrongly only faults in later.
pub fn restore(
    store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
    state: &InstanceState,
    ahead: &[Range<u64>],
) -> Result<()> {
    restore_from(store, instance, memory, state, Pages::Saved, ahead)
}

fn restore_from(
    mut store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
    state: &InstanceState,
    pages: Pages,
    ahead: &[Range<u64>],
) -> Result<()> {
    let mut store = store.as_context_mut();
    let other = |what: String| {
        Error::Wasm(format!(
            "cannot restore: {what}; the state is from another image"
        ))
    };

    // Everything checked before anything changes.
    rewritten(&mut store, instance, memory, "restore")?;
    let globals = exported_globals(&mut store, instance)
        .into_iter()
        .filter(|(_, g)| g.ty(&store).mutability() == Mutability::Var)
        .collect::<Vec<_>>();
    let theirs: Vec<u32> = state.globals.iter().map(|g| g.0).collect();
    let ours: Vec<u32> = globals.iter().map(|g| g.0).collect();
    if theirs != ours {
        return Err(other(format!(
            "it has mutable globals {theirs:?}, this instance {ours:?}"
        )));
    }
    for ((index, global), (_, value)) in globals.iter().zip(&state.globals) {
        let ty = global.ty(&store);
        if !value.fits(ty.content()) {
            return Err(other(format!(
                "global {index} is a {} here, the state holds {value:?}",
                ty.content()
            )));
        }
    }
    if memory.page_size(&store) != state.page_size {
        return Err(other(format!(
            "its memory has {}-byte pages, this instance's {}",
            state.page_size,
            memory.page_size(&store)
        )));
    }
    let current = memory.size(&store);
    let minimum = memory.ty(&store).minimum();
    if state.memory_pages < minimum {
        return Err(other(format!(
            "its memory ({} pages) is smaller than a fresh instance's ({minimum})",
            state.memory_pages
        )));
    }
    // Grown ahead, not run: a spare (`lang::spare`) is grown towards the size it expects.
    if current > state.memory_pages {
        return Err(Error::Wasm(format!(
            "cannot restore into a memory of {current} pages, larger than the state's {}",
            state.memory_pages
        )));
    }

    if state.memory_pages > current {
        memory
            .grow(&mut store, state.memory_pages - current)
            .map_err(|e| {
                Error::Wasm(format!(
                    "restoring needs {} MiB of memory: {e:#}",
                    state.memory_bytes() >> 20
                ))
            })?;
    }
    let mem = memory.data_mut(&mut store);
    let len = mem.len() as u64;
    if len != state.memory_bytes() {
        return Err(Error::Wasm(format!(
            "restoring: the memory is {len} bytes, not the state's {}",
            state.memory_bytes()
        )));
    }
    for run in &state.zeros {
        for page in run.clone() {
            let page = &mut mem[byte_range(&(page..page + 1), len)];
            if !is_zero(page) {
                page.fill(0);
            }
        }
    }
    let spans: Vec<Range<usize>> = state.runs.iter().map(|r| byte_range(r, len)).collect();
    let absent: Vec<Range<usize>> = without(&state.runs, ahead)
        .iter()
        .map(|r| byte_range(r, len))
        .collect();
    let mut at = 0;
    let sources: Vec<usize> = spans
        .iter()
        .map(|s| {
            at += s.len();
            at - s.len()
        })
        .collect();
    let source = |i: usize, span: &Range<usize>| match pages {
        Pages::Saved => &state.data[sources[i]..sources[i] + span.len()],
        Pages::Memory(from) => &from[span.clone()],
    };
    // Half the pages on a second thread when there are many: filling a few MiB is one core's
    // page faults and memory bandwidth, and the host's other cores wait on this restore.
    let split = if at >= PARALLEL_BYTES {
        sources.partition_point(|&o| o < at / 2)
    } else {
        spans.len()
    };
    let boundary = spans.get(split).map_or(mem.len(), |s| s.start);
    let (lo, hi) = mem.split_at_mut(boundary);
    let (lo_absent, hi_absent) = absent.split_at(absent.partition_point(|r| r.start < boundary));
    let hi_absent: Vec<Range<usize>> = hi_absent
        .iter()
        .map(|r| r.start - boundary..r.end - boundary)
        .collect();
    let fill = |part: &mut [u8], base: usize, range: Range<usize>, absent: &[Range<usize>]| {
        // SAFETY: the runs lie within `part`, part of the memory's accessible part (its length
        // was checked), borrowed mutably here; a write population faults the pages in as the
        // writes below would.
        unsafe {
            crate::platform::memory::populate(
                absent,
                part.as_mut_ptr(),
                part.len(),
                crate::platform::memory::Populate::Write,
            );
        }
        for i in range {
            let span = &spans[i];
            part[span.start - base..span.end - base].copy_from_slice(source(i, span));
        }
    };
    if split < spans.len() {
        std::thread::scope(|scope| {
            scope.spawn(|| fill(hi, boundary, split..spans.len(), &hi_absent));
            fill(lo, 0, 0..split, lo_absent);
        });
    } else {
        fill(lo, 0, 0..split, lo_absent);
    }

    for ((index, global), (_, value)) in globals.iter().zip(&state.globals) {
        global
            .set(&mut store, value.to_val())
            .map_err(|e| Error::Wasm(format!("restoring global {index}: {e:#}")))?;
    }
    Ok(())
}

/// Makes `to`, a fresh instance of the image `from` was made from, hold `from`'s state: as
/// [`capture()`](super::capture()) then [`restore`], but each page goes straight from one memory
/// to the other, so a fork copies its parent's pages once and allocates no buffer for them.
/// Returns what was copied.
pub fn copy(
    mut from: impl AsContextMut,
    from_instance: &Instance,
    from_memory: Memory,
    to: impl AsContextMut,
    to_instance: &Instance,
    to_memory: Memory,
    ahead: &[Range<u64>],
) -> Result<Copied> {
    let mut mapped = Vec::new();
    let plan = capture_with(
        &mut from,
        from_instance,
        from_memory,
        Scan::Pagemap,
        Some(&mut mapped),
    )?;
    let from = from.as_context();
    restore_from(
        to,
        to_instance,
        to_memory,
        &plan,
        Pages::Memory(from_memory.data(&from)),
        ahead,
    )?;
    Ok(Copied {
        state: plan,
        mapped,
    })
}

/// What [`copy`] copied.
#[derive(Debug)]
pub struct Copied {
    /// The state, its pages named but not held.
    pub state: InstanceState,
    /// The image's pages the source had mapped (read, not written), as runs of host page
    /// indices: what the copy's first turns are likely to read.
    pub mapped: Vec<Range<u64>>,
}

/// Where a restore's page bytes come from.
#[derive(Clone, Copy)]
enum Pages<'a> {
    /// The state's own `data`.
    Saved,
    /// Another instance's memory, at the same offsets (the state only names its pages).
    Memory(&'a [u8]),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::capture;
    use crate::engine::state::fixture::{GUEST, Guest, P, build_image, image, setups, word};
    use crate::engine::state::pages::PAGE;
    use crate::engine::state::restore;
    use wasmtime::Module;

    #[test]
    fn restore_brings_back_memory_and_globals() {
        for (label, module) in setups(image()) {
            let mut a = Guest::new(&module);
            assert_eq!(a.load(4096), 0x5eed, "{label}: the warm-up is in the image");
            a.store(8, 111); // over the image's data
            a.store(4096, 0); // zero over the image's data
            a.store(20 * P, 222); // a page the image left zero
            a.call::<_, ()>("set", (42, -7i64, 1.5f64));
            let state = a.capture(Scan::Pagemap).unwrap();

            // Twice from the same state: a fork's children.
            for _ in 0..2 {
                let mut b = Guest::new(&module);
                assert_eq!(b.call::<_, i32>("g", ()), 1, "{label}: fresh");
                b.restore(&state).unwrap();
                assert_eq!(b.load(8), 111, "{label}");
                assert_eq!(b.load(4096), 0, "{label}: zeroed over the image");
                assert_eq!(b.load(20 * P), 222, "{label}");
                assert_eq!(b.load(0), word(b"image"), "{label}: untouched image data");
                assert_eq!(
                    b.load(16 * P),
                    word(b"image"),
                    "{label}: untouched image data"
                );
                assert_eq!(b.call::<_, i32>("g", ()), 42, "{label}");
                assert_eq!(b.call::<_, i64>("h", ()), -7, "{label}");
                assert_eq!(b.call::<_, f64>("f", ()), 1.5, "{label}");
                assert_eq!(b.call::<_, i32>("k", ()), 7, "{label}");
            }
        }
    }

    #[test]
    fn copy_gives_what_capture_then_restore_gives() {
        for (label, module) in setups(image()) {
            let mut a = Guest::new(&module);
            a.store(8, 111);
            a.store(4096, 0);
            a.store(20 * P, 222);
            assert_eq!(a.call::<_, i32>("grow", 1), 4, "{label}");
            a.store(70 * P, 333); // in the grown page
            a.call::<_, ()>("set", (42, -7i64, 1.5f64));
            let mut b = Guest::new(&module);
            a.copy_to(&mut b, &[]).unwrap();
            let mut c = Guest::new(&module);
            c.restore(&a.capture(Scan::Pagemap).unwrap()).unwrap();
            assert_eq!(
                b.memory.data(&b.store),
                c.memory.data(&c.store),
                "{label}: the same memory"
            );
            assert_eq!(b.call::<_, i32>("g", ()), 42, "{label}");
            assert_eq!(b.call::<_, i64>("h", ()), -7, "{label}");
            assert_eq!(b.call::<_, f64>("f", ()), 1.5, "{label}");
            assert_eq!(b.load(4096), 0, "{label}: zeroed over the image");
            // The copy is the child's own from then on.
            b.store(8, 5);
            assert_eq!(a.load(8), 111, "{label}");
        }
    }

    #[test]
    fn grown_memory_round_trips() {
        for (label, module) in setups(image()) {
            let mut a = Guest::new(&module);
            assert_eq!(a.call::<_, i32>("grow", 3), 4, "{label}");
            a.store(4 * 65536 + 8, 77); // the first grown page (host page 64)
            a.store(7 * 65536 - 4, 78); // the last one (host page 111)
            a.load(5 * 65536); // read, not written
            let state = a.capture(Scan::Pagemap).unwrap();
            assert_eq!(state.memory_pages(), 7, "{label}");
            assert_eq!(state.runs, [64..65, 111..112], "{label}");
            assert!(
                state.zeros.iter().all(|r| r.end <= 64),
                "{label}: grown zero pages are what growing gives: {state:?}"
            );

            let mut b = Guest::new(&module);
            b.restore(&state).unwrap();
            assert_eq!(b.memory.size(&b.store), 7, "{label}");
            assert_eq!(b.load(4 * 65536 + 8), 77, "{label}");
            assert_eq!(b.load(7 * 65536 - 4), 78, "{label}");
            assert_eq!(b.load(5 * 65536), 0, "{label}");
        }
    }

    #[test]
    fn restore_refuses_instances_it_cannot_make_whole() {
        let (_, module) = setups(image()).remove(0);
        let mut a = Guest::new(&module);
        a.store(8, 1);
        let state = a.capture(Scan::Pagemap).unwrap();

        let mut grown = Guest::new(&module);
        grown.call::<_, i32>("grow", 1);
        let err = grown.restore(&state).unwrap_err().to_string();
        assert!(err.contains("larger than the state's"), "{err}");

        let mut smaller = state.clone();
        smaller.memory_pages = 2;
        let err = Guest::new(&module)
            .restore(&smaller)
            .unwrap_err()
            .to_string();
        assert!(err.contains("another image"), "{err}");

        let other = build_image(
            r#"(module
                (memory (export "memory") 4)
                (global (mut i32) (i32.const 0))
                (global (mut i64) (i64.const 0))
                (global (mut f32) (f32.const 0))
                (func (export "warm")))"#,
        );
        let (_, other) = setups(&other).remove(0);
        let err = Guest::new(&other).restore(&state).unwrap_err().to_string();
        assert!(err.contains("another image"), "{err}");

        let mut fewer = state.clone();
        fewer.globals.pop();
        let err = Guest::new(&module).restore(&fewer).unwrap_err().to_string();
        assert!(err.contains("another image"), "{err}");

        let mut c = Guest::new(&module);
        let stray = Memory::new(&mut c.store, wasmtime::MemoryType::new(4, None)).unwrap();
        let err = capture(&mut c.store, &c.instance, stray)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the instance's memory 0"), "{err}");
        let err = restore(&mut c.store, &c.instance, stray, &state, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the instance's memory 0"), "{err}");

        // A module the rewrite has not seen: its globals would be missed.
        let plain = Module::new(module.engine(), GUEST).unwrap();
        let mut p = Guest::new(&plain);
        let err = p.capture(Scan::Pagemap).unwrap_err().to_string();
        assert!(err.contains("does not export its globals"), "{err}");
        let err = p.restore(&state).unwrap_err().to_string();
        assert!(err.contains("does not export its globals"), "{err}");
    }

    /// What a spare is (`lang::spare`): grown ahead and some of its pages faulted in, not run.
    #[test]
    fn copy_into_an_instance_made_ahead_gives_the_same() {
        for (label, module) in setups(image()) {
            let mut a = Guest::new(&module);
            a.store(8, 111);
            a.store(4096, 0);
            assert_eq!(a.call::<_, i32>("grow", 2), 4, "{label}");
            a.store(70 * P, 333);
            let mut fresh = Guest::new(&module);
            a.copy_to(&mut fresh, &[]).unwrap();
            let mut ahead = Guest::new(&module);
            ahead.memory.grow(&mut ahead.store, 1).unwrap();
            let mem = ahead.memory.data_mut(&mut ahead.store);
            // SAFETY: the memory's accessible part; a write population keeps contents.
            unsafe {
                crate::platform::memory::populate(
                    &[0..2 * PAGE, 16 * PAGE..17 * PAGE, 66 * PAGE..68 * PAGE],
                    mem.as_mut_ptr(),
                    mem.len(),
                    crate::platform::memory::Populate::Write,
                );
            }
            // Page 70 was not made ahead: named wrongly, it faults in as it is written.
            let plan = a
                .copy_to(&mut ahead, &[0..2, 16..17, 66..68, 70..71])
                .unwrap();
            assert_eq!(
                ahead.memory.data(&ahead.store),
                fresh.memory.data(&fresh.store),
                "{label}"
            );
            assert!(plan.state.saved_pages() >= 3, "{label}: {:?}", plan.state);
            // Grown past the state: refused, not silently bigger.
            let mut bigger = Guest::new(&module);
            bigger.memory.grow(&mut bigger.store, 3).unwrap();
            let err = a.copy_to(&mut bigger, &[]).unwrap_err().to_string();
            assert!(err.contains("larger than the state's"), "{label}: {err}");
        }
    }
}
