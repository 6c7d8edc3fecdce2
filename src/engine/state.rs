//! An instance's interpreter state, captured and restored into a fresh instance of its image:
//! what pausing a session to disk, forking and snapshotting it are made of (#24).
//!
//! The state is the linear memory and the mutable globals (tables do not change at run time;
//! wizer assumes the same), which images export for this (`engine::globals`). Instances start
//! copy-on-write from the image, so only the pages an instance made private can differ from a
//! fresh one's: `/proc/self/pagemap` names them, and only those are saved. A restore writes
//! them over a fresh instance of the same image.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::ops::Range;

use sha2::{Digest, Sha256};
use wasmtime::{AsContextMut, Global, Instance, Memory, Mutability, V128, Val, ValType};

use super::globals::{MEMORY_EXPORT, parse_global_export_name};
use super::prefault::{PM_FILE, PM_PRESENT, PM_SWAP};
use super::{EngineError as Error, Result};

/// Host pages: the unit of copy-on-write, and of what is saved.
const PAGE: usize = 4096;

/// The largest memory a state may describe: a 32-bit linear memory's.
const MAX_MEMORY: u64 = 1 << 32;

/// Room for everything but the pages in a decoded body (globals, metadata, run tables).
const BODY_SLACK: u64 = 64 << 20;

/// The longest metadata key or value.
const MAX_META: usize = 1 << 20;

const MAGIC: &[u8; 8] = b"WBXSTATE";
const FORMAT_VERSION: u32 = 1;
/// Fast over ratio: pausing is on a session's path, and most of a heap compresses anyway.
const ZSTD_LEVEL: i32 = 1;
const CHECKSUM: usize = 32;
/// From this many bytes, a restore writes pages on two threads.
const PARALLEL_BYTES: usize = 2 << 20;

/// A mutable global's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalValue {
    I32(i32),
    I64(i64),
    /// Bits, so a NaN round-trips exactly.
    F32(u32),
    F64(u64),
    V128(u128),
}

impl GlobalValue {
    fn from_val(val: &Val) -> Option<Self> {
        Some(match *val {
            Val::I32(v) => Self::I32(v),
            Val::I64(v) => Self::I64(v),
            Val::F32(v) => Self::F32(v),
            Val::F64(v) => Self::F64(v),
            Val::V128(v) => Self::V128(v.as_u128()),
            _ => return None,
        })
    }

    fn to_val(self) -> Val {
        match self {
            Self::I32(v) => Val::I32(v),
            Self::I64(v) => Val::I64(v),
            Self::F32(v) => Val::F32(v),
            Self::F64(v) => Val::F64(v),
            Self::V128(v) => Val::V128(V128::from(v)),
        }
    }

    fn fits(self, ty: &ValType) -> bool {
        matches!(
            (self, ty),
            (Self::I32(_), ValType::I32)
                | (Self::I64(_), ValType::I64)
                | (Self::F32(_), ValType::F32)
                | (Self::F64(_), ValType::F64)
                | (Self::V128(_), ValType::V128)
        )
    }
}

/// What an instance holds that its image does not.
#[derive(Clone, PartialEq, Eq)]
pub struct InstanceState {
    page_size: u64,
    memory_pages: u64,
    /// Saved host pages as runs of page indices; their bytes back to back in `data`.
    runs: Vec<Range<u64>>,
    data: Vec<u8>,
    /// Host pages, within the image's initial memory, that read as zero here. Nothing to copy,
    /// but the image may hold data there: a restore zeroes those that do not read as zero.
    zeros: Vec<Range<u64>>,
    /// By index in the global index space, ascending.
    globals: Vec<(u32, GlobalValue)>,
    /// A monotonic-clock reading (nanoseconds) the caller took with the state, carried as is.
    pub clock_ns: u64,
    /// Free-form facts for the caller, carried as is. Small: a key or value over 1 MiB would
    /// make the file unreadable.
    pub meta: BTreeMap<String, String>,
}

impl std::fmt::Debug for InstanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceState")
            .field("memory_pages", &self.memory_pages)
            .field("saved_pages", &self.saved_pages())
            .field("zero_pages", &self.zero_pages())
            .field("globals", &self.globals)
            .field("clock_ns", &self.clock_ns)
            .field("meta", &self.meta)
            .finish()
    }
}

fn count(runs: &[Range<u64>]) -> u64 {
    runs.iter().map(|r| r.end - r.start).sum()
}

/// Appends host page `page` to `runs`, extending the last run when contiguous.
fn push_page(runs: &mut Vec<Range<u64>>, page: u64) {
    match runs.last_mut() {
        Some(r) if r.end == page => r.end += 1,
        _ => runs.push(page..page + 1),
    }
}

/// The byte range of a run of host pages in a memory of `len` bytes (the last page may be
/// short under custom page sizes).
fn byte_range(run: &Range<u64>, len: u64) -> Range<usize> {
    let start = run.start * PAGE as u64;
    let end = (run.end * PAGE as u64).min(len);
    start as usize..end as usize
}

fn is_zero(bytes: &[u8]) -> bool {
    // No early exit: OR-ing whole words vectorises, and most pages tested are zero.
    let (words, tail) = bytes.split_at(bytes.len() / 8 * 8);
    words.chunks_exact(8).fold(0u64, |acc, w| {
        acc | u64::from_ne_bytes(w.try_into().expect("8 bytes"))
    }) == 0
        && tail.iter().all(|&b| b == 0)
}

impl InstanceState {
    /// The linear memory's size, in wasm pages.
    pub fn memory_pages(&self) -> u64 {
        self.memory_pages
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_pages * self.page_size
    }

    /// Host pages whose bytes are saved.
    pub fn saved_pages(&self) -> u64 {
        count(&self.runs)
    }

    /// Host pages saved as zero-filled (no bytes).
    pub fn zero_pages(&self) -> u64 {
        count(&self.zeros)
    }

    /// The saved host pages, as runs of page indices.
    pub fn runs(&self) -> &[Range<u64>] {
        &self.runs
    }

    pub fn saved_bytes(&self) -> usize {
        self.data.len()
    }

    pub fn globals(&self) -> &[(u32, GlobalValue)] {
        &self.globals
    }
}

/// Where the pages to save are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// The pages `/proc/self/pagemap` says are private; every page without it.
    Pagemap,
    /// Every page: slow (reads all of memory) but needs nothing from the kernel.
    #[cfg_attr(not(test), allow(dead_code))]
    Full,
}

/// Whether a pagemap entry is a page this instance made its own: a private page in RAM, or
/// swapped out (a private page the kernel wrote to swap, so written; a migrating page counts
/// too, and file pages, the image's, never). Pages not mapped at all are the image's or zero.
/// Non-exclusive private pages (the shared zero page; a page shared with a forked child) are
/// included: their contents decide.
fn private(entry: u64) -> bool {
    entry & (PM_PRESENT | PM_SWAP) != 0 && entry & PM_FILE == 0
}

/// Host pages as runs of page indices.
type Runs = Vec<Range<u64>>;

/// Byte runs as [`Runs`].
fn page_runs(bytes: Vec<Range<usize>>) -> Runs {
    bytes
        .into_iter()
        .map(|r| (r.start / PAGE) as u64..r.end.div_ceil(PAGE) as u64)
        .collect()
}

/// The host pages of `mem` that are this process's own ([`private`]), and those of the image
/// it has mapped, as runs of page indices: from one `PAGEMAP_SCAN`, or on a kernel without it
/// from the pagemap's entries (which leaves the mapped ones out).
fn scan_pages(mem: &[u8]) -> std::io::Result<(Runs, Runs)> {
    match super::prefault::scan(mem.as_ptr(), mem.len()) {
        Ok(s) => Ok((page_runs(s.own), page_runs(s.mapped))),
        Err(e) => {
            tracing::debug!("PAGEMAP_SCAN failed ({e}); reading the pagemap");
            let entries = super::prefault::pagemap(mem.as_ptr(), mem.len().div_ceil(PAGE))?;
            let mut runs = Vec::new();
            for (page, &e) in entries.iter().enumerate() {
                if private(e) {
                    push_page(&mut runs, page as u64);
                }
            }
            Ok((runs, Vec::new()))
        }
    }
}

/// `runs` without the pages in `have` (both ascending and disjoint).
fn without(runs: &[Range<u64>], have: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut h = have.iter().peekable();
    for run in runs {
        let mut start = run.start;
        while start < run.end {
            while h.peek().is_some_and(|x| x.end <= start) {
                h.next();
            }
            match h.peek() {
                Some(x) if x.start <= start => start = x.end.min(run.end),
                Some(x) if x.start < run.end => {
                    out.push(start..x.start);
                    start = x.end.min(run.end);
                }
                _ => {
                    out.push(start..run.end);
                    start = run.end;
                }
            }
        }
    }
    out
}

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

/// Makes `to`, a fresh instance of the image `from` was made from, hold `from`'s state: as
/// [`capture`] then [`restore`], but each page goes straight from one memory to the other, so
/// a fork copies its parent's pages once and allocates no buffer for them. Returns what was
/// copied.
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

/// With `mapped` given, the pages to save are found and named but their bytes are not copied
/// (the state's `data` stays empty): [`copy`] reads them from the memory itself. The image's
/// pages the instance has mapped go to `mapped`.
fn capture_with(
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
fn rewritten(
    mut store: impl AsContextMut,
    instance: &Instance,
    memory: Memory,
    verb: &str,
) -> Result<()> {
    let Some(ours) = instance.get_memory(&mut store, MEMORY_EXPORT) else {
        return Err(Error::Wasm(format!(
            "cannot {verb}: the instance's module does not export its globals (not an image \
             built by engine::snapshot::build)"
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
fn exported_globals(mut store: impl AsContextMut, instance: &Instance) -> Vec<(u32, Global)> {
    let mut globals: Vec<(u32, Global)> = instance
        .exports(&mut store)
        .filter_map(|e| Some((parse_global_export_name(e.name())?, e.into_global()?)))
        .collect();
    globals.sort_by_key(|g| g.0);
    globals
}

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
        #[cfg(target_os = "linux")]
        // SAFETY: the runs lie within `part`, part of the memory's accessible part (its length
        // was checked), borrowed mutably here; POPULATE_WRITE faults the pages in as the writes
        // below would.
        unsafe {
            super::prefault::advise(
                absent,
                part.as_mut_ptr(),
                part.len(),
                libc::MADV_POPULATE_WRITE,
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

/// What a state must have been captured from: the image (its module hash), the wasmtime that
/// ran it and the language.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateKey {
    pub image: String,
    pub wasmtime: String,
    pub language: String,
}

impl StateKey {
    /// A key under this build's wasmtime.
    pub fn new(image: impl Into<String>, language: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            wasmtime: super::cache::wasmtime_version().to_string(),
            language: language.into(),
        }
    }
}

impl std::fmt::Display for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} image {} under wasmtime {}",
            self.language, self.image, self.wasmtime
        )
    }
}

/// Why a state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("not a wasmbox state file")]
    NotAState,
    #[error(
        "state file format {found} is not supported (this build reads format {FORMAT_VERSION})"
    )]
    Version { found: u32 },
    #[error("the state file is corrupted or truncated (its checksum does not match)")]
    Corrupted,
    #[error("the state is from another image: it was saved from {found}, and this is {expected}")]
    OtherImage {
        found: Box<StateKey>,
        expected: Box<StateKey>,
    },
    #[error("malformed state file: {0}")]
    Malformed(String),
}

fn malformed(what: impl Into<String>) -> StateError {
    StateError::Malformed(what.into())
}

/// Little-endian fields written into the compressed body.
struct Out<W: Write>(W);

impl<W: Write> Out<W> {
    fn bytes(&mut self, b: &[u8]) {
        self.0.write_all(b).expect("writing to memory");
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(u32::try_from(s.len()).expect("a string under 4 GiB"));
        self.bytes(s.as_bytes());
    }
    fn runs(&mut self, runs: &[Range<u64>]) {
        self.u32(u32::try_from(runs.len()).expect("runs of a 4 GiB memory"));
        for r in runs {
            self.u64(r.start);
            self.u64(r.end - r.start);
        }
    }
}

/// Fields read back from the body; a short read is a malformed body.
struct In<R: Read>(R);

impl<R: Read> In<R> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], StateError> {
        let mut b = [0; N];
        self.0.read_exact(&mut b).map_err(body_error)?;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, StateError> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, StateError> {
        self.array().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, StateError> {
        self.array().map(u64::from_le_bytes)
    }
    /// `n` bytes, allocated as they arrive (not from the declared length).
    fn vec(&mut self, n: u64) -> Result<Vec<u8>, StateError> {
        let mut v = Vec::with_capacity(n.min(16 << 20) as usize);
        (&mut self.0)
            .take(n)
            .read_to_end(&mut v)
            .map_err(body_error)?;
        if v.len() as u64 != n {
            return Err(malformed("the body ends early"));
        }
        Ok(v)
    }
    fn str(&mut self, max: usize) -> Result<String, StateError> {
        let n = self.u32()?;
        if n as usize > max {
            return Err(malformed(format!("a {n}-byte string")));
        }
        String::from_utf8(self.vec(n.into())?).map_err(|_| malformed("a string is not UTF-8"))
    }
    /// Runs of host pages, ascending and apart, within `pages`.
    fn runs(&mut self, pages: u64) -> Result<Vec<Range<u64>>, StateError> {
        let n = self.u32()?;
        let mut runs = Vec::with_capacity(n.min(1 << 16) as usize);
        let mut end = 0;
        for _ in 0..n {
            let start = self.u64()?;
            let len = self.u64()?;
            if start < end || len == 0 || len > pages || start > pages - len {
                return Err(malformed("page runs out of order or past the memory"));
            }
            end = start + len;
            runs.push(start..end);
        }
        Ok(runs)
    }
}

fn body_error(e: std::io::Error) -> StateError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => malformed("the body ends early"),
        _ => malformed(format!("the body does not decompress: {e}")),
    }
}

impl InstanceState {
    /// The state as a file: magic, format version and `key`, then the body compressed with
    /// zstd, then SHA-256 of all that.
    pub fn encode(&self, key: &StateKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() / 2 + 4096);
        out.extend_from_slice(MAGIC);
        let mut header = Out(&mut out);
        header.u32(FORMAT_VERSION);
        header.str(&key.image);
        header.str(&key.wasmtime);
        header.str(&key.language);
        let mut z = zstd::stream::write::Encoder::new(&mut out, ZSTD_LEVEL).expect("zstd encoder");
        self.write_body(&mut z);
        z.finish().expect("zstd to memory");
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    fn write_body(&self, w: impl Write) {
        let mut body = Out(w);
        body.u64(self.page_size);
        body.u64(self.memory_pages);
        body.u64(self.clock_ns);
        body.u32(u32::try_from(self.meta.len()).expect("metadata entries"));
        for (k, v) in &self.meta {
            debug_assert!(
                k.len().max(v.len()) <= MAX_META,
                "metadata too big to read back"
            );
            body.str(k);
            body.str(v);
        }
        body.u32(u32::try_from(self.globals.len()).expect("globals"));
        for &(index, value) in &self.globals {
            body.u32(index);
            match value {
                GlobalValue::I32(v) => {
                    body.bytes(&[0]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::I64(v) => {
                    body.bytes(&[1]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::F32(v) => {
                    body.bytes(&[2]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::F64(v) => {
                    body.bytes(&[3]);
                    body.bytes(&v.to_le_bytes());
                }
                GlobalValue::V128(v) => {
                    body.bytes(&[4]);
                    body.bytes(&v.to_le_bytes());
                }
            }
        }
        body.runs(&self.zeros);
        body.runs(&self.runs);
        body.bytes(&self.data);
    }

    /// Reads a state [`InstanceState::encode`] wrote for `expected`'s image. Sizes in the file
    /// are checked against bounds before anything is allocated for them.
    pub fn decode(bytes: &[u8], expected: &StateKey) -> Result<Self, StateError> {
        if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(StateError::NotAState);
        }
        let found = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if found != FORMAT_VERSION {
            return Err(StateError::Version { found });
        }
        let Some(split) = bytes.len().checked_sub(CHECKSUM).filter(|&n| n >= 12) else {
            return Err(StateError::Corrupted);
        };
        let (signed, sum) = bytes.split_at(split);
        if Sha256::digest(signed).as_slice() != sum {
            return Err(StateError::Corrupted);
        }

        let mut header = In(&signed[12..]);
        let key = StateKey {
            image: header.str(4096)?,
            wasmtime: header.str(4096)?,
            language: header.str(4096)?,
        };
        if key != *expected {
            return Err(StateError::OtherImage {
                found: Box::new(key),
                expected: Box::new(expected.clone()),
            });
        }
        let decoder = zstd::stream::read::Decoder::with_buffer(header.0)
            .map_err(|e| malformed(format!("the body does not decompress: {e}")))?;
        let mut body = In(decoder.take(MAX_MEMORY + BODY_SLACK));
        let page_size = body.u64()?;
        let memory_pages = body.u64()?;
        if !page_size.is_power_of_two() || page_size > 1 << 16 {
            return Err(malformed(format!("{page_size}-byte wasm pages")));
        }
        let memory_bytes = memory_pages
            .checked_mul(page_size)
            .filter(|&n| n <= MAX_MEMORY)
            .ok_or_else(|| malformed(format!("a memory of {memory_pages} pages")))?;
        let pages = memory_bytes.div_ceil(PAGE as u64);
        let clock_ns = body.u64()?;
        let mut meta = BTreeMap::new();
        for _ in 0..body.u32()? {
            let k = body.str(MAX_META)?;
            let v = body.str(MAX_META)?;
            if meta.insert(k, v).is_some() {
                return Err(malformed("a metadata key twice"));
            }
        }
        let n = body.u32()?;
        let mut globals = Vec::with_capacity(n.min(1 << 10) as usize);
        for _ in 0..n {
            let index = body.u32()?;
            if globals.last().is_some_and(|&(last, _)| last >= index) {
                return Err(malformed("globals out of order"));
            }
            let value = match body.u8()? {
                0 => GlobalValue::I32(i32::from_le_bytes(body.array()?)),
                1 => GlobalValue::I64(i64::from_le_bytes(body.array()?)),
                2 => GlobalValue::F32(u32::from_le_bytes(body.array()?)),
                3 => GlobalValue::F64(u64::from_le_bytes(body.array()?)),
                4 => GlobalValue::V128(u128::from_le_bytes(body.array()?)),
                tag => return Err(malformed(format!("global type {tag}"))),
            };
            globals.push((index, value));
        }
        let zeros = body.runs(pages)?;
        let runs = body.runs(pages)?;
        let total: u64 = runs
            .iter()
            .map(|r| byte_range(r, memory_bytes).len() as u64)
            .sum();
        let data = body.vec(total)?;
        if body.0.read(&mut [0]).map_err(body_error)? != 0 {
            return Err(malformed("bytes after the body"));
        }
        Ok(Self {
            page_size,
            memory_pages,
            runs,
            data,
            zeros,
            globals,
            clock_ns,
            meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use wasmtime::{Config, Engine, Module, Store, WasmParams, WasmResults};

    /// 4 wasm pages, 64 host pages. After the warm-up the image holds data in host pages 0, 1
    /// and 16; the rest of the initial memory is zero.
    const GUEST: &str = r#"(module
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

    const P: i32 = PAGE as i32;

    fn engine_err(e: wasmtime::Error) -> Error {
        Error::Wasm(format!("{e:#}"))
    }

    /// `wat` snapshotted after its export `warm` ran, as images are.
    fn build_image(wat: &str) -> Vec<u8> {
        let engine = Engine::default();
        let wasm = wat::parse_str(wat).unwrap();
        crate::engine::snapshot::build(&engine, &wasm, "test image", |module| {
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

    fn image() -> &'static [u8] {
        static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
        IMAGE.get_or_init(|| build_image(GUEST))
    }

    /// The ways instances get their memory: on demand from a compiled file (as cached images
    /// are loaded), and from the pooling allocator's slots, the image in memory (a memfd).
    fn setups(wasm: &[u8]) -> Vec<(&'static str, Module)> {
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

        fn call<P: WasmParams, R: WasmResults>(&mut self, name: &str, params: P) -> R {
            self.instance
                .get_typed_func::<P, R>(&mut self.store, name)
                .unwrap()
                .call(&mut self.store, params)
                .unwrap()
        }

        fn load(&mut self, at: i32) -> i32 {
            self.call("load", at)
        }

        fn store(&mut self, at: i32, value: i32) {
            self.call::<_, ()>("store", (at, value))
        }

        fn capture(&mut self, scan: Scan) -> Result<InstanceState> {
            match scan {
                Scan::Pagemap => capture(&mut self.store, &self.instance, self.memory),
                Scan::Full => {
                    capture_with(&mut self.store, &self.instance, self.memory, scan, None)
                }
            }
        }

        fn restore(&mut self, state: &InstanceState) -> Result<()> {
            restore(&mut self.store, &self.instance, self.memory, state, &[])
        }
    }

    fn word(text: &[u8]) -> i32 {
        i32::from_le_bytes(text[..4].try_into().unwrap())
    }

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
            copy(
                &mut a.store,
                &a.instance,
                a.memory,
                &mut b.store,
                &b.instance,
                b.memory,
                &[],
            )
            .unwrap();
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

    fn key() -> StateKey {
        StateKey::new("0123abcd", "python")
    }

    /// A state with everything set: data runs, zero runs, globals, clock, metadata.
    fn sample() -> InstanceState {
        let (_, module) = setups(image()).remove(0);
        let mut a = Guest::new(&module);
        a.call::<_, i32>("grow", 1);
        for page in [0, 3, 4, 5, 30, 70] {
            a.store(page * P + 100, page + 1);
        }
        a.store(4096, 0);
        a.call::<_, ()>("set", (-1, i64::MIN, f64::NAN));
        let mut state = a.capture(Scan::Pagemap).unwrap();
        state.clock_ns = 123_456_789;
        state.meta.insert("cwd".into(), "/workspace".into());
        state.meta.insert("turns".into(), "3".into());
        assert_eq!(state.runs, [0..1, 3..6, 30..31, 70..71]);
        assert!(state.zeros.contains(&(1..2)));
        state
    }

    #[test]
    fn encode_decode_round_trip() {
        let state = sample();
        let bytes = state.encode(&key());
        assert_eq!(&bytes[..8], MAGIC);
        assert!(
            bytes.len() < state.saved_bytes() / 4,
            "compressed: {}",
            bytes.len()
        );
        let back = InstanceState::decode(&bytes, &key()).unwrap();
        assert_eq!(back, state);

        let (_, module) = setups(image()).remove(1);
        let mut b = Guest::new(&module);
        b.restore(&back).unwrap();
        assert_eq!(
            (b.load(100), b.load(4 * P + 100), b.load(70 * P + 100)),
            (1, 5, 71)
        );
        assert_eq!(b.load(4096), 0);
        assert!(b.call::<_, f64>("f", ()).is_nan());
        assert_eq!(b.call::<_, i64>("h", ()), i64::MIN);
    }

    #[test]
    fn a_flipped_byte_is_a_checksum_error() {
        let bytes = sample().encode(&key());
        for at in 12..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            match InstanceState::decode(&bad, &key()) {
                Err(StateError::Corrupted) => {}
                other => panic!("byte {at} of {}: {other:?}", bytes.len()),
            }
        }
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(matches!(
            InstanceState::decode(&bad, &key()),
            Err(StateError::NotAState)
        ));
        let mut bad = bytes;
        bad[8] = 2;
        let err = InstanceState::decode(&bad, &key()).unwrap_err();
        assert!(matches!(err, StateError::Version { found: 2 }), "{err}");
    }

    #[test]
    fn a_state_from_another_image_says_so() {
        let bytes = sample().encode(&key());
        let others = [
            StateKey::new("0123abce", "python"),
            StateKey::new("0123abcd", "javascript"),
            StateKey {
                wasmtime: "47.0.0".into(),
                ..key()
            },
        ];
        for other in others {
            let err = InstanceState::decode(&bytes, &other).unwrap_err();
            assert!(matches!(err, StateError::OtherImage { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains("the state is from another image"), "{msg}");
            assert!(msg.contains("0123abcd"), "{msg}");
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_errors_not_panics() {
        let bytes = sample().encode(&key());
        for n in 0..bytes.len() {
            let err = InstanceState::decode(&bytes[..n], &key()).unwrap_err();
            assert!(
                matches!(err, StateError::NotAState | StateError::Corrupted),
                "{n}: {err:?}"
            );
        }
        for junk in [&b""[..], b"WBXSTATE", b"\0asm\x01\0\0\0", &[0xff; 100]] {
            assert!(InstanceState::decode(junk, &key()).is_err());
        }
    }

    /// A file around `body` (compressed when `zstd`) with a correct checksum.
    fn frame(body: &[u8], zstd: bool) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let mut h = Out(&mut out);
        h.u32(FORMAT_VERSION);
        h.str(&key().image);
        h.str(&key().wasmtime);
        h.str(&key().language);
        if zstd {
            out.extend(zstd::stream::encode_all(body, 1).unwrap());
        } else {
            out.extend_from_slice(body);
        }
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// A body: 64 KiB pages, `pages` of them, no clock, metadata or globals, then `rest`.
    fn body(pages: u64, rest: impl FnOnce(&mut Out<&mut Vec<u8>>)) -> Vec<u8> {
        let mut b = Vec::new();
        let mut o = Out(&mut b);
        o.u64(65536);
        o.u64(pages);
        o.u64(0);
        o.u32(0);
        o.u32(0);
        rest(&mut o);
        b
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let mut good = Vec::new();
        sample().write_body(&mut good);
        assert!(InstanceState::decode(&frame(&good, true), &key()).is_ok());

        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("not zstd", good.clone(), false),
            ("empty", vec![], true),
            ("cut short", good[..good.len() - 1].to_vec(), true),
            ("trailing bytes", [&good[..], &[0]].concat(), true),
            ("pages past 4 GiB", body(65537, |o| o.runs(&[])), true),
            (
                "odd page size",
                {
                    let mut b = body(1, |o| o.runs(&[]));
                    b[..8].copy_from_slice(&3u64.to_le_bytes());
                    b
                },
                true,
            ),
            (
                "a run past the memory",
                body(4, |o| {
                    o.runs(&[]);
                    o.runs(&[Range { start: 60, end: 65 }]);
                }),
                true,
            ),
            (
                "runs out of order",
                body(4, |o| {
                    o.runs(&[]);
                    o.runs(&[3..4, 1..2]);
                }),
                true,
            ),
            (
                "an empty run",
                body(4, |o| {
                    o.runs(&[]);
                    o.runs(&[Range { start: 3, end: 3 }]);
                }),
                true,
            ),
            // 4 GiB of pages claimed, a few bytes there: refused without allocating them.
            (
                "pages missing",
                body(65536, |o| {
                    o.runs(&[]);
                    o.runs(&[Range {
                        start: 0,
                        end: 1 << 20,
                    }]);
                    o.bytes(&[1; 4096]);
                }),
                true,
            ),
            (
                "an unknown global type",
                {
                    let mut b = body(1, |_| {});
                    b.truncate(b.len() - 4);
                    let mut o = Out(&mut b);
                    o.u32(1);
                    o.u32(0);
                    o.bytes(&[9]);
                    b
                },
                true,
            ),
        ];
        for (what, body, zstd) in cases {
            match InstanceState::decode(&frame(&body, zstd), &key()) {
                Err(StateError::Malformed(_)) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn pagemap_entries_that_count_as_the_instances_own() {
        assert!(private(PM_PRESENT), "a private page in RAM");
        assert!(private(PM_PRESENT | super::super::prefault::PM_EXCLUSIVE));
        assert!(private(PM_SWAP), "a private page swapped out");
        assert!(!private(PM_PRESENT | PM_FILE), "the image's page");
        assert!(!private(PM_SWAP | PM_FILE), "the image's page, migrating");
        assert!(!private(0), "not mapped: the image's, or zero");
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
            copy(
                &mut a.store,
                &a.instance,
                a.memory,
                &mut fresh.store,
                &fresh.instance,
                fresh.memory,
                &[],
            )
            .unwrap();
            let mut ahead = Guest::new(&module);
            ahead.memory.grow(&mut ahead.store, 1).unwrap();
            let mem = ahead.memory.data_mut(&mut ahead.store);
            // SAFETY: the memory's accessible part; POPULATE_WRITE keeps contents.
            unsafe {
                super::super::prefault::advise(
                    &[0..2 * PAGE, 16 * PAGE..17 * PAGE, 66 * PAGE..68 * PAGE],
                    mem.as_mut_ptr(),
                    mem.len(),
                    libc::MADV_POPULATE_WRITE,
                );
            }
            let plan = copy(
                &mut a.store,
                &a.instance,
                a.memory,
                &mut ahead.store,
                &ahead.instance,
                ahead.memory,
                // Page 70 was not made ahead: named wrongly, it faults in as it is written.
                &[0..2, 16..17, 66..68, 70..71],
            )
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
            let err = copy(
                &mut a.store,
                &a.instance,
                a.memory,
                &mut bigger.store,
                &bigger.instance,
                bigger.memory,
                &[],
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("larger than the state's"), "{label}: {err}");
        }
    }

    #[test]
    fn without_takes_out_the_pages_an_instance_has() {
        assert_eq!(
            without(&[0..10, 12..14, 20..30], &[2..4, 9..13, 25..26, 29..40]),
            vec![0..2, 4..9, 13..14, 20..25, 26..29]
        );
        assert_eq!(without(&[0..5, 7..8], &[]), vec![0..5, 7..8]);
        assert_eq!(without(&[3..5, 6..7], &[0..10, 20..21]), Runs::new());
    }

    /// The scan's runs are the pages the pagemap entries sort the same way, on a real mapping:
    /// written pages of an image-backed memory, a read one and one past the image.
    #[test]
    fn the_scan_finds_what_the_pagemap_entries_say() {
        let (_, module) = setups(image()).remove(0);
        let mut a = Guest::new(&module);
        for at in [0, 8 * P, 9 * P, 30 * P, 31 * P + 4, 50 * P] {
            a.store(at, 1);
        }
        // A read of the image's page 2 (its data covers pages 0 to 16), and one past it.
        let _ = a.load(2 * P);
        let _ = a.load(40 * P);
        let mem = a.memory.data(&a.store);
        let entries = super::super::prefault::pagemap(mem.as_ptr(), mem.len() / PAGE).unwrap();
        let (mut expected, mut image) = (Vec::new(), Vec::new());
        for (page, &e) in entries.iter().enumerate() {
            if private(e) {
                push_page(&mut expected, page as u64);
            } else if e & PM_PRESENT != 0 {
                push_page(&mut image, page as u64);
            }
        }
        match super::super::prefault::scan(mem.as_ptr(), mem.len()) {
            Ok(s) => {
                let (own, mapped) = (page_runs(s.own), page_runs(s.mapped));
                assert_eq!(own, expected);
                assert_eq!(mapped, image);
                assert!(count(&own) >= 5, "{own:?}");
                assert!(mapped.iter().any(|r| r.contains(&2)), "{mapped:?}");
            }
            Err(e) => eprintln!("no PAGEMAP_SCAN here ({e}): not exercised"),
        }
        assert_eq!(scan_pages(mem).unwrap().0, expected);
    }

    /// Pages swapped out are still saved. Needs swap (and Linux 5.4's MADV_PAGEOUT); without,
    /// it only says so.
    #[test]
    fn swapped_out_pages_are_saved() {
        let (_, module) = setups(image()).remove(0);
        let mut a = Guest::new(&module);
        a.store(8, 1);
        a.store(30 * P, 5);
        let before = a.capture(Scan::Pagemap).unwrap();
        let mem = a.memory.data_mut(&mut a.store);
        // SAFETY: the memory's accessible part; PAGEOUT keeps contents.
        unsafe { libc::madvise(mem.as_mut_ptr().cast(), mem.len(), libc::MADV_PAGEOUT) };
        let entries = super::super::prefault::pagemap(mem.as_ptr(), mem.len() / PAGE).unwrap();
        if !entries.iter().any(|e| e & PM_SWAP != 0) {
            eprintln!("no page was swapped out (no swap?): not exercised");
            return;
        }
        assert_eq!(a.capture(Scan::Pagemap).unwrap(), before);
    }

    /// Timings of a 64 MiB memory with 1 MiB written; run with
    /// `cargo test --release --lib timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timing_64_mib_memory_1_mib_dirty() {
        use std::time::Instant;
        let image = build_image(
            r#"(module
                (memory (export "memory") 1024)
                (global $sp (mut i32) (i32.const 0))
                (func (export "warm")
                    (memory.fill (i32.const 0) (i32.const 0xab) (i32.const 0x4000000))
                    (global.set $sp (i32.const 1)))
                (func (export "store") (param i32 i32) (i32.store (local.get 0) (local.get 1)))
                (func (export "load") (param i32) (result i32) (i32.load (local.get 0))))"#,
        );
        for (label, module) in setups(&image) {
            for (layout, stride) in [("contiguous", 1), ("every 16th page", 16)] {
                let mut a = Guest::new(&module);
                // Pseudo-random bytes (xorshift), which compress as little as anything.
                let mut x = 0x2545_f491_4f6c_dd1du64;
                let mem = a.memory.data_mut(&mut a.store);
                for i in 0..256i32 {
                    let page = &mut mem[(i * stride) as usize * PAGE..][..PAGE];
                    for w in page.chunks_exact_mut(8) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        w.copy_from_slice(&x.to_le_bytes());
                    }
                    page[8..12].copy_from_slice(&i.to_le_bytes());
                }
                let t = Instant::now();
                let mem = a.memory.data(&a.store);
                super::super::prefault::pagemap(mem.as_ptr(), mem.len() / PAGE).unwrap();
                let pagemap = t.elapsed();
                let t = Instant::now();
                let state = a.capture(Scan::Pagemap).unwrap();
                let capture = t.elapsed();
                assert_eq!(state.saved_pages(), 256);
                let t = Instant::now();
                let bytes = state.encode(&key());
                let encode = t.elapsed();
                let t = Instant::now();
                let back = InstanceState::decode(&bytes, &key()).unwrap();
                let decode = t.elapsed();
                let t = Instant::now();
                let mut b = Guest::new(&module);
                let instantiate = t.elapsed();
                let t = Instant::now();
                b.restore(&back).unwrap();
                let restore = t.elapsed();
                assert_eq!(b.load(255 * stride * P + 8), 255);
                let t = Instant::now();
                let full = a.capture(Scan::Full).unwrap();
                let full_scan = t.elapsed();
                eprintln!(
                    "{label}, {layout}: capture {capture:?} (pagemap {pagemap:?}; full scan {full_scan:?}, {} pages), \
                     encode {encode:?} ({} KiB), decode {decode:?}, instantiate \
                     {instantiate:?}, restore {restore:?}",
                    full.saved_pages(),
                    bytes.len() >> 10
                );
            }
        }
    }
}
