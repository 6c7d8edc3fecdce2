//! Memory: which pages of a mapping are this process's own (Linux's pagemap), and faulting
//! pages in ahead of use. Elsewhere nothing is known about a mapping's pages, so a used instance
//! is dropped rather than reset in place, and pages fault in on first touch.

use std::ops::Range;

#[cfg(target_os = "linux")]
const PAGE: usize = 4096;

/// How [`populate`] faults pages in.
#[derive(Clone, Copy, Debug)]
pub enum Populate {
    /// As a write would: private copies of copy-on-write pages.
    Write,
    /// As a read would: the mapping's pages as they are, no copies.
    Read,
}

/// Faults in each run (byte ranges from `base`, cut at `len`) as `how` says; false once one
/// fails (an older kernel), so the caller stops asking. Elsewhere it does nothing and says
/// false: pages fault in on first touch, as they would have.
///
/// # Safety
/// `[base, base + len)` must be one live, writable mapping that nothing unmaps meanwhile.
pub unsafe fn populate(runs: &[Range<usize>], base: *mut u8, len: usize, how: Populate) -> bool {
    #[cfg(target_os = "linux")]
    {
        let advice = match how {
            Populate::Write => libc::MADV_POPULATE_WRITE,
            Populate::Read => libc::MADV_POPULATE_READ,
        };
        for r in runs {
            let end = r.end.min(len);
            if end <= r.start {
                break;
            }
            // SAFETY: within the caller's mapping; the advice only faults pages in.
            if unsafe { libc::madvise(base.add(r.start).cast(), end - r.start, advice) } != 0 {
                return false;
            }
        }
        true
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (runs, base, len, how);
        false
    }
}

/// Asks the kernel to swap the range out (Linux 5.4's `MADV_PAGEOUT`), for tests of saving
/// swapped-out pages; false where it cannot.
///
/// # Safety
/// As [`populate`]; the contents are kept.
#[cfg(test)]
pub unsafe fn page_out(base: *mut u8, len: usize) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: the caller's mapping; PAGEOUT keeps contents.
    return unsafe { libc::madvise(base.cast(), len, libc::MADV_PAGEOUT) } == 0;
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (base, len);
        false
    }
}

/// Pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst): the page is in RAM; it is
/// swapped out (or another swap-type entry, such as a page being migrated); it is a page of a
/// file or shared memory (here: still the image's); it is mapped only by this process.
pub const PM_PRESENT: u64 = 1 << 63;
pub const PM_SWAP: u64 = 1 << 62;
pub const PM_FILE: u64 = 1 << 61;
pub const PM_EXCLUSIVE: u64 = 1 << 56;

/// The `/proc/self/pagemap` entries of the `pages` 4 KiB pages from `base` (page-aligned).
#[cfg(target_os = "linux")]
pub fn pagemap(base: *const u8, pages: usize) -> std::io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let start = base as usize;
    if !start.is_multiple_of(PAGE) {
        return Err(std::io::Error::other("linear memory is not page-aligned"));
    }
    let mut raw = vec![0u8; pages * 8];
    std::fs::File::open("/proc/self/pagemap")?
        .read_exact_at(&mut raw, (start / PAGE * 8) as u64)?;
    Ok(raw
        .chunks_exact(8)
        .map(|e| u64::from_ne_bytes(e.try_into().expect("8 bytes")))
        .collect())
}

/// The mapped pages of a range, by whose they are: as byte runs from its start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// This process's own: in RAM or swapped out, and not a file's page (here: not the
    /// image's). What an instance wrote.
    pub own: Vec<Range<usize>>,
    /// A file's pages mapped here (here: the image's, read and not written).
    pub mapped: Vec<Range<usize>>,
}

/// Sorts the mapped pages of `[base, base + len)` (page-aligned) into [`Scanned`]. One
/// `PAGEMAP_SCAN` ioctl (Linux 6.7) walks the page tables and returns runs, where reading
/// the pagemap costs an 8-byte entry per page of the whole range and a test of each. An error
/// (an older kernel) means the caller reads [`pagemap`] instead.
#[cfg(target_os = "linux")]
pub fn scan(base: *const u8, len: usize) -> std::io::Result<Scanned> {
    use std::os::fd::AsRawFd;

    /// `struct pm_scan_arg` (include/uapi/linux/fs.h).
    #[repr(C)]
    struct PmScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }
    /// `struct page_region`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct PageRegion {
        start: u64,
        end: u64,
        categories: u64,
    }
    /// `_IOWR('f', 16, struct pm_scan_arg)`.
    const PAGEMAP_SCAN: u32 = 0xC000_0000 | (96 << 16) | ((b'f' as u32) << 8) | 16;
    const PAGE_IS_FILE: u64 = 1 << 2;
    const PAGE_IS_PRESENT: u64 = 1 << 3;
    const PAGE_IS_SWAPPED: u64 = 1 << 4;
    const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

    let start = base as u64;
    if !start.is_multiple_of(PAGE as u64) {
        return Err(std::io::Error::other("linear memory is not page-aligned"));
    }
    let end = start + len.div_ceil(PAGE) as u64 * PAGE as u64;
    let file = std::fs::File::open("/proc/self/pagemap")?;
    let mut regions = vec![PageRegion::default(); 512];
    let mut scanned = Scanned::default();
    let mut at = start;
    while at < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: at,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            // Present or swapped; neighbours come back as one region unless one is a file's
            // page and the other not.
            category_inverted: 0,
            category_mask: 0,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_FILE,
        };
        // SAFETY: `arg` describes `regions`, which the kernel fills (at most `vec_len`); it only
        // reads the page tables of `[at, end)`.
        let n = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for r in &regions[..n as usize] {
            let run = (r.start - start) as usize..(r.end - start) as usize;
            let runs = match r.categories & PAGE_IS_FILE {
                0 => &mut scanned.own,
                _ => &mut scanned.mapped,
            };
            match runs.last_mut() {
                Some(last) if last.end == run.start => last.end = run.end,
                _ => runs.push(run),
            }
        }
        if arg.walk_end <= at {
            return Err(std::io::Error::other("PAGEMAP_SCAN made no progress"));
        }
        at = arg.walk_end;
    }
    Ok(scanned)
}

#[cfg(not(target_os = "linux"))]
pub fn scan(_: *const u8, _: usize) -> std::io::Result<Scanned> {
    Err(std::io::Error::other("PAGEMAP_SCAN is Linux's"))
}

#[cfg(not(target_os = "linux"))]
pub fn pagemap(_: *const u8, _: usize) -> std::io::Result<Vec<u64>> {
    Err(std::io::Error::other("/proc/self/pagemap is Linux's"))
}
