//! Calibration: what it takes to ready an instance of the image without running wasm. At load,
//! throwaway instances report where the random generators' states sit in linear memory and which
//! pages small first turns touch; every later instance then gets fresh generator states and
//! those pages written directly, a third of a warm-up turn's CPU.

use wasmtime::{Instance, Store};

use super::turn::{call, run_turn};
use super::{Error, Python, Result};
use crate::engine::prefault::PageSet;
use crate::lang::guest::{Guest, GuestState};
use crate::lang::image_runtime::Shared;
use crate::lang::live::exported_memory;

/// Measures what [`FastReady`] needs on throwaway instances: where the random generators'
/// states are, and which pages small first turns map after the polish. Without an image (or
/// on failure) instances are readied by a warm-up turn.
pub(super) fn calibrate(shared: &Shared<Python>) -> Result<FastReady> {
    if !shared.image {
        return Err(Error::wasm(
            "no pre-initialised image: a warm-up turn readies each",
        ));
    }
    let fast = measure_fast_ready(shared)?;
    tracing::debug!(
        "python: instances readied without a turn: {} generator(s) reseeded, {} pages copied \
         and {} mapped ahead",
        fast.rngs.len(),
        fast.pages.pages(),
        fast.pages.read_pages()
    );
    Ok(fast)
}

fn measure_fast_ready(shared: &Shared<Python>) -> Result<FastReady> {
    let (polish_turn, preimport) = (&shared.flavour.polish_turn, &shared.flavour.preimport);
    let fail = |what: &str| Error::wasm(format!("calibration: {what}"));
    // Where the generators are: their addresses (`id`) and states, from the guest.
    let (mut guest, instance) = shared.instantiate_in(None)?;
    run_turn(&mut guest.store, &instance, &call(("script", RNG_PROBE))).map_err(|e| {
        fail(&format!(
            "the generator probe failed: {e:#}: {}",
            guest.take_stderr()
        ))
    })?;
    let report = String::from_utf8_lossy(&guest.take_stdout()).into_owned();
    let memory = exported_memory(&mut guest, &instance)?;
    let rngs = report
        .lines()
        .map(|line| RngState::locate(memory.data(&guest.store), line))
        .collect::<std::result::Result<Vec<_>, Unlocated>>()
        .map_err(|e| fail(&e.to_string()))?;
    drop(guest);
    // Which pages: those a pooled instance writes, polished and then given a small turn
    // (each sample on its own instance). The polish moves the heap on, so a turn after it
    // writes pages that one on a fresh instance would not. Of the pages only read, those
    // the polish maps are left to it (see engine/prefault.rs); the few more that the turn
    // reads are mapped ahead.
    let mut pages = PageSet::default();
    for sample in sample_turns(preimport) {
        let (mut guest, instance) = shared.instantiate_in(None)?;
        let memory = exported_memory(&mut guest, &instance)?;
        let measure = |guest: &Guest| {
            PageSet::measure_memory(&guest.store, memory, true)
                .map_err(|e| fail(&format!("reading the page map: {e}")))
        };
        run_turn(&mut guest.store, &instance, polish_turn)
            .map_err(|e| fail(&format!("the polish turn failed: {e:#}")))?;
        let polished = measure(&guest)?;
        // As a call runs it: asking for images, so the look for figures is measured too.
        let turn = call(("run", sample, false, 1));
        run_turn(&mut guest.store, &instance, &turn).map_err(|e| {
            fail(&format!(
                "the sample turn {sample:?} failed: {e:#}: {}",
                guest.take_stderr()
            ))
        })?;
        pages.merge(measure(&guest)?.reads_beyond(&polished));
    }
    for r in &rngs {
        pages.add(r.index.min(r.state)..r.index.max(r.state + MT_WORDS * 4) + 4);
    }
    Ok(FastReady { pages, rngs })
}

/// Small first turns whose pages every instance gets ahead: a `print`, and the common first
/// steps with the pre-imported numpy and pandas (a new array's allocation alone writes ~17
/// pages past the heap's end).
fn sample_turns(preimport: &[String]) -> Vec<&'static str> {
    let has = |m: &str| preimport.iter().any(|p| p == m);
    let mut turns = vec!["print(1+1)"];
    if has("numpy") {
        turns.push("import numpy as np\nprint(np.arange(1000).sum())");
    }
    if has("pandas") {
        turns.push("import pandas as pd\nprint(pd.__version__)");
    }
    turns
}

/// Words of an MT19937 state (CPython's `random` and numpy's legacy `RandomState` both use it).
const MT_WORDS: usize = 624;

/// Prints, per generator the image holds, a line: its kind, its object's address, whether a
/// cached value would repeat in every instance, its index and its 624 state words.
const RNG_PROBE: &str = include_str!("rng_probe.py");

/// Where one generator's state is in linear memory (the same in every instance of an image).
#[derive(Clone, Copy, Debug)]
struct RngState {
    /// The 624 words.
    state: usize,
    /// The position in them (624: draw a fresh block first).
    index: usize,
}

/// Why a generator the probe reported was not found in memory (`kind`: which generator).
#[derive(Debug, thiserror::Error)]
enum Unlocated {
    #[error("{kind}: unreadable probe output ({error})")]
    Unreadable {
        kind: String,
        error: std::num::ParseIntError,
    },
    #[error("{0}: short probe output")]
    Short(String),
    #[error("{kind}: {words} state words, not {MT_WORDS}")]
    Words { kind: String, words: usize },
    #[error("{0}: a cached value would repeat in every instance")]
    Cached(String),
    #[error("{kind}: object address {addr} is outside memory")]
    Outside { kind: String, addr: usize },
    #[error("{0}: state not found in its object")]
    NotFound(String),
    #[error("unknown generator {0}")]
    UnknownGenerator(String),
    #[error("{0}: its index is not where expected")]
    Index(String),
}

impl RngState {
    /// Finds a generator reported by [`RNG_PROBE`] in `memory`: its words within its object,
    /// and its index where the runtime's layout puts it (CPython's `RandomObject` has it
    /// before the words, numpy's `mt19937_state` after), both checked against the report.
    fn locate(memory: &[u8], line: &str) -> std::result::Result<Self, Unlocated> {
        let mut it = line.split_whitespace();
        let kind = it.next().unwrap_or_default().to_string();
        let nums = it
            .map(|w| w.parse::<u64>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|error| Unlocated::Unreadable {
                kind: kind.clone(),
                error,
            })?;
        let [addr, cached, pos, words @ ..] = nums.as_slice() else {
            return Err(Unlocated::Short(kind));
        };
        if words.len() != MT_WORDS {
            return Err(Unlocated::Words {
                kind,
                words: words.len(),
            });
        }
        if *cached != 0 {
            return Err(Unlocated::Cached(kind));
        }
        let bytes: Vec<u8> = words
            .iter()
            .flat_map(|w| (*w as u32).to_le_bytes())
            .collect();
        let addr = *addr as usize;
        // The words sit near the object's head (after its header and a few fields).
        let window = memory
            .get(addr..(addr + 512 + bytes.len()).min(memory.len()))
            .ok_or_else(|| Unlocated::Outside {
                kind: kind.clone(),
                addr,
            })?;
        let at = window
            .windows(bytes.len())
            .position(|w| w == bytes)
            .ok_or_else(|| Unlocated::NotFound(kind.clone()))?;
        let state = addr + at;
        let index = match kind.as_str() {
            "random" => state.checked_sub(4),
            "numpy" => Some(state + bytes.len()),
            _ => None,
        }
        .ok_or_else(|| Unlocated::UnknownGenerator(kind.clone()))?;
        let word = memory
            .get(index..index + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        if word != Some(*pos as u32) {
            return Err(Unlocated::Index(kind));
        }
        Ok(Self { state, index })
    }
}

/// Readies an instance of the image without running wasm: the pages first turns write copied
/// and those they read mapped ([`PageSet`]), and fresh random states written into the generators (a snapshot
/// would otherwise give every sandbox the image's sequences). A third of a warm-up turn's CPU.
pub struct FastReady {
    pub(super) pages: PageSet,
    rngs: Vec<RngState>,
}

impl FastReady {
    pub(super) fn ready(
        &self,
        store: &mut Store<GuestState>,
        instance: &Instance,
    ) -> wasmtime::Result<()> {
        let memory = instance
            .get_memory(&mut *store, "memory")
            .ok_or_else(|| wasmtime::format_err!("the module exports no memory"))?;
        self.pages.populate_memory(&*store, memory);
        let data = memory.data_mut(&mut *store);
        let outside = || wasmtime::format_err!("a generator's state is outside the memory");
        for r in &self.rngs {
            let words = data
                .get_mut(r.state..r.state + MT_WORDS * 4)
                .ok_or_else(outside)?;
            getrandom::fill(words)
                .map_err(|e| wasmtime::format_err!("no entropy for the generators: {e}"))?;
            // As CPython's and numpy's seeding do: the top bit set, so the state is never zero.
            words[3] |= 0x80;
            data.get_mut(r.index..r.index + 4)
                .ok_or_else(outside)?
                .copy_from_slice(&(MT_WORDS as u32).to_le_bytes());
        }
        Ok(())
    }
}
