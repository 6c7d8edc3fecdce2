//! The language runtimes: each loaded once per process on first use (or by `prepare`), with
//! its load's stages reported to the calls that wait on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::engine::cache::Origin;
use crate::engine::progress::ProgressSink;
use crate::lang::go::{GoCacheStats, GoRuntime};
use crate::lang::javascript::JsRuntime;
use crate::lang::python::{PythonPaths, PythonRuntime};
use crate::lang::session::SessionRuntime;
use crate::{Error, Inner, Language, Result, Wasmbox, engine, lang};

/// Whether a runtime is ready, for `health` and `prepare`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RuntimeStatus {
    pub language: Language,
    /// "ready", "not loaded yet", "missing: ...", or "not available in this build".
    pub status: String,
}

impl Wasmbox {
    /// Loads every local runtime, compiling (with progress on stderr) what is not cached yet.
    /// Returns, per language, how it was obtained and how long it took, or why it failed.
    pub async fn prepare(&self) -> Vec<(Language, Result<(Origin, Duration)>)> {
        let start = Instant::now();
        let python = self
            .load_python(None)
            .await
            .map(|(_, o)| (o, start.elapsed()));
        let start = Instant::now();
        let js = self
            .load_javascript(None)
            .await
            .map(|(_, o)| (o, start.elapsed()));
        let start = Instant::now();
        let go = self.load_go(None).await.map(|(_, o)| (o, start.elapsed()));
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
        vec![
            (Language::Python, python),
            (Language::JavaScript, js),
            (Language::Go, go),
        ]
    }

    /// The state of each language's runtime, without loading anything.
    pub fn runtime_status(&self) -> Vec<RuntimeStatus> {
        let python = if self.inner.runtimes.python.cell.initialized() {
            "ready".to_string()
        } else {
            match PythonPaths::new(&self.inner.config.runtimes_dir).check() {
                Ok(()) => "not loaded yet (loads on first use)".to_string(),
                Err(e) => format!("missing: {e}"),
            }
        };
        let javascript = if self.inner.runtimes.javascript.cell.initialized() {
            "ready".to_string()
        } else {
            let path = lang::javascript::module_path(&self.inner.config.runtimes_dir);
            if path.is_file() {
                "not loaded yet (loads on first use)".to_string()
            } else {
                format!("missing: {} (run ./fetch-runtimes.sh)", path.display())
            }
        };
        let mut out = vec![
            RuntimeStatus {
                language: Language::Python,
                status: python,
            },
            RuntimeStatus {
                language: Language::JavaScript,
                status: javascript,
            },
        ];
        let go = match self.inner.runtimes.go.cell.get() {
            Some(go) => format!("ready ({})", go.toolchain().version),
            None => match lang::go::find_go(&self.inner.config.runtimes_dir) {
                Some(p) if p.is_file() => {
                    format!(
                        "not loaded yet (loads on first use; toolchain {})",
                        p.display()
                    )
                }
                _ => format!(
                    "missing: no Go toolchain at {} (run ./fetch-runtimes.sh, or set WASMBOX_GO)",
                    lang::go::pinned_go(&self.inner.config.runtimes_dir).display()
                ),
            },
        };
        out.push(RuntimeStatus {
            language: Language::Go,
            status: go,
        });
        out.push(RuntimeStatus {
            language: Language::Bash,
            status: "not available in this build".into(),
        });
        out
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
                PythonPaths::new(&inner.config.runtimes_dir),
                &inner.config.python,
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
                    inner.config.python.pool_size,
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
        Ok(match language {
            Language::Python => self.load_python(progress).await?.0,
            Language::JavaScript => self.load_javascript(progress).await?.0,
            other => {
                return Err(Error::invalid(format!(
                    "{} keeps no session between calls",
                    other.name()
                )));
            }
        })
    }

    /// The Python runtime, loaded on first use (for benches and metrics).
    pub async fn python(&self) -> Result<Arc<PythonRuntime>> {
        Ok(self.load_python(None).await?.0)
    }

    /// Pool counters of the loaded runtimes (nothing is loaded by asking).
    pub fn pool_stats(&self) -> Vec<engine::pool::PoolStats> {
        let mut out = Vec::new();
        if let Some(p) = self.inner.runtimes.python.cell.get() {
            out.push(p.pool_stats());
            out.extend(p.spare_stats());
        }
        if let Some(js) = self.inner.runtimes.javascript.cell.get() {
            out.push(js.pool_stats());
            out.extend(js.spare_stats());
        }
        out
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

impl Runtimes {
    /// The loaded runtime that keeps `language`'s sessions; `None` when it has not loaded (so
    /// no session of it can be live).
    pub(crate) fn loaded_session(&self, language: Language) -> Option<Arc<dyn SessionRuntime>> {
        match language {
            Language::Python => self
                .python
                .cell
                .get()
                .map(|r| r.clone() as Arc<dyn SessionRuntime>),
            Language::JavaScript => self
                .javascript
                .cell
                .get()
                .map(|r| r.clone() as Arc<dyn SessionRuntime>),
            _ => None,
        }
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
