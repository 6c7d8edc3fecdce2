//! Persistent sandboxes: a registry of ids, each with its own workspace, env, live language
//! sessions and background jobs, a lifetime, and a reaper that removes expired ones.
//!
//! Creating a sandbox starts nothing (two directories, a small metadata file and an entry in a
//! map); a language's session starts on its first execution there.
//!
//! With a data directory, sandboxes outlive the server process: each one's directory holds a
//! `meta.json` (template, owner, lifetime, env) and a `lock` file this process keeps locked while
//! the sandbox is its own. A server that starts (or is asked for an id it does not know) adopts
//! unexpired sandboxes whose lock it can take — their files, not their interpreters' state — and
//! removes expired ones. Locks die with their process, so two servers sharing a data directory
//! never adopt each other's live sandboxes.
//!
//! A sandbox that cannot be adopted for another reason (its `meta.json` does not parse or does
//! not match, its workspace does not open) is never deleted: its directory is moved to
//! `<data>/quarantine/<id>-<unix time>/` with the reason, listed to the local user and removed
//! only by `delete_sandbox`.

pub mod budget;
pub mod copy;
pub mod fs;
mod host_folders;
pub mod jobs;
mod meta;
mod quarantine;
mod registry;
pub mod slot;
pub mod snapshots;
mod templates;
#[cfg(test)]
mod tests;
pub mod webhook;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::engine::limits::{Stop, StopReason};
use crate::lang::{Language, Place};
use fs::{Quota, Workspace, rfc3339};
use jobs::Job;
use meta::Claim;
pub(crate) use meta::{from_unix_ms, has_id_shape, unix_ms};
pub use quarantine::Quarantined;
pub use registry::Sandboxes;
use slot::{SESSION_LANGUAGES, SlotLock};
pub use templates::{TEMPLATES, Template, template};

/// Sandbox settings.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub max_live: usize,
    pub quota: Quota,
    /// Background jobs running at once, per sandbox.
    pub max_running_jobs: usize,
    /// Ended jobs kept for listing, per sandbox.
    pub max_kept_jobs: usize,
    /// Live sandboxes one owner (an HTTP token) may hold.
    pub max_per_owner: usize,
    /// Where sandboxes live so that a restarted server finds them (`WASMBOX_DATA`); `None`: a
    /// private temporary directory removed with the registry.
    pub data_dir: Option<PathBuf>,
    /// Save sessions after every call (`WASMBOX_SAVE_EVERY_CALL=1`), so even a killed server
    /// leaves them as of their last call.
    pub save_every_call: bool,
    /// Sessions idle this long are saved to disk and stay live (`WASMBOX_SAVE_IDLE_MS`, 0:
    /// never), so a stop mid-call, clean or not, leaves them as of the turn before it.
    pub save_idle: Option<Duration>,
    /// Sessions idle this long are saved to disk and their instances freed
    /// (`WASMBOX_IDLE_PAUSE_S`, 0: never); the next call restores them.
    pub idle_pause: Option<Duration>,
    /// What one owner's snapshots and saved sessions may take on disk
    /// (`WASMBOX_SNAPSHOT_DISK_MB`), charged by blocks and entries ([`budget`]).
    pub snapshot_bytes: u64,
    /// The largest state file one session may save (`WASMBOX_STATE_MB`); a larger one is not
    /// written and the session stays live.
    pub max_state_bytes: u64,
    /// Sessions kept in memory at once, across sandboxes (`WASMBOX_LIVE_SESSIONS`); past it
    /// the least recently used are saved to disk and freed.
    pub max_live_sessions: usize,
}

/// Why a sandbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "Sandbox not found: no sandbox with id {0:?} (it was deleted, expired after its timeout_seconds, or never existed). Create one with create_sandbox."
    )]
    NotFound(String),
    #[error(
        "Template '{0}' not found locally. Local templates: code-interpreter, python, javascript, go"
    )]
    TemplateNotFound(String),
    #[error(
        "too many live sandboxes ({0}, the limit; WASMBOX_MAX_SANDBOXES raises it): delete one with delete_sandbox, or wait for one to expire"
    )]
    TooMany(usize),
    #[error("Invalid timeout_seconds {0}: it must be between 1 and {1}")]
    BadTimeout(i64, u64),
    #[error("sandbox {0} is paused: call resume_sandbox first")]
    Paused(String),
    #[error(
        "template '{template}' runs {languages}; language {language} is not available in this sandbox (use a code-interpreter sandbox)"
    )]
    LanguageNotInTemplate {
        template: &'static str,
        languages: String,
        language: &'static str,
    },
    #[error(
        "{0} background jobs are running in this sandbox (the limit): wait for one to end or kill it with execute_kill_process"
    )]
    TooManyJobs(usize),
    #[error("process {0:?} not found in this sandbox")]
    JobNotFound(String),
    #[error(
        "this token already holds {0} live sandboxes (its limit; WASMBOX_MAX_SANDBOXES_PER_TOKEN raises it): delete one with delete_sandbox, or wait for one to expire"
    )]
    TooManyForOwner(usize),
    #[error("creating the sandbox's workspace failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("deleting the quarantined sandbox's files failed: {0}")]
    Quarantine(std::io::Error),
    #[error(
        "the sandbox's environment would take {0} bytes (names and values); the limit is {limit} KiB: set fewer or shorter variables, or put large values in a file",
        limit = MAX_ENV_BYTES >> 10
    )]
    EnvTooLarge(usize),
}

/// A sandbox's env in all, names and values: it is kept in memory and in `meta.json`, and
/// copied into every execution in the sandbox.
pub const MAX_ENV_BYTES: usize = 64 << 10;

/// Refuses an env over [`MAX_ENV_BYTES`].
pub fn check_env_size(env: &BTreeMap<String, String>) -> Result<(), SandboxError> {
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(SandboxError::EnvTooLarge(bytes));
    }
    Ok(())
}

struct Lifetime {
    timeout: Duration,
    expires_at: SystemTime,
    paused: bool,
}

/// One persistent sandbox.
pub struct Sandbox {
    pub id: String,
    pub template: &'static Template,
    /// Who may see and use it: [`crate::engine::cpu::LOCAL_OWNER`] over stdio, a token's fingerprint over HTTP.
    pub owner: String,
    claim: Option<Claim>,
    pub created_at: SystemTime,
    lifetime: Mutex<Lifetime>,
    env: Mutex<BTreeMap<String, String>>,
    /// Hosts its runs may reach, within the server's `WASMBOX_ALLOW_HOSTS` (`None`: all of those).
    allow_hosts: Mutex<Option<Vec<String>>>,
    /// Python packages installed into it: trees of the shared store, on its `sys.path`.
    packages: Mutex<Vec<crate::lang::python::PackageTree>>,
    pub fs: Arc<Workspace>,
    /// Raised when the sandbox goes: whatever still runs in it stops.
    pub stop: Arc<Stop>,
    /// By [`SESSION_LANGUAGES`].
    sessions: [SlotLock; 2],
    jobs: Mutex<Vec<Arc<Job>>>,
    pub executions: AtomicU64,
    max_running_jobs: usize,
    max_kept_jobs: usize,
    /// Held across a whole [`Sandbox::save`], so the last file written has the newest state.
    saving: Mutex<()>,
    /// The output its ended jobs keep, in all.
    kept_output: Arc<jobs::KeptOutput>,
    /// Complete: a fork or a sandbox made from a snapshot is hidden from every tool (and has no
    /// `meta.json`) until its files are copied, so no job can run in it while they are.
    filled: AtomicBool,
}

/// A sandbox as HOPX's SandboxInfo describes it, plus local details (what runs, how full).
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct SandboxInfo {
    pub sandbox_id: String,
    pub template_id: String,
    pub template_name: String,
    pub organization_id: u64,
    pub node_id: Option<String>,
    /// Always `local`.
    pub region: String,
    /// running or paused.
    pub status: String,
    pub public_host: Option<String>,
    pub direct_url: Option<String>,
    pub preview_url: Option<String>,
    pub resources: Resources,
    pub internet_access: bool,
    pub live_mode: bool,
    /// The lifetime set at creation or by update_sandbox_timeout.
    pub timeout_seconds: u64,
    pub expires_at: String,
    pub created_at: String,
    pub started_at: Option<String>,
    pub end_at: String,
    pub location: String,
    pub languages: Vec<Language>,
    /// Hosts its code may reach over HTTP (`allow_hosts`); absent: all the server allows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    /// Python packages installed with install_packages, as `name==version`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    pub workspace: WorkspaceUsage,
    pub executions: u64,
    pub jobs_running: usize,
}

#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Resources {
    pub vcpu: Option<u32>,
    pub memory_mb: Option<u64>,
    pub disk_mb: u64,
}

/// What a sandbox's files take (`/workspace` and `/tmp`) and may take.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct WorkspaceUsage {
    pub bytes: u64,
    pub entries: u64,
    pub max_bytes: u64,
    pub max_entries: u64,
}

impl Sandbox {
    /// Where an execution with working directory `cwd` (a guest path, already made to exist)
    /// runs, stopped by `stop`.
    pub fn place(&self, cwd: String, stop: Arc<Stop>) -> Place {
        Place {
            workspace: self.fs.host_workspace(),
            tmp: self.fs.host_tmp(),
            cwd,
            stop,
            disk: Some(self.fs.budget().clone()),
            output: None,
        }
    }

    pub fn check_language(&self, language: Language) -> Result<(), SandboxError> {
        if self.template.languages.contains(&language) {
            return Ok(());
        }
        Err(SandboxError::LanguageNotInTemplate {
            template: self.template.id,
            languages: self
                .template
                .languages
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            language: language.as_str(),
        })
    }

    pub fn check_running(&self) -> Result<(), SandboxError> {
        if self.lifetime.lock().unwrap().paused {
            return Err(SandboxError::Paused(self.id.clone()));
        }
        Ok(())
    }

    /// Sets variables (on top of the others with `merge`, else instead of them), refused whole
    /// when the result would be over [`MAX_ENV_BYTES`], and saves them.
    pub fn set_env(
        &self,
        vars: &BTreeMap<String, String>,
        merge: bool,
    ) -> Result<(), SandboxError> {
        {
            let mut env = self.env.lock().unwrap();
            let mut next = if merge { env.clone() } else { BTreeMap::new() };
            next.extend(vars.iter().map(|(k, v)| (k.clone(), v.clone())));
            check_env_size(&next)?;
            *env = next;
        }
        self.save();
        Ok(())
    }

    /// Removes every variable, and saves that.
    pub fn clear_env(&self) {
        self.env.lock().unwrap().clear();
        self.save();
    }

    /// The sandbox's variables.
    pub fn env(&self) -> BTreeMap<String, String> {
        self.env.lock().unwrap().clone()
    }

    /// Its hosts, for a sandbox being made (not yet saved: its publication saves it).
    pub fn allow_hosts_mut(&self) -> std::sync::MutexGuard<'_, Option<Vec<String>>> {
        self.allow_hosts.lock().unwrap()
    }

    /// Hosts its runs may reach (`None`: all the server allows).
    pub fn allow_hosts(&self) -> Option<Vec<String>> {
        self.allow_hosts.lock().unwrap().clone()
    }

    /// Sets the hosts its runs may reach (checked by the caller against the server's list) and
    /// saves it.
    pub fn set_allow_hosts(&self, hosts: Option<Vec<String>>) {
        *self.allow_hosts.lock().unwrap() = hosts;
        self.save();
    }

    /// Its installed packages.
    pub fn packages(&self) -> Vec<crate::lang::python::PackageTree> {
        self.packages.lock().unwrap().clone()
    }

    /// Sets its packages (a fork's or a snapshot's, not yet saved).
    pub fn packages_mut(&self) -> std::sync::MutexGuard<'_, Vec<crate::lang::python::PackageTree>> {
        self.packages.lock().unwrap()
    }

    /// Adds installed trees, each replacing one of the same name, and saves the list.
    pub fn add_packages(&self, trees: impl IntoIterator<Item = crate::lang::python::PackageTree>) {
        {
            let mut have = self.packages.lock().unwrap();
            for t in trees {
                let n = crate::packages::wheel::normalize(&t.name);
                have.retain(|h| crate::packages::wheel::normalize(&h.name) != n);
                have.push(t);
            }
        }
        self.save();
    }

    /// The sandbox's env with the call's on top.
    pub fn env_with(&self, call: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env = self.env.lock().unwrap().clone();
        env.extend(call.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    /// The lifetime set at creation or by the last timeout update.
    pub fn timeout(&self) -> Duration {
        self.lifetime.lock().unwrap().timeout
    }

    pub fn expires_at(&self) -> SystemTime {
        self.lifetime.lock().unwrap().expires_at
    }

    pub fn status(&self) -> &'static str {
        if self.lifetime.lock().unwrap().paused {
            "paused"
        } else {
            "running"
        }
    }

    /// Adds a job, within the running-jobs limit; ended jobs beyond the kept count are dropped.
    pub fn add_job(&self, job: Arc<Job>) -> Result<(), SandboxError> {
        let mut jobs = self.jobs.lock().unwrap();
        if jobs.iter().filter(|j| j.running()).count() >= self.max_running_jobs {
            return Err(SandboxError::TooManyJobs(self.max_running_jobs));
        }
        job.keep_output_in(self.kept_output.clone());
        jobs.push(job);
        let ended = jobs.iter().filter(|j| !j.running()).count();
        if ended > self.max_kept_jobs {
            let mut drop = ended - self.max_kept_jobs;
            jobs.retain(|j| {
                if drop > 0 && !j.running() {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
        Ok(())
    }

    pub fn jobs(&self) -> Vec<Arc<Job>> {
        self.jobs.lock().unwrap().clone()
    }

    /// `f` of the jobs, while none of their output is dropped (see [`jobs::KeptOutput::steady`]).
    pub fn with_jobs<R>(&self, f: impl FnOnce(&[Arc<Job>]) -> R) -> R {
        let jobs = self.jobs();
        self.kept_output.steady(|| f(&jobs))
    }

    pub fn job(&self, id: &str) -> Result<Arc<Job>, SandboxError> {
        self.jobs
            .lock()
            .unwrap()
            .iter()
            .find(|j| j.id == id)
            .cloned()
            .ok_or_else(|| SandboxError::JobNotFound(id.to_string()))
    }

    /// The sandbox as HOPX's SandboxInfo (key `sandbox_id`), plus local details.
    pub fn info(&self) -> SandboxInfo {
        // The walk first: the reaper takes this lock while it holds the registry's.
        let (bytes, entries) = self.fs.usage();
        let l = self.lifetime.lock().unwrap();
        let quota = self.fs.quota();
        SandboxInfo {
            sandbox_id: self.id.clone(),
            template_id: self.template.id.into(),
            template_name: self.template.id.into(),
            organization_id: 0,
            node_id: None,
            region: "local".into(),
            status: if l.paused { "paused" } else { "running" }.into(),
            public_host: None,
            direct_url: None,
            preview_url: None,
            resources: Resources {
                vcpu: None,
                memory_mb: None,
                disk_mb: quota.max_bytes / (1 << 20),
            },
            internet_access: false,
            live_mode: false,
            timeout_seconds: l.timeout.as_secs(),
            expires_at: rfc3339(l.expires_at),
            created_at: rfc3339(self.created_at),
            started_at: None,
            end_at: rfc3339(l.expires_at),
            location: "local".into(),
            languages: self.template.languages.to_vec(),
            allow_hosts: self.allow_hosts(),
            packages: self
                .packages()
                .iter()
                .map(|t| format!("{}=={}", t.name, t.version))
                .collect(),
            workspace: WorkspaceUsage {
                bytes,
                entries,
                max_bytes: quota.max_bytes,
                max_entries: quota.max_entries,
            },
            executions: self.executions.load(Ordering::Relaxed),
            jobs_running: self
                .jobs
                .lock()
                .unwrap()
                .iter()
                .filter(|j| j.running())
                .count(),
        }
    }

    /// Stops everything running in the sandbox and removes its files.
    fn destroy(&self) {
        self.stop_all(StopReason::SandboxGone);
        self.fs.destroy();
    }

    /// The session slot for `language`, if the sandbox keeps sessions of it.
    pub fn slot(&self, language: Language) -> Option<&SlotLock> {
        let i = SESSION_LANGUAGES.iter().position(|l| *l == language)?;
        Some(&self.sessions[i])
    }

    /// Where `language`'s session is saved between a pause (or a restart) and the next call.
    pub fn state_path(&self, language: Language) -> PathBuf {
        self.fs
            .host_root()
            .join("state")
            .join(format!("{}.state", language.as_str()))
    }

    pub fn stop_all(&self, why: StopReason) {
        self.stop.stop(why);
        for j in self.jobs.lock().unwrap().iter() {
            j.stop.stop(why);
        }
    }
}
