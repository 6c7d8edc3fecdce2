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
use crate::lang::mounts::Tree;

/// Longest a waiting guest goes without looking at its deadline and stop flag.
const SLICE: Duration = Duration::from_millis(10);
/// How often a sandboxed guest's disk count is looked at while it runs (a walk only when the
/// count says it is over: something besides this guest's writes filled the space).
const QUOTA_EVERY: Duration = Duration::from_millis(500);

const MODULE: &str = "wasi_snapshot_preview1";
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;
const ERRNO_PERM: i32 = 63;
const ERRNO_XDEV: i32 = 75;
const SUBSCRIPTION_SIZE: usize = 48;
const EVENT_SIZE: usize = 32;
const TAG_CLOCK: u8 = 0;
const CLOCK_REALTIME: u32 = 0;
const CLOCK_MONOTONIC: u32 = 1;
const SUBSCRIPTION_CLOCK_ABSTIME: u16 = 1;

mod disk;
mod watch;

pub use disk::OpenFiles;
use disk::*;
use watch::poll_clocks;
pub use watch::{Watch, clock};

/// Replaces WASI call `$name` in `$linker` with a host function whose body reaches
/// wasmtime-wasi's own calls through `$o` (the [`Hooks`] `$hooks`).
macro_rules! shadow {
    ($linker:ident, $hooks:ident, $name:literal, |$c:ident, $o:ident $(, $p:ident: $t:ty)*| $body:block) => {{
        let $o = $hooks.clone();
        $linker
            .func_wrap(MODULE, $name, move |mut $c: Caller<'_, GuestState> $(, $p: $t)*| $body)
            .map_err(super::guest::engine_err)?;
    }};
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

    shadow!(
        linker,
        lk,
        "poll_oneoff",
        |c, o, subs: i32, events: i32, n: i32, nevents: i32| {
            match poll_clocks(&mut c, subs, events, n, nevents)? {
                Some(errno) => Ok(errno),
                None => original::poll_oneoff(&mut c, &o)?.call(&mut c, (subs, events, n, nevents)),
            }
        }
    );

    shadow!(
        linker,
        lk,
        "fd_write",
        |c, o, fd: i32, iovs: i32, n: i32, nwritten: i32| {
            if let Some(errno) = write_stdio(&mut c, fd, iovs, n, nwritten)? {
                return Ok(errno);
            }
            let f = original::fd_write(&mut c, &o)?;
            // Appending writes at the end, others at the position: at most this much more.
            let grow = |c: &mut Caller<'_, GuestState>, mem, before: &Stat, total: u64| {
                let at = fd_tell(c, mem, &o, fd)?.unwrap_or(before.size);
                Ok(at.max(before.size).saturating_add(total) - before.size)
            };
            write(&mut c, &o, (fd, iovs, n), grow, |c| {
                f.call(c, (fd, iovs, n, nwritten))
            })
        }
    );

    shadow!(
        linker,
        lk,
        "fd_pwrite",
        |c, o, fd: i32, iovs: i32, n: i32, offset: i64, nwritten: i32| {
            let f = original::fd_pwrite(&mut c, &o)?;
            let grow = |_: &mut Caller<'_, GuestState>, _, before: &Stat, total: u64| {
                let end = (offset as u64).saturating_add(total);
                Ok(end.max(before.size) - before.size)
            };
            write(&mut c, &o, (fd, iovs, n), grow, |c| {
                f.call(c, (fd, iovs, n, offset, nwritten))
            })
        }
    );

    shadow!(
        linker,
        lk,
        "fd_filestat_set_size",
        |c, o, fd: i32, size: i64| {
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
        }
    );

    shadow!(
        linker,
        lk,
        "path_open",
        |c,
         o,
         dirfd: i32,
         dirflags: i32,
         path: i32,
         path_len: i32,
         oflags: i32,
         base: i64,
         inheriting: i64,
         fdflags: i32,
         opened: i32| {
            rerouted(
                &mut c,
                (dirfd, path, path_len),
                |c, (dirfd, path, path_len)| {
                    let f = original::path_open(c, &o)?;
                    let args = (
                        dirfd, dirflags, path, path_len, oflags, base, inheriting, fdflags, opened,
                    );
                    let errno = match budgeted(c, dirfd) {
                        None => f.call(&mut *c, args)?,
                        Some((disk, mem)) => open_counted(c, &o, &f, args, &disk, mem)?,
                    };
                    if errno == ERRNO_SUCCESS
                        && c.data().reroutes.lends()
                        && let Some(Extern::Memory(mem)) = c.get_export("memory")
                        && let Some(fd) = read_u32(c, mem, opened)
                    {
                        c.data_mut().reroutes.opened(dirfd as u32, fd);
                    }
                    Ok(errno)
                },
            )
        }
    );

    shadow!(linker, lk, "fd_close", |c, o, fd: i32| {
        c.data_mut().reroutes.forget(fd as u32);
        if let Some((id, disk)) = c.data_mut().files.fds.remove(&(fd as u32)) {
            disk.closed(id);
        }
        original::fd_close(&mut c, &o)?.call(&mut c, (fd,))
    });

    shadow!(linker, lk, "fd_renumber", |c, o, from: i32, to: i32| {
        let errno = original::fd_renumber(&mut c, &o)?.call(&mut c, (from, to))?;
        if errno == ERRNO_SUCCESS && from != to {
            c.data_mut().reroutes.renumbered(from as u32, to as u32);
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
    });

    shadow!(
        linker,
        lk,
        "path_unlink_file",
        |c, o, dirfd: i32, path: i32, path_len: i32| {
            rerouted(
                &mut c,
                (dirfd, path, path_len),
                |c, (dirfd, path, path_len)| {
                    let f = original::path_unlink_file(c, &o)?;
                    removing(c, &o, (dirfd, path, path_len), |c| {
                        f.call(c, (dirfd, path, path_len))
                    })
                },
            )
        }
    );

    shadow!(
        linker,
        lk,
        "path_remove_directory",
        |c, o, dirfd: i32, path: i32, path_len: i32| {
            rerouted(
                &mut c,
                (dirfd, path, path_len),
                |c, (dirfd, path, path_len)| {
                    let disk = budget_of(c, dirfd);
                    let _change = disk.as_deref().map(DiskBudget::change);
                    let errno = original::path_remove_directory(c, &o)?
                        .call(&mut *c, (dirfd, path, path_len))?;
                    if errno == ERRNO_SUCCESS
                        && let Some(disk) = &disk
                    {
                        disk.changed(0, -1);
                    }
                    Ok(errno)
                },
            )
        }
    );

    shadow!(
        linker,
        lk,
        "path_rename",
        |c, o, fd: i32, old: i32, old_len: i32, new_fd: i32, new: i32, new_len: i32| {
            rerouted(&mut c, (fd, old, old_len), |c, (fd, old, old_len)| {
                rerouted(c, (new_fd, new, new_len), |c, (new_fd, new, new_len)| {
                    if !same_tree(c, fd, new_fd) {
                        return Ok(ERRNO_XDEV);
                    }
                    let f = original::path_rename(c, &o)?;
                    let args = (fd, old, old_len, new_fd, new, new_len);
                    let Some((disk, mem)) = budgeted(c, fd) else {
                        return f.call(c, args);
                    };
                    let _change = disk.change();
                    let from = path_stat(c, mem, &o, fd, false, old, old_len)?;
                    let to = path_stat(c, mem, &o, new_fd, false, new, new_len)?;
                    let errno = f.call(&mut *c, args)?;
                    // A rename over another file removes the name it had; one onto the file
                    // itself (the same name, or another of its names) changes nothing.
                    if errno == ERRNO_SUCCESS
                        && let (Some(from), Some(to)) = (from, to)
                        && from.id != to.id
                    {
                        gone(&disk, to);
                    }
                    Ok(errno)
                })
            })
        }
    );

    shadow!(
        linker,
        lk,
        "path_create_directory",
        |c, o, dirfd: i32, path: i32, path_len: i32| {
            rerouted(
                &mut c,
                (dirfd, path, path_len),
                |c, (dirfd, path, path_len)| {
                    let f = original::path_create_directory(c, &o)?;
                    new_entry(c, dirfd, |c| f.call(c, (dirfd, path, path_len)))
                },
            )
        }
    );

    shadow!(
        linker,
        lk,
        "path_symlink",
        |c, o, old: i32, old_len: i32, dirfd: i32, new: i32, new_len: i32| {
            rerouted(&mut c, (dirfd, new, new_len), |c, (dirfd, new, new_len)| {
                // The folder's owner would follow it on the host.
                if matches!(c.data().reroutes.tree(dirfd as u32), Tree::Lent(..)) {
                    return Ok(ERRNO_PERM);
                }
                let f = original::path_symlink(c, &o)?;
                new_entry(c, dirfd, |c| f.call(c, (old, old_len, dirfd, new, new_len)))
            })
        }
    );

    shadow!(
        linker,
        lk,
        "path_link",
        |c,
         o,
         old_fd: i32,
         old_flags: i32,
         old: i32,
         old_len: i32,
         new_fd: i32,
         new: i32,
         new_len: i32| {
            rerouted(
                &mut c,
                (old_fd, old, old_len),
                |c, (old_fd, old, old_len)| {
                    rerouted(c, (new_fd, new, new_len), |c, (new_fd, new, new_len)| {
                        if !same_tree(c, old_fd, new_fd) {
                            return Ok(ERRNO_XDEV);
                        }
                        let f = original::path_link(c, &o)?;
                        let args = (old_fd, old_flags, old, old_len, new_fd, new, new_len);
                        // A new name of a file: an entry, and no bytes (a file's count once).
                        new_entry(c, new_fd, |c| f.call(c, args))
                    })
                },
            )
        }
    );

    shadow!(
        linker,
        lk,
        "path_filestat_get",
        |c, o, fd: i32, flags: i32, path: i32, path_len: i32, buf: i32| {
            rerouted(&mut c, (fd, path, path_len), |c, (fd, path, path_len)| {
                original::path_filestat_get(c, &o)?.call(c, (fd, flags, path, path_len, buf))
            })
        }
    );

    shadow!(
        linker,
        lk,
        "path_filestat_set_times",
        |c, o, fd: i32, flags: i32, path: i32, path_len: i32, atim: i64, mtim: i64, what: i32| {
            rerouted(&mut c, (fd, path, path_len), |c, (fd, path, path_len)| {
                original::path_filestat_set_times(c, &o)?
                    .call(c, (fd, flags, path, path_len, atim, mtim, what))
            })
        }
    );

    shadow!(
        linker,
        lk,
        "path_readlink",
        |c, o, fd: i32, path: i32, path_len: i32, buf: i32, buf_len: i32, used: i32| {
            rerouted(&mut c, (fd, path, path_len), |c, (fd, path, path_len)| {
                original::path_readlink(c, &o)?.call(c, (fd, path, path_len, buf, buf_len, used))
            })
        }
    );

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
    path_filestat_set_times(i32, i32, i32, i32, i64, i64, i32);
    path_readlink(i32, i32, i32, i32, i32, i32);
}

/// A module with a memory of its own (4 pages) that exports each call [`Originals`] lists,
/// forwarding to the import: a guest that makes exactly the calls a test asks for (the disk
/// probe's).
#[cfg(any(test, feature = "testing"))]
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

type PathArg = (i32, i32, i32);
/// `path_open`'s parameters.
type OpenArgs = (i32, i32, i32, i32, i32, i64, i64, i32, i32);

/// Runs a path call where it goes: on a mount slot, a path whose first component names a mount
/// below it goes to the mount's descriptor with the rest of the path (see `lang::mounts`). A
/// path that names the mount itself is given as `.`, written over the path's first byte for the
/// call and put back after (a guest's calls never overlap).
fn rerouted<R>(
    c: &mut Caller<'_, GuestState>,
    (fd, path, len): PathArg,
    f: impl FnOnce(&mut Caller<'_, GuestState>, PathArg) -> wasmtime::Result<R>,
) -> wasmtime::Result<R> {
    if c.data().reroutes.subs.is_empty() {
        return f(c, (fd, path, len));
    }
    let Some(Extern::Memory(mem)) = c.get_export("memory") else {
        return f(c, (fd, path, len));
    };
    let (Ok(p), Ok(n), Ok(dir)) = (
        usize::try_from(path),
        usize::try_from(len),
        u32::try_from(fd),
    ) else {
        return f(c, (fd, path, len));
    };
    let r = match mem.data(&*c).get(p..p.saturating_add(n)) {
        Some(bytes) => c.data().reroutes.reroute(dir, bytes),
        None => None,
    };
    let Some(r) = r else {
        return f(c, (fd, path, len));
    };
    if !r.dot {
        return f(c, (r.fd as i32, (p + r.skip) as i32, r.len as i32));
    }
    let saved = std::mem::replace(&mut mem.data_mut(&mut *c)[p], b'.');
    let out = f(c, (r.fd as i32, path, 1));
    mem.data_mut(&mut *c)[p] = saved;
    out
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
