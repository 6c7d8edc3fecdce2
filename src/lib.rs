//! wasmbox: a local WebAssembly code-execution sandbox for AI assistants.
//!
//! The library is the product: [`Wasmbox`] runs code; the MCP server (`mcp`) and the CLI are
//! thin fronts over it, so tests, benches and both fronts drive the same code.

pub mod cloud;
pub mod config;
pub mod engine;
pub mod error;
pub mod lang;
pub mod mcp;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, Semaphore};
use wasmtime::Engine;

pub use config::Config;
use engine::cache::{ModuleCache, Origin};
pub use engine::limits::{LimitHit, Limits};
pub use error::{Error, Result};
use lang::go::{GoCacheStats, GoRuntime};
use lang::javascript::JsRuntime;
use lang::python::{PythonPaths, PythonRuntime};
pub use lang::{ExecRequest, ExecResult, Language};

/// What a caller asks for, before validation (the shape of the MCP tools' arguments).
#[derive(Clone, Debug, Default)]
pub struct ExecOptions {
    pub language: String,
    pub code: String,
    pub env: BTreeMap<String, String>,
    /// Seconds; `None` means the default (30 s).
    pub timeout_secs: Option<f64>,
    /// Linear-memory cap in MiB; `None` means the default (1024).
    pub memory_mb: Option<u64>,
    /// Echo the value of a final expression (default: no, like `python -c`).
    pub echo: bool,
}

/// The sandbox service: one engine, the loaded runtimes, and the limits.
#[derive(Clone)]
pub struct Wasmbox {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    engine: Engine,
    cache: ModuleCache,
    python: OnceCell<Arc<PythonRuntime>>,
    javascript: OnceCell<Arc<JsRuntime>>,
    go: OnceCell<Arc<GoRuntime>>,
    permits: Semaphore,
    guests: engine::threads::GuestThreads,
    started: Instant,
    executions: AtomicU64,
}

/// Whether a runtime is ready, for `health` and `prepare`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RuntimeStatus {
    pub language: Language,
    /// "ready", "not loaded yet", "missing: ...", or "not available in this build".
    pub status: String,
}

impl Wasmbox {
    /// Builds the engine. Runtimes load on first use or with [`Wasmbox::prepare`].
    pub fn new(config: Config) -> Result<Self> {
        let engine = engine::build_engine(config.pooled_instances, config.max_memory_bytes)?;
        let cache = ModuleCache::new(config.cache_dir.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                permits: Semaphore::new(config.max_concurrency),
                guests: engine::threads::GuestThreads::new(config.max_concurrency),
                config,
                engine,
                cache,
                python: OnceCell::new(),
                javascript: OnceCell::new(),
                go: OnceCell::new(),
                started: Instant::now(),
                executions: AtomicU64::new(0),
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    pub fn executions(&self) -> u64 {
        self.inner.executions.load(Ordering::Relaxed)
    }

    /// Loads every local runtime, compiling (with progress on stderr) what is not cached yet.
    /// Returns, per language, how it was obtained and how long it took, or why it failed.
    pub async fn prepare(&self) -> Vec<(Language, Result<(Origin, Duration)>)> {
        let start = Instant::now();
        let python = self.load_python().await.map(|(_, o)| (o, start.elapsed()));
        let start = Instant::now();
        let js = self
            .load_javascript()
            .await
            .map(|(_, o)| (o, start.elapsed()));
        let start = Instant::now();
        let go = self.load_go().await.map(|(_, o)| (o, start.elapsed()));
        vec![
            (Language::Python, python),
            (Language::JavaScript, js),
            (Language::Go, go),
        ]
    }

    /// The state of each language's runtime, without loading anything.
    pub fn runtime_status(&self) -> Vec<RuntimeStatus> {
        let python = if self.inner.python.initialized() {
            "ready".to_string()
        } else {
            match PythonPaths::new(&self.inner.config.runtimes_dir).check() {
                Ok(()) => "not loaded yet (loads on first use)".to_string(),
                Err(e) => format!("missing: {e}"),
            }
        };
        let javascript = if self.inner.javascript.initialized() {
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
        let go = match self.inner.go.get() {
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

    async fn load_python(&self) -> Result<(Arc<PythonRuntime>, Origin)> {
        load_once(&self.inner.python, self.inner.clone(), |inner| {
            PythonRuntime::load(
                &inner.engine,
                &inner.cache,
                PythonPaths::new(&inner.config.runtimes_dir),
                &inner.config.python,
            )
        })
        .await
    }

    async fn load_javascript(&self) -> Result<(Arc<JsRuntime>, Origin)> {
        load_once(&self.inner.javascript, self.inner.clone(), |inner| {
            JsRuntime::load(
                &inner.engine,
                &inner.cache,
                &inner.config.runtimes_dir,
                inner.config.python.pool_size,
            )
        })
        .await
    }

    /// The Python runtime, loaded on first use (for benches and metrics).
    pub async fn python(&self) -> Result<Arc<PythonRuntime>> {
        Ok(self.load_python().await?.0)
    }

    /// Pool counters of the loaded runtimes (nothing is loaded by asking).
    pub fn pool_stats(&self) -> Vec<engine::pool::PoolStats> {
        let mut out = Vec::new();
        if let Some(p) = self.inner.python.get() {
            out.push(p.pool_stats());
        }
        if let Some(js) = self.inner.javascript.get() {
            out.push(js.pool_stats());
        }
        out
    }

    async fn load_go(&self) -> Result<(Arc<GoRuntime>, Origin)> {
        load_once(&self.inner.go, self.inner.clone(), |inner| {
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
        self.inner.go.get().map(|g| g.stats())
    }

    /// The JavaScript runtime, loaded on first use (for sessions and benches).
    pub async fn javascript(&self) -> Result<Arc<JsRuntime>> {
        Ok(self.load_javascript().await?.0)
    }

    /// Validates caller options into a request, with the errors a caller can act on.
    pub fn request(&self, opts: ExecOptions) -> Result<ExecRequest> {
        let cfg = &self.inner.config;
        let language = Language::parse(&opts.language)?;
        if opts.code.len() > cfg.max_code_bytes {
            return Err(Error::InvalidArgument(format!(
                "code is {} bytes; the limit is {} bytes",
                opts.code.len(),
                cfg.max_code_bytes
            )));
        }
        let timeout = match opts.timeout_secs {
            None => cfg.default_limits.timeout,
            Some(t) if t.is_nan() || t <= 0.0 => {
                return Err(Error::InvalidArgument(format!(
                    "Invalid timeout {t}: timeout must be positive (seconds)"
                )));
            }
            Some(t) if t > cfg.max_timeout.as_secs_f64() => {
                return Err(Error::InvalidArgument(format!(
                    "Invalid timeout {t}: the maximum is {} seconds",
                    cfg.max_timeout.as_secs()
                )));
            }
            Some(t) => Duration::from_secs_f64(t),
        };
        let memory_bytes = match opts.memory_mb {
            None => cfg.default_limits.memory_bytes,
            Some(m) => {
                let bytes = (m as usize).saturating_mul(config::MIB);
                if m == 0 || bytes > cfg.max_memory_bytes {
                    return Err(Error::InvalidArgument(format!(
                        "Invalid memory limit {m} MiB: it must be between 1 and {} MiB",
                        cfg.max_memory_bytes / config::MIB
                    )));
                }
                bytes
            }
        };
        for (k, v) in &opts.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(Error::InvalidArgument(format!(
                    "Invalid environment variable {k:?}: names must be non-empty without '=' or NUL, values without NUL"
                )));
            }
        }
        Ok(ExecRequest {
            language,
            code: opts.code,
            env: opts.env,
            timeout,
            memory_bytes,
            output_bytes: cfg.default_limits.output_bytes,
            echo: opts.echo,
        })
    }

    /// Runs a one-shot: a fresh sandbox that has never run user code, dropped afterwards.
    pub async fn execute(&self, req: ExecRequest) -> Result<ExecResult> {
        if matches!(req.language, Language::Bash) {
            return Err(Error::LanguageNotAvailable(
                "bash needs a shell, which the local WebAssembly sandbox does not have; it is meant to \
                 run in the HOPX cloud (HOPX_API_KEY), and that fallback is not available yet in this \
                 build. Use language \"python\", \"javascript\" or \"go\" to run locally"
                    .into(),
            ));
        }
        let job: Box<dyn FnOnce() -> Result<ExecResult> + Send> = match req.language {
            Language::Python => {
                let (python, _) = self.load_python().await?;
                Box::new(move || python.run_oneshot(&req))
            }
            Language::Go => {
                let (go, _) = self.load_go().await?;
                Box::new(move || go.run_oneshot(&req))
            }
            _ => {
                let (js, _) = self.load_javascript().await?;
                Box::new(move || js.run_oneshot(&req))
            }
        };
        let _permit = self
            .inner
            .permits
            .acquire()
            .await
            .map_err(|_| Error::Busy("shutting down".into()))?;
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        let t = Instant::now();
        let r = self.inner.guests.run(job).await;
        tracing::debug!("execute: on guest thread {:?}", t.elapsed());
        r
    }
}

/// Loads a runtime once per process on a blocking thread; concurrent callers wait for the same
/// load, and a failure is not cached (the next call tries again, e.g. after fetch-runtimes).
async fn load_once<T: Send + Sync + 'static>(
    cell: &OnceCell<Arc<T>>,
    inner: Arc<Inner>,
    load: fn(&Inner) -> Result<(T, Origin)>,
) -> Result<(Arc<T>, Origin)> {
    let mut origin = Origin::Cached;
    let rt = cell
        .get_or_try_init(|| async {
            let (rt, o) = tokio::task::spawn_blocking(move || load(&inner))
                .await
                .map_err(|e| Error::Engine(format!("loading a runtime panicked: {e}")))??;
            origin = o;
            Ok::<_, Error>(Arc::new(rt))
        })
        .await?;
    Ok((rt.clone(), origin))
}
