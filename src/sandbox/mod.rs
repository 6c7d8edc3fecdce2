//! Persistent sandboxes: a registry of ids, each with its own workspace, env, live language
//! sessions and background jobs, a lifetime, and a reaper that removes expired ones.
//!
//! Creating a sandbox starts nothing (two directories and an entry in a map); a language's
//! session starts on its first execution there.

pub mod fs;
pub mod jobs;
pub mod webhook;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::engine::limits::{Stop, StopReason};
use crate::lang::javascript::JsSession;
use crate::lang::python::PySession;
use crate::lang::{Language, Place};
use fs::{Quota, Workspace, rfc3339};
use jobs::Job;

/// A local template: which languages its sandboxes run.
#[derive(Debug)]
pub struct Template {
    pub id: &'static str,
    pub description: &'static str,
    pub languages: &'static [Language],
}

const PY_DESC: &str = "Python 3.15 (WASI) with numpy, pandas, scipy, scikit-learn and matplotlib, run locally in WebAssembly";

/// The templates that exist locally; anything else is a cloud template.
pub static TEMPLATES: &[Template] = &[
    Template {
        id: "code-interpreter",
        description: "Python 3.15 (numpy, pandas, scipy, scikit-learn, matplotlib), JavaScript (QuickJS-NG) and Go (standard library, built for wasip1), run locally in WebAssembly",
        languages: &[Language::Python, Language::JavaScript, Language::Go],
    },
    Template {
        id: "python",
        description: PY_DESC,
        languages: &[Language::Python],
    },
    Template {
        id: "javascript",
        description: "JavaScript (QuickJS-NG 0.16, ES2023) with console, timers, process and a small fs module, run locally in WebAssembly",
        languages: &[Language::JavaScript],
    },
    Template {
        id: "go",
        description: "Go (standard library) built for GOOS=wasip1 by a real Go toolchain and run locally in WebAssembly",
        languages: &[Language::Go],
    },
];

pub fn template(name: &str) -> Option<&'static Template> {
    TEMPLATES.iter().find(|t| t.id == name)
}

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
    #[error("creating the sandbox's workspace failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A session slot: the live session, or why the last one ended (said once, on the next call).
pub struct Slot<T> {
    pub session: Option<T>,
    pub ended: Option<String>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self {
            session: None,
            ended: None,
        }
    }
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
    pub created_at: SystemTime,
    lifetime: Mutex<Lifetime>,
    pub env: Mutex<BTreeMap<String, String>>,
    pub fs: Arc<Workspace>,
    /// Raised when the sandbox goes: whatever still runs in it stops.
    pub stop: Arc<Stop>,
    pub python: Arc<tokio::sync::Mutex<Slot<PySession>>>,
    pub javascript: Arc<tokio::sync::Mutex<Slot<JsSession>>>,
    jobs: Mutex<Vec<Arc<Job>>>,
    pub executions: AtomicU64,
    max_running_jobs: usize,
    max_kept_jobs: usize,
}

impl Sandbox {
    /// Where an execution with working directory `cwd` (a guest path, already made to exist)
    /// runs, stopped by `stop`.
    pub fn place(&self, cwd: String, stop: Arc<Stop>) -> Place {
        let fs = self.fs.clone();
        Place {
            workspace: self.fs.host_workspace(),
            tmp: self.fs.host_tmp(),
            cwd,
            stop,
            over_quota: Some(Arc::new(move || fs.over_quota())),
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

    /// The sandbox's env with the call's on top.
    pub fn env_with(&self, call: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env = self.env.lock().unwrap().clone();
        env.extend(call.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
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
    pub fn info(&self) -> Value {
        let l = self.lifetime.lock().unwrap();
        let (bytes, entries) = self.fs.usage();
        let quota = self.fs.quota();
        json!({
            "sandbox_id": self.id,
            "template_id": self.template.id,
            "template_name": self.template.id,
            "organization_id": 0,
            "node_id": null,
            "region": "local",
            "status": if l.paused { "paused" } else { "running" },
            "public_host": null,
            "direct_url": null,
            "preview_url": null,
            "resources": {
                "vcpu": null,
                "memory_mb": null,
                "disk_mb": quota.max_bytes / (1 << 20),
            },
            "internet_access": false,
            "live_mode": false,
            "timeout_seconds": l.timeout.as_secs(),
            "expires_at": rfc3339(l.expires_at),
            "created_at": rfc3339(self.created_at),
            "started_at": null,
            "end_at": rfc3339(l.expires_at),
            "location": "local",
            "languages": self.template.languages,
            "workspace": {"bytes": bytes, "entries": entries, "max_bytes": quota.max_bytes, "max_entries": quota.max_entries},
            "executions": self.executions.load(Ordering::Relaxed),
            "jobs_running": self.jobs.lock().unwrap().iter().filter(|j| j.running()).count(),
        })
    }

    /// Stops everything running in the sandbox and removes its files.
    fn destroy(&self) {
        self.stop.stop(StopReason::SandboxGone);
        for j in self.jobs.lock().unwrap().iter() {
            j.stop.stop(StopReason::SandboxGone);
        }
        self.fs.destroy();
    }
}

/// The registry of live sandboxes.
pub struct Sandboxes {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
    root: tempfile::TempDir,
    pub config: SandboxConfig,
}

impl Sandboxes {
    /// A registry whose workspaces live in a private directory removed when it is dropped, and
    /// its reaper thread, which ends with it.
    pub fn new(config: SandboxConfig) -> std::io::Result<Arc<Self>> {
        let root = tempfile::Builder::new()
            .prefix("wasmbox-sandboxes-")
            .tempdir()?;
        let me = Arc::new(Self {
            map: Mutex::new(HashMap::new()),
            root,
            config,
        });
        let weak = Arc::downgrade(&me);
        std::thread::Builder::new()
            .name("wasmbox-sandbox-reaper".into())
            .spawn(move || reap(weak))?;
        Ok(me)
    }

    pub fn root(&self) -> PathBuf {
        self.root.path().to_path_buf()
    }

    /// Creates a sandbox; nothing runs until code does.
    pub fn create(
        &self,
        template_name: &str,
        timeout_secs: Option<i64>,
        env: BTreeMap<String, String>,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let template = template(template_name)
            .ok_or_else(|| SandboxError::TemplateNotFound(template_name.to_string()))?;
        let timeout = self.timeout(timeout_secs)?;
        let mut map = self.map.lock().unwrap();
        if map.len() >= self.config.max_live {
            return Err(SandboxError::TooMany(self.config.max_live));
        }
        // 122 random bits: ids are capabilities, never guessable.
        let id = format!("wb{}", uuid::Uuid::new_v4().simple());
        let fs = Workspace::create(self.root.path(), &id, self.config.quota)?;
        let now = SystemTime::now();
        let sandbox = Arc::new(Sandbox {
            id: id.clone(),
            template,
            created_at: now,
            lifetime: Mutex::new(Lifetime {
                timeout,
                expires_at: now + timeout,
                paused: false,
            }),
            env: Mutex::new(env),
            fs: Arc::new(fs),
            stop: Arc::new(Stop::default()),
            python: Default::default(),
            javascript: Default::default(),
            jobs: Mutex::new(Vec::new()),
            executions: AtomicU64::new(0),
            max_running_jobs: self.config.max_running_jobs,
            max_kept_jobs: self.config.max_kept_jobs,
        });
        map.insert(id, sandbox.clone());
        Ok(sandbox)
    }

    fn timeout(&self, secs: Option<i64>) -> Result<Duration, SandboxError> {
        match secs {
            None => Ok(self.config.default_timeout),
            Some(s) if s <= 0 || s as u64 > self.config.max_timeout.as_secs() => Err(
                SandboxError::BadTimeout(s, self.config.max_timeout.as_secs()),
            ),
            Some(s) => Ok(Duration::from_secs(s as u64)),
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>, SandboxError> {
        let sb = self
            .map
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))?;
        // The reaper runs every second; an expired sandbox is gone from the caller's view now.
        if sb.expires_at() <= SystemTime::now() {
            self.delete(id).ok();
            return Err(SandboxError::NotFound(id.to_string()));
        }
        Ok(sb)
    }

    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        let mut v: Vec<_> = self.map.lock().unwrap().values().cloned().collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes a sandbox: its running code is stopped, its files deleted.
    pub fn delete(&self, id: &str) -> Result<(), SandboxError> {
        let sb = self
            .map
            .lock()
            .unwrap()
            .remove(id)
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))?;
        sb.destroy();
        tracing::info!(sandbox = %id, "sandbox removed");
        Ok(())
    }

    /// Sets a new lifetime, counted from now.
    pub fn set_timeout(&self, id: &str, secs: i64) -> Result<Arc<Sandbox>, SandboxError> {
        let timeout = self.timeout(Some(secs))?;
        let sb = self.get(id)?;
        {
            let mut l = sb.lifetime.lock().unwrap();
            l.timeout = timeout;
            l.expires_at = SystemTime::now() + timeout;
        }
        Ok(sb)
    }

    pub fn set_paused(&self, id: &str, paused: bool) -> Result<Arc<Sandbox>, SandboxError> {
        let sb = self.get(id)?;
        sb.lifetime.lock().unwrap().paused = paused;
        Ok(sb)
    }

    fn expired(&self) -> Vec<String> {
        let now = SystemTime::now();
        self.map
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.expires_at() <= now)
            .map(|s| s.id.clone())
            .collect()
    }
}

impl Drop for Sandboxes {
    fn drop(&mut self) {
        for sb in self.map.get_mut().unwrap().values() {
            sb.destroy();
        }
    }
}

/// Removes expired sandboxes once a second, for as long as the registry exists.
fn reap(registry: Weak<Sandboxes>) {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(r) = registry.upgrade() else { return };
        for id in r.expired() {
            if r.delete(&id).is_ok() {
                tracing::info!(sandbox = %id, "sandbox expired");
            }
        }
    }
}
