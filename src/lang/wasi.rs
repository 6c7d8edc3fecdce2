//! The host interface every guest gets: wasmtime-wasi's preview 1, with the one call that can
//! block, `poll_oneoff`, replaced by a wait that ends at the guest's deadline and stop flag.
//!
//! wasmtime's epoch checks run only while wasm executes. With `allow_blocking_current_thread`
//! a clock subscription in wasmtime-wasi 48 is an uninterruptible `std::thread::sleep`, so a
//! guest sleeping in `time.sleep(60)`, `os.sleep` or Go's `time.Sleep` kept its thread, ignored
//! its deadline, kill and sandbox deletion, and held a CPU slot while doing nothing. Here the
//! wait is cut into slices that look at the guest's [`Watch`] (kept in the store, where the
//! epoch callback looks too), and the guest's CPU slot is given back for the length of the wait.
//! Subscriptions on descriptors go to wasmtime-wasi's own `poll_oneoff`: guests have only files,
//! an empty stdin and captured output streams, which are always ready, so it never blocks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmtime::{Caller, Engine, Extern, Instance, Linker, Memory, Module, Trap, TypedFunc};
use wasmtime_wasi::clocks::HostMonotonicClock;

use super::Result;
use super::guest::GuestState;
use crate::engine::cpu;
use crate::engine::disk::{DiskBudget, FileId, Over};
use crate::engine::limits::{Stop, StopReason, Stopped};

/// Longest a waiting guest goes without looking at its deadline and stop flag.
const SLICE: Duration = Duration::from_millis(10);
/// How often a sandboxed guest's disk count is looked at while it runs (a walk only when the
/// count says it is over: something besides this guest's writes filled the space).
const QUOTA_EVERY: Duration = Duration::from_millis(500);

const MODULE: &str = "wasi_snapshot_preview1";
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;
const SUBSCRIPTION_SIZE: usize = 48;
const EVENT_SIZE: usize = 32;
const TAG_CLOCK: u8 = 0;
const CLOCK_REALTIME: u32 = 0;
const CLOCK_MONOTONIC: u32 = 1;
const SUBSCRIPTION_CLOCK_ABSTIME: u16 = 1;

/// What ends a guest's call from outside its own code: the deadline, the stop flag (kill,
/// sandbox deleted or expired) and, in a sandbox, the disk quota. Kept in the store so that the
/// epoch callback and every waiting host call look at the same values.
pub struct Watch {
    deadline: Instant,
    timeout: Duration,
    stop: Arc<Stop>,
    /// The call's own flag: raised when its client gives up on it.
    cancel: Option<Arc<Stop>>,
    /// What the guest may hold on disk (its sandbox's, or its one-shot scratch dirs').
    disk: Option<Arc<DiskBudget>>,
    /// Why the disk limit stopped the guest, for its result's note.
    disk_over: Option<Over>,
    last_quota: Instant,
    /// Zero of the guest's monotonic clock, for absolute clock subscriptions.
    origin: Instant,
    /// The call's running reports, when its caller wants them.
    ticker: Option<crate::engine::progress::Ticker>,
}

impl Watch {
    /// What the guest's disk calls are counted against.
    pub fn disk(&self) -> Option<&Arc<DiskBudget>> {
        self.disk.as_ref()
    }

    pub fn new(timeout: Duration, origin: Instant) -> Self {
        let now = Instant::now();
        Self {
            deadline: now + timeout,
            timeout,
            stop: Arc::new(Stop::default()),
            cancel: None,
            disk: None,
            disk_over: None,
            last_quota: now,
            origin,
            ticker: None,
        }
    }

    /// Starts a call: `timeout` from now, the given stop flag (a fresh one when `None`) and
    /// disk budget.
    pub fn arm(
        &mut self,
        timeout: Duration,
        stop: Option<Arc<Stop>>,
        cancel: Option<Arc<Stop>>,
        disk: Option<Arc<DiskBudget>>,
        ticker: Option<crate::engine::progress::Ticker>,
    ) {
        let now = Instant::now();
        self.deadline = now + timeout;
        self.timeout = timeout;
        self.stop = stop.unwrap_or_default();
        self.cancel = cancel;
        self.disk = disk;
        self.disk_over = None;
        self.last_quota = now;
        self.ticker = ticker;
    }

    /// Ends the call's running reports (a session's guest outlives its calls).
    pub fn end_reports(&mut self) {
        self.ticker = None;
    }

    /// A new deadline for the same call's settings.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.deadline = Instant::now() + timeout;
        self.timeout = timeout;
    }

    /// The deadline a timeout note names, when the call's covers more than this guest's run.
    pub fn report_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The guest's monotonic clock now, in nanoseconds.
    pub fn clock_ns(&self) -> u64 {
        self.origin
            .elapsed()
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The error that ends the guest now, if anything should.
    pub fn check(&mut self, now: Instant) -> wasmtime::Result<()> {
        let cancelled = || self.cancel.as_deref().and_then(Stop::reason);
        if let Some(why) = self.stop.reason().or_else(cancelled) {
            return Err(Stopped(why).into());
        }
        if now >= self.deadline {
            return Err(Trap::Interrupt.into());
        }
        if let Some(disk) = &self.disk
            && now.duration_since(self.last_quota) >= QUOTA_EVERY
        {
            self.last_quota = now;
            if let Some(over) = disk.over_quota() {
                return Err(self.disk_full(over));
            }
        }
        if let Some(t) = &mut self.ticker {
            t.tick(now);
        }
        Ok(())
    }

    /// Stops the guest for the disk limit. Not raised on the shared flag: freeing space lets
    /// the next run go on.
    fn disk_full(&mut self, over: Over) -> wasmtime::Error {
        self.disk_over = Some(over);
        Stopped(StopReason::DiskQuota).into()
    }

    /// What the disk limit stopped the guest at, once.
    pub fn take_disk_over(&mut self) -> Option<Over> {
        self.disk_over.take()
    }

    /// Waits until `wake` (forever: `None`) without holding a CPU slot, in slices that end
    /// the wait with the guest's deadline, stop flag or quota. The slot is taken back before
    /// returning `Ok`.
    pub fn wait(&mut self, wake: Option<Instant>) -> wasmtime::Result<()> {
        let released = cpu::release();
        loop {
            let now = Instant::now();
            self.check(now)?;
            if wake.is_some_and(|w| now >= w) {
                break;
            }
            let mut until = (now + SLICE).min(self.deadline);
            if let Some(w) = wake {
                until = until.min(w);
            }
            std::thread::sleep(until.saturating_duration_since(now));
        }
        self.retake(released)
    }

    /// Gives this guest's CPU slot to another owner's waiting call when its owner holds more
    /// than its share (`engine::cpu`), then waits for a slot again.
    pub fn share_slot(&mut self) -> wasmtime::Result<()> {
        match cpu::yield_over_share() {
            Some(released) => self.retake(released),
            None => Ok(()),
        }
    }

    /// Takes a CPU slot back. Waiting for one is waiting too: the deadline and stop flag still
    /// apply.
    fn retake(&mut self, mut released: cpu::Released) -> wasmtime::Result<()> {
        while !released.reacquire(SLICE) {
            self.check(Instant::now())?;
        }
        Ok(())
    }
}

/// The guest's monotonic clock: nanoseconds since its [`Watch`]'s origin.
struct GuestClock(Instant);

impl HostMonotonicClock for GuestClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos().try_into().unwrap_or(u64::MAX)
    }
}

/// A monotonic clock for a new guest that reads `start` now (a restored session's clock goes on
/// from where it was saved), and the [`Watch`] that converts its absolute times.
pub fn clock(timeout: Duration, start: Duration) -> (impl HostMonotonicClock + 'static, Watch) {
    let now = Instant::now();
    // An origin before this boot cannot be an Instant: such a clock restarts from zero.
    let origin = now.checked_sub(start).unwrap_or(now);
    (GuestClock(origin), Watch::new(timeout, origin))
}

/// A linker with WASI preview 1, the interruptible `poll_oneoff`, and the calls that change
/// what a guest holds on disk counted against its [`DiskBudget`].
pub fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
    fn wasi(s: &mut GuestState) -> &mut wasmtime_wasi::p1::WasiP1Ctx {
        &mut s.wasi
    }
    let mut original: Linker<GuestState> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut original, wasi).map_err(super::guest::engine_err)?;
    let lk = Arc::new(Hooks {
        linker: original,
        module: Module::new(engine, forwarders_wat()).map_err(super::guest::engine_err)?,
    });
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, wasi).map_err(super::guest::engine_err)?;
    linker.allow_shadowing(true);
    let e = super::guest::engine_err;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "poll_oneoff",
            move |mut c: Caller<'_, GuestState>, subs: i32, events: i32, n: i32, nevents: i32| {
                match poll_clocks(&mut c, subs, events, n, nevents)? {
                    Some(errno) => Ok(errno),
                    None => {
                        original::poll_oneoff(&mut c, &o)?.call(&mut c, (subs, events, n, nevents))
                    }
                }
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "fd_write",
            move |mut c: Caller<'_, GuestState>, fd: i32, iovs: i32, n: i32, nwritten: i32| {
                if let Some(errno) = write_stdio(&mut c, fd, iovs, n, nwritten)? {
                    return Ok(errno);
                }
                let disk = c.data().watch.disk.clone();
                let _change = disk.as_deref().map(DiskBudget::change);
                let f = original::fd_write(&mut c, &o)?;
                let args = (fd, iovs, n, nwritten);
                let Some(FileWrite {
                    disk,
                    mem,
                    before,
                    total,
                }) = file_write(&mut c, &o, fd, iovs, n)?
                else {
                    return f.call(&mut c, args);
                };
                // Appending writes at the end, others at the position: at most this much more.
                let at = fd_tell(&mut c, mem, &o, fd)?.unwrap_or(before.size);
                let grow = at.max(before.size).saturating_add(total) - before.size;
                resize(&mut c, mem, &o, &disk, fd, before, grow, |c| {
                    f.call(c, args)
                })
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "fd_pwrite",
            move |mut c: Caller<'_, GuestState>,
                  fd: i32,
                  iovs: i32,
                  n: i32,
                  offset: i64,
                  nwritten: i32| {
                let disk = c.data().watch.disk.clone();
                let _change = disk.as_deref().map(DiskBudget::change);
                let f = original::fd_pwrite(&mut c, &o)?;
                let args = (fd, iovs, n, offset, nwritten);
                let Some(FileWrite {
                    disk,
                    mem,
                    before,
                    total,
                }) = file_write(&mut c, &o, fd, iovs, n)?
                else {
                    return f.call(&mut c, args);
                };
                let end = (offset as u64).saturating_add(total);
                let grow = end.max(before.size) - before.size;
                resize(&mut c, mem, &o, &disk, fd, before, grow, |c| {
                    f.call(c, args)
                })
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "fd_filestat_set_size",
            move |mut c: Caller<'_, GuestState>, fd: i32, size: i64| {
                let f = original::fd_filestat_set_size(&mut c, &o)?;
                let Some((disk, mem)) = counted(&mut c, fd) else {
                    return f.call(&mut c, (fd, size));
                };
                let _change = disk.change();
                let Some(before) = fd_stat(&mut c, mem, &o, fd)? else {
                    return f.call(&mut c, (fd, size));
                };
                let grow = (size as u64).max(before.size) - before.size;
                resize(&mut c, mem, &o, &disk, fd, before, grow, |c| {
                    f.call(c, (fd, size))
                })
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_open",
            move |mut c: Caller<'_, GuestState>,
                  dirfd: i32,
                  dirflags: i32,
                  path: i32,
                  path_len: i32,
                  oflags: i32,
                  base: i64,
                  inheriting: i64,
                  fdflags: i32,
                  opened: i32| {
                let f = original::path_open(&mut c, &o)?;
                let args = (
                    dirfd, dirflags, path, path_len, oflags, base, inheriting, fdflags, opened,
                );
                let Some((disk, mem)) = budgeted(&mut c) else {
                    return f.call(&mut c, args);
                };
                let _change = disk.change();
                let (creat, trunc) = (oflags & OFLAGS_CREAT != 0, oflags & OFLAGS_TRUNC != 0);
                let follow = dirflags & LOOKUP_SYMLINK_FOLLOW != 0;
                let before = if creat || trunc {
                    path_stat(&mut c, mem, &o, dirfd, follow, path, path_len)?
                } else {
                    None
                };
                let new_entry = creat && before.is_none();
                let r = disk
                    .reserve(0, new_entry as u64)
                    .map_err(|over| c.data_mut().watch.disk_full(over))?;
                let errno = f.call(&mut c, args)?;
                if errno != ERRNO_SUCCESS {
                    r.settle(0, 0);
                    return Ok(errno);
                }
                let freed = match before {
                    Some(b) if trunc && b.filetype == FILETYPE_REGULAR => b.size,
                    _ => 0,
                };
                r.settle(-(freed as i64), new_entry as i64);
                let fd = read_u32(&c, mem, opened);
                if let Some(fd) = fd
                    && let Some(st) = fd_stat(&mut c, mem, &o, fd as i32)?
                    && st.filetype == FILETYPE_REGULAR
                {
                    disk.opened(st.id);
                    c.data_mut().files.fds.insert(fd, (st.id, disk.clone()));
                }
                Ok(errno)
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "fd_close",
            move |mut c: Caller<'_, GuestState>, fd: i32| {
                if let Some((id, disk)) = c.data_mut().files.fds.remove(&(fd as u32)) {
                    disk.closed(id);
                }
                original::fd_close(&mut c, &o)?.call(&mut c, (fd,))
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "fd_renumber",
            move |mut c: Caller<'_, GuestState>, from: i32, to: i32| {
                let errno = original::fd_renumber(&mut c, &o)?.call(&mut c, (from, to))?;
                if errno == ERRNO_SUCCESS && from != to {
                    let files = &mut c.data_mut().files;
                    if (0..=2).contains(&to) {
                        files.stdio_moved = true;
                    }
                    if let Some((id, disk)) = files.fds.remove(&(to as u32)) {
                        disk.closed(id);
                    }
                    if let Some(moved) = files.fds.remove(&(from as u32)) {
                        files.fds.insert(to as u32, moved);
                    }
                }
                Ok(errno)
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_unlink_file",
            move |mut c: Caller<'_, GuestState>, dirfd: i32, path: i32, path_len: i32| {
                let f = original::path_unlink_file(&mut c, &o)?;
                removing(&mut c, &o, (dirfd, path, path_len), |c| {
                    f.call(c, (dirfd, path, path_len))
                })
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_remove_directory",
            move |mut c: Caller<'_, GuestState>, dirfd: i32, path: i32, path_len: i32| {
                let disk = c.data().watch.disk.clone();
                let _change = disk.as_deref().map(DiskBudget::change);
                let errno = original::path_remove_directory(&mut c, &o)?
                    .call(&mut c, (dirfd, path, path_len))?;
                if errno == ERRNO_SUCCESS
                    && let Some(disk) = &disk
                {
                    disk.changed(0, -1);
                }
                Ok(errno)
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_rename",
            move |mut c: Caller<'_, GuestState>,
                  fd: i32,
                  old: i32,
                  old_len: i32,
                  new_fd: i32,
                  new: i32,
                  new_len: i32| {
                let f = original::path_rename(&mut c, &o)?;
                let args = (fd, old, old_len, new_fd, new, new_len);
                let Some((disk, mem)) = budgeted(&mut c) else {
                    return f.call(&mut c, args);
                };
                let _change = disk.change();
                let from = path_stat(&mut c, mem, &o, fd, false, old, old_len)?;
                let to = path_stat(&mut c, mem, &o, new_fd, false, new, new_len)?;
                let errno = f.call(&mut c, args)?;
                // A rename over another file removes the name it had; one onto the file itself
                // (the same name, or another of its names) changes nothing.
                if errno == ERRNO_SUCCESS
                    && let (Some(from), Some(to)) = (from, to)
                    && from.id != to.id
                {
                    gone(&disk, to);
                }
                Ok(errno)
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_create_directory",
            move |mut c: Caller<'_, GuestState>, dirfd: i32, path: i32, path_len: i32| {
                let f = original::path_create_directory(&mut c, &o)?;
                new_entry(&mut c, |c| f.call(c, (dirfd, path, path_len)))
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_symlink",
            move |mut c: Caller<'_, GuestState>,
                  old: i32,
                  old_len: i32,
                  dirfd: i32,
                  new: i32,
                  new_len: i32| {
                let f = original::path_symlink(&mut c, &o)?;
                new_entry(&mut c, |c| f.call(c, (old, old_len, dirfd, new, new_len)))
            },
        )
        .map_err(e)?;

    let o = lk.clone();
    linker
        .func_wrap(
            MODULE,
            "path_link",
            move |mut c: Caller<'_, GuestState>,
                  old_fd: i32,
                  old_flags: i32,
                  old: i32,
                  old_len: i32,
                  new_fd: i32,
                  new: i32,
                  new_len: i32| {
                let f = original::path_link(&mut c, &o)?;
                let args = (old_fd, old_flags, old, old_len, new_fd, new, new_len);
                // A new name of a file: an entry, and no bytes (a file's count once).
                new_entry(&mut c, |c| f.call(c, args))
            },
        )
        .map_err(e)?;

    linker.allow_shadowing(false);
    Ok(linker)
}

const OFLAGS_CREAT: i32 = 1;
const OFLAGS_TRUNC: i32 = 8;
const LOOKUP_SYMLINK_FOLLOW: i32 = 1;
const FILETYPE_REGULAR: u8 = 4;
const FILESTAT_SIZE: usize = 64;

/// wasmtime-wasi's own functions, for the shadows to call. A host function reaches guest memory
/// through its caller's `memory` export, and a host-to-host call has no caller; so they are
/// called through a small wasm module per store that imports the guest's memory and exports it
/// again, with one forwarding function for each.
pub struct Hooks {
    linker: Linker<GuestState>,
    module: Module,
}

macro_rules! originals {
    ($($name:ident ( $($p:ident),* );)*) => {
        const SIGNATURES: &[(&str, &[&str])] = &[$((stringify!($name), &[$(stringify!($p)),*]),)*];

        /// The forwarding functions of a store's module, made when the guest first needs one.
        #[derive(Default)]
        pub struct Originals {
            $($name: Option<TypedFunc<($($p,)*), i32>>,)*
        }

        impl Originals {
            fn of(c: &mut Caller<'_, GuestState>, inst: Instance) -> wasmtime::Result<Self> {
                Ok(Self {
                    $($name: Some(inst.get_typed_func(&mut *c, stringify!($name))?),)*
                })
            }
        }

        mod original {
            use super::*;
            $(
                pub(super) fn $name(
                    c: &mut Caller<'_, GuestState>,
                    h: &Hooks,
                ) -> wasmtime::Result<TypedFunc<($($p,)*), i32>> {
                    if c.data().originals.$name.is_none() {
                        forwarders(c, h)?;
                    }
                    Ok(c.data().originals.$name.clone().expect("made by forwarders"))
                }
            )*
        }
    };
}

originals! {
    poll_oneoff(i32, i32, i32, i32);
    fd_write(i32, i32, i32, i32);
    fd_pwrite(i32, i32, i32, i64, i32);
    fd_filestat_set_size(i32, i64);
    fd_filestat_get(i32, i32);
    fd_tell(i32, i32);
    fd_close(i32);
    fd_renumber(i32, i32);
    path_open(i32, i32, i32, i32, i32, i64, i64, i32, i32);
    path_filestat_get(i32, i32, i32, i32, i32);
    path_unlink_file(i32, i32, i32);
    path_remove_directory(i32, i32, i32);
    path_rename(i32, i32, i32, i32, i32, i32);
    path_create_directory(i32, i32, i32);
    path_symlink(i32, i32, i32, i32, i32);
    path_link(i32, i32, i32, i32, i32, i32, i32);
}

/// A module with a memory of its own (4 pages) that exports each call [`Originals`] lists,
/// forwarding to the import: a guest that makes exactly the calls a test asks for.
#[doc(hidden)]
pub fn calls_wat() -> String {
    forwarders_wat()
        .replacen("(import \"env\" \"memory\" (memory 0))", "", 1)
        .replacen("(export \"memory\"", "(memory 4)\n(export \"memory\"", 1)
}

/// The forwarding module's text.
fn forwarders_wat() -> String {
    let mut imports = String::new();
    let mut funcs = String::new();
    for (name, params) in SIGNATURES {
        let ps = params.join(" ");
        imports.push_str(&format!(
            "(import \"{MODULE}\" \"{name}\" (func ${name} (param {ps}) (result i32)))\n"
        ));
        let gets: String = (0..params.len())
            .map(|i| format!("local.get {i} "))
            .collect();
        funcs.push_str(&format!(
            "(func (export \"{name}\") (param {ps}) (result i32) {gets}call ${name})\n"
        ));
    }
    format!(
        "(module (import \"env\" \"memory\" (memory 0))\n{imports}(export \"memory\" (memory 0))\n{funcs})"
    )
}

/// Instantiates the forwarding module in the guest's store, on its memory.
fn forwarders(c: &mut Caller<'_, GuestState>, h: &Hooks) -> wasmtime::Result<()> {
    let Some(Extern::Memory(mem)) = c.get_export("memory") else {
        wasmtime::bail!("the guest exports no memory");
    };
    let mut imports: Vec<Extern> = vec![mem.into()];
    for (name, _) in SIGNATURES {
        imports.push(h.linker.get(&mut *c, MODULE, name)?);
    }
    let inst = Instance::new(&mut *c, &h.module, &imports)?;
    let originals = Originals::of(c, inst)?;
    c.data_mut().originals = originals;
    Ok(())
}

/// The guest's open regular files as its budget knows them; released when the store goes.
#[derive(Default)]
pub struct OpenFiles {
    fds: HashMap<u32, (FileId, Arc<DiskBudget>)>,
    /// `fd_renumber` put something on stdin, stdout or stderr: writes there may reach a file.
    stdio_moved: bool,
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
struct Stat {
    id: FileId,
    filetype: u8,
    nlink: u64,
    size: u64,
}

/// The guest's budget and memory when a write to `fd` counts: the guest has a budget, and `fd`
/// is not the captured stdio (which has caps of its own).
fn counted(c: &mut Caller<'_, GuestState>, fd: i32) -> Option<(Arc<DiskBudget>, Memory)> {
    if (0..=2).contains(&fd) && !c.data().files.stdio_moved {
        return None;
    }
    budgeted(c)
}

/// The guest's budget and memory, when it has a budget (path calls: no descriptor to skip).
fn budgeted(c: &mut Caller<'_, GuestState>) -> Option<(Arc<DiskBudget>, Memory)> {
    let disk = c.data().watch.disk.clone()?;
    match c.get_export("memory") {
        Some(Extern::Memory(m)) => Some((disk, m)),
        _ => None,
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

/// Runs a call that removes the name `(dirfd, path, path_len)` if it exists (an unlink), and
/// counts what went.
fn removing(
    c: &mut Caller<'_, GuestState>,
    lk: &Hooks,
    (dirfd, path, path_len): (i32, i32, i32),
    call: impl FnOnce(&mut Caller<'_, GuestState>) -> wasmtime::Result<i32>,
) -> wasmtime::Result<i32> {
    let Some((disk, mem)) = budgeted(c) else {
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

/// `fd_write` on the captured stdout or stderr, straight into its buffer (no disk, and no need
/// for the forwarding module). `None` when `fd` is something else.
fn write_stdio(
    c: &mut Caller<'_, GuestState>,
    fd: i32,
    iovs: i32,
    n: i32,
    nwritten: i32,
) -> wasmtime::Result<Option<i32>> {
    let d = c.data();
    if !(1..=2).contains(&fd) || d.files.stdio_moved {
        return Ok(None);
    }
    let out = d.stdio[fd as usize - 1].clone();
    let Some(Extern::Memory(mem)) = c.get_export("memory") else {
        return Ok(None);
    };
    let data = mem.data_mut(&mut *c);
    let (at, count) = (iovs as u32 as usize, n as u32 as usize);
    let Some(list) = count
        .checked_mul(8)
        .and_then(|len| data.get(at..at.checked_add(len)?))
    else {
        return Ok(Some(ERRNO_FAULT));
    };
    let mut spans = Vec::with_capacity(count);
    for iov in list.chunks_exact(8) {
        let ptr = u32::from_le_bytes(iov[0..4].try_into().unwrap()) as usize;
        let len = u32::from_le_bytes(iov[4..8].try_into().unwrap()) as usize;
        match ptr.checked_add(len) {
            Some(end) if end <= data.len() => spans.push((ptr, end)),
            _ => return Ok(Some(ERRNO_FAULT)),
        }
    }
    let Some(nw) = (nwritten as u32 as usize)
        .checked_add(4)
        .filter(|end| *end <= data.len())
    else {
        return Ok(Some(ERRNO_FAULT));
    };
    let mut total = 0u32;
    for (start, end) in spans {
        match out.push(&data[start..end]) {
            Ok(()) => total = total.wrapping_add((end - start) as u32),
            Err(wasmtime_wasi::p2::StreamError::Trap(e)) => return Err(e),
            Err(e) => return Err(wasmtime::format_err!("{e}")),
        }
    }
    data[nw - 4..nw].copy_from_slice(&total.to_le_bytes());
    Ok(Some(ERRNO_SUCCESS))
}

/// Runs a call that may make `fd`'s file up to `grow` bytes larger, within the budget, and
/// counts what it did.
#[allow(clippy::too_many_arguments)]
fn resize(
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

/// Runs a call that makes one entry, within the budget.
fn new_entry(
    c: &mut Caller<'_, GuestState>,
    call: impl FnOnce(&mut Caller<'_, GuestState>) -> wasmtime::Result<i32>,
) -> wasmtime::Result<i32> {
    let Some(disk) = c.data().watch.disk.clone() else {
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
fn gone(disk: &DiskBudget, b: Stat) {
    if b.filetype == FILETYPE_REGULAR {
        disk.unlinked(b.id, b.size, b.nlink <= 1);
    } else {
        disk.changed(0, -1);
    }
}

/// Bytes an `iovec` array asks to write; `None` when it is not in memory (the call fails).
fn iov_total(c: &Caller<'_, GuestState>, mem: Memory, iovs: i32, n: i32) -> Option<u64> {
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

fn read_u32(c: &Caller<'_, GuestState>, mem: Memory, at: i32) -> Option<u32> {
    let at = at as u32 as usize;
    let b = mem.data(c).get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().unwrap()))
}

/// Calls `f` with the address of [`FILESTAT_SIZE`] bytes of guest memory to answer in, reads
/// the answer and gives the guest its bytes back. The guest is single-threaded and not running
/// while its host call runs, so nothing else sees them. `None` when the call failed.
fn scratch_call(
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

fn parse_stat(b: [u8; FILESTAT_SIZE]) -> Stat {
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    Stat {
        id: (u64_at(0), u64_at(8)),
        filetype: b[16],
        nlink: u64_at(24),
        size: u64_at(32),
    }
}

fn fd_stat(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    lk: &Hooks,
    fd: i32,
) -> wasmtime::Result<Option<Stat>> {
    let f = original::fd_filestat_get(c, lk)?;
    Ok(scratch_call(c, mem, |c, at| f.call(c, (fd, at)))?.map(parse_stat))
}

fn fd_tell(
    c: &mut Caller<'_, GuestState>,
    mem: Memory,
    lk: &Hooks,
    fd: i32,
) -> wasmtime::Result<Option<u64>> {
    let f = original::fd_tell(c, lk)?;
    Ok(scratch_call(c, mem, |c, at| f.call(c, (fd, at)))?
        .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap())))
}

fn path_stat(
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

/// `poll_oneoff` for subscriptions that are all clocks: waits for the first to expire and
/// reports every one that has. `None` when any subscription is on a descriptor.
fn poll_clocks(
    caller: &mut Caller<'_, GuestState>,
    subs: i32,
    events: i32,
    n: i32,
    nevents: i32,
) -> wasmtime::Result<Option<i32>> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return Ok(None);
    };
    let n = n as u32 as usize;
    if n == 0 {
        // Sleeping forever is not a thing in preview 1.
        return Ok(Some(ERRNO_INVAL));
    }
    let (subs, events, nevents) = (
        subs as u32 as usize,
        events as u32 as usize,
        nevents as u32 as usize,
    );
    let data = memory.data(&caller);
    let in_bounds =
        |at: usize, len: usize| at.checked_add(len).is_some_and(|end| end <= data.len());
    let Some(subs_len) = n.checked_mul(SUBSCRIPTION_SIZE) else {
        return Ok(Some(ERRNO_FAULT));
    };
    if !in_bounds(subs, subs_len) || !in_bounds(events, n * EVENT_SIZE) || !in_bounds(nevents, 4) {
        return Ok(Some(ERRNO_FAULT));
    }
    let origin = caller.data().watch.origin;
    let now = Instant::now();
    // (userdata, when it fires; `None`: never within this process's clock range)
    let mut clocks = Vec::with_capacity(n);
    for i in 0..n {
        let s = &data[subs + i * SUBSCRIPTION_SIZE..][..SUBSCRIPTION_SIZE];
        if s[8] != TAG_CLOCK {
            return Ok(None);
        }
        let userdata = u64::from_le_bytes(s[0..8].try_into().unwrap());
        let id = u32::from_le_bytes(s[16..20].try_into().unwrap());
        let timeout = u64::from_le_bytes(s[24..32].try_into().unwrap());
        let flags = u16::from_le_bytes(s[40..42].try_into().unwrap());
        let absolute = flags & SUBSCRIPTION_CLOCK_ABSTIME != 0;
        let fires = match (id, absolute) {
            (CLOCK_MONOTONIC | CLOCK_REALTIME, false) => {
                now.checked_add(Duration::from_nanos(timeout))
            }
            (CLOCK_MONOTONIC, true) => origin.checked_add(Duration::from_nanos(timeout)),
            (CLOCK_REALTIME, true) => {
                let wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos().try_into().unwrap_or(u64::MAX));
                now.checked_add(Duration::from_nanos(timeout.saturating_sub(wall)))
            }
            _ => return Ok(Some(ERRNO_INVAL)),
        };
        clocks.push((userdata, fires));
    }
    let first = clocks.iter().filter_map(|c| c.1).min();
    caller.data_mut().watch.wait(first)?;
    let now = Instant::now();
    let data = memory.data_mut(&mut *caller);
    let mut count = 0usize;
    for (userdata, fires) in clocks {
        if fires.is_none_or(|f| f > now) {
            continue;
        }
        let e = &mut data[events + count * EVENT_SIZE..][..EVENT_SIZE];
        e.fill(0);
        e[0..8].copy_from_slice(&userdata.to_le_bytes());
        // error 0 (success), type 0 (clock), no bytes or flags.
        count += 1;
    }
    data[nevents..nevents + 4].copy_from_slice(&(count as u32).to_le_bytes());
    Ok(Some(ERRNO_SUCCESS))
}
