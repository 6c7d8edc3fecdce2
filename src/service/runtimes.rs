//! The language runtimes: each loaded once per process on first use (or by `prepare`), with
//! its load's stages reported to the calls that wait on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use super::{Inner, bash_unavailable};
use crate::engine::cache::Origin;
use crate::engine::progress::ProgressSink;
use crate::lang::go::{GoCacheStats, GoRuntime};
use crate::lang::image_runtime::{Flavour, ImageRuntime};
use crate::lang::javascript::JsRuntime;
use crate::lang::live::SessionRuntime;
use crate::lang::python::{PythonPaths, PythonRuntime};
use crate::lang::{ExecRequest, ExecResult};
use crate::{Error, Language, Result, Wasmbox, engine, lang};

/// Whether a runtime is ready, for `health` and `prepare`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RuntimeStatus {
    pub language: Language,
    pub status: RuntimeState,
}

/// A runtime's state; `health` shows it as its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeState {
    /// Loaded; Go names its toolchain's version.
    Ready { version: Option<String> },
    /// Not loaded yet; it loads on first use (`from`: "; toolchain PATH" when worth saying).
    NotLoaded { from: String },
    /// Not there: the error a call would get.
    Missing(String),
    /// Not in this build (bash, the cloud's).
    NotInThisBuild,
}

impl std::fmt::Display for RuntimeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeState::Ready { version: None } => f.write_str("ready"),
            RuntimeState::Ready { version: Some(v) } => write!(f, "ready ({v})"),
            RuntimeState::NotLoaded { from } => {
                write!(f, "not loaded yet (loads on first use{from})")
            }
            RuntimeState::Missing(why) => write!(f, "missing: {why}"),
            RuntimeState::NotInThisBuild => f.write_str("not available in this build"),
        }
    }
}

impl serde::Serialize for RuntimeState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Wasmbox {
    /// Loads every local runtime, compiling (with progress on stderr) what is not cached yet.
    /// Returns, per language, how it was obtained and how long it took, or why it failed.
    pub async fn prepare(&self) -> Vec<(Language, Result<(Origin, Duration)>)> {
        let mut out = Vec::new();
        for language in LOCAL {
            let start = Instant::now();
            let loaded = self.runtime(language, None).await;
            out.push((language, loaded.map(|(_, o)| (o, start.elapsed()))));
        }
        if let Some(max_age) = self.inner.config.cache_max_age {
            let cache = self.module_cache().clone();
            let pruned = tokio::task::spawn_blocking(move || cache.prune_stale(max_age)).await;
            if let Ok((files, bytes)) = pruned
                && files > 0
            {
                tracing::info!(
                    "module cache: removed {files} compiled module(s) unused for {} days ({} MB)",
                    max_age.as_secs() / 86400,
                    bytes >> 20
                );
            }
        }
        out
    }

    /// The state of each language's runtime, without loading anything.
    pub fn runtime_status(&self) -> Vec<RuntimeStatus> {
        let dir = &self.inner.config.runtimes_dir;
        let mut out: Vec<_> = LOCAL
            .into_iter()
            .map(|language| RuntimeStatus {
                language,
                status: match self.inner.runtimes.loaded(language) {
                    Some(rt) => rt.ready(),
                    None => unloaded(language, dir),
                },
            })
            .collect();
        out.push(RuntimeStatus {
            language: Language::Bash,
            status: RuntimeState::NotInThisBuild,
        });
        out
    }

    /// `language`'s runtime, loaded on first use; Bash has none here (it is the cloud's).
    pub(crate) async fn runtime(
        &self,
        language: Language,
        progress: Option<&ProgressSink>,
    ) -> Result<(Arc<dyn Runtime>, Origin)> {
        Ok(match language {
            Language::Python => {
                let (rt, o) = self.load_python(progress).await?;
                (rt as Arc<dyn Runtime>, o)
            }
            Language::JavaScript => {
                let (rt, o) = self.load_javascript(progress).await?;
                (rt as Arc<dyn Runtime>, o)
            }
            Language::Go => {
                let (rt, o) = self.load_go(progress).await?;
                (rt as Arc<dyn Runtime>, o)
            }
            Language::Bash => return Err(bash_unavailable()),
        })
    }

    pub(crate) async fn load_python(
        &self,
        progress: Option<&ProgressSink>,
    ) -> Result<(Arc<PythonRuntime>, Origin)> {
        let rt = &self.inner.runtimes.python;
        rt.load(Language::Python, progress, self.inner.clone(), |inner| {
            Ok(PythonRuntime::load(
                &inner.engine,
                &inner.cache,
                PythonPaths::new(&inner.config.runtimes_dir).with_packages(inner.packages.store()),
                &inner.config.python,
                &inner.config.pool,
            )?)
        })
        .await
    }

    pub(crate) async fn load_javascript(
        &self,
        progress: Option<&ProgressSink>,
    ) -> Result<(Arc<JsRuntime>, Origin)> {
        let rt = &self.inner.runtimes.javascript;
        rt.load(
            Language::JavaScript,
            progress,
            self.inner.clone(),
            |inner| {
                Ok(JsRuntime::load(
                    &inner.engine,
                    &inner.cache,
                    &inner.config.runtimes_dir,
                    &inner.config.pool,
                )?)
            },
        )
        .await
    }

    /// The runtime that keeps `language`'s sessions, loaded on first use.
    pub(crate) async fn session_runtime(
        &self,
        language: Language,
        progress: Option<&ProgressSink>,
    ) -> Result<Arc<dyn SessionRuntime>> {
        let no_sessions = || {
            Error::invalid(format!(
                "{} keeps no session between calls",
                language.name()
            ))
        };
        if !crate::sandbox::slot::SESSION_LANGUAGES.contains(&language) {
            return Err(no_sessions());
        }
        self.runtime(language, progress)
            .await?
            .0
            .sessions()
            .ok_or_else(no_sessions)
    }

    /// The Python runtime, loaded on first use (for benches and metrics).
    pub async fn python(&self) -> Result<Arc<PythonRuntime>> {
        Ok(self.load_python(None).await?.0)
    }

    /// Pool counters of the loaded runtimes (nothing is loaded by asking).
    pub fn pool_stats(&self) -> Vec<engine::pool::PoolStats> {
        LOCAL
            .into_iter()
            .filter_map(|l| self.inner.runtimes.loaded(l))
            .flat_map(|rt| rt.pools())
            .collect()
    }

    pub(crate) async fn load_go(
        &self,
        progress: Option<&ProgressSink>,
    ) -> Result<(Arc<GoRuntime>, Origin)> {
        let rt = &self.inner.runtimes.go;
        rt.load(Language::Go, progress, self.inner.clone(), |inner| {
            let go = GoRuntime::load(
                &inner.config.runtimes_dir,
                &inner.config.cache_dir,
                &inner.engine,
            )?;
            Ok((go, Origin::Cached))
        })
        .await
    }

    /// Go's build-cache counters, once Go has been used in this process.
    pub fn go_cache_stats(&self) -> Option<GoCacheStats> {
        self.inner.runtimes.go.cell.get().map(|g| g.stats())
    }

    /// The JavaScript runtime, loaded on first use (for sessions and benches).
    pub async fn javascript(&self) -> Result<Arc<JsRuntime>> {
        Ok(self.load_javascript(None).await?.0)
    }
}

/// The local runtimes, each loaded once per process.
#[derive(Default)]
pub(crate) struct Runtimes {
    python: Loaded<PythonRuntime>,
    javascript: Loaded<JsRuntime>,
    go: Loaded<GoRuntime>,
}

/// A runtime once loaded, and what its load is doing now (`None` before its first stage), for
/// calls that wait on it and report progress.
struct Loaded<T> {
    cell: OnceCell<Arc<T>>,
    stages: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

/// The languages that run here, in the order `prepare` loads them.
const LOCAL: [Language; 3] = [Language::Python, Language::JavaScript, Language::Go];

/// What the facade asks of a loaded runtime, whatever its language: the registry below is the
/// one place that knows which type serves which language.
pub(crate) trait Runtime: Send + Sync {
    /// Runs `req` in a fresh instance (a one-shot, or a command in a sandbox's place).
    fn oneshot(self: Arc<Self>, req: &ExecRequest) -> lang::Result<ExecResult>;
    /// Its instance pools' counters.
    fn pools(&self) -> Vec<engine::pool::PoolStats>;
    /// What `health` says of it once loaded.
    fn ready(&self) -> RuntimeState {
        RuntimeState::Ready { version: None }
    }
    /// The runtime that keeps its sessions, if it keeps any.
    fn sessions(self: Arc<Self>) -> Option<Arc<dyn SessionRuntime>>;
}

/// Python and JavaScript: a pool and a spare, and sessions.
impl<F: Flavour> Runtime for ImageRuntime<F> {
    fn oneshot(self: Arc<Self>, req: &ExecRequest) -> lang::Result<ExecResult> {
        self.run_oneshot(req)
    }
    fn pools(&self) -> Vec<engine::pool::PoolStats> {
        std::iter::once(self.pool_stats())
            .chain(self.spare_stats())
            .collect()
    }
    fn sessions(self: Arc<Self>) -> Option<Arc<dyn SessionRuntime>> {
        Some(self)
    }
}

/// Go builds each snippet (its cache stands in for pools) and keeps no session.
impl Runtime for GoRuntime {
    fn oneshot(self: Arc<Self>, req: &ExecRequest) -> lang::Result<ExecResult> {
        GoRuntime::run_oneshot(&self, req)
    }
    fn pools(&self) -> Vec<engine::pool::PoolStats> {
        Vec::new()
    }
    fn ready(&self) -> RuntimeState {
        RuntimeState::Ready {
            version: Some(self.toolchain().version.clone()),
        }
    }
    fn sessions(self: Arc<Self>) -> Option<Arc<dyn SessionRuntime>> {
        None
    }
}

/// Where an unloaded runtime would load from, or why it cannot, without loading it.
fn unloaded(language: Language, dir: &std::path::Path) -> RuntimeState {
    let from = |from: String| RuntimeState::NotLoaded { from };
    match language {
        Language::Python => match PythonPaths::new(dir).check() {
            Ok(()) => from(String::new()),
            Err(e) => RuntimeState::Missing(e.to_string()),
        },
        Language::JavaScript => {
            let path = lang::javascript::module_path(dir);
            match path.is_file() {
                true => from(String::new()),
                false => RuntimeState::Missing(missing("javascript", path)),
            }
        }
        Language::Go => match lang::go::find_go(dir) {
            Some(p) if p.is_file() => from(format!("; toolchain {}", p.display())),
            _ => RuntimeState::Missing(format!(
                "{}; or set WASMBOX_GO to a go 1.21+ binary",
                missing("go", lang::go::pinned_go(dir))
            )),
        },
        Language::Bash => RuntimeState::NotInThisBuild,
    }
}

/// Health's line for a runtime not there: the error a call would get.
fn missing(runtime: &'static str, path: std::path::PathBuf) -> String {
    lang::LangError::RuntimeMissing { runtime, path }.to_string()
}

impl Runtimes {
    /// `language`'s runtime if it has loaded (asking loads nothing).
    pub(crate) fn loaded(&self, language: Language) -> Option<Arc<dyn Runtime>> {
        match language {
            Language::Python => self.python.get(),
            Language::JavaScript => self.javascript.get(),
            Language::Go => self.go.get(),
            Language::Bash => None,
        }
    }

    /// The loaded runtime that keeps `language`'s sessions; `None` when it has not loaded (so
    /// no session of it can be live).
    pub(crate) fn loaded_session(&self, language: Language) -> Option<Arc<dyn SessionRuntime>> {
        self.loaded(language)?.sessions()
    }
}

impl<T: Runtime + 'static> Loaded<T> {
    fn get(&self) -> Option<Arc<dyn Runtime>> {
        self.cell.get().map(|r| r.clone() as Arc<dyn Runtime>)
    }
}

impl<T> Default for Loaded<T> {
    fn default() -> Self {
        Self {
            cell: OnceCell::new(),
            stages: Default::default(),
        }
    }
}

/// How often a call waiting on a long load says it still is.
const LOAD_HEARTBEAT: Duration = Duration::from_secs(5);

/// Loads the runtime once per process on a blocking thread; concurrent callers wait for the same
/// load, and a failure is not cached (the next call tries again, e.g. after fetch-runtimes).
/// A caller with a progress sink hears the load's stages, whichever caller started it.
impl<T: Send + Sync + 'static> Loaded<T> {
    async fn load(
        &self,
        language: Language,
        progress: Option<&ProgressSink>,
        inner: Arc<Inner>,
        load: fn(&Inner) -> Result<(T, Origin)>,
    ) -> Result<(Arc<T>, Origin)> {
        let (cell, stages) = (&self.cell, &self.stages);
        if let Some(rt) = cell.get() {
            return Ok((rt.clone(), Origin::Cached));
        }
        let mut origin = Origin::Cached;
        let init = cell.get_or_try_init(|| async {
            let tx = stages.clone();
            let report: engine::progress::StageFn = Arc::new(move |m: &str| {
                tx.send_replace(Some(m.to_string()));
            });
            let first = format!("loading the {} runtime", language.as_str());
            stages.send_replace(Some(first.clone()));
            let (rt, o) = tokio::task::spawn_blocking(move || {
                engine::progress::with_stages(Some(report), || load(&inner))
            })
            .await
            .map_err(|e| Error::wasm(format!("loading a runtime panicked: {e}")))??;
            origin = o;
            Ok::<_, Error>(Arc::new(rt))
        });
        let rt = match progress {
            None => init.await?,
            Some(sink) => report_load(init, stages.subscribe(), language, sink).await?,
        };
        Ok((rt.clone(), origin))
    }
}

/// Waits for `load`, reporting each stage it enters to `sink` and, through a long stage, that
/// it still is.
async fn report_load<R>(
    load: impl std::future::Future<Output = R>,
    mut stages: tokio::sync::watch::Receiver<Option<String>>,
    language: Language,
    sink: &ProgressSink,
) -> R {
    let start = Instant::now();
    let mut current = format!("loading the {} runtime", language.as_str());
    sink.stage(current.clone());
    // A load already under way may be further on.
    if let Some(s) = stages.borrow_and_update().clone()
        && s != current
    {
        sink.stage(s.clone());
        current = s;
    }
    let mut heartbeat =
        tokio::time::interval_at(tokio::time::Instant::now() + LOAD_HEARTBEAT, LOAD_HEARTBEAT);
    tokio::pin!(load);
    loop {
        tokio::select! {
            biased;
            r = &mut load => return r,
            Ok(()) = stages.changed() => {
                if let Some(s) = stages.borrow_and_update().clone()
                    && s != current
                {
                    sink.stage(s.clone());
                    current = s;
                }
            }
            _ = heartbeat.tick() => {
                sink.stage(format!("{current} ({} s so far)", start.elapsed().as_secs()));
            }
        }
    }
}
