//! Putting an instance that has run back into the state of one of its image that never ran, in
//! place: what lets a one-shot's instance serve the next one-shot instead of being torn down and
//! made again (each of those makes and frees the few hundred private pages a turn writes).
//!
//! Every page either instance made its own since it was made gets the pristine one's bytes;
//! every other page of both is still the image's (or zero), so the memories are then equal byte
//! for byte. The mutable globals get the pristine values. Nothing else of an instance can change
//! at run time for images that pass `globals::state_beyond_memory`, which the caller checks.

use std::ops::Range;

use wasmtime::{AsContext, AsContextMut, Instance, Memory, Mutability};

use super::GlobalValue;
use super::capture::{exported_globals, rewritten};
use super::pages::{byte_range, count, scan_pages};
use crate::engine::{EngineError as Error, Result};

/// What [`Pristine::reset`] needs of the instance it copies from, read once.
#[derive(Debug)]
pub struct Pristine {
    /// Its memory's size in bytes: an instance whose memory grew is not reset.
    bytes: usize,
    /// Host pages it made its own (none, unless it was readied by writing some).
    own: Vec<Range<u64>>,
    /// Its mutable globals, by index, ascending.
    globals: Vec<(u32, GlobalValue)>,
}

/// What a reset did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// The instance holds the pristine state; this many host pages were copied.
    Done { pages: u64 },
    /// Its memory grew: left as it was.
    Grew,
    /// It made more than the caller's limit of pages its own: left as it was (copying them
    /// back would cost more than a new instance).
    TooMany { pages: u64 },
}

impl Pristine {
    /// Reads what a reset from `instance` needs. `instance` must be one of an image built by
    /// `engine::preinit::build` (its globals exported), and must not run afterwards.
    pub fn of(mut store: impl AsContextMut, instance: &Instance, memory: Memory) -> Result<Self> {
        rewritten(&mut store, instance, memory, "reset instances")?;
        let mut globals = Vec::new();
        for (index, global) in exported_globals(&mut store, instance) {
            if global.ty(&store).mutability() != Mutability::Var {
                continue;
            }
            let value = GlobalValue::from_val(&global.get(&mut store)).ok_or_else(|| {
                Error::Wasm(format!(
                    "cannot reset instances: global {index} holds a reference"
                ))
            })?;
            globals.push((index, value));
        }
        let mem = memory.data(&store);
        let own = scan_pages(mem)
            .map_err(|e| Error::Wasm(format!("cannot reset instances: the page map: {e}")))?
            .0;
        Ok(Self {
            bytes: mem.len(),
            own,
            globals,
        })
    }

    /// Makes `to`, an instance of the same image as `from` (the instance this was read from),
    /// hold `from`'s state again, unless its memory grew or it made more than `most` host pages
    /// its own. A `to` whose globals are not `from`'s is an error, and is left as it was.
    pub fn reset(
        &self,
        from: impl AsContext,
        from_memory: Memory,
        mut to: impl AsContextMut,
        to_instance: &Instance,
        to_memory: Memory,
        most: u64,
    ) -> Result<Reset> {
        let mut to = to.as_context_mut();
        if to_memory.data_size(&to) != self.bytes {
            return Ok(Reset::Grew);
        }
        let globals: Vec<_> = exported_globals(&mut to, to_instance)
            .into_iter()
            .filter(|(_, g)| g.ty(&to).mutability() == Mutability::Var)
            .collect();
        let ours: Vec<u32> = globals.iter().map(|g| g.0).collect();
        let theirs: Vec<u32> = self.globals.iter().map(|g| g.0).collect();
        if ours != theirs {
            return Err(Error::Wasm(format!(
                "cannot reset: mutable globals {ours:?}, the pristine instance's {theirs:?}"
            )));
        }
        let own = scan_pages(to_memory.data(&to))
            .map_err(|e| Error::Wasm(format!("cannot reset: the page map: {e}")))?
            .0;
        let pages = count(&own);
        if pages > most {
            return Ok(Reset::TooMany { pages });
        }
        let runs = union(&own, &self.own);
        let source = from_memory.data(&from);
        let target = to_memory.data_mut(&mut to);
        if source.len() != self.bytes {
            return Err(Error::Wasm(
                "cannot reset: the pristine instance's memory grew".into(),
            ));
        }
        let len = self.bytes as u64;
        for run in &runs {
            let span = byte_range(run, len);
            target[span.clone()].copy_from_slice(&source[span]);
        }
        for ((index, global), (_, value)) in globals.iter().zip(&self.globals) {
            global
                .set(&mut to, value.to_val())
                .map_err(|e| Error::Wasm(format!("resetting global {index}: {e:#}")))?;
        }
        Ok(Reset::Done {
            pages: count(&runs),
        })
    }
}

/// The pages in either of two ascending, disjoint lists of runs, as one such list.
fn union(a: &[Range<u64>], b: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut all: Vec<Range<u64>> = a.iter().chain(b).cloned().collect();
    all.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(all.len());
    for r in all {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::fixture::{Guest, P, image, setups};

    use crate::testing::Rng;

    /// [`Pristine::reset`] of `used` from `pristine`.
    fn reset(p: &Pristine, pristine: &Guest, used: &mut Guest, most: u64) -> Result<Reset> {
        p.reset(
            &pristine.store,
            pristine.memory,
            &mut used.store,
            &used.instance,
            used.memory,
            most,
        )
    }

    #[test]
    fn union_merges_overlapping_and_touching_runs() {
        assert_eq!(
            union(&[0..2, 5..8], &[1..3, 8..9, 20..21]),
            vec![0..3, 5..9, 20..21]
        );
        assert_eq!(union(&[], &[4..5, 7..8]), vec![4..5, 7..8]);
    }

    /// The property recycling rests on: after any sequence of writes (over the image's data,
    /// past it, zeros, the same page again), global changes and resets, a reset instance's
    /// memory and globals are a never-run instance's, byte for byte, measured afresh.
    #[test]
    fn a_reset_instance_equals_a_fresh_one_after_random_runs() {
        for (label, module) in setups(image()) {
            let mut pristine = Guest::new(&module);
            let p = Pristine::of(&mut pristine.store, &pristine.instance, pristine.memory).unwrap();
            let mut fresh = Guest::new(&module);
            let mut used = Guest::new(&module);
            let size = used.memory.data_size(&used.store) as u64;
            let mut rng = Rng(0x5eed_0001 ^ label.len() as u64);
            for round in 0..40 {
                for _ in 0..rng.below(30) {
                    let at = (rng.below(size / 4) * 4) as i32;
                    let value = match rng.below(3) {
                        0 => 0,
                        _ => rng.next() as i32,
                    };
                    used.store(at, value);
                }
                if rng.below(2) == 0 {
                    used.call::<_, ()>(
                        "set",
                        (rng.next() as i32, rng.next() as i64, rng.next() as f64),
                    );
                }
                // Reads map the image's pages (or the zero page) without making them own.
                for _ in 0..rng.below(10) {
                    let _ = used.load((rng.below(size / 4) * 4) as i32);
                }
                let r = reset(&p, &pristine, &mut used, u64::MAX).unwrap();
                assert!(matches!(r, Reset::Done { .. }), "{label} {round}: {r:?}");
                assert!(
                    used.memory.data(&used.store) == fresh.memory.data(&fresh.store),
                    "{label}, round {round}: memory differs from a fresh instance's"
                );
                let globals = |g: &mut Guest| {
                    (
                        g.call::<_, i32>("g", ()),
                        g.call::<_, i64>("h", ()),
                        g.call::<_, f64>("f", ()).to_bits(),
                    )
                };
                assert_eq!(globals(&mut used), globals(&mut fresh), "{label} {round}");
            }
            // The pristine instance itself never changed.
            assert!(pristine.memory.data(&pristine.store) == fresh.memory.data(&fresh.store));
        }
    }

    #[test]
    fn a_grown_memory_or_too_many_pages_are_left_alone() {
        let (_, module) = setups(image()).remove(0);
        let mut pristine = Guest::new(&module);
        let p = Pristine::of(&mut pristine.store, &pristine.instance, pristine.memory).unwrap();
        let mut used = Guest::new(&module);
        for i in 0..8 {
            used.store(20 * P + i * P, 1);
        }
        let r = reset(&p, &pristine, &mut used, 4);
        assert!(
            matches!(r, Ok(Reset::TooMany { pages }) if pages >= 8),
            "{r:?}"
        );
        assert_eq!(used.load(20 * P), 1, "left as it was");
        assert_eq!(used.call::<_, i32>("grow", 1), 4);
        let r = reset(&p, &pristine, &mut used, u64::MAX);
        assert_eq!(r.unwrap(), Reset::Grew);
    }
}
