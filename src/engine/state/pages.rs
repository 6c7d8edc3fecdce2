//! Which host pages of a linear memory an instance made its own: the kernel's pagemap read for
//! them, and the page-run arithmetic capture, restore and the file format share. Kept apart
//! because it is the part that speaks to the kernel (and falls back when the kernel says
//! nothing).

use std::ops::Range;

use crate::engine::prefault::{self, PM_FILE, PM_PRESENT, PM_SWAP};

/// Host pages: the unit of copy-on-write, and of what is saved.
pub(super) const PAGE: usize = 4096;

/// Host pages as runs of page indices.
type Runs = Vec<Range<u64>>;

pub(super) fn count(runs: &[Range<u64>]) -> u64 {
    runs.iter().map(|r| r.end - r.start).sum()
}

/// Appends host page `page` to `runs`, extending the last run when contiguous.
pub(super) fn push_page(runs: &mut Vec<Range<u64>>, page: u64) {
    match runs.last_mut() {
        Some(r) if r.end == page => r.end += 1,
        _ => runs.push(page..page + 1),
    }
}

/// The byte range of a run of host pages in a memory of `len` bytes (the last page may be
/// short under custom page sizes).
pub(super) fn byte_range(run: &Range<u64>, len: u64) -> Range<usize> {
    let start = run.start * PAGE as u64;
    let end = (run.end * PAGE as u64).min(len);
    start as usize..end as usize
}

pub(super) fn is_zero(bytes: &[u8]) -> bool {
    // No early exit: OR-ing whole words vectorises, and most pages tested are zero.
    let (words, tail) = bytes.split_at(bytes.len() / 8 * 8);
    words.chunks_exact(8).fold(0u64, |acc, w| {
        acc | u64::from_ne_bytes(w.try_into().expect("8 bytes"))
    }) == 0
        && tail.iter().all(|&b| b == 0)
}

/// Where the pages to save are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scan {
    /// The pages `/proc/self/pagemap` says are private; every page without it.
    Pagemap,
    /// Every page: slow (reads all of memory) but needs nothing from the kernel.
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
pub(super) fn scan_pages(mem: &[u8]) -> std::io::Result<(Runs, Runs)> {
    match prefault::scan(mem.as_ptr(), mem.len()) {
        Ok(s) => Ok((page_runs(s.own), page_runs(s.mapped))),
        Err(e) => {
            tracing::debug!("PAGEMAP_SCAN failed ({e}); reading the pagemap");
            let entries = prefault::pagemap(mem.as_ptr(), mem.len().div_ceil(PAGE))?;
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
pub(super) fn without(runs: &[Range<u64>], have: &[Range<u64>]) -> Vec<Range<u64>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::fixture::{Guest, P, image, setups};

    #[test]
    fn pagemap_entries_that_count_as_the_instances_own() {
        assert!(private(PM_PRESENT), "a private page in RAM");
        assert!(private(PM_PRESENT | prefault::PM_EXCLUSIVE));
        assert!(private(PM_SWAP), "a private page swapped out");
        assert!(!private(PM_PRESENT | PM_FILE), "the image's page");
        assert!(!private(PM_SWAP | PM_FILE), "the image's page, migrating");
        assert!(!private(0), "not mapped: the image's, or zero");
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
        let entries = prefault::pagemap(mem.as_ptr(), mem.len() / PAGE).unwrap();
        let (mut expected, mut image) = (Vec::new(), Vec::new());
        for (page, &e) in entries.iter().enumerate() {
            if private(e) {
                push_page(&mut expected, page as u64);
            } else if e & PM_PRESENT != 0 {
                push_page(&mut image, page as u64);
            }
        }
        match prefault::scan(mem.as_ptr(), mem.len()) {
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
        unsafe { crate::platform::memory::page_out(mem.as_mut_ptr(), mem.len()) };
        let entries = prefault::pagemap(mem.as_ptr(), mem.len() / PAGE).unwrap();
        if !entries.iter().any(|e| e & PM_SWAP != 0) {
            eprintln!("no page was swapped out (no swap?): not exercised");
            return;
        }
        assert_eq!(a.capture(Scan::Pagemap).unwrap(), before);
    }
}
