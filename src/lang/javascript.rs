//! JavaScript: our QuickJS-NG reactor (`runtimes/quickjs`), built from pinned sources.
//!
//! Contract (see `runtimes/quickjs/README.md`): `_initialize`, then `wb_init` (0 = ok), then per
//! snippet `wb_alloc` + copy + `wb_eval(ptr, len, flags)`, which runs promises and timers to
//! completion and returns 0 (ok), 1 (uncaught error or unhandled rejection, context still usable)
//! or 2 (host error); `process.exit(n)` arrives as `proc_exit(n)`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Instance, InstancePre, Module, Store};

use super::guest::{
    Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, copy_in, engine_err, wasi_linker,
};
use super::session::{Session, SessionRuntime, StateKeyCell, exported_memory};
use super::spare::{Spares, rebind_with};
use super::{ExecRequest, ExecResult, Language, Place};
use super::{LangError as Error, Result};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::pool::{Pool, PoolStats};
use crate::engine::prefault::PageSet;
use crate::engine::state::StateKey;
use crate::engine::threads::on_guest_stack;
use crate::engine::{self, snapshot};

/// `wb_eval` flag: print the completion value (REPL style), for sessions.
const FLAG_ECHO: i32 = 1;
/// `wb_eval` flag: evaluate as an ES module (needed for `import` declarations).
const FLAG_MODULE: i32 = 2;

const BASE_ENV: &[(&str, &str)] = &[
    ("PWD", WORKSPACE_GUEST),
    ("HOME", TMP_GUEST),
    ("TMPDIR", TMP_GUEST),
];

/// Where `fetch-runtimes.sh` builds the module.
pub fn module_path(runtimes_dir: &Path) -> PathBuf {
    runtimes_dir.join("quickjs").join("qjs.wasm")
}

/// A loaded JavaScript runtime: the pre-initialised image (the module snapshotted after
/// `wb_init`, so an instance starts with its context made and the prelude run: creating one
/// parses the prelude, about 4 ms) pre-linked once, and a pool of instances made ahead of time.
pub struct JsRuntime {
    shared: Arc<Shared>,
    pool: Pool<Ready, Error>,
    spares: Spares,
}

/// What every instance is made from; the pool's refill threads hold it too.
struct Shared {
    engine: Engine,
    pre: InstancePre<GuestState>,
    /// Instances start initialised (false only if the image could not be built).
    image: bool,
    /// The pages a first `wb_eval` writes in an instance of the image, copied ahead of the
    /// request, and those it reads, mapped (none when not measured): left to page faults they
    /// were half of a pooled one-shot's time.
    pages: PageSet,
    state_key: Arc<StateKeyCell>,
}

impl Shared {
    /// A new context, made in `place`'s directories or fresh ones, not yet armed with a
    /// request's limits.
    /// A fresh instance in `place`, not run (not even its runtime's init), its clock reading
    /// `clock`.
    fn instantiate_at(&self, place: Option<&Place>, clock: Duration) -> Result<(Guest, Instance)> {
        let mut guest = Guest::unarmed_at(&self.engine, &spec(), &BTreeMap::new(), place, clock)?;
        let instance = self.pre.instantiate(&mut guest.store).map_err(engine_err)?;
        Ok((guest, instance))
    }

    fn instantiate_in(&self, place: Option<&Place>) -> Result<Ready> {
        let mut guest = Guest::unarmed_in(&self.engine, &spec(), &BTreeMap::new(), place)?;
        let instance = self.pre.instantiate(&mut guest.store).map_err(engine_err)?;
        if !self.image {
            init(&mut guest.store, &instance).map_err(engine_err)?;
        }
        if let Some(memory) = instance.get_memory(&mut guest.store, "memory") {
            self.pages.populate_memory(&guest.store, memory);
        }
        Ok(Ready { guest, instance })
    }

    /// Which pages a fresh instance's first small eval writes and reads, measured on a
    /// throwaway one.
    fn measure_pages(&self) -> Result<PageSet> {
        let Ready {
            mut guest,
            instance,
        } = self.instantiate_in(None)?;
        let status = eval(&mut guest.store, &instance, "console.log(1+1)", 0)
            .map_err(|e| Error::wasm(format!("the sample eval failed: {e:#}")))?;
        if status != 0 {
            return Err(Error::wasm(format!(
                "the sample eval returned {status}: {}",
                guest.take_stderr()
            )));
        }
        let memory = exported_memory(&mut guest, &instance)?;
        PageSet::measure_memory(&guest.store, memory, true)
            .map_err(|e| Error::wasm(format!("reading the page map: {e}")))
    }
}

/// An instance whose context is initialised and has never run user code.
struct Ready {
    guest: Guest,
    instance: Instance,
}

impl JsRuntime {
    pub fn load(
        engine: &Engine,
        cache: &ModuleCache,
        runtimes_dir: &Path,
        pool_size: usize,
    ) -> Result<(Self, Origin)> {
        let path = module_path(runtimes_dir);
        if !path.is_file() {
            return Err(Error::RuntimeMissing {
                runtime: "javascript",
                path,
            });
        }
        let ((module, origin), compiled_image) = match load_image(engine, cache, &path) {
            Ok((loaded, key)) => (loaded, Some(cache.compiled_path(engine, &key))),
            Err(e) => {
                tracing::warn!(
                    "javascript: the pre-initialised image could not be built ({e}); falling \
                     back to the plain module (each context costs ~4 ms to create)"
                );
                (cache.load(engine, &path, "javascript")?, None)
            }
        };
        let image = compiled_image.is_some();
        let state_key = Arc::new(StateKeyCell::for_image(
            Language::JavaScript,
            compiled_image,
        ));
        let pre = wasi_linker(engine)?
            .instantiate_pre(&module)
            .map_err(engine_err)?;
        let mut shared = Shared {
            engine: engine.clone(),
            pre,
            image,
            pages: PageSet::default(),
            state_key,
        };
        match on_guest_stack("javascript calibration", || shared.measure_pages()) {
            Ok(pages) => {
                tracing::debug!(
                    "javascript: {} pages copied and {} mapped ahead per instance",
                    pages.pages(),
                    pages.read_pages()
                );
                shared.pages = pages;
            }
            Err(e) => tracing::info!("javascript: instances' pages are left to fault in: {e}"),
        }
        let shared = Arc::new(shared);
        let s = shared.clone();
        let pool = Pool::new(
            "javascript",
            pool_size,
            1,
            move || s.instantiate_in(None),
            None,
        );
        let made = shared.clone();
        let spares = Spares::new(
            "javascript-spare",
            move || {
                let (mut guest, instance) = made.instantiate_at(None, Duration::ZERO)?;
                // What a first eval touches, as pooled instances have it.
                if let Some(memory) = instance.get_memory(&mut guest.store, "memory") {
                    made.pages.populate_memory(&guest.store, memory);
                }
                Ok((guest, instance))
            },
            move |guest, place, clock| rebind_with(&spec(), guest, place, clock),
        );
        Ok((
            Self {
                shared,
                pool,
                spares,
            },
            origin,
        ))
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// The counters of the spare instance kept for restores and forks, once there is one.
    pub fn spare_stats(&self) -> Option<PoolStats> {
        self.spares.stats()
    }

    /// Whether instances start from the pre-initialised image.
    pub fn has_image(&self) -> bool {
        self.shared.image
    }

    /// Pages copied into each new instance before it is used: those a first small eval writes.
    pub fn prefaulted_pages(&self) -> usize {
        self.shared.pages.pages()
    }

    /// Waits until the pool is full (tests and benches measure the hit path with this).
    pub fn wait_pool_full(&self, timeout: Duration) -> bool {
        self.pool.wait_full(timeout)
    }

    /// Runs `req` in a ready context (from the pool, or made now) and drops it. Blocking: call
    /// it on a guest thread.
    pub fn run_oneshot(&self, req: &ExecRequest) -> Result<ExecResult> {
        let Ready {
            mut guest,
            instance,
        } = match &req.place {
            None => self.pool.take_or_make()?,
            Some(place) => self.shared.instantiate_in(Some(place))?,
        };
        guest.arm(req);
        // A plain one-shot's context was made with the base environment: nothing to reset.
        let outcome = run(&mut guest.store, &instance, req, req.place.is_some());
        let result = guest.finish(outcome, Language::JavaScript);
        if req.place.is_none() {
            self.pool.refill();
        }
        Ok(result)
    }

    /// Evaluates one snippet in a session; the value of a final expression is echoed, as in a
    /// REPL.
    pub fn eval(s: &mut Session, code: &str, timeout: Duration) -> ExecResult {
        if !s.alive {
            return s.ended(Language::JavaScript);
        }
        s.guest.restart_clock();
        s.guest.set_deadline(timeout);
        let flags = if looks_like_module(code) {
            FLAG_MODULE
        } else {
            FLAG_ECHO
        };
        let outcome = eval(&mut s.guest.store, &s.instance, code, flags);
        // Any trap or exit leaves the guest's state undefined: never run it again.
        s.alive = outcome.is_ok();
        s.guest.result(outcome, Language::JavaScript)
    }
}

impl SessionRuntime for JsRuntime {
    fn language(&self) -> Language {
        Language::JavaScript
    }

    /// One context whose globals persist across calls. `req` gives the session's env and
    /// limits (its code is not run).
    fn start(&self, req: &ExecRequest) -> Result<Session> {
        self.shared.state_key.prepare();
        let Ready {
            mut guest,
            instance,
        } = self.shared.instantiate_in(req.place.as_ref())?;
        guest.arm(req);
        Ok(Session::new(guest, instance))
    }

    fn instantiate(&self, req: &ExecRequest, clock: Duration) -> Result<(Guest, Instance)> {
        self.shared.instantiate_at(req.place.as_ref(), clock)
    }

    /// Runs `req.code` (echoing a final expression when `req.echo`) with `req`'s limits, env and
    /// working directory, which are applied first: a sandbox's env may have changed since.
    fn call(&self, s: &mut Session, req: &ExecRequest, _rich: bool) -> ExecResult {
        s.guest.arm(req);
        if !s.alive {
            return s.ended(Language::JavaScript);
        }
        // The sandbox's env may have changed since the last call, or lost a variable.
        let outcome = run(&mut s.guest.store, &s.instance, req, true);
        s.alive = outcome.is_ok();
        s.guest.result(outcome, Language::JavaScript)
    }

    fn state_key(&self) -> std::result::Result<Arc<StateKey>, String> {
        self.shared.state_key.get()
    }

    fn reseed(&self, s: &mut Session) -> Result<()> {
        let reseed = s
            .instance
            .get_typed_func::<(), ()>(&mut s.guest.store, "wb_reseed")
            .map_err(|e| Error::wasm(format!("javascript: qjs.wasm has no wb_reseed: {e:#}")))?;
        reseed
            .call(&mut s.guest.store, ())
            .map_err(|e| Error::wasm(format!("javascript: reseeding a copied session: {e:#}")))
    }

    fn spares(&self) -> &Spares {
        &self.spares
    }
}

/// Runs `req.code` (echoing a final expression when `req.echo`), after setting `process.env`
/// to the base environment plus the call's (when `reset_env` or the call has env) and moving to
/// the sandbox's working directory (when it has one): a context is made before its call is known.
fn run(
    store: &mut Store<GuestState>,
    instance: &Instance,
    req: &ExecRequest,
    reset_env: bool,
) -> wasmtime::Result<i32> {
    let mut setup = String::new();
    if reset_env || !req.env.is_empty() {
        setup = env_setup(&req.env);
    }
    if let Some(place) = &req.place {
        setup.push_str(&chdir(&place.cwd));
    }
    if !setup.is_empty() {
        let status = eval(store, instance, &setup, 0)?;
        if status != 0 {
            wasmtime::bail!("setting process.env and the working directory failed ({status})");
        }
    }
    let flags = if looks_like_module(&req.code) {
        FLAG_MODULE
    } else if req.echo {
        FLAG_ECHO
    } else {
        0
    };
    eval(store, instance, &req.code, flags)
}

/// Replaces `process.env` with the base environment plus the call's.
fn env_setup(env: &BTreeMap<String, String>) -> String {
    let mut full: BTreeMap<&str, &str> = BASE_ENV.iter().copied().collect();
    for (k, v) in env {
        full.insert(k, v);
    }
    let json = serde_json::to_string(&full).expect("a map always serialises");
    format!(
        "((e) => {{ for (const k of Object.keys(process.env)) delete process.env[k]; Object.assign(process.env, e); }})({json});"
    )
}

fn chdir(cwd: &str) -> String {
    format!(
        "process.chdir({});",
        serde_json::to_string(cwd).expect("a string always serialises")
    )
}

fn spec() -> GuestSpec<'static> {
    GuestSpec {
        argv: &["node"],
        base_env: BASE_ENV,
        read_only: Vec::new(),
    }
}

/// `_initialize` and `wb_init`: what the image's snapshot was taken after.
fn init(store: &mut Store<GuestState>, instance: &Instance) -> wasmtime::Result<()> {
    instance
        .get_typed_func::<(), ()>(&mut *store, "_initialize")?
        .call(&mut *store, ())?;
    let status = instance
        .get_typed_func::<(), i32>(&mut *store, "wb_init")?
        .call(&mut *store, ())?;
    if status != 0 {
        wasmtime::bail!("the JavaScript runtime failed to initialise (wb_init returned {status})");
    }
    Ok(())
}

/// What determines the image's bytes: the module (our C entry and prelude are compiled in).
pub fn image_key(module_sha: &str) -> String {
    let mut d = Sha256::new();
    d.update(b"wasmbox-javascript-image-v1\0");
    d.update(snapshot::IMAGE_FORMAT.as_bytes());
    d.update(b"\0");
    d.update(module_sha.as_bytes());
    hex::encode(d.finalize())
}

/// Loads the image from the module cache, building it the first time (well under a second).
fn load_image(
    engine: &Engine,
    cache: &ModuleCache,
    path: &Path,
) -> Result<((Module, Origin), String)> {
    let key = image_key(&cache.file_sha256(path)?);
    let loaded = cache.load_with(engine, &key, "javascript image", || {
        crate::engine::progress::stage("building the pre-initialised javascript image (once)");
        let wasm = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let warm_engine = engine::warmup_engine()?;
        let linker = wasi_linker(&warm_engine)?;
        // The snapshot freezes wasi-libc's preopen table and cwd: the warm-up uses the
        // production preopen layout (a fresh /workspace and /tmp, as every sandbox has).
        on_guest_stack("javascript image", || {
            snapshot::build(&warm_engine, &wasm, "javascript image", |module| {
                let mut guest = Guest::unarmed(&warm_engine, &spec(), &BTreeMap::new())?;
                let instance = linker
                    .instantiate(&mut guest.store, module)
                    .map_err(engine_err)?;
                init(&mut guest.store, &instance).map_err(|e| {
                    Error::wasm(format!(
                        "the JavaScript image warm-up failed: {e:#}: {}",
                        guest.take_stderr()
                    ))
                })?;
                Ok::<_, Error>(guest.into_parts(instance))
            })
        })
    })?;
    Ok((loaded, key))
}

fn eval(
    store: &mut Store<GuestState>,
    instance: &Instance,
    code: &str,
    flags: i32,
) -> wasmtime::Result<i32> {
    let ptr = copy_in(store, instance, "wb_alloc", code.as_bytes())?;
    if ptr == 0 {
        wasmtime::bail!(
            "the JavaScript runtime could not allocate {} bytes for the code",
            code.len()
        );
    }
    let status = instance
        .get_typed_func::<(i32, i32, i32), i32>(&mut *store, "wb_eval")?
        .call(&mut *store, (ptr, code.len() as i32, flags))?;
    instance
        .get_typed_func::<i32, ()>(&mut *store, "wb_free")?
        .call(&mut *store, ptr)?;
    if status == 2 {
        wasmtime::bail!("the JavaScript runtime refused the call (wb_eval returned 2)");
    }
    Ok(status)
}

/// Whether the code has `import`/`export` declarations, which only an ES module may contain.
/// Scripts are the default: their top-level declarations persist in a session.
fn looks_like_module(code: &str) -> bool {
    code.lines().map(str::trim_start).any(|l| {
        (l.starts_with("import ") || l.starts_with("import{") || l.starts_with("import*"))
            && (l.contains(" from ")
                || l.contains("from'")
                || l.contains("from\"")
                || l.contains('\'')
                || l.contains('"'))
            && !l.starts_with("import(")
            || l.starts_with("export ")
    })
}

#[cfg(test)]
mod tests {
    use super::{image_key, looks_like_module};

    #[test]
    fn image_key_follows_the_module() {
        assert_eq!(image_key("aa"), image_key("aa"));
        assert_ne!(
            image_key("aa"),
            image_key("ab"),
            "a new qjs.wasm rebuilds the image"
        );
    }

    #[test]
    fn module_detection() {
        assert!(looks_like_module(
            "import * as std from 'qjs:std';\nstd.exit(0)"
        ));
        assert!(looks_like_module("import fs from \"fs\""));
        assert!(looks_like_module("import 'x.js'"));
        assert!(looks_like_module("export const a = 1"));
        assert!(!looks_like_module("const m = await import('fs')"));
        assert!(!looks_like_module("console.log('import x from y')"));
        assert!(!looks_like_module("let important = 1"));
    }
}
