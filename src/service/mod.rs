//! The service: [`Wasmbox`], everything it is and does. This file holds its state and
//! construction; one-shots and runs (`exec`), the runtimes registry, cloud runs and sandboxes
//! (`hopx`), a sandbox's packages, and its sessions (saved, evicted, forked, snapshotted) each
//! have a file of their own.

mod evict;
mod exec;
mod fork;
mod hopx;
mod packages;
mod run_end;
mod runtimes;
mod save;
mod snapshot;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::Engine;

use crate::engine::cache::ModuleCache;
use crate::lang::LangError;
use crate::sandbox::Sandboxes;
use crate::{Config, Error, Result, cloud, engine, lang, reach, sandbox};

pub use exec::{ExecOptions, OneShot, cancelled, check_env};
pub use hopx::CloudSandbox;
pub use runtimes::{RuntimeState, RuntimeStatus};
pub use save::{PAUSE_WAIT, SavedSession};

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
    /// Calls waiting for a place in `live`.
    guest_queue: AtomicUsize,
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
    packages: Arc<crate::packages::Packages>,
    /// Cloud sandboxes, by their wasmbox id.
    cloud_sandboxes: std::sync::Mutex<std::collections::HashMap<String, Arc<CloudSandbox>>>,
    /// The audit lines of background runs still going, by run id (written as each ends, or
    /// at exit for those the exit cuts short).
    run_ends: Arc<run_end::RunEnds>,
}

impl Wasmbox {
    /// Builds the engine. Runtimes load on first use or with [`Wasmbox::prepare`].
    pub fn new(config: Config) -> Result<Self> {
        let engine = engine::build_engine(config.pooled_instances, config.max_memory_bytes)?;
        let cache = ModuleCache::new(config.cache_dir.clone());
        let sandboxes = Sandboxes::new(config.sandbox.clone())
            .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        let webhook_key = sandbox::webhook::secret(&config.webhook, &config.cache_dir);
        let packages = crate::packages::Packages::new(
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
                run_ends: Default::default(),
                webhook_key,
                http: sandbox::webhook::client(&config.webhook)
                    .map_err(|e| Error::wasm(format!("building the HTTP client: {e}")))?,
                reach: Arc::new(reach::Reach::new(config.reach.clone()).map_err(Error::invalid)?),
                live: Semaphore::new(config.max_guests),
                guest_queue: AtomicUsize::new(0),
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

    /// What is running and waiting now, for `/metrics`: cheap (a few locks, no I/O).
    pub fn load(&self) -> Load {
        let inner = &self.inner;
        let (busy, background) = inner.cpu.busy();
        let (waiting, waiting_background) = inner.cpu.waiting();
        let (jobs_running, jobs_queued) = inner.jobs.load();
        let free_guests = inner.live.available_permits();
        Load {
            cpu_slots: inner.cpu.total(),
            cpu_busy: (busy - background, background),
            cpu_waiting: (waiting, waiting_background),
            guests_live: inner.config.max_guests.saturating_sub(free_guests),
            guests_waiting: inner.guest_queue.load(Ordering::Relaxed),
            jobs_running,
            jobs_queued,
        }
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

    /// The compiled-module cache.
    pub fn module_cache(&self) -> &ModuleCache {
        &self.inner.cache
    }

    /// The registry of persistent sandboxes.
    pub fn sandboxes(&self) -> &Arc<Sandboxes> {
        &self.inner.sandboxes
    }
}

/// What [`Wasmbox::load`] reports; pairs are (foreground, background).
#[derive(Clone, Copy, Debug, Default)]
pub struct Load {
    pub cpu_slots: usize,
    pub cpu_busy: (usize, usize),
    pub cpu_waiting: (usize, usize),
    /// Guests alive (computing or waiting in a sleep), and calls waiting for a place among them.
    pub guests_live: usize,
    pub guests_waiting: usize,
    /// Background jobs and async executions running, and async executions queued for a place.
    pub jobs_running: usize,
    pub jobs_queued: usize,
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
