//! wasmbox: a local WebAssembly code-execution sandbox for AI assistants.
//!
//! The library is the product: [`Wasmbox`] runs code; the MCP server (`mcp`) and the CLI are
//! thin fronts over it, so tests, benches and both fronts drive the same code.

pub mod cloud;
pub mod config;
mod durable;
pub mod engine;
pub mod fit;
pub mod lang;
pub mod mcp;
pub mod sandbox;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, Semaphore};
use wasmtime::Engine;

use cloud::CloudError;
pub use config::Config;
pub use durable::{PAUSE_WAIT, SavedSession};
use engine::EngineError;
use engine::cache::{ModuleCache, Origin};
pub use engine::limits::{LimitHit, Limits};
use engine::progress::ProgressSink;
use lang::LangError;
use lang::go::{GoCacheStats, GoRuntime};
use lang::javascript::JsRuntime;
use lang::python::{PythonPaths, PythonRuntime};
use lang::session::SessionRuntime;
pub use lang::{ExecRequest, ExecResult, Language};
use sandbox::fs::FsError;
use sandbox::jobs::Job;
use sandbox::{Sandbox, SandboxError, Sandboxes};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The library's error: each layer's own, composed. Each message says what went wrong and what
/// to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Lang(#[from] LangError),

    #[error(transparent)]
    Sandbox(#[from] SandboxError),

    #[error(transparent)]
    File(#[from] FsError),

    #[error(transparent)]
    Snapshot(#[from] sandbox::snapshots::SnapshotError),

    #[error("{0}")]
    Webhook(String),

    #[error(transparent)]
    Cloud(#[from] CloudError),

    #[error("the client cancelled the call{0}")]
    Cancelled(&'static str),
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        Error::Lang(e.into())
    }
}

impl Error {
    pub fn wasm(msg: impl Into<String>) -> Self {
        EngineError::Wasm(msg.into()).into()
    }

    pub fn busy(msg: impl Into<String>) -> Self {
        EngineError::Busy(msg.into()).into()
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        LangError::InvalidArgument(msg.into()).into()
    }

    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        EngineError::io(path, source).into()
    }
}

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
    /// Raised when the caller gives up on the call (see [`ExecRequest::cancel`]).
    pub cancel: Option<Arc<engine::limits::Stop>>,
    /// Where the call's progress goes (see [`ExecRequest::progress`]).
    pub progress: Option<engine::progress::ProgressSink>,
    /// Whose call it is (see [`ExecRequest::owner`]); `None` is the local user.
    pub owner: Option<engine::cpu::Owner>,
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
    /// What each runtime's load is doing, for calls that wait on it and report progress.
    loading: LoadStages,
    /// Live guests (computing or waiting): a call waits for one within the queue wait.
    live: Semaphore,
    /// Guests computing: given back while a guest waits in a sleep.
    cpu: Arc<engine::cpu::CpuSlots>,
    guests: engine::threads::GuestThreads,
    /// Background jobs and async executions running, in all and per owner.
    jobs: Arc<sandbox::jobs::JobBudget>,
    started: Instant,
    executions: AtomicU64,
    sandboxes: Arc<Sandboxes>,
    webhook_key: Vec<u8>,
    /// Delivers webhooks only (checked addresses, no redirects).
    http: reqwest::Client,
    /// The HOPX client; whether it may be used is `cloud::route`'s call.
    cloud: Option<cloud::Cloud>,
    /// Cloud sandboxes, by their wasmbox id.
    cloud_sandboxes: std::sync::Mutex<std::collections::HashMap<String, Arc<CloudSandbox>>>,
}

/// A sandbox in the HOPX cloud behind a wasmbox id: its calls are forwarded.
pub struct CloudSandbox {
    pub id: String,
    /// Who created it (see [`sandbox::Sandbox::owner`]).
    pub owner: String,
    pub template: String,
    pub created_at: std::time::SystemTime,
    pub timeout_seconds: Option<u64>,
    pub sandbox: cloud::Sandbox,
    /// Its place within the cloud sandbox limits, given back when it is forgotten.
    _slot: cloud::CloudSlot,
}

impl CloudSandbox {
    /// HOPX has deleted it by now (its lifetime is always set).
    fn expired(&self) -> bool {
        self.timeout_seconds.is_some_and(|t| {
            self.created_at + Duration::from_secs(t) <= std::time::SystemTime::now()
        })
    }
}

/// A blocking execution handed to a guest thread.
type Run = Box<dyn FnOnce() -> Result<ExecResult> + Send>;

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
        let sandboxes = Sandboxes::new(config.sandbox.clone())
            .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        let webhook_key = sandbox::webhook::secret(&config.webhook, &config.cache_dir);
        let wb = Self {
            inner: Arc::new(Inner {
                cloud: cloud::Cloud::new(config.cloud.clone())
                    .inspect_err(|e| tracing::warn!("the HOPX client is unavailable: {e}"))
                    .ok(),
                sandboxes,
                cloud_sandboxes: Default::default(),
                webhook_key,
                http: sandbox::webhook::client(&config.webhook)
                    .map_err(|e| Error::wasm(format!("building the HTTP client: {e}")))?,
                live: Semaphore::new(config.max_guests),
                cpu: engine::cpu::CpuSlots::new(config.max_concurrency, config.foreground_slots),
                guests: engine::threads::GuestThreads::new(
                    config.max_concurrency,
                    config.max_guests,
                ),
                jobs: sandbox::jobs::JobBudget::new(
                    config.max_jobs,
                    config.max_jobs_per_owner,
                    config.async_queue,
                    config.async_queue_bytes,
                ),
                config,
                engine,
                cache,
                python: OnceCell::new(),
                javascript: OnceCell::new(),
                go: OnceCell::new(),
                loading: LoadStages::default(),
                started: Instant::now(),
                executions: AtomicU64::new(0),
            }),
        };
        wb.start_idle_keeper();
        Ok(wb)
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

    async fn load_python(
        &self,
        progress: Option<&ProgressSink>,
    ) -> Result<(Arc<PythonRuntime>, Origin)> {
        let stages = (&self.inner.loading.python, Language::Python, progress);
        load_once(&self.inner.python, stages, self.inner.clone(), |inner| {
            Ok(PythonRuntime::load(
                &inner.engine,
                &inner.cache,
                PythonPaths::new(&inner.config.runtimes_dir),
                &inner.config.python,
            )?)
        })
        .await
    }

    async fn load_javascript(
        &self,
        progress: Option<&ProgressSink>,
    ) -> Result<(Arc<JsRuntime>, Origin)> {
        let stages = (
            &self.inner.loading.javascript,
            Language::JavaScript,
            progress,
        );
        load_once(
            &self.inner.javascript,
            stages,
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
    async fn session_runtime(
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

    /// Slots of the pooling allocator in use (instances, memories, GC heaps) and its limit:
    /// live instances are bounded by construction, and this is where that shows.
    pub fn slot_stats(&self) -> Option<serde_json::Value> {
        let m = self.inner.engine.pooling_allocator_metrics()?;
        Some(serde_json::json!({
            "limit": self.inner.config.pooled_instances,
            "core_instances": m.core_instances(),
            "memories": m.memories(),
            "gc_heaps": m.gc_heaps(),
        }))
    }

    /// Declares how many owners (HTTP tokens) share this server: with more than one, no owner
    /// may hold every job place (see [`sandbox::jobs::JobBudget`]).
    pub fn set_owners(&self, owners: usize) {
        self.inner.jobs.set_owners(owners);
    }

    /// CPU slots: how many, how many background work may never take, and in use now.
    pub fn cpu_stats(&self) -> serde_json::Value {
        let cpu = &self.inner.cpu;
        let (busy, background) = cpu.busy();
        serde_json::json!({
            "total": cpu.total(),
            "reserved_for_calls": cpu.reserved(),
            "per_owner_while_others_wait": cpu.share(),
            "busy": busy,
            "background": background,
            "max_guests": self.inner.config.max_guests,
        })
    }

    /// `owner`'s running background jobs and async executions, and the caps.
    pub fn job_stats(&self, owner: &str) -> serde_json::Value {
        let cfg = &self.inner.config;
        serde_json::json!({
            "running": self.inner.jobs.running(owner).1,
            "max_per_token": self.inner.jobs.per_owner().0,
            "max": cfg.max_jobs,
        })
    }

    /// Pool counters of the loaded runtimes (nothing is loaded by asking).
    pub fn pool_stats(&self) -> Vec<engine::pool::PoolStats> {
        let mut out = Vec::new();
        if let Some(p) = self.inner.python.get() {
            out.push(p.pool_stats());
            out.extend(p.spare_stats());
        }
        if let Some(js) = self.inner.javascript.get() {
            out.push(js.pool_stats());
            out.extend(js.spare_stats());
        }
        out
    }

    async fn load_go(&self, progress: Option<&ProgressSink>) -> Result<(Arc<GoRuntime>, Origin)> {
        let stages = (&self.inner.loading.go, Language::Go, progress);
        load_once(&self.inner.go, stages, self.inner.clone(), |inner| {
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
        Ok(self.load_javascript(None).await?.0)
    }

    /// Validates caller options into a request, with the errors a caller can act on.
    pub fn request(&self, opts: ExecOptions) -> Result<ExecRequest> {
        let cfg = &self.inner.config;
        let language = Language::parse(&opts.language)?;
        if opts.code.len() > cfg.max_code_bytes {
            return Err(Error::invalid(format!(
                "code is {} bytes; the limit is {} bytes",
                opts.code.len(),
                cfg.max_code_bytes
            )));
        }
        let timeout = match opts.timeout_secs {
            None => cfg.default_limits.timeout,
            Some(t) if t.is_nan() || t <= 0.0 => {
                return Err(Error::invalid(format!(
                    "Invalid timeout {t}: timeout must be positive (seconds)"
                )));
            }
            Some(t) if t > cfg.max_timeout.as_secs_f64() => {
                return Err(Error::invalid(format!(
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
                    return Err(Error::invalid(format!(
                        "Invalid memory limit {m} MiB: it must be between 1 and {} MiB",
                        cfg.max_memory_bytes / config::MIB
                    )));
                }
                bytes
            }
        };
        check_env(&opts.env)?;
        Ok(ExecRequest {
            language,
            code: opts.code,
            env: opts.env,
            timeout,
            memory_bytes,
            output_bytes: cfg.default_limits.output_bytes,
            echo: opts.echo,
            place: None,
            scratch_quota: cfg.oneshot_quota,
            cancel: opts.cancel,
            progress: opts.progress,
            images: cfg.images,
            owner: opts.owner.unwrap_or_else(|| sandbox::LOCAL_OWNER.into()),
        })
    }

    /// Runs a one-shot: a fresh sandbox that has never run user code, dropped afterwards.
    /// Bash goes to the HOPX cloud (a fresh cloud sandbox, deleted afterwards) when it is
    /// configured, and fails with an error naming `HOPX_API_KEY` otherwise.
    pub async fn execute(&self, req: ExecRequest) -> Result<ExecResult> {
        if req.language == Language::Bash {
            let route = cloud::RouteRequest {
                language: Some(req.language.as_str()),
                ..Default::default()
            };
            return self.execute_in_cloud(&req, &route).await;
        }
        let owner = req.owner.clone();
        let run = self.runner(req).await?;
        self.on_guest_thread(owner, run).await
    }

    /// A one-shot that goes where routing says: `bash`, `internet_access` or a cloud-only
    /// template run in a fresh HOPX sandbox (deleted afterwards), the rest locally.
    pub async fn execute_routed(
        &self,
        req: ExecRequest,
        template: Option<&str>,
        internet_access: bool,
    ) -> Result<ExecResult> {
        let route = cloud::RouteRequest {
            language: Some(req.language.as_str()),
            template,
            internet_access,
            ..Default::default()
        };
        match cloud::decide(&route) {
            cloud::Location::Local => self.execute(req).await,
            cloud::Location::Cloud { .. } => self.execute_in_cloud(&req, &route).await,
        }
    }

    async fn execute_in_cloud(
        &self,
        req: &ExecRequest,
        route: &cloud::RouteRequest<'_>,
    ) -> Result<ExecResult> {
        cloud::route(route, &self.inner.config.cloud)?;
        let client = self.cloud()?;
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        let language = req.language.as_str();
        if let Some(p) = &req.progress {
            p.stage("running in a fresh HOPX cloud sandbox; waiting for it");
        }
        let run = async {
            match route
                .template
                .filter(|t| !cloud::LOCAL_TEMPLATES.contains(t))
            {
                None => {
                    client
                        .oneshot(language, &req.code, req.timeout, &req.env)
                        .await
                }
                Some(template) => {
                    let mut create = cloud::CreateSandbox::new(template);
                    create.internet_access = Some(route.internet_access);
                    create.timeout_seconds = Some(client.config().oneshot_timeout(req.timeout));
                    let mut exec = cloud::ExecuteRequest::new(language, req.code.clone());
                    exec.timeout = req.timeout;
                    exec.env = req.env.clone();
                    exec.workdir = Some(lang::guest::WORKSPACE_GUEST.into());
                    client
                        .with_sandbox(&create, |sb| async move { sb.execute(&exec).await })
                        .await
                }
            }
        };
        // Dropping the run on cancellation deletes its cloud sandbox (the client's guard).
        let r = tokio::select! {
            r = run => r?,
            _ = cancelled(req.cancel.as_deref()) => {
                return Err(Error::Cancelled("; its HOPX sandbox is deleted"));
            }
        };
        let id = r.sandbox_id.clone();
        let mut r = r.into_exec_result(req.language);
        r.cloud_sandbox_id = Some(id);
        Ok(r)
    }

    /// Creates a sandbox in the HOPX cloud (routing has decided it must: a cloud-only template
    /// or internet access) and gives it a wasmbox id.
    pub async fn create_cloud_sandbox(
        &self,
        template: &str,
        timeout_seconds: Option<u64>,
        internet_access: bool,
        env: BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Arc<CloudSandbox>> {
        let location = cloud::route(
            &cloud::RouteRequest {
                template: Some(template),
                internet_access,
                ..Default::default()
            },
            &self.inner.config.cloud,
        )?;
        if location == cloud::Location::Local {
            return Err(Error::invalid(format!(
                "template {template} runs locally; create it as a local sandbox"
            )));
        }
        let client = self.cloud()?;
        let timeout = client.config().sandbox_timeout(timeout_seconds)?;
        drop(self.live_cloud_sandboxes());
        let slot = client.reserve(Some(owner))?;
        let mut req = cloud::CreateSandbox::new(template);
        req.timeout_seconds = Some(timeout);
        req.internet_access = Some(internet_access);
        req.env_vars = env;
        let sandbox = client.start(&req).await?;
        let sb = Arc::new(CloudSandbox {
            id: format!("wb{}", uuid::Uuid::new_v4().simple()),
            owner: owner.to_string(),
            template: template.to_string(),
            created_at: std::time::SystemTime::now(),
            timeout_seconds: Some(timeout),
            sandbox,
            _slot: slot,
        });
        self.inner
            .cloud_sandboxes
            .lock()
            .unwrap()
            .insert(sb.id.clone(), sb.clone());
        Ok(sb)
    }

    /// The cloud sandboxes map without those HOPX has ended (their places are given back).
    fn live_cloud_sandboxes(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<CloudSandbox>>> {
        let mut map = self.inner.cloud_sandboxes.lock().unwrap();
        map.retain(|_, c| !c.expired());
        map
    }

    pub fn cloud_sandbox(&self, id: &str) -> Option<Arc<CloudSandbox>> {
        self.live_cloud_sandboxes().get(id).cloned()
    }

    pub fn cloud_sandboxes(&self) -> Vec<Arc<CloudSandbox>> {
        let mut v: Vec<_> = self.live_cloud_sandboxes().values().cloned().collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    /// Forgets a cloud sandbox (deleted, or gone on the HOPX side).
    pub fn forget_cloud_sandbox(&self, id: &str) {
        self.inner.cloud_sandboxes.lock().unwrap().remove(id);
    }

    /// The HOPX client, once routing has said the cloud may be used.
    pub fn cloud(&self) -> Result<&cloud::Cloud> {
        self.inner
            .cloud
            .as_ref()
            .ok_or_else(|| Error::wasm("the HOPX client could not be built (see the server log)"))
    }

    /// Runs `req` in a fresh instance (not the session) on `sb`'s files and env: a command
    /// (`python file.py`) or an isolated run with a sandbox id, like a new process would.
    pub async fn execute_fresh_in(
        &self,
        sb: &Arc<Sandbox>,
        mut req: ExecRequest,
        working_dir: Option<&str>,
    ) -> Result<ExecResult> {
        self.place_in(sb, &mut req, working_dir, sb.stop.clone())?;
        let owner = req.owner.clone();
        let run = self.runner(req).await?;
        self.on_guest_thread(owner, with_quota_note(sb, run)).await
    }

    /// The blocking run of `req` as a one-shot (in its `place` if it has one), with its
    /// runtime loaded.
    async fn runner(&self, req: ExecRequest) -> Result<Run> {
        let progress = req.progress.as_ref();
        Ok(match req.language {
            Language::Bash => return Err(bash_unavailable()),
            Language::Python => {
                let (python, _) = self.load_python(progress).await?;
                Box::new(move || Ok(python.run_oneshot(&req)?))
            }
            Language::Go => {
                let (go, _) = self.load_go(progress).await?;
                Box::new(move || Ok(go.run_oneshot(&req)?))
            }
            Language::JavaScript => {
                let (js, _) = self.load_javascript(progress).await?;
                Box::new(move || Ok(js.run_oneshot(&req)?))
            }
        })
    }

    /// Runs a blocking execution on a guest thread, holding a CPU slot (`owner`'s share of
    /// them) while it computes. Waiting for the thread and the slot is bounded by the queue wait
    /// (then: busy); the call's own deadline starts when it runs.
    async fn on_guest_thread(&self, owner: engine::cpu::Owner, run: Run) -> Result<ExecResult> {
        let cfg = &self.inner.config;
        let queued = Instant::now();
        let busy = move || {
            Error::busy(format!(
                "every execution slot ({} running at once, WASMBOX_CONCURRENCY) stayed taken for {:.0} s (WASMBOX_QUEUE_WAIT_S); try again shortly",
                cfg.max_concurrency,
                cfg.queue_wait.as_secs_f64()
            ))
        };
        let _live = match tokio::time::timeout(cfg.queue_wait, self.inner.live.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(Error::busy("shutting down")),
            Err(_) => return Err(busy()),
        };
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        let cpu = self.inner.cpu.clone();
        let wait = cfg.queue_wait.saturating_sub(queued.elapsed());
        let refused = busy();
        let t = Instant::now();
        let r = self
            .inner
            .guests
            .run(
                move || match cpu.acquire(&owner, engine::cpu::Class::Foreground, wait) {
                    Some(permit) => engine::cpu::CpuSlots::run_holding(permit, run),
                    None => Err(refused),
                },
            )
            .await;
        tracing::debug!("execute: on guest thread {:?}", t.elapsed());
        r
    }

    /// Runs `run` as background work on a thread of its own (it may last an hour and must not
    /// hold a guest thread): it computes only in the slots background work may take, waits for
    /// one until `stop` is raised (the guest then stops itself at once), and keeps its place
    /// in the job budget until it ends.
    fn spawn_background(
        &self,
        owner: engine::cpu::Owner,
        name: String,
        run: Run,
        stop: Arc<engine::limits::Stop>,
        ticket: sandbox::jobs::JobTicket,
        done: impl FnOnce(Result<ExecResult>) + Send + 'static,
    ) -> Result<()> {
        let cpu = self.inner.cpu.clone();
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new()
            .name(name)
            .stack_size(engine::GUEST_THREAD_STACK)
            .spawn(move || {
                let _ticket = ticket;
                let since = Instant::now();
                let permit = loop {
                    let p = cpu.acquire_since(
                        &owner,
                        engine::cpu::Class::Background,
                        since,
                        Duration::from_millis(10),
                    );
                    if p.is_some() || stop.reason().is_some() {
                        break p;
                    }
                };
                let go = move || match permit {
                    Some(p) => engine::cpu::CpuSlots::run_holding(p, run),
                    None => run(),
                };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(go))
                    .unwrap_or_else(|_| Err(Error::wasm("the job panicked")));
                done(r);
            })
            .map(drop)
            .map_err(|e| Error::busy(format!("starting a job thread: {e}")))
    }

    /// The compiled-module cache.
    pub fn module_cache(&self) -> &ModuleCache {
        &self.inner.cache
    }

    /// The registry of persistent sandboxes.
    pub fn sandboxes(&self) -> &Arc<Sandboxes> {
        &self.inner.sandboxes
    }

    /// Readies `req` to run in `sb`: the sandbox is running and offers the language, the
    /// working directory exists, and the env is the sandbox's plus the call's.
    fn place_in(
        &self,
        sb: &Sandbox,
        req: &mut ExecRequest,
        working_dir: Option<&str>,
        stop: Arc<engine::limits::Stop>,
    ) -> Result<()> {
        sb.check_running()?;
        if req.language == Language::Bash {
            return Err(bash_unavailable());
        }
        sb.check_language(req.language)?;
        let cwd = sb
            .fs
            .working_dir(working_dir.unwrap_or(lang::guest::WORKSPACE_GUEST))?;
        req.env = sb.env_with(&req.env);
        req.place = Some(sb.place(cwd, stop));
        // The work is the sandbox owner's, whoever the library was called by.
        req.owner = sb.owner.as_str().into();
        sb.executions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `req` in a persistent sandbox: Python and JavaScript in the sandbox's live session
    /// for the language (started on first use, replaced after it ended), Go as a program in the
    /// sandbox's workspace. `rich` collects plots and a final DataFrame (Python).
    pub async fn execute_in(
        &self,
        sb: &Arc<Sandbox>,
        mut req: ExecRequest,
        working_dir: Option<&str>,
        rich: bool,
    ) -> Result<ExecResult> {
        self.place_in(sb, &mut req, working_dir, sb.stop.clone())?;
        let owner = req.owner.clone();
        let run: Run = match sb.slot(req.language) {
            Some(slot) => {
                let rt = self
                    .session_runtime(req.language, req.progress.as_ref())
                    .await?;
                let slot = slot.clone().lock_owned().await;
                if slot.session.is_none() {
                    self.make_room(&sb.id, req.language).await;
                }
                let path = sb.state_path(req.language);
                let save_after = self.inner.config.sandbox.save_every_call;
                let durable = self.inner.sandboxes.persistent();
                let gate = self.inner.sandboxes.state_gate(&sb.owner);
                Box::new(move || {
                    let mut slot = slot;
                    let keep = sandbox::sessions::Keep {
                        state: &path,
                        save_after,
                        durable,
                        gate: &gate,
                    };
                    sandbox::sessions::call(&mut slot, &*rt, &req, rich, &keep)
                })
            }
            None => self.runner(req).await?,
        };
        self.on_guest_thread(owner, with_quota_note(sb, run)).await
    }

    /// Starts `req` as a background job of `sb`, in a fresh instance that shares the sandbox's
    /// workspace and env (not its sessions), on a thread of its own. Returns at once.
    pub async fn start_job(
        &self,
        sb: &Arc<Sandbox>,
        mut req: ExecRequest,
        working_dir: Option<&str>,
        name: Option<String>,
    ) -> Result<Arc<Job>> {
        // Nobody waits on a job's call: it reports nothing.
        req.progress = None;
        let job = Job::new(name, req.language, req.output_bytes);
        // A job's result carries no images: its figures are left alone.
        req.images = None;
        self.place_in(sb, &mut req, working_dir, job.stop.clone())?;
        if let Some(p) = req.place.as_mut() {
            p.output = Some(job.output());
        }
        let run = self.runner(req).await?;
        let ticket = self.inner.jobs.try_take(&sb.owner)?;
        sb.add_job(job.clone())?;
        let (j, sb2) = (job.clone(), sb.clone());
        let started = self.spawn_background(
            sb.owner.as_str().into(),
            format!("wasmbox-job-{}", job.id),
            run,
            job.stop.clone(),
            ticket,
            move |r| {
                let r = r.map(|mut r| {
                    quota_note(&sb2, &mut r);
                    r
                });
                j.finish(r.map_err(|e| e.to_string()));
            },
        );
        if let Err(e) = started {
            job.finish(Err(e.to_string()));
            return Err(e);
        }
        Ok(job)
    }

    /// Runs `req` (in `sb` as a background job, or as a one-shot) and POSTs the result to
    /// `callback_url` when done. Returns the execution id at once.
    pub async fn execute_async(
        &self,
        owner: &str,
        sb: Option<&Arc<Sandbox>>,
        req: ExecRequest,
        working_dir: Option<&str>,
        callback_url: &str,
    ) -> Result<String> {
        let url = sandbox::webhook::check_url(callback_url, &self.inner.config.webhook)?;
        let me = self.clone();
        let sandbox_id = sb.map(|s| s.id.clone());
        let language = req.language;
        // Nor does a webhook's payload.
        let mut req = req;
        req.images = None;
        let (id, pending): (String, futures_like::Pending) = match sb {
            Some(sb) => {
                let job = self.start_job(sb, req, working_dir, None).await?;
                let j = job.clone();
                (
                    job.id.clone(),
                    Box::pin(async move {
                        j.wait().await;
                        j.result().unwrap_or_else(|| Err("the job vanished".into()))
                    }),
                )
            }
            None => {
                let bytes = req.code.len();
                let mut req = req;
                req.progress = None;
                let run = self.runner(req).await?;
                let place = self.inner.jobs.take_queued(owner, bytes).await?;
                let owner: engine::cpu::Owner = owner.into();
                let me2 = self.clone();
                let id = format!("exec_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                let name = format!("wasmbox-async-{id}");
                (
                    id,
                    Box::pin(async move {
                        let ticket = match place {
                            sandbox::jobs::Queued::Now(t) => t,
                            sandbox::jobs::Queued::Later(p) => p.wait().await,
                        };
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let stop = Arc::new(engine::limits::Stop::default());
                        me2.spawn_background(owner, name, run, stop, ticket, move |r| {
                            let _ = tx.send(r);
                        })
                        .map_err(|e| e.to_string())?;
                        match rx.await {
                            Ok(r) => r.map_err(|e| e.to_string()),
                            Err(_) => Err("the execution vanished".to_string()),
                        }
                    }),
                )
            }
        };
        let exec_id = id.clone();
        tokio::spawn(async move {
            let result = pending.await;
            let mut payload = match &result {
                Ok(r) => serde_json::json!({
                    "status": if r.success { "completed" } else { "failed" },
                    "stdout": r.stdout,
                    "stderr": r.stderr,
                    "exit_code": r.exit_code,
                    "execution_time": r.execution_time,
                    "success": r.success,
                    "limit": r.limit,
                    "truncated": r.truncated,
                }),
                Err(e) => serde_json::json!({
                    "status": "failed", "stdout": "", "stderr": e, "exit_code": 1, "success": false,
                    "truncated": false,
                }),
            };
            payload["execution_id"] = serde_json::json!(exec_id);
            payload["sandbox_id"] = serde_json::json!(sandbox_id);
            payload["language"] = serde_json::json!(language);
            // A payload is an answer too: within the budget, whatever the guest printed.
            if fit::fit_value(&mut payload, me.inner.config.result_bytes) {
                payload["truncated"] = serde_json::json!(true);
            }
            sandbox::webhook::deliver(&me.inner.http, url, &me.inner.webhook_key, payload).await;
        });
        Ok(id)
    }
}

mod futures_like {
    pub type Pending = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<crate::ExecResult, String>> + Send>,
    >;
}

fn bash_unavailable() -> Error {
    LangError::LanguageNotAvailable(
        "bash needs a shell, which a local WebAssembly sandbox does not have. One-shots (no \
         sandbox_id) run bash in the HOPX cloud when HOPX_API_KEY is set; for a sandbox with a \
         shell, create a cloud sandbox (internet_access=true, or a cloud template) with \
         HOPX_API_KEY set. python, javascript and go run locally"
            .into(),
    )
    .into()
}

/// Resolves once `cancel` is raised; never without one. (A `Stop` is a plain atomic, so it is
/// polled, at the pace guests check it.)
pub async fn cancelled(cancel: Option<&engine::limits::Stop>) {
    let Some(cancel) = cancel else {
        return std::future::pending().await;
    };
    while cancel.reason().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `run`, then [`quota_note`] on the same thread: confirming an over-quota count is a
/// directory walk, which must not run on the async runtime's workers.
fn with_quota_note(sb: &Arc<Sandbox>, run: Run) -> Run {
    let sb = sb.clone();
    Box::new(move || {
        run().map(|mut r| {
            quota_note(&sb, &mut r);
            r
        })
    })
}

/// Marks a result whose run left the sandbox over its quota without being stopped for it
/// (the space filled from elsewhere).
fn quota_note(sb: &Sandbox, r: &mut ExecResult) {
    if r.limit == Some(LimitHit::Disk) {
        return;
    }
    if let Some(o) = sb.fs.over_quota() {
        r.success = false;
        r.limit.get_or_insert(LimitHit::Disk);
        r.notes.push(format!(
            "/workspace and /tmp are over their disk quota: {} bytes in {} files and directories (limits {} bytes, {} entries); remove files with file_remove or from code",
            o.bytes, o.entries, o.quota.max_bytes, o.quota.max_entries
        ));
    }
}

/// Environment variables a guest can be given: names non-empty without `=` or NUL, values
/// without NUL. (Checked for per-call env and for a sandbox's own.)
pub fn check_env(env: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(Error::invalid(format!(
                "Invalid environment variable {k:?}: names must be non-empty without '=' or NUL, values without NUL"
            )));
        }
    }
    Ok(())
}

/// What each runtime's load is doing now (`None` before its first stage).
#[derive(Default)]
struct LoadStages {
    python: Arc<tokio::sync::watch::Sender<Option<String>>>,
    javascript: Arc<tokio::sync::watch::Sender<Option<String>>>,
    go: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

/// A runtime's load stages, its language, and where a waiting call reports them.
type Stages<'a> = (
    &'a Arc<tokio::sync::watch::Sender<Option<String>>>,
    Language,
    Option<&'a ProgressSink>,
);

/// How often a call waiting on a long load says it still is.
const LOAD_HEARTBEAT: Duration = Duration::from_secs(5);

/// Loads a runtime once per process on a blocking thread; concurrent callers wait for the same
/// load, and a failure is not cached (the next call tries again, e.g. after fetch-runtimes).
/// A caller with a progress sink hears the load's stages, whichever caller started it.
async fn load_once<T: Send + Sync + 'static>(
    cell: &OnceCell<Arc<T>>,
    (stages, language, progress): Stages<'_>,
    inner: Arc<Inner>,
    load: fn(&Inner) -> Result<(T, Origin)>,
) -> Result<(Arc<T>, Origin)> {
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
