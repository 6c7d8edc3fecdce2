//! The shadows' side of disk accounting: which writes count, what a change replaced (read by
//! identity through wasmtime-wasi's own calls) and what it did, against the guest's budget.

use super::*;

/// The guest's open regular files as its budget knows them; released when the store goes.
#[derive(Default)]
pub struct OpenFiles {
    pub(super) fds: HashMap<u32, (FileId, Arc<DiskBudget>)>,
    /// `fd_renumber` put something on stdin, stdout or stderr: writes there may reach a file.
    pub(super) stdio_moved: bool,
}

impl OpenFiles {
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }
}

impl Drop for OpenFiles {
    fn drop(&mut self) {
        for (_, (id, disk)) in self.fds.drain() {
            disk.closed(id);
        }
    }
}

/// A file as `fd_filestat_get` / `path_filestat_get` describe it.
#[derive(Clone, Copy)]
pub(super) struct Stat {
    pub(super) id: FileId,
    pub(super) filetype: u8,
    pub(super) nlink: u64,
    pub(super) size: u64,
}

/// The budget and memory a write to `fd` counts against: the guest has a budget there, and
/// `fd` is not the captured stdio (which has caps of its own).
pub(super) fn counted(
    c: &mut Caller<'_, GuestState>,
    fd: i32,
) -> Option<(Arc<DiskBudget>, Memory)> {
    if (0..=2).contains(&fd) && !c.data().files.stdio_moved {
        return None;
    }
    budgeted(c, fd)
}

/// The budget of the folder `fd` is in, and the guest's memory, when there is a budget.
pub(super) fn budgeted(
    c: &mut Caller<'_, GuestState>,
    fd: i32,
) -> Option<(Arc<DiskBudget>, Memory)> {
    let disk = budget_of(c, fd)?;
    match c.get_export("memory") {
        Some(Extern::Memory(m)) => Some((disk, m)),
        _ => None,
    }
}

/// The budget a change through `fd` counts against: a lent folder's own (none for a read-only
/// one, which refuses every change), or the guest's for anything else.
pub(super) fn budget_of(c: &Caller<'_, GuestState>, fd: i32) -> Option<Arc<DiskBudget>> {
    match c.data().reroutes.tree(fd as u32) {
        Tree::Own => c.data().watch.disk.clone(),
        Tree::Lent(_, budget) => budget.cloned(),
    }
}

/// Whether `a` and `b` are in the same folder (a rename or link between two may not cross).
pub(super) fn same_tree(c: &Caller<'_, GuestState>, a: i32, b: i32) -> bool {
    let r = &c.data().reroutes;
    match (r.tree(a as u32), r.tree(b as u32)) {
        (Tree::Own, Tree::Own) => true,
        (Tree::Lent(i, _), Tree::Lent(j, _)) => i == j,
        _ => false,
    }
}

/// What `fd_write` and `fd_pwrite` need to count a write: the budget, memory, the file as it
/// is and the bytes asked for. `None` when the write does not count (stdio, no budget, not a
/// regular file) or cannot be read (the original call then fails as it should).
fn file_write(
    c: &mut Caller<'_, GuestState>,
    lk: &Hooks,
    fd: i32,
    iovs: i32,
    n: i32,
) -> wasmtime::Result<Option<FileWrite>> {
    let Some((disk, mem)) = counted(c, fd) else {
        return Ok(None);
    };
    let Some(total) = iov_total(c, mem, iovs, n) else {
        return Ok(None);
    };
    Ok(fd_stat(c, mem, lk, fd)?
        .filter(|s| s.filetype == FILETYPE_REGULAR)
        .map(|before| FileWrite {
            disk,
            mem,
            before,
            total,
        }))
}

/// A write [`file_write`] found to count.
struct FileWrite {
    disk: Arc<DiskBudget>,
    mem: Memory,
    before: Stat,
    total: u64,
}

/// Runs a write to `fd` (`fd_write`, `fd_pwrite`) under the budget's change lock: a write to a
/// regular file may make it `grow(.., size before, bytes asked for)` larger, within the budget.
pub(super) fn write(
    c: &mut Caller<'_, GuestState>,
    lk: &Hooks,
    (fd, iovs, n): (i32, i32, i32),
    grow: impl FnOnce(&mut Caller<'_, GuestState>, Memory, &Stat, u64) -> wasmtime::Result<u64>,
    call: impl FnOnce(&mut Caller<'_, GuestState>) -> wasmtime::Result<i32>,
) -> wasmtime::Result<i32> {
    let disk = budget_of(c, fd);
    let _change = disk.as_deref().map(DiskBudget::change);
    let Some(FileWrite {
        disk,
        mem,
        before,
        total,
    }) = file_write(c, lk, fd, iovs, n)?
    else {
        return call(c);
    };
    let grow = grow(c, mem, &before, total)?;
    resize(c, mem, lk, &disk, fd, before, grow, call)
}

/// Runs a call that removes the name `(dirfd, path, path_len)` if it exists (an unlink), and
/// counts what went.
pub(super) fn removing(
    c: &mut Caller<'_, GuestState>,
    lk: &Hooks,
    (dirfd, path, path_len): (i32, i32, i32),
    call: impl FnOnce(&mut Caller<'_, GuestState>) -> wasmtime::Result<i32>,
) -> wasmtime::Result<i32> {
    let Some((disk, mem)) = budgeted(c, dirfd) else {
        return call(c);
    };
    let _change = disk.change();
    let before = path_stat(c, mem, lk, dirfd, false, path, path_len)?;
    let errno = call(c)?;
    if errno == ERRNO_SUCCESS
        && let Some(b) = before
    {
        gone(&disk, b);
    }
    Ok(errno)
}

/// Runs a call that may make `fd`'s file up to `grow` bytes larger, within the budget, and
/// counts what it did.
#[allow(clippy::too_many_arguments)]
pub(super) fn resize(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    lk: &Hooks,
    disk: &DiskBudget,
    fd: i32,
    before: Stat,
    grow: u64,
    call: impl FnOnce(&mut Caller<'_, GuestState>) -> wasmtime::Result<i32>,
) -> wasmtime::Result<i32> {
    let r = disk
        .reserve(grow, 0)
        .map_err(|over| c.data_mut().watch.disk_full(over))?;
    let errno = call(c)?;
    let after = match fd_stat(c, mem, lk, fd)? {
        Some(s) => s.size,
        None => before.size + grow,
    };
    r.settle(after as i64 - before.size as i64, 0);
    if before.nlink == 0 {
        disk.orphan_resized(before.id, after);
    }
    Ok(errno)
}

/// `path_open` under `disk`: an entry it creates and the bytes a truncation frees are counted,
/// and a regular file it opens is known to the budget until closed.
pub(super) fn open_counted(
    c: &mut Caller<'_, GuestState>,
    lk: &Hooks,
    f: &TypedFunc<OpenArgs, i32>,
    args: OpenArgs,
    disk: &Arc<DiskBudget>,
    mem: Memory,
) -> wasmtime::Result<i32> {
    let (dirfd, dirflags, path, path_len, oflags, .., opened) = args;
    let _change = disk.change();
    let (creat, trunc) = (oflags & OFLAGS_CREAT != 0, oflags & OFLAGS_TRUNC != 0);
    let follow = dirflags & LOOKUP_SYMLINK_FOLLOW != 0;
    let before = if creat || trunc {
        path_stat(c, mem, lk, dirfd, follow, path, path_len)?
    } else {
        None
    };
    let new_entry = creat && before.is_none();
    let r = disk
        .reserve(0, new_entry as u64)
        .map_err(|over| c.data_mut().watch.disk_full(over))?;
    let errno = f.call(&mut *c, args)?;
    if errno != ERRNO_SUCCESS {
        r.settle(0, 0);
        return Ok(errno);
    }
    let freed = match before {
        Some(b) if trunc && b.filetype == FILETYPE_REGULAR => b.size,
        _ => 0,
    };
    r.settle(-(freed as i64), new_entry as i64);
    if let Some(fd) = read_u32(c, mem, opened)
        && let Some(st) = fd_stat(c, mem, lk, fd as i32)?
        && st.filetype == FILETYPE_REGULAR
    {
        disk.opened(st.id);
        c.data_mut().files.fds.insert(fd, (st.id, disk.clone()));
    }
    Ok(errno)
}

/// Runs a call that makes one entry in `dirfd`'s folder, within its budget.
pub(super) fn new_entry(
    c: &mut Caller<'_, GuestState>,
    dirfd: i32,
    call: impl FnOnce(&mut Caller<'_, GuestState>) -> wasmtime::Result<i32>,
) -> wasmtime::Result<i32> {
    let Some(disk) = budget_of(c, dirfd) else {
        return call(c);
    };
    let _change = disk.change();
    let r = disk
        .reserve(0, 1)
        .map_err(|over| c.data_mut().watch.disk_full(over))?;
    let errno = call(c)?;
    if errno == ERRNO_SUCCESS {
        r.settle(0, 1);
    } else {
        r.settle(0, 0);
    }
    Ok(errno)
}

/// Counts a name that went away.
pub(super) fn gone(disk: &DiskBudget, b: Stat) {
    if b.filetype == FILETYPE_REGULAR {
        disk.unlinked(b.id, b.size, b.nlink <= 1);
    } else {
        disk.changed(0, -1);
    }
}

/// Bytes an `iovec` array asks to write; `None` when it is not in memory (the call fails).
pub(super) fn iov_total(c: &Caller<'_, GuestState>, mem: Memory, iovs: i32, n: i32) -> Option<u64> {
    let data = mem.data(c);
    let (at, n) = (iovs as u32 as usize, n as u32 as usize);
    let bytes = data.get(at..at.checked_add(n.checked_mul(8)?)?)?;
    Some(
        bytes
            .chunks_exact(8)
            .map(|iov| u32::from_le_bytes(iov[4..8].try_into().unwrap()) as u64)
            .sum(),
    )
}

pub(super) fn read_u32(c: &Caller<'_, GuestState>, mem: Memory, at: i32) -> Option<u32> {
    let at = at as u32 as usize;
    let b = mem.data(c).get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().unwrap()))
}

/// Calls `f` with the address of [`FILESTAT_SIZE`] bytes of guest memory to answer in, reads
/// the answer and gives the guest its bytes back. The guest is single-threaded and not running
/// while its host call runs, so nothing else sees them. `None` when the call failed.
pub(super) fn scratch_call(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    f: impl FnOnce(&mut Caller<'_, GuestState>, i32) -> wasmtime::Result<i32>,
) -> wasmtime::Result<Option<[u8; FILESTAT_SIZE]>> {
    let len = mem.data_size(&*c);
    let Some(at) = len.checked_sub(FILESTAT_SIZE) else {
        return Ok(None);
    };
    let mut saved = [0u8; FILESTAT_SIZE];
    saved.copy_from_slice(&mem.data(&*c)[at..at + FILESTAT_SIZE]);
    let errno = f(c, at as u32 as i32);
    let data = mem.data_mut(&mut *c);
    let mut out = [0u8; FILESTAT_SIZE];
    out.copy_from_slice(&data[at..at + FILESTAT_SIZE]);
    data[at..at + FILESTAT_SIZE].copy_from_slice(&saved);
    Ok((errno? == ERRNO_SUCCESS).then_some(out))
}

pub(super) fn parse_stat(b: [u8; FILESTAT_SIZE]) -> Stat {
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    Stat {
        id: (u64_at(0), u64_at(8)),
        filetype: b[16],
        nlink: u64_at(24),
        size: u64_at(32),
    }
}

pub(super) fn fd_stat(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    lk: &Hooks,
    fd: i32,
) -> wasmtime::Result<Option<Stat>> {
    let f = original::fd_filestat_get(c, lk)?;
    Ok(scratch_call(c, mem, |c, at| f.call(c, (fd, at)))?.map(parse_stat))
}

pub(super) fn fd_tell(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    lk: &Hooks,
    fd: i32,
) -> wasmtime::Result<Option<u64>> {
    let f = original::fd_tell(c, lk)?;
    Ok(scratch_call(c, mem, |c, at| f.call(c, (fd, at)))?
        .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap())))
}

pub(super) fn path_stat(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    lk: &Hooks,
    dirfd: i32,
    follow: bool,
    path: i32,
    path_len: i32,
) -> wasmtime::Result<Option<Stat>> {
    let f = original::path_filestat_get(c, lk)?;
    let flags = if follow { LOOKUP_SYMLINK_FOLLOW } else { 0 };
    Ok(scratch_call(c, mem, |c, at| {
        f.call(c, (dirfd, flags, path, path_len, at))
    })?
    .map(parse_stat))
}
