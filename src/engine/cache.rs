//! Compiled-module cache.
//!
//! Compiling CPython's 100 MB module takes a minute or more, so each module is compiled once and
//! kept as a `.cwasm` named by SHA-256 of (module bytes, wasmtime version, engine settings).
//! Loading one is an mmap (`Module::deserialize_file`), which also backs the copy-on-write memory
//! images. Files are written atomically; one that wasmtime refuses (corrupt, or from another
//! engine) is compiled again and replaced. A per-module lock file keeps two processes from
//! compiling the same module at once.

use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use super::{EngineError as Error, Result};

/// Where compiled modules live, and how they are named.
#[derive(Clone, Debug)]
pub struct ModuleCache {
    dir: PathBuf,
    /// Compiled files this process has mapped: `evict_unused` keeps them.
    in_use: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<PathBuf>>>,
}

/// What the module cache holds, for `cache_stats`.
#[derive(Clone, Debug, serde::Serialize, schemars::JsonSchema)]
pub struct CacheStats {
    pub dir: PathBuf,
    pub files: u64,
    pub bytes: u64,
    pub in_use: u64,
}

/// How a module was obtained, for `prepare` and the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Cached,
    Compiled,
}

/// Size and mtime of a source file together with its hash, so an unchanged 100 MB module is not
/// hashed on every start.
#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime_ns: u128,
    sha256: String,
}

impl ModuleCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            in_use: Default::default(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key of `wasm_sha256` compiled by `engine`.
    pub fn key(engine: &Engine, wasm_sha256: &str) -> String {
        // The compatibility hash covers the engine settings that change compiled code; it is
        // stable for a given wasmtime build, which is all a local cache needs.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let mut d = Sha256::new();
        d.update(wasm_sha256.as_bytes());
        d.update(b"\0wasmtime-");
        d.update(wasmtime_version().as_bytes());
        d.update(b"\0");
        d.update(h.finish().to_le_bytes());
        hex::encode(d.finalize())
    }

    /// Where the compiled copy of the module identified by `source_key` is (see
    /// [`ModuleCache::load_with`]).
    pub fn compiled_path(&self, engine: &Engine, source_key: &str) -> PathBuf {
        self.dir
            .join(format!("{}.cwasm", Self::key(engine, source_key)))
    }

    /// SHA-256 of a file, reusing a stamp kept in the cache when size and mtime are unchanged.
    pub fn file_sha256(&self, path: &Path) -> Result<String> {
        let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let stamp_path = self.dir.join("stamps").join(format!(
            "{}.json",
            hex::encode(Sha256::digest(canonical.to_string_lossy().as_bytes()))
        ));
        if let Ok(text) = fs::read_to_string(&stamp_path)
            && let Ok(stamp) = serde_json::from_str::<Stamp>(&text)
            && stamp.len == meta.len()
            && stamp.mtime_ns == mtime_ns
        {
            return Ok(stamp.sha256);
        }
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let sha256 = hex::encode(hasher.finalize());
        let stamp = Stamp {
            len: meta.len(),
            mtime_ns,
            sha256: sha256.clone(),
        };
        // A stamp that cannot be written only costs a re-hash next time.
        let _ = write_atomically(
            &stamp_path,
            serde_json::to_string(&stamp).unwrap().as_bytes(),
        );
        Ok(sha256)
    }

    /// Loads `wasm_path` compiled for `engine`, compiling (with progress on stderr) and caching
    /// it when no valid cached copy exists.
    pub fn load(&self, engine: &Engine, wasm_path: &Path, label: &str) -> Result<(Module, Origin)> {
        let sha = self.file_sha256(wasm_path)?;
        self.load_with(engine, &sha, label, || {
            fs::read(wasm_path).map_err(|e| Error::io(wasm_path, e))
        })
    }

    /// Like [`ModuleCache::load`], for a module whose identity the caller already knows: `id`
    /// must name the module's bytes uniquely (its SHA-256, or the hash of the inputs of a
    /// reproducible build), so nothing is hashed and `wasm_path` is read only to compile.
    pub fn load_keyed(
        &self,
        engine: &Engine,
        id: &str,
        wasm_path: &Path,
        label: &str,
    ) -> Result<(Module, Origin)> {
        self.load_with(engine, id, label, || {
            fs::read(wasm_path).map_err(|e| Error::io(wasm_path, e))
        })
    }

    /// Loads the module identified by `source_key` (a hash of everything that determines its
    /// bytes), calling `wasm` to produce the bytes only when no compiled copy is cached.
    pub fn load_with<E: From<Error>>(
        &self,
        engine: &Engine,
        source_key: &str,
        label: &str,
        wasm: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<(Module, Origin), E> {
        self.load_compiled(engine, source_key, label, || {
            let bytes = wasm()?;
            with_progress(label, bytes.len(), || engine.precompile_module(&bytes))
                .map_err(|e| Error::Wasm(format!("compiling {label}: {e:#}")).into())
        })
    }

    /// [`ModuleCache::load_with`] for a builder that compiles what it makes itself, with an
    /// engine of `engine`'s settings: pre-initialised images, built once, not on every start
    /// (`engine::preinit::build_compiled`).
    pub fn load_compiled<E: From<Error>>(
        &self,
        engine: &Engine,
        source_key: &str,
        label: &str,
        compile: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<(Module, Origin), E> {
        let key = Self::key(engine, source_key);
        let cwasm = self.compiled_path(engine, source_key);
        if let Some(module) = self.try_load(engine, &cwasm, label) {
            return Ok((module, Origin::Cached));
        }
        fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let lock_path = self.dir.join(format!("{key}.lock"));
        let lock = File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
        if lock.try_lock().is_err() {
            tracing::info!("{label}: another process is compiling this module; waiting for it");
            super::progress::stage(&format!(
                "{label}: another wasmbox process is compiling it; waiting for that"
            ));
            lock.lock().map_err(|e| Error::io(&lock_path, e))?;
            if let Some(module) = self.try_load(engine, &cwasm, label) {
                return Ok((module, Origin::Cached));
            }
        }
        let compiled = compile()?;
        write_atomically(&cwasm, &compiled).map_err(|e| Error::io(&cwasm, e))?;
        drop(compiled);
        let module = self
            .try_load(engine, &cwasm, label)
            .ok_or_else(|| Error::Wasm(format!("{label}: freshly compiled module did not load")))?;
        drop(lock);
        Ok((module, Origin::Compiled))
    }

    /// The compiled runtimes in the cache directory (Go's own caches are counted separately).
    pub fn stats(&self) -> CacheStats {
        let in_use = self.in_use.lock().unwrap();
        let (mut files, mut bytes) = (0, 0);
        for (_, meta) in self.cwasm_files() {
            files += 1;
            bytes += meta.len();
        }
        CacheStats {
            dir: self.dir.clone(),
            files,
            bytes,
            in_use: in_use.len() as u64,
        }
    }

    /// Removes compiled files this process does not use: images left by older runtimes or
    /// settings (hundreds of MB each). Returns (files, bytes) removed.
    pub fn evict_unused(&self) -> (u64, u64) {
        self.remove_unused(|_| true)
    }

    /// Removes compiled files that no process has loaded for `max_age` (loading one marks it
    /// used, in its mtime), except this process's own: images of older runtimes, settings or
    /// wasmbox versions, hundreds of MB each, would otherwise pile up with every upgrade.
    /// Returns (files, bytes) removed.
    pub fn prune_stale(&self, max_age: Duration) -> (u64, u64) {
        let now = std::time::SystemTime::now();
        self.remove_unused(|meta| {
            meta.modified()
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > max_age)
        })
    }

    fn remove_unused(&self, remove: impl Fn(&fs::Metadata) -> bool) -> (u64, u64) {
        let in_use = self.in_use.lock().unwrap();
        let (mut files, mut bytes) = (0, 0);
        for (path, meta) in self.cwasm_files() {
            if in_use.contains(&path) || !remove(&meta) {
                continue;
            }
            if fs::remove_file(&path).is_ok() {
                files += 1;
                bytes += meta.len();
                let _ = fs::remove_file(path.with_extension("lock"));
            }
        }
        (files, bytes)
    }

    fn cwasm_files(&self) -> Vec<(PathBuf, fs::Metadata)> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
            .collect()
    }

    /// The module `id` compiled for `engine`, if this cache already holds it (never compiles).
    pub fn cached(&self, engine: &Engine, id: &str, label: &str) -> Option<Module> {
        let cwasm = self.dir.join(format!("{}.cwasm", Self::key(engine, id)));
        self.try_load(engine, &cwasm, label)
    }

    fn try_load(&self, engine: &Engine, cwasm: &Path, label: &str) -> Option<Module> {
        if !cwasm.is_file() {
            return None;
        }
        // SAFETY: the file is one this cache wrote atomically for this engine's key, in a
        // directory of the user's own; wasmtime still checks its header and engine settings, and
        // anything it refuses is recompiled.
        let loaded = unsafe { Module::deserialize_file(engine, cwasm) }.or_else(|mapped| {
            // A file that cannot be mapped (wine, some network drives) is loaded from a copy in
            // memory: no sharing of its pages between processes, but it runs.
            let bytes = fs::read(cwasm).map_err(|_| mapped)?;
            // SAFETY: as above, the same bytes.
            let m = unsafe { Module::deserialize(engine, &bytes) }?;
            tracing::debug!(
                "{label}: {} loaded from memory, not mapped",
                cwasm.display()
            );
            Ok::<_, wasmtime::Error>(m)
        });
        match loaded {
            Ok(m) => {
                // Marks it used, for `prune_stale` in other processes and later ones.
                let _ = set_mtime(cwasm, std::time::SystemTime::now());
                self.in_use.lock().unwrap().insert(cwasm.to_path_buf());
                Some(m)
            }
            Err(e) => {
                tracing::warn!(
                    "{label}: cached module {} is unusable ({e:#}); compiling it again",
                    cwasm.display()
                );
                let _ = fs::remove_file(cwasm);
                None
            }
        }
    }
}

/// A compiled file's mtime says when a process last loaded it.
fn set_mtime(path: &Path, t: std::time::SystemTime) -> std::io::Result<()> {
    File::options().write(true).open(path)?.set_modified(t)
}

pub fn wasmtime_version() -> &'static str {
    // Pinned in Cargo.toml; part of every cache key.
    "48.0.8"
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// reader never sees half a file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Runs a long compile while showing it is alive: a spinner with elapsed time on a terminal,
/// a log line every 15 s otherwise (stdout is never touched: it may be the MCP channel).
pub fn with_progress<T>(label: &str, size: usize, work: impl FnOnce() -> T) -> T {
    let mib = size as f64 / (1024.0 * 1024.0);
    let msg = format!("compiling {label} ({mib:.0} MiB of wasm)");
    super::progress::stage(&msg);
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let bar: Arc<Mutex<Option<indicatif::ProgressBar>>> = Arc::new(Mutex::new(None));
    let ticker = if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}").unwrap(),
        );
        pb.set_message(msg.clone());
        pb.enable_steady_tick(Duration::from_millis(120));
        *bar.lock().unwrap() = Some(pb);
        None
    } else {
        if mib > 20.0 {
            tracing::info!("{msg}: this takes a minute or more on 2 cores");
        } else {
            tracing::info!("{msg}");
        }
        let done = done.clone();
        let label = label.to_string();
        Some(std::thread::spawn(move || {
            let mut last = Instant::now();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if last.elapsed() >= Duration::from_secs(15) {
                    last = Instant::now();
                    tracing::info!(
                        "still compiling {label}: {:.0} s",
                        start.elapsed().as_secs_f64()
                    );
                }
            }
        }))
    };
    let out = work();
    done.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.join();
    }
    if let Some(pb) = bar.lock().unwrap().take() {
        pb.finish_and_clear();
    }
    tracing::info!("compiled {label} in {:.1} s", start.elapsed().as_secs_f64());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Old images nobody loads go; recent ones, and the ones this process maps however old, stay.
    #[test]
    fn prune_removes_only_stale_files_nobody_here_uses() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path());
        let engine = Engine::default();
        let wat = dir.path().join("m.wat");
        fs::write(&wat, "(module (func (export \"f\")))").unwrap();
        let (_module, origin) = cache.load(&engine, &wat, "test").unwrap();
        assert_eq!(origin, Origin::Compiled);
        let month_ago = std::time::SystemTime::now() - Duration::from_secs(30 * 86400);
        let mine = cache.cwasm_files()[0].0.clone();
        set_mtime(&mine, month_ago).unwrap();
        let stale = dir.path().join("stale.cwasm");
        let recent = dir.path().join("recent.cwasm");
        fs::write(&stale, vec![0u8; 1000]).unwrap();
        fs::write(stale.with_extension("lock"), "").unwrap();
        fs::write(&recent, "x").unwrap();
        set_mtime(&stale, month_ago).unwrap();
        assert_eq!(
            cache.prune_stale(Duration::from_secs(14 * 86400)),
            (1, 1000)
        );
        assert!(!stale.exists() && !stale.with_extension("lock").exists());
        assert!(recent.exists() && mine.exists());
        // Loading marks a file used: another process's prune keeps it.
        let other = ModuleCache::new(dir.path());
        other.load(&engine, &wat, "test").unwrap();
        drop(other);
        let fresh = ModuleCache::new(dir.path());
        assert_eq!(fresh.prune_stale(Duration::from_secs(14 * 86400)), (0, 0));
        assert!(mine.exists());
    }
}
