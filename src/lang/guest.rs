//! What every language's sandbox shares: the store with its WASI context and limits, and the
//! fresh `/workspace` and `/tmp`. How a guest's end becomes an [`ExecResult`] is `outcome`'s.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{Engine, Linker, Store, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::outcome::{Limits, finish};
use super::scratch::Scratch;
use super::wasi::Watch;
use super::{ExecRequest, ExecResult, Language, Place};
use super::{LangError as Error, Result};
use crate::engine::deadline_ticks;
use crate::engine::disk::DiskBudget;
use crate::engine::limits::{CappedOutput, MemoryLimiter};

pub const WORKSPACE_GUEST: &str = "/workspace";
pub const TMP_GUEST: &str = "/tmp";
/// Where host folders appear: preopened in every guest after `/tmp`, in this order, so that the
/// images' baked preopen tables know them (an empty read-only directory when nothing is lent).
pub const MOUNT_SLOTS: [&str; 2] = ["/data", "/mnt"];

/// Output cap of a guest no request has taken yet (its warm-up output is discarded).
const UNARMED_OUTPUT_CAP: usize = 1 << 20;
/// Deadline of an unarmed guest: long enough for any warm-up, short enough to end a stuck one.
const UNARMED_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// What each guest's store holds.
pub struct GuestState {
    pub(super) wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
    /// The current call's deadline, stop flag and quota, for the epoch callback and waits.
    pub(super) watch: Watch,
    pub(super) originals: super::wasi::Originals,
    pub(super) files: super::wasi::OpenFiles,
    /// The captured stdout and stderr, which `fd_write` fills directly.
    pub(super) stdio: [CappedOutput; 2],
    /// The figures the current call handed over through `host.call` (Python).
    pub(super) images: super::images::ImageSink,
    /// The current run's host calls (`reach`): what it may reach, and its budget.
    pub(super) calls: crate::reach::calls::HostCalls,
    /// A host call's answer waiting for `wasmbox.take` (`host.call`'s two-step form).
    pub(super) held: Option<Vec<u8>>,
    /// Where path calls on the mount slots go (see [`super::mounts`]).
    pub(super) reroutes: super::mounts::Reroutes,
}

fn perms(writable: bool) -> FsPerms {
    if writable {
        FsPerms::ReadWrite
    } else {
        FsPerms::ReadOnly
    }
}

/// A linker with WASI preview 1 (its waits interruptible), the only host interface guests get.
pub fn wasi_linker(engine: &Engine) -> Result<Linker<GuestState>> {
    super::wasi::linker(engine)
}

/// How a runtime wants its guest laid out.
pub struct GuestSpec<'a> {
    pub argv: &'a [&'a str],
    /// Set before the caller's `env`, which may override them.
    pub base_env: &'a [(&'a str, &'a str)],
    /// Read-only runtime files, preopened first and in this order (guest paths are baked into
    /// some runtimes' preopen tables).
    pub read_only: Vec<(&'a Path, &'a str)>,
    /// The host folders lent to it, under [`MOUNT_SLOTS`].
    pub mounts: &'a super::mounts::Layout,
    /// Read-only folders preopened after the slots (and before folders lent below them).
    pub after_slots: Vec<(&'a Path, &'a str)>,
}

/// Exit code of a guest stopped from outside (killed, or its sandbox went away), as a shell
/// reports a SIGKILLed process.
pub const EXIT_KILLED: i32 = 137;

/// Exit code of a guest whose client cancelled the call, as a shell reports an interrupt.
pub const EXIT_CANCELLED: i32 = 130;

/// How often (in epoch ticks) a watched guest's callback looks at its stop flags: a kill or a
/// cancellation takes effect within this (50 ms).
const WATCH_TICKS: u64 = 5;

/// One guest about to run: its store, captured output and scratch directories (removed when it
/// is dropped; a sandbox's own directories are not).
pub struct Guest {
    pub store: Store<GuestState>,
    stdout: CappedOutput,
    stderr: CappedOutput,
    start: Instant,
    /// Between [`Guest::arm`] and [`Guest::result`]: keeps the epoch ticking for its deadline.
    running: Option<crate::engine::epoch::Running>,
    /// Whether the epoch deadline goes through [`Watch::check`] (sandboxed guests).
    callback: bool,
    /// Declared after `store`, so the guest's descriptors are closed before it is looked at.
    _scratch: Option<Scratch>,
}

/// What a guest's store holds and the handles [`Guest`] keeps beside it, for a place.
struct Parts {
    state: GuestState,
    stdout: CappedOutput,
    stderr: CappedOutput,
    scratch: Option<Scratch>,
}

impl Parts {
    fn new(
        spec: &GuestSpec<'_>,
        env: &BTreeMap<String, String>,
        place: Option<&Place>,
        clock: Duration,
    ) -> Result<Self> {
        let scratch = match place {
            Some(_) => None,
            None => Some(Scratch::take()?),
        };
        let (ws_dir, tmp_dir) = match (&scratch, place) {
            (Some(s), _) => s.paths(),
            (None, Some(p)) => (p.workspace.as_path(), p.tmp.as_path()),
            (None, None) => unreachable!("scratch dirs exist when there is no place"),
        };
        let (stdout, stderr) = match place.and_then(|p| p.output.clone()) {
            Some(out) => out,
            None => (
                CappedOutput::new(UNARMED_OUTPUT_CAP),
                CappedOutput::new(UNARMED_OUTPUT_CAP),
            ),
        };
        let mut wasi = WasiCtxBuilder::new();
        wasi.args(spec.argv);
        for (k, v) in spec.base_env {
            wasi.env(k, v);
        }
        if let Some(p) = place {
            wasi.env("PWD", &p.cwd);
        }
        for (k, v) in env {
            wasi.env(k, v);
        }
        let (clock, watch) = super::wasi::clock(UNARMED_DEADLINE, clock);
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .monotonic_clock(clock)
            .allow_blocking_current_thread(true);
        for (host, guest) in &spec.read_only {
            wasi.preopened_dir(host, guest, FsPerms::ReadOnly)
                .map_err(engine_err)?;
        }
        wasi.preopened_dir(ws_dir, WORKSPACE_GUEST, FsPerms::ReadWrite)
            .and_then(|w| w.preopened_dir(tmp_dir, TMP_GUEST, FsPerms::ReadWrite))
            .map_err(engine_err)?;
        // Descriptors are numbered from 3 in the order of the preopens.
        let mut next_fd = 3 + spec.read_only.len() as u32 + 2;
        let layout = spec.mounts;
        let mut reroutes = super::mounts::Reroutes::new(layout);
        let mut below = Vec::new();
        for (i, slot) in MOUNT_SLOTS.into_iter().enumerate() {
            let (host, perms) = match layout.at_slot(slot) {
                Some((at, m)) => {
                    reroutes.preopened(next_fd, at);
                    (m.host.clone(), perms(m.writable))
                }
                None => {
                    let subs: Vec<_> = layout.below(slot).collect();
                    let names: Vec<&str> = subs.iter().map(|(n, _, _)| *n).collect();
                    below.extend(subs.into_iter().map(|(n, at, m)| (i, n, at, m)));
                    (super::mounts::slot_dir(slot, &names)?, FsPerms::ReadOnly)
                }
            };
            wasi.preopened_dir(&host, slot, perms).map_err(engine_err)?;
            reroutes.slots[i] = Some(next_fd);
            next_fd += 1;
        }
        for (host, guest) in &spec.after_slots {
            wasi.preopened_dir(host, guest, FsPerms::ReadOnly)
                .map_err(engine_err)?;
            next_fd += 1;
        }
        for (slot, name, at, m) in below {
            wasi.preopened_dir(&m.host, &m.guest, perms(m.writable))
                .map_err(engine_err)?;
            reroutes
                .subs
                .push((slot, name.as_bytes().to_vec(), next_fd));
            reroutes.preopened(next_fd, at);
            next_fd += 1;
        }
        Ok(Self {
            state: GuestState {
                wasi: wasi.build_p1(),
                limiter: MemoryLimiter::new(usize::MAX),
                watch,
                originals: Default::default(),
                files: Default::default(),
                stdio: [stdout.clone(), stderr.clone()],
                images: Default::default(),
                calls: Default::default(),
                held: None,
                reroutes,
            },
            stdout,
            stderr,
            scratch,
        })
    }
}

impl Guest {
    /// A fresh store for `req`: empty `/workspace` and `/tmp`, no host environment, no sockets,
    /// capped output, the memory cap and the deadline armed (it covers instantiation too).
    pub fn new(engine: &Engine, req: &ExecRequest, spec: &GuestSpec<'_>) -> Result<Self> {
        let mut guest = Self::unarmed_in(engine, spec, &req.env, req.place.as_ref())?;
        guest.arm(req);
        Ok(guest)
    }

    /// A store not yet tied to a request (for pools): default caps, and a deadline far away
    /// that [`Guest::arm`] replaces. `env` comes after the spec's base environment.
    pub fn unarmed(
        engine: &Engine,
        spec: &GuestSpec<'_>,
        env: &BTreeMap<String, String>,
    ) -> Result<Self> {
        Self::unarmed_in(engine, spec, env, None)
    }

    /// As [`Guest::unarmed`], in a sandbox's directories when `place` is given (`PWD` is then
    /// its working directory).
    pub fn unarmed_in(
        engine: &Engine,
        spec: &GuestSpec<'_>,
        env: &BTreeMap<String, String>,
        place: Option<&Place>,
    ) -> Result<Self> {
        Self::unarmed_at(engine, spec, env, place, Duration::ZERO)
    }

    /// As [`Guest::unarmed_in`], with the guest's monotonic clock reading `clock` now.
    pub fn unarmed_at(
        engine: &Engine,
        spec: &GuestSpec<'_>,
        env: &BTreeMap<String, String>,
        place: Option<&Place>,
        clock: Duration,
    ) -> Result<Self> {
        let start = Instant::now();
        let parts = Parts::new(spec, env, place, clock)?;
        let mut store = Store::new(engine, parts.state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(deadline_ticks(UNARMED_DEADLINE));
        store.epoch_deadline_trap();
        Ok(Self {
            store,
            stdout: parts.stdout,
            stderr: parts.stderr,
            start,
            running: None,
            callback: false,
            _scratch: parts.scratch,
        })
    }

    /// Makes this unarmed guest, whose instance has not run, what [`Guest::unarmed_at`] would
    /// have made for `place` and `clock`: an instance made ahead of time (a spare) takes its
    /// session's directories and clock when it is taken. Everything the guest held lives in its
    /// store's state and is replaced; the instance has made no host call that could keep any.
    pub fn rebind(
        &mut self,
        spec: &GuestSpec<'_>,
        env: &BTreeMap<String, String>,
        place: Option<&Place>,
        clock: Duration,
    ) -> Result<()> {
        debug_assert!(self.running.is_none(), "rebinding an armed guest");
        let parts = Parts::new(spec, env, place, clock)?;
        *self.store.data_mut() = parts.state;
        self.store
            .set_epoch_deadline(deadline_ticks(UNARMED_DEADLINE));
        self.stdout = parts.stdout;
        self.stderr = parts.stderr;
        self._scratch = parts.scratch;
        self.start = Instant::now();
        self.callback = false;
        Ok(())
    }

    /// Makes this guest, whose instance ran a one-shot and whose memory and globals were then
    /// made the image's again ([`super::recycle`]), what [`Guest::unarmed`] makes: fresh
    /// directories, output, clock and WASI state, and deadlines that trap again. The store's
    /// forwarding instance is kept (it holds no state, and a new one per reuse would pile up in
    /// the store).
    pub fn recycle(&mut self, spec: &GuestSpec<'_>) -> Result<()> {
        let parts = Parts::new(spec, &BTreeMap::new(), None, Duration::ZERO)?;
        let originals = std::mem::take(&mut self.store.data_mut().originals);
        *self.store.data_mut() = parts.state;
        self.store.data_mut().originals = originals;
        self.store.epoch_deadline_trap();
        self.store
            .set_epoch_deadline(deadline_ticks(UNARMED_DEADLINE));
        self.stdout = parts.stdout;
        self.stderr = parts.stderr;
        self._scratch = parts.scratch;
        self.running = None;
        self.start = Instant::now();
        self.callback = false;
        Ok(())
    }

    /// Applies `req`'s limits from now on and restarts the clock: called when a request takes
    /// this guest. Output written before (a warm-up) is discarded.
    pub fn arm(&mut self, req: &ExecRequest) {
        self.stdout.take();
        self.stderr.take();
        self.stdout.set_cap(req.output_bytes);
        self.stderr.set_cap(req.output_bytes);
        self.store.data_mut().limiter.set_limit(req.memory_bytes);
        self.store.data_mut().images = super::images::ImageSink::new(req.images);
        self.store.data_mut().calls = crate::reach::calls::HostCalls::new(req.reach.clone());
        self.store.data_mut().held = None;
        let (stop, disk) = match (&req.place, &self._scratch) {
            (Some(p), _) => (Some(p.stop.clone()), p.disk.clone()),
            (None, Some(s)) => {
                let (ws, tmp) = s.paths();
                let roots = vec![ws.to_path_buf(), tmp.to_path_buf()];
                (None, Some(DiskBudget::new(roots, req.scratch_quota)))
            }
            (None, None) => (None, None),
        };
        // The stop flags are read, and running reports made, by the epoch callback (the
        // engine's epoch is shared).
        let watched = req.place.is_some() || req.cancel.is_some() || req.progress.is_some();
        let ticker = req.progress.clone().map(|sink| {
            crate::engine::progress::Ticker::new(sink, self.stdout.clone(), self.stderr.clone())
        });
        self.store
            .data_mut()
            .watch
            .arm(req.timeout, stop, req.cancel.clone(), disk, ticker);
        if watched {
            self.watch_by_callback();
        }
        self.set_epoch(req.timeout, watched);
        self.start = Instant::now();
        self.running.get_or_insert_with(Default::default);
    }

    /// The deadline a timeout note names (Go's covers the build as well as the run).
    pub fn report_timeout(&mut self, timeout: Duration) {
        self.store.data_mut().watch.report_timeout(timeout);
    }

    /// A new deadline, `timeout` from now, for the next call on a live guest (a session).
    pub fn set_deadline(&mut self, timeout: Duration) {
        self.store.data_mut().watch.set_timeout(timeout);
        let sandboxed = self.callback;
        self.set_epoch(timeout, sandboxed);
    }

    fn set_epoch(&mut self, timeout: Duration, sandboxed: bool) {
        let ticks = deadline_ticks(timeout);
        self.store.set_epoch_deadline(if sandboxed {
            ticks.min(WATCH_TICKS)
        } else {
            ticks
        });
    }

    /// A sandboxed guest's deadline goes through a callback that also ends it when its stop
    /// flag is raised (kill, sandbox deleted) or its workspace goes over quota, and gives its
    /// CPU slot to another owner when its owner holds more than its share: the engine's epoch
    /// is shared, so per-guest stops must go through the store.
    fn watch_by_callback(&mut self) {
        if self.callback {
            return;
        }
        self.callback = true;
        self.store.epoch_deadline_callback(|mut cx| {
            let watch = &mut cx.data_mut().watch;
            watch.check(Instant::now())?;
            watch.share_slot()?;
            let now = Instant::now();
            Ok(UpdateDeadline::Continue(
                deadline_ticks(watch.deadline() - now).min(WATCH_TICKS),
            ))
        });
    }

    /// The store and instance, for a snapshot; the scratch directories go away.
    pub fn into_parts(
        self,
        instance: wasmtime::Instance,
    ) -> (Store<GuestState>, wasmtime::Instance) {
        (self.store, instance)
    }

    /// What the guest wrote to stdout so far (for probes of our own).
    pub fn take_stdout(&self) -> Vec<u8> {
        self.stdout.take().bytes
    }

    /// The images the guest handed over since it was armed, and notes on those left out.
    pub fn take_images(&mut self) -> (Vec<super::RichOutput>, Vec<String>) {
        self.store.data_mut().images.take()
    }

    /// What the guest wrote so far, as text (for warm-up failures).
    pub fn take_stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.take().bytes).into_owned()
    }

    /// Maps the guest's outcome (an exit status, or the error a trap or `proc_exit` raised) and
    /// its output to the caller-facing result; the sandbox is dropped in the background.
    pub fn finish(mut self, outcome: wasmtime::Result<i32>, language: Language) -> ExecResult {
        let result = self.result(outcome, language);
        self.close_files();
        crate::engine::threads::drop_later(self);
        result
    }

    /// Closes every file a spent guest still holds, now rather than when its instance is
    /// dropped or reset after the reply: a file it removed while open counts against its
    /// folder's room until closed, and the next run must find that room free.
    pub fn close_files(&mut self) {
        let data = self.store.data_mut();
        if data.files.is_empty() {
            return;
        }
        data.wasi = WasiCtxBuilder::new().build_p1();
        data.files = super::wasi::OpenFiles::default();
    }

    /// The result of the latest call on a guest that lives on (a session): takes the output
    /// written since the last call and restarts the clock and the memory flag for the next one.
    pub fn result(&mut self, outcome: wasmtime::Result<i32>, language: Language) -> ExecResult {
        let memory_hit = std::mem::take(&mut self.store.data_mut().limiter.hit);
        let timeout = self.store.data().watch.timeout();
        let disk_over = self.store.data_mut().watch.take_disk_over();
        self.store.data_mut().watch.end_reports();
        let r = finish(
            outcome,
            Limits {
                timeout,
                memory_hit,
                disk_over,
            },
            self.stdout.take(),
            self.stderr.take(),
            self.start,
            language,
        );
        self.start = Instant::now();
        self.running = None;
        r
    }

    /// The guest's monotonic clock now, in nanoseconds (saved with a session's state).
    /// What this guest's disk calls are counted against, once armed.
    pub fn disk_budget(&self) -> Option<Arc<DiskBudget>> {
        self.store.data().watch.disk().cloned()
    }

    pub fn clock_ns(&self) -> u64 {
        self.store.data().watch.clock_ns()
    }

    /// Regular files the guest holds open (a restored session has none of them).
    pub fn open_files(&self) -> usize {
        self.store.data().files.len()
    }

    /// Restarts the clock that `execution_time` is measured from, for a call about to run.
    pub fn restart_clock(&mut self) {
        self.start = Instant::now();
        self.running.get_or_insert_with(Default::default);
    }
}

/// Copies `bytes` into guest memory allocated by the guest's own allocator export; returns the
/// pointer, or 0 when the guest could not allocate.
pub fn copy_in(
    store: &mut Store<GuestState>,
    instance: &wasmtime::Instance,
    alloc_export: &str,
    bytes: &[u8],
) -> wasmtime::Result<i32> {
    let alloc = instance.get_typed_func::<i32, i32>(&mut *store, alloc_export)?;
    let memory = instance
        .get_memory(&mut *store, "memory")
        .ok_or_else(|| wasmtime::format_err!("the module exports no memory"))?;
    let len = i32::try_from(bytes.len())
        .map_err(|_| wasmtime::format_err!("input is too large for the guest"))?;
    let ptr = alloc.call(&mut *store, len)?;
    if ptr != 0 {
        memory.write(&mut *store, ptr as u32 as usize, bytes)?;
    }
    Ok(ptr)
}

pub fn engine_err(e: wasmtime::Error) -> Error {
    Error::wasm(format!("{e:#}"))
}
