//! Pre-faulting, ahead of a request, the pages a fresh instance is going to write and read.
//!
//! Every instance of an image starts from the same copy-on-write mapping of it, and a small
//! turn writes the same few hundred pages in each. Left to page faults, most of them are first
//! mapped read-only (a read, or the kernel's fault-around of a neighbour), so the write that
//! follows must replace a present entry, which flushes the TLB of every CPU running the
//! process: an inter-processor interrupt per page, which on a VM costs microseconds and stalls
//! whatever request runs on the other CPU (272 per one-shot, measured). `MADV_POPULATE_WRITE`
//! on pages not mapped yet makes the same private copies with no fault and no flush.
//!
//! Pages only read can be mapped ahead too (`MADV_POPULATE_READ`: the image's own pages, no
//! copies). QuickJS's first eval reads ~148 (its 17 faults down to 7). Of CPython's ~1,900,
//! mapping all cost more CPU than the faults it saved; its pool's polish turn maps most, and
//! only those a first turn reads beyond the polish (~125) are mapped ahead.
//!
//! Which pages: measured once per image on calibration instances after sample turns
//! (`/proc/self/pagemap` tells private, written pages from those still shared with the image).

use std::collections::BTreeSet;
use std::ops::Range;

const PAGE: usize = 4096;

/// Page runs (byte ranges in linear memory) that instances of one image write, and optionally
/// those they only read.
#[derive(Clone, Debug, Default)]
pub struct PageSet {
    runs: Vec<Range<usize>>,
    reads: Vec<Range<usize>>,
}

/// Appends page `off` to `runs`, extending the last run when contiguous.
fn push_page(runs: &mut Vec<Range<usize>>, off: usize) {
    match runs.last_mut() {
        Some(r) if off == r.end => r.end = off + PAGE,
        _ => runs.push(off..off + PAGE),
    }
}

fn count(runs: &[Range<usize>]) -> usize {
    runs.iter().map(|r| r.len() / PAGE).sum()
}

/// The offsets of the pages in `runs`.
fn pages_of(runs: &[Range<usize>]) -> BTreeSet<usize> {
    runs.iter().flat_map(|r| r.clone().step_by(PAGE)).collect()
}

/// Page offsets, in order, as runs.
fn to_runs(pages: &BTreeSet<usize>) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    for &p in pages {
        push_page(&mut runs, p);
    }
    runs
}

impl PageSet {
    /// How many pages [`PageSet::populate`] copies ahead.
    pub fn pages(&self) -> usize {
        count(&self.runs)
    }

    /// How many pages only read it maps ahead.
    pub fn read_pages(&self) -> usize {
        count(&self.reads)
    }

    /// This set with only the read pages that `earlier` had not mapped.
    pub fn reads_beyond(mut self, earlier: &PageSet) -> Self {
        self.reads = to_runs(&(&pages_of(&self.reads) - &pages_of(&earlier.reads)));
        self
    }

    /// Adds `other`'s pages to this set's: pages written by either are copied, and pages read
    /// by either but written by neither are mapped.
    pub fn merge(&mut self, other: PageSet) {
        let written = &pages_of(&self.runs) | &pages_of(&other.runs);
        let read = &(&pages_of(&self.reads) | &pages_of(&other.reads)) - &written;
        self.runs = to_runs(&written);
        self.reads = to_runs(&read);
    }

    /// Adds `range` (rounded out to pages): pages the host itself writes into each instance.
    pub fn add(&mut self, range: Range<usize>) {
        let start = range.start / PAGE * PAGE;
        let end = range.end.div_ceil(PAGE) * PAGE;
        self.runs.push(start..end);
        self.runs.sort_by_key(|r| r.start);
    }

    /// The pages of `[base, base + len)` that this process has written (present, private and
    /// mapped only here), and with `reads` those mapped but still the image's. Runs are exact:
    /// copying pages in a gap costs more than another `madvise` call (measured).
    fn measure(base: *const u8, len: usize, reads: bool) -> std::io::Result<Self> {
        let mut set = Self::default();
        for (i, e) in pagemap(base, len / PAGE)?.into_iter().enumerate() {
            // The shared zero page, mapped by reads of memory past the image, is not exclusive.
            if e & PM_PRESENT != 0 && e & PM_FILE == 0 && e & PM_EXCLUSIVE != 0 {
                push_page(&mut set.runs, i * PAGE);
            } else if reads && e & PM_PRESENT != 0 && e & PM_FILE != 0 {
                push_page(&mut set.reads, i * PAGE);
            }
        }
        Ok(set)
    }

    /// [`PageSet::measure`] of a wasm linear memory's accessible part.
    pub fn measure_memory(
        store: impl wasmtime::AsContext,
        memory: wasmtime::Memory,
        reads: bool,
    ) -> std::io::Result<Self> {
        let store = store.as_context();
        Self::measure(memory.data_ptr(&store), memory.data_size(&store), reads)
    }

    /// Makes the set's written pages private copies in `memory`, and maps its read pages.
    /// Contents do not change; a failure (a kernel before 5.14) only leaves the pages to fault
    /// in as before.
    pub fn populate_memory(&self, store: impl wasmtime::AsContext, memory: wasmtime::Memory) {
        let store = store.as_context();
        // SAFETY: the memory's accessible part, live while its store is borrowed here, and
        // nothing can grow it meanwhile.
        unsafe { self.populate(memory.data_ptr(&store), memory.data_size(&store)) }
    }

    /// # Safety
    /// `[base, base + len)` must be one live, writable mapping (a wasm linear memory's
    /// accessible part) that nothing unmaps while this runs.
    unsafe fn populate(&self, base: *mut u8, len: usize) {
        use crate::platform::memory::{Populate, populate};
        // SAFETY: the caller's mapping; a write population copies pages as a store would, a
        // read one maps them as they are.
        unsafe {
            if populate(&self.runs, base, len, Populate::Write) {
                populate(&self.reads, base, len, Populate::Read);
            }
        }
    }
}

pub use crate::platform::memory::{
    PM_EXCLUSIVE, PM_FILE, PM_PRESENT, PM_SWAP, Scanned, pagemap, scan,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_beyond_keeps_only_pages_not_mapped_before() {
        let p = |a: usize, b: usize| a * PAGE..b * PAGE;
        let earlier = PageSet {
            runs: vec![],
            reads: vec![p(0, 4), p(10, 12)],
        };
        let later = PageSet {
            runs: vec![p(20, 21)],
            reads: vec![p(2, 6), p(8, 13)],
        };
        let beyond = later.reads_beyond(&earlier);
        assert_eq!(beyond.reads, vec![p(4, 6), p(8, 10), p(12, 13)]);
        assert_eq!(beyond.read_pages(), 5);
        assert_eq!(
            beyond.runs,
            vec![p(20, 21)],
            "written pages are kept as they are"
        );
    }

    #[test]
    fn merge_unites_and_a_page_written_by_either_is_not_also_read() {
        let p = |a: usize, b: usize| a * PAGE..b * PAGE;
        let mut a = PageSet {
            runs: vec![p(0, 2)],
            reads: vec![p(5, 7)],
        };
        a.merge(PageSet {
            runs: vec![p(2, 3), p(6, 7)],
            reads: vec![p(1, 2), p(9, 10)],
        });
        assert_eq!(a.runs, vec![p(0, 3), p(6, 7)]);
        assert_eq!(a.reads, vec![p(5, 6), p(9, 10)]);
    }
}
