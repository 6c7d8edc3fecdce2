//! wasmbox: a local WebAssembly code-execution sandbox for AI assistants.
//!
//! The library is the product: [`Wasmbox`] runs code; the MCP server (`mcp`) and the CLI are
//! thin fronts over it, so tests, benches and both fronts drive the same code.

pub mod bounded;
pub mod cloud;
pub mod config;
pub mod engine;
mod error;
mod exec;
pub mod fit;
pub mod lang;
pub mod mcp;
pub mod packages;
pub mod platform;
pub mod reach;
mod runtimes;
pub mod sandbox;
pub mod session;
pub mod setup;
#[cfg(test)]
mod testing;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::Engine;

pub use config::Config;
use engine::cache::ModuleCache;
pub use engine::limits::{LimitHit, Limits};
pub use error::{Error, Result};
pub use exec::{ExecOptions, cancelled, check_env};
use lang::LangError;
pub use lang::{ExecRequest, ExecResult, Language};
pub use runtimes::RuntimeStatus;
use sandbox::Sandboxes;
pub use session::{PAUSE_WAIT, SavedSession};

/// The sandbox service: one engine, the loaded runtimes, and the limits.
#[derive(Clone)]
pub struct Wasmbox {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    engine: Engine,
    cache: ModuleCache,
    runtimes: runtimes::Runtimes,
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
    /// What guests may reach: the server's allowlist and the client their requests go through.
    reach: Arc<reach::Reach>,
    /// The HOPX client; whether it may be used is `cloud::route`'s call.
    cloud: Option<cloud::Cloud>,
    /// Where installed Python packages come from and are kept.
    packages: Arc<packages::Packages>,
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
    pub sandbox: cloud::Agent,
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

impl Wasmbox {
    /// Builds the engine. Runtimes load on first use or with [`Wasmbox::prepare`].
    pub fn new(config: Config) -> Result<Self> {
        let engine = engine::build_engine(config.pooled_instances, config.max_memory_bytes)?;
        let cache = ModuleCache::new(config.cache_dir.clone());
        let sandboxes = Sandboxes::new(config.sandbox.clone())
            .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        let webhook_key = sandbox::webhook::secret(&config.webhook, &config.cache_dir);
        let packages = packages::Packages::new(
            &config.cache_dir,
            lang::python::PythonPaths::new(&config.runtimes_dir).stdlib_zip(),
            config.wheelhouse.clone(),
            (!config.cloud.offline).then_some(config.package_index.as_str()),
        )
        .map_err(|e| Error::io(&config.cache_dir, e))?;
        let wb = Self {
            inner: Arc::new(Inner {
                cloud: cloud::Cloud::new(config.cloud.clone())
                    .inspect_err(|e| tracing::warn!("the HOPX client is unavailable: {e}"))
                    .ok(),
                sandboxes,
                packages: Arc::new(packages),
                cloud_sandboxes: Default::default(),
                webhook_key,
                http: sandbox::webhook::client(&config.webhook)
                    .map_err(|e| Error::wasm(format!("building the HTTP client: {e}")))?,
                reach: Arc::new(reach::Reach::new(config.reach.clone()).map_err(Error::invalid)?),
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
                runtimes: runtimes::Runtimes::default(),
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

    /// The compiled-module cache.
    pub fn module_cache(&self) -> &ModuleCache {
        &self.inner.cache
    }

    /// The registry of persistent sandboxes.
    pub fn sandboxes(&self) -> &Arc<Sandboxes> {
        &self.inner.sandboxes
    }
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
