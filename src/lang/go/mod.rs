//! Go: snippets are built on the host by a real Go toolchain for `GOOS=wasip1 GOARCH=wasm`, then
//! run in wasmtime like every other guest.
//!
//! The toolchain only ever sees the snippet as `main.go` in a private temp dir, with a fixed
//! environment (no host variables). Built `.wasm` files are cached by SHA-256 of (source, Go
//! version, flags) in `<cache>/go-wasm/`, their compiled modules in `<cache>/go-modules/` (the
//! module cache, keyed by engine), both bounded by an LRU on mtime; loaded modules stay in
//! memory (a small LRU). New snippets are compiled with Winch, wasmtime's baseline compiler:
//! 0.3-0.9 s instead of 3-6 s with Cranelift on 2 cores. A snippet run again is recompiled with
//! Cranelift in the background (one at a time), and later runs use that faster code.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::{Engine, InstancePre, Linker, Strategy};

use super::guest::{Guest, GuestSpec, GuestState};
use super::{ExecRequest, ExecResult, Language, Stage};
use super::{LangError as Error, Result};
use crate::engine::build_engine_with;
use crate::engine::cache::ModuleCache;

mod build;
use build::{compile_result, stopped, stopped_result, timeout_result};
mod source;
pub(crate) mod toolchain;

pub use source::prepare_source;
use toolchain::*;
/// `wasmbox/http`, the package a Go guest imports for HTTP through the host (reach).
pub const WASMBOX_HTTP: &str = include_str!("wasmbox_http.go");

/// Whether a snippet imports `wasmbox/http`, so its build gets the package beside it.
pub fn uses_wasmbox_http(source: &str) -> bool {
    source.contains("\"wasmbox/http\"")
}

pub use toolchain::{GO_BUILD_FLAGS, GoToolchain, build_env, find_go, pinned_go};

/// Counters for `health`: a repeat snippet is a hit, a new one a build.
#[derive(Default, Debug, Clone, Copy, Serialize, schemars::JsonSchema)]
pub struct GoCacheStats {
    /// Snippets built with the Go toolchain.
    pub builds: u64,
    /// Runs whose `.wasm` came from the cache (in memory or on disk): no toolchain run.
    pub wasm_hits: u64,
    /// Runs whose compiled module was already loaded in memory.
    pub module_hits: u64,
    /// Build failures (compile errors and build deadlines).
    pub failed_builds: u64,
    /// Snippets recompiled with Cranelift after they ran again.
    pub optimized: u64,
    /// A recompile with Cranelift is running now.
    pub optimizing: bool,
}

#[derive(Default)]
struct Counters {
    builds: AtomicU64,
    wasm_hits: AtomicU64,
    module_hits: AtomicU64,
    failed_builds: AtomicU64,
    optimized: AtomicU64,
}

/// A loaded module, ready to instantiate.
struct Loaded {
    pre: InstancePre<GuestState>,
    /// The engine `pre` was compiled for (stores must use the same one).
    engine: Engine,
    /// Compiled with Cranelift rather than Winch.
    optimized: bool,
    last_used: AtomicU64,
}

/// The Go runtime: toolchain, Winch engine, caches.
pub struct GoRuntime {
    toolchain: GoToolchain,
    engine: Engine,
    linker: Linker<GuestState>,
    /// Cranelift (the runtimes' engine), for snippets that run again.
    optimizing: Engine,
    optimizing_linker: Linker<GuestState>,
    tiering: AtomicBool,
    modules: ModuleCache,
    wasm_dir: PathBuf,
    modules_dir: PathBuf,
    gocache: PathBuf,
    cache_limit_bytes: u64,
    max_wasm_bytes: u64,
    /// GOCACHE entries unused for this long are removed (`None`: left to Go).
    gocache_max_age: Option<Duration>,
    /// When GOCACHE was last trimmed (Unix seconds): at load, then at most daily.
    gocache_trimmed: AtomicU64,
    loaded: Mutex<HashMap<String, Arc<Loaded>>>,
    /// One lock per key being built, so two requests for the same source build once.
    building: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    clock: AtomicU64,
    counters: Counters,
}

/// What a snippet became: a module to run, or a result to return (compile error, deadline).
enum Built {
    Ready(Arc<Loaded>),
    Done(ExecResult),
}

impl GoRuntime {
    /// Finds the toolchain and makes the Winch engine; compiles nothing. `optimizing` is the
    /// Cranelift engine that snippets seen again are recompiled with.
    pub fn load(runtimes_dir: &Path, cache_dir: &Path, optimizing: &Engine) -> Result<Self> {
        let toolchain = GoToolchain::find(runtimes_dir)?;
        let engine = build_engine_with(Strategy::Winch)?;
        let linker = crate::lang::host_call::linker(&engine)?;
        let optimizing_linker = crate::lang::host_call::linker(optimizing)?;
        let wasm_dir = cache_dir.join("go-wasm");
        let modules_dir = cache_dir.join("go-modules");
        for d in [&wasm_dir, &modules_dir] {
            fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
        }
        let env_u64 = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        let cache_limit_bytes =
            env_u64("WASMBOX_GO_CACHE_MB", DEFAULT_CACHE_MB).saturating_mul(1 << 20);
        let max_wasm_bytes =
            env_u64("WASMBOX_GO_MAX_WASM_MB", DEFAULT_MAX_WASM_MB).saturating_mul(1 << 20);
        let gocache_max_age =
            match env_u64("WASMBOX_GOCACHE_MAX_AGE_DAYS", DEFAULT_GOCACHE_MAX_AGE_DAYS) {
                0 => None,
                days => Some(Duration::from_secs(days.saturating_mul(86400))),
            };
        let me = Self {
            toolchain,
            engine,
            linker,
            optimizing: optimizing.clone(),
            optimizing_linker,
            tiering: AtomicBool::new(false),
            modules: ModuleCache::new(&modules_dir),
            wasm_dir,
            modules_dir,
            gocache: cache_dir.join("go-build"),
            cache_limit_bytes,
            max_wasm_bytes,
            gocache_max_age,
            gocache_trimmed: AtomicU64::new(0),
            loaded: Mutex::new(HashMap::new()),
            building: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            counters: Counters::default(),
        };
        me.trim_gocache();
        Ok(me)
    }

    /// Removes GOCACHE entries unused for the configured age, but never the pre-warmed ones,
    /// which it marks used instead (Go's own trim takes any entry unused for 5 days). Runs at
    /// load and then at most once a day, before a build.
    fn trim_gocache(&self) {
        let Some(max_age) = self.gocache_max_age else {
            return;
        };
        let now = unix_secs(SystemTime::now());
        let last = self.gocache_trimmed.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 86400
            || self
                .gocache_trimmed
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let (files, bytes) = trim_gocache(&self.gocache, max_age, SystemTime::now());
        if files > 0 {
            tracing::info!(
                "go: removed {files} GOCACHE entries ({} MiB) unused for {} days",
                bytes >> 20,
                max_age.as_secs() / 86400
            );
        }
    }

    pub fn toolchain(&self) -> &GoToolchain {
        &self.toolchain
    }

    pub fn stats(&self) -> GoCacheStats {
        let c = &self.counters;
        GoCacheStats {
            builds: c.builds.load(Ordering::Relaxed),
            wasm_hits: c.wasm_hits.load(Ordering::Relaxed),
            module_hits: c.module_hits.load(Ordering::Relaxed),
            failed_builds: c.failed_builds.load(Ordering::Relaxed),
            optimized: c.optimized.load(Ordering::Relaxed),
            optimizing: self.tiering.load(Ordering::Relaxed),
        }
    }

    /// The cache key of a (prepared) source: sha256 of source, Go version, flags and target.
    pub fn key(&self, source: &str) -> String {
        let mut d = Sha256::new();
        d.update(self.toolchain.version.as_bytes());
        d.update(b"\0wasip1/wasm\0");
        for f in GO_BUILD_FLAGS {
            d.update(f.as_bytes());
            d.update(b"\0");
        }
        d.update(source.as_bytes());
        if uses_wasmbox_http(source) {
            d.update(WASMBOX_HTTP.as_bytes());
        }
        hex::encode(d.finalize())
    }

    /// Builds (or finds) and runs `req` in a fresh instance. Blocking: call it on a guest thread.
    /// The deadline covers build and run.
    pub fn run_oneshot(self: &Arc<Self>, req: &ExecRequest) -> Result<ExecResult> {
        let start = Instant::now();
        let deadline = start + req.timeout;
        let source = match prepare_source(&req.code) {
            Ok(s) => s,
            Err(cgo) => return Ok(compile_result(1, cgo.to_string(), req, start)),
        };
        let loaded = match self.module_for(&source, req, start, deadline)? {
            Built::Ready(l) => l,
            Built::Done(r) => return Ok(r),
        };
        if let Some(p) = &req.progress {
            p.stage("running the Go program");
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Ok(timeout_result(Stage::Run, req, start));
        }
        let mut run_req = req.clone();
        run_req.timeout = remaining;
        let spec = GuestSpec {
            argv: &["main.wasm"],
            base_env: BASE_ENV,
            read_only: Vec::new(),
            mounts: crate::lang::mounts::for_owner(&req.owner),
            after_slots: Vec::new(),
        };
        let mut guest = Guest::new(&loaded.engine, &run_req, &spec)?;
        // The deadline covers build and run: a timeout note names the caller's.
        guest.report_timeout(req.timeout);
        let outcome = loaded
            .pre
            .instantiate(&mut guest.store)
            .and_then(|instance| {
                instance
                    .get_typed_func::<(), ()>(&mut guest.store, "_start")?
                    .call(&mut guest.store, ())
            })
            .map(|()| 0);
        let mut r = guest.finish(outcome, Language::Go);
        r.stage = Some(Stage::Run);
        r.execution_time = start.elapsed().as_secs_f64();
        Ok(r)
    }

    /// The loaded module for `source`: from memory, from the disk caches, or built now. Only one
    /// request builds a given key; others wait for it (within their own deadline).
    fn module_for(
        self: &Arc<Self>,
        source: &str,
        req: &ExecRequest,
        start: Instant,
        deadline: Instant,
    ) -> Result<Built> {
        let key = self.key(source);
        if let Some(l) = self.memory_hit(&key) {
            self.counters.wasm_hits.fetch_add(1, Ordering::Relaxed);
            self.counters.module_hits.fetch_add(1, Ordering::Relaxed);
            if !l.optimized {
                self.tier_up(&key);
            }
            return Ok(Built::Ready(l));
        }
        if let Some(p) = &req.progress {
            p.stage("compiling the Go program");
        }
        let lock = self
            .building
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        let guard = loop {
            match lock.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if let Some(why) = stopped(req) {
                        return Ok(Built::Done(stopped_result(why, req, start)));
                    }
                    if Instant::now() >= deadline {
                        return Ok(Built::Done(timeout_result(Stage::Compile, req, start)));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        let out = self.build_and_load(&key, source, req, start, deadline);
        drop(guard);
        let mut building = self.building.lock().unwrap();
        if Arc::strong_count(&lock) <= 2 {
            building.remove(&key);
        }
        out
    }

    fn memory_hit(&self, key: &str) -> Option<Arc<Loaded>> {
        let l = self.loaded.lock().unwrap().get(key).cloned()?;
        l.last_used.store(
            self.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        Some(l)
    }

    fn build_and_load(
        &self,
        key: &str,
        source: &str,
        req: &ExecRequest,
        start: Instant,
        deadline: Instant,
    ) -> Result<Built> {
        // Someone else may have finished this key while we waited for its lock.
        if let Some(l) = self.memory_hit(key) {
            self.counters.wasm_hits.fetch_add(1, Ordering::Relaxed);
            self.counters.module_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Built::Ready(l));
        }
        let wasm = self.wasm_dir.join(format!("{key}.wasm"));
        let wasm_known = wasm.is_file();
        if wasm_known {
            self.counters.wasm_hits.fetch_add(1, Ordering::Relaxed);
            touch(&wasm);
        } else {
            match self.build(source, &wasm, req, start, deadline)? {
                None => {
                    self.counters.builds.fetch_add(1, Ordering::Relaxed);
                }
                Some(r) => {
                    self.counters.failed_builds.fetch_add(1, Ordering::Relaxed);
                    return Ok(Built::Done(r));
                }
            }
        }
        // A snippet optimized by an earlier process is used as is; else Winch (fast compile).
        let optimized = wasm_known
            .then(|| self.modules.cached(&self.optimizing, key, "go snippet"))
            .flatten();
        let (engine, linker, module) = match optimized {
            Some(m) => (&self.optimizing, &self.optimizing_linker, m),
            None => {
                let (m, _) = self
                    .modules
                    .load_keyed(&self.engine, key, &wasm, "go snippet")?;
                (&self.engine, &self.linker, m)
            }
        };
        let loaded = self.remember(key, engine, linker, &module)?;
        // Keep the compiled module fresh for the disk LRU (memory hits never come here).
        touch(
            &self
                .modules_dir
                .join(format!("{}.cwasm", ModuleCache::key(engine, key))),
        );
        if !wasm_known {
            self.evict();
        }
        Ok(Built::Ready(loaded))
    }

    /// Links `module` and keeps it in the memory LRU under `key`.
    fn remember(
        &self,
        key: &str,
        engine: &Engine,
        linker: &Linker<GuestState>,
        module: &wasmtime::Module,
    ) -> Result<Arc<Loaded>> {
        let pre = linker
            .instantiate_pre(module)
            .map_err(|e| Error::wasm(format!("go: linking the snippet: {e:#}")))?;
        let loaded = Arc::new(Loaded {
            pre,
            engine: engine.clone(),
            optimized: Engine::same(engine, &self.optimizing),
            last_used: AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)),
        });
        let mut map = self.loaded.lock().unwrap();
        map.insert(key.to_string(), loaded.clone());
        while map.len() > MEMORY_LRU {
            let oldest = map
                .iter()
                .min_by_key(|(_, l)| l.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        Ok(loaded)
    }

    /// Recompiles a snippet that ran again with Cranelift on a background thread (one at a
    /// time, so a 2-core machine keeps a core for requests); later runs use the faster code.
    fn tier_up(self: &Arc<Self>, key: &str) {
        if self.tiering.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        let key = key.to_string();
        let spawned = std::thread::Builder::new()
            .name("wasmbox-go-tierup".into())
            .spawn(move || {
                let wasm = this.wasm_dir.join(format!("{key}.wasm"));
                let out = this
                    .modules
                    .load_keyed(&this.optimizing, &key, &wasm, "go snippet (Cranelift)")
                    .map_err(Error::from)
                    .and_then(|(m, _)| {
                        this.remember(&key, &this.optimizing, &this.optimizing_linker, &m)
                    });
                match out {
                    Ok(_) => {
                        this.counters.optimized.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::warn!("go: optimizing a snippet failed: {e}"),
                }
                this.tiering.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.tiering.store(false, Ordering::Release);
        }
    }

    /// Keeps the on-disk Go caches under their bound, dropping least recently used files.
    fn evict(&self) {
        let mut files: Vec<(SystemTime, u64, PathBuf)> = [&self.wasm_dir, &self.modules_dir]
            .iter()
            .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                m.is_file().then(|| {
                    (
                        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        m.len(),
                        e.path(),
                    )
                })
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        if total <= self.cache_limit_bytes {
            return;
        }
        files.sort();
        for (_, len, path) in files {
            if total <= self.cache_limit_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
                tracing::debug!("go cache: evicted {}", path.display());
            }
        }
    }
}
