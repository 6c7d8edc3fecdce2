//! JavaScript: our QuickJS-NG reactor (`runtimes/quickjs`), built from pinned sources.
//!
//! Contract (see `runtimes/quickjs/README.md`): `_initialize`, then `wb_init` (0 = ok), then per
//! snippet `wb_alloc` + copy + `wb_eval(ptr, len, flags)`, which runs promises and timers to
//! completion and returns 0 (ok), 1 (uncaught error or unhandled rejection, context still usable)
//! or 2 (host error); `process.exit(n)` arrives as `proc_exit(n)`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Instance, Linker, Module, Store};

use super::guest::{Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, copy_in, engine_err};
use super::image_runtime::{Flavour, ImageRuntime, PoolOptions, Ready, Shared};
use super::live::{Session, exported_memory};
use super::{ExecRequest, ExecResult, Language};
use super::{LangError as Error, Result};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::prefault::PageSet;
use crate::engine::preinit;
use crate::engine::threads::on_guest_stack;

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

/// The JavaScript runtime: instances of the pre-initialised image (the module snapshotted after
/// `wb_init`, so an instance starts with its context made and the prelude run: creating one
/// parses the prelude, about 4 ms).
pub type JsRuntime = ImageRuntime<JavaScript>;

/// What JavaScript adds to the image runtime. Its calibration is the pages a first `wb_eval`
/// writes in an instance of the image, copied ahead of the request, and those it reads, mapped:
/// left to page faults they were half of a pooled one-shot's time.
pub struct JavaScript;

impl Flavour for JavaScript {
    const LANGUAGE: Language = Language::JavaScript;
    type Calibration = PageSet;

    fn spec(&self) -> GuestSpec<'_> {
        spec()
    }

    fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
        crate::lang::host_call::linker(engine)
    }

    /// Which pages a fresh instance's first small eval writes and reads, measured on a
    /// throwaway one.
    fn calibrate(shared: &Shared<Self>) -> Result<PageSet> {
        let Ready {
            mut guest,
            instance,
        } = shared.ready_in(None)?;
        let status = eval(&mut guest.store, &instance, "console.log(1+1)", 0)
            .map_err(|e| Error::wasm(format!("the sample eval failed: {e:#}")))?;
        if status != 0 {
            return Err(Error::wasm(format!(
                "the sample eval returned {status}: {}",
                guest.take_stderr()
            )));
        }
        let memory = exported_memory(&mut guest, &instance)?;
        let pages = PageSet::measure_memory(&guest.store, memory, true)
            .map_err(|e| Error::wasm(format!("reading the page map: {e}")))?;
        tracing::debug!(
            "javascript: {} pages copied and {} mapped ahead per instance",
            pages.pages(),
            pages.read_pages()
        );
        Ok(pages)
    }

    fn ready(shared: &Shared<Self>, guest: &mut Guest, instance: &Instance) -> Result<()> {
        if !shared.image {
            init(&mut guest.store, instance).map_err(engine_err)?;
        }
        Self::prefault(shared, guest, instance);
        Ok(())
    }

    fn prefault(shared: &Shared<Self>, guest: &mut Guest, instance: &Instance) {
        if let Some(memory) = instance.get_memory(&mut guest.store, "memory") {
            shared.calibration.populate_memory(&guest.store, memory);
        }
    }

    fn oneshot(guest: &mut Guest, instance: &Instance, req: &ExecRequest) -> ExecResult {
        // A plain one-shot's context was made with the base environment: nothing to reset.
        let outcome = run(&mut guest.store, instance, req, req.place.is_some());
        guest.result(outcome, Language::JavaScript)
    }

    /// The sandbox's env may have changed since the last call, or lost a variable: it is set
    /// again.
    fn call(s: &mut Session, req: &ExecRequest, _rich: bool) -> ExecResult {
        let outcome = run(&mut s.guest.store, &s.instance, req, true);
        // Any trap or exit leaves the guest's state undefined: never run it again.
        s.alive = outcome.is_ok();
        s.guest.result(outcome, Language::JavaScript)
    }

    fn reseed(s: &mut Session) -> Result<()> {
        let reseed = s
            .instance
            .get_typed_func::<(), ()>(&mut s.guest.store, "wb_reseed")
            .map_err(|e| Error::wasm(format!("javascript: qjs.wasm has no wb_reseed: {e:#}")))?;
        reseed
            .call(&mut s.guest.store, ())
            .map_err(|e| Error::wasm(format!("javascript: reseeding a copied session: {e:#}")))
    }
}

impl JsRuntime {
    pub fn load(
        engine: &Engine,
        cache: &ModuleCache,
        runtimes_dir: &Path,
        pool: &PoolOptions,
    ) -> Result<(Self, Origin)> {
        let path = module_path(runtimes_dir);
        if !path.is_file() {
            return Err(Error::RuntimeMissing {
                runtime: "javascript",
                path,
            });
        }
        let built = load_image(engine, cache, &path);
        Self::assemble(
            engine,
            cache,
            Some(built),
            &path,
            "each context costs ~4 ms to create",
            JavaScript,
            pool,
        )
    }

    /// Pages copied into each new instance before it is used: those a first small eval writes.
    pub fn prefaulted_pages(&self) -> usize {
        self.shared().calibration.pages()
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
        s.alive = outcome.is_ok();
        s.guest.result(outcome, Language::JavaScript)
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
        mounts: super::mounts::server_layout(),
        after_slots: Vec::new(),
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
    d.update(b"wasmbox-javascript-image-v3\0");
    d.update(preinit::IMAGE_FORMAT.as_bytes());
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
    let loaded = cache.load_compiled(engine, &key, "javascript image", || {
        crate::engine::progress::stage("building the pre-initialised javascript image (once)");
        let wasm = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        // The snapshot freezes wasi-libc's preopen table and cwd: the warm-up uses the
        // production preopen layout (a fresh /workspace and /tmp, as every sandbox has, and
        // the mount slots with nothing lent below them, as on every server).
        on_guest_stack("javascript image", || {
            preinit::build_compiled(&wasm, "javascript image", |module| {
                let linker = crate::lang::host_call::linker(module.engine())?;
                let spec = GuestSpec {
                    mounts: super::mounts::none(),
                    ..spec()
                };
                let mut guest = Guest::unarmed(module.engine(), &spec, &BTreeMap::new())?;
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
