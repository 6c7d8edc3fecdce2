//! Running code: validating a request, the guest threads and CPU slots a call runs on,
//! one-shots, runs in a sandbox (its session or a fresh instance), background jobs and
//! async executions with their webhook.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::bash_unavailable;
use super::run_end::RunEnd;
use crate::engine::limits::LimitHit;
use crate::lang::{ExecRequest, ExecResult, Language};
use crate::sandbox::Sandbox;
use crate::sandbox::jobs::Job;
use crate::telemetry::{audit, metrics};
use crate::{Error, Result, Wasmbox, cloud, config, engine, fit, lang, sandbox};

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
    /// Hosts the run may reach, within the server's `WASMBOX_ALLOW_HOSTS` (`None`: all of those).
    pub allow_hosts: Option<Vec<String>>,
    /// Who to ask before the run's code calls a destructive tool of the person's MCP servers.
    pub consent: Option<Arc<dyn crate::reach::tools::Consent>>,
    /// The tool call, as the audit log names it: the run notes its host calls there.
    pub audit: Option<Arc<audit::Origin>>,
}

/// Where a one-shot goes and what it needs first, beside its run's [`ExecOptions`].
#[derive(Clone, Debug, Default)]
pub struct OneShot {
    /// A HOPX template: a cloud-only one runs the one-shot in the cloud.
    pub template: Option<String>,
    /// Runs the one-shot in the HOPX cloud (local sandboxes have no network).
    pub internet_access: bool,
    /// Pure-Python packages to install first (local Python one-shots only).
    pub packages: Vec<String>,
}

/// A blocking execution handed to a guest thread.
type Run = Box<dyn FnOnce() -> Result<ExecResult> + Send>;

impl Wasmbox {
    /// What a run may reach: the server's hosts, narrowed to `allow_hosts` when given (and
    /// refused when they are not within the server's).
    pub fn reach_for(&self, allow_hosts: Option<&[String]>) -> Result<Arc<crate::reach::Reach>> {
        Ok(match allow_hosts {
            None => self.inner.reach.clone(),
            Some(hosts) => Arc::new(self.inner.reach.narrowed(hosts).map_err(Error::invalid)?),
        })
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
        let mut opts = opts;
        for s in &cfg.reach.secrets {
            opts.env
                .entry(s.name.clone())
                .or_insert_with(|| s.placeholder.clone());
        }
        check_env(&opts.env)?;
        let owner = opts
            .owner
            .unwrap_or_else(|| engine::cpu::LOCAL_OWNER.into());
        let local = *owner == *engine::cpu::LOCAL_OWNER;
        let reach = self.reach_for(opts.allow_hosts.as_deref())?.for_caller(
            local,
            opts.consent,
            opts.audit.as_ref().map(|o| o.host_calls.clone()),
        );
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
            owner,
            reach: Some(reach),
            packages: Vec::new(),
            audit: opts.audit,
        })
    }

    /// A one-shot from what the caller asked: validated, its packages installed, run where
    /// routing says. The packages' outcome comes back for the caller's note.
    pub async fn oneshot(
        &self,
        opts: ExecOptions,
        shot: OneShot,
    ) -> Result<(ExecResult, Option<crate::packages::Outcome>)> {
        let started = Instant::now();
        let req = self.request(opts)?;
        let language = req.language.as_str();
        let r = self.oneshot_request(req, shot).await;
        metrics::latency(metrics::Run::Oneshot, language, started.elapsed());
        r
    }

    /// [`Self::oneshot`] once its request is valid.
    async fn oneshot_request(
        &self,
        mut req: ExecRequest,
        shot: OneShot,
    ) -> Result<(ExecResult, Option<crate::packages::Outcome>)> {
        let mut installed = None;
        if !shot.packages.is_empty() {
            if req.language != Language::Python || shot.internet_access || shot.template.is_some() {
                let why = "packages are installed for local Python one-shots only (in the HOPX cloud, pip install in the code works)";
                return Err(Error::invalid(why));
            }
            let (paths, out) = self.oneshot_packages(&shot.packages, &req.owner).await?;
            req.packages = paths;
            installed = Some(out);
        }
        let r = self
            .execute_routed(req, shot.template.as_deref(), shot.internet_access)
            .await?;
        Ok((r, installed))
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
        let (rt, _) = self.runtime(req.language, progress).await?;
        Ok(Box::new(move || Ok(rt.oneshot(&req)?)))
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
        // The wait for a live place and, on the guest thread, for a CPU slot; the run is the
        // call's other child.
        let queue = tracing::debug_span!("queue.guest");
        let call = tracing::Span::current();
        let _live = match self.inner.live.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                // Only a call that has to wait is counted in the queue (until it leaves it, by
                // a permit, a timeout or its caller dropping it).
                let _in_line = InLine::enter(&self.inner.guest_queue);
                let live = tokio::time::timeout(cfg.queue_wait, self.inner.live.acquire());
                match live.instrument(queue.clone()).await {
                    Ok(Ok(permit)) => permit,
                    Ok(Err(_)) => return Err(Error::busy("shutting down")),
                    Err(_) => return Err(busy()),
                }
            }
        };
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        let cpu = self.inner.cpu.clone();
        let wait = cfg.queue_wait.saturating_sub(queued.elapsed());
        let refused = busy();
        let t = Instant::now();
        let r = self
            .inner
            .guests
            .run(move || {
                let slot =
                    queue.in_scope(|| cpu.acquire(&owner, engine::cpu::Class::Foreground, wait));
                drop(queue);
                match slot {
                    Some(permit) => tracing::debug_span!(parent: &call, "guest.run")
                        .in_scope(|| engine::cpu::CpuSlots::run_holding(permit, run)),
                    None => Err(refused),
                }
            })
            .await;
        tracing::debug!("execute: on guest thread {:?}", t.elapsed());
        r
    }

    /// Runs `run` as background work on a thread of its own (it may last an hour and must not
    /// hold a guest thread): it computes only in the slots background work may take, waits for
    /// one until `stop` is raised (the guest then stops itself at once), and keeps its place
    /// in the job budget until it ends.
    #[allow(clippy::too_many_arguments)]
    fn spawn_background(
        &self,
        owner: engine::cpu::Owner,
        name: String,
        run: Run,
        stop: Arc<engine::limits::Stop>,
        ticket: sandbox::jobs::JobTicket,
        end: Option<RunEnd>,
        done: impl FnOnce(Result<ExecResult>) + Send + 'static,
    ) -> Result<()> {
        let cpu = self.inner.cpu.clone();
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        let ends = self.inner.run_ends.clone();
        let held = end.map(|e| ends.hold(e));
        let (end, run_ends) = (held.clone(), ends.clone());
        // The run stays in its call's trace, though it outlives the call.
        let call = tracing::Span::current();
        std::thread::Builder::new()
            .name(name)
            .stack_size(engine::GUEST_THREAD_STACK)
            .spawn(move || {
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
                let run = tracing::debug_span!(parent: &call, "guest.run", background = true);
                let r = run
                    .in_scope(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(go)))
                    .unwrap_or_else(|_| Err(Error::wasm("the job panicked")));
                drop(run);
                // The place is free before the job shows as ended, so a client that saw it
                // end can start the next one.
                drop(ticket);
                if let Some(end) = end.and_then(|id| run_ends.take(&id)) {
                    end.record(stop.reason(), r.as_ref().ok());
                }
                done(r);
            })
            .map(drop)
            .map_err(|e| {
                // Never started: its call's answer is the error, and it has no end.
                if let Some(id) = held {
                    ends.take(&id);
                }
                Error::busy(format!("starting a job thread: {e}"))
            })
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
        if let Some(list) = sb.allow_hosts() {
            let reach = req.reach.as_ref().unwrap_or(&self.inner.reach);
            req.reach = Some(Arc::new(
                reach.within_sandbox(&list).map_err(Error::invalid)?,
            ));
        }
        req.place = Some(sb.place(cwd, stop));
        if req.language == Language::Python {
            req.packages = sb.packages().iter().map(|t| t.guest_path()).collect();
        }
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
        req: ExecRequest,
        working_dir: Option<&str>,
        rich: bool,
    ) -> Result<ExecResult> {
        // From here to the result: a session's start or restore and the queue are part of it.
        let started = Instant::now();
        let language = req.language.as_str();
        let r = self.execute_in_place(sb, req, working_dir, rich).await;
        metrics::latency(metrics::Run::Turn, language, started.elapsed());
        r
    }

    /// [`Self::execute_in`], unmeasured.
    async fn execute_in_place(
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
                if !slot.is_live() {
                    self.make_room(&sb.id, req.language).await;
                }
                let path = sb.state_path(req.language);
                let save_after = self.inner.config.sandbox.save_every_call;
                let durable = self.inner.sandboxes.persistent();
                let gate = self.inner.sandboxes.state_gate(&sb.owner);
                Box::new(move || {
                    let mut slot = slot;
                    let disk = crate::sandbox::slot::Persistence {
                        state: &path,
                        save_after,
                        durable,
                        gate: &gate,
                    };
                    slot.call(&*rt, &req, rich, &disk)
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
        let end = RunEnd::of(&req, &job.id, Some(&sb.id), "background");
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
            end,
            move |r| {
                let r = r.map(|mut r| {
                    quota_note(&sb2, &mut r);
                    r
                });
                j.finish(r.map_err(|e| e.to_string().into()));
            },
        );
        if let Err(e) = started {
            job.finish(Err(e.to_string().into()));
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
                        j.result()
                            .unwrap_or_else(|| Err("the job vanished".into()))
                            .map_err(String::from)
                    }),
                )
            }
            None => {
                let bytes = req.code.len();
                let mut req = req;
                req.progress = None;
                let id = format!("exec_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                let end = RunEnd::of(&req, &id, None, "async");
                let run = self.runner(req).await?;
                let place = self.inner.jobs.take_queued(owner, bytes).await?;
                let owner: engine::cpu::Owner = owner.into();
                let me2 = self.clone();
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
                        me2.spawn_background(owner, name, run, stop, ticket, end, move |r| {
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
        // The run and its webhook stay in the call's trace.
        tokio::spawn(Instrument::in_current_span(async move {
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
        }));
        Ok(id)
    }
}

mod futures_like {
    pub type Pending = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<crate::ExecResult, String>> + Send>,
    >;
}

/// One more in a queue's count while held.
struct InLine<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InLine<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
