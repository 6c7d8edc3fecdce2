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
pub mod jobs;
pub mod sessions;
pub mod snapshots;
pub mod webhook;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::engine::limits::{Stop, StopReason};
use crate::lang::session::Session;
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

/// The owner of sandboxes created over stdio (one local user).
pub const LOCAL_OWNER: &str = "local";

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

/// A session slot: the live session, or why the last one ended (said once, on the next call).
/// A session saved to disk (paused, swapped out, or left by a previous server) is in the
/// sandbox's state file instead, until the next call restores it.
#[derive(Default)]
pub struct Slot {
    pub session: Option<Session>,
    pub ended: Option<String>,
    /// When its last call ended: idle sessions, and the least recently used ones when live
    /// sessions reach their cap, are saved to disk and freed.
    pub last_used: Option<std::time::Instant>,
    /// The state file holds the live session as it is now: freeing it needs no new save.
    pub saved: bool,
    /// A marker says the live session has turns no file holds (see `sessions::call`).
    pub unsaved_marked: bool,
}

/// A sandbox's slot for one language, held for the length of a call.
pub type SlotLock = Arc<tokio::sync::Mutex<Slot>>;

/// The languages whose sessions a sandbox keeps, in the order of [`Sandbox::slot`]'s slots.
pub const SESSION_LANGUAGES: [Language; 2] = [Language::Python, Language::JavaScript];

struct Lifetime {
    timeout: Duration,
    expires_at: SystemTime,
    paused: bool,
}

/// What `meta.json` keeps of a sandbox: enough to adopt its files after a restart.
#[derive(Serialize, Deserialize)]
struct Meta {
    id: String,
    template: String,
    owner: String,
    created_at_ms: u64,
    timeout_secs: u64,
    expires_at_ms: u64,
    paused: bool,
    env: BTreeMap<String, String>,
}

/// Why a directory was quarantined, kept beside its files (`quarantine.json`).
#[derive(Serialize, Deserialize)]
struct QuarantineNote {
    id: String,
    reason: String,
}

/// A sandbox directory that could not be adopted, moved aside with its files.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub id: String,
    pub reason: String,
    pub quarantined_at: SystemTime,
    /// Where its files are (`workspace/`, `tmp/`, the unreadable `meta.json`).
    pub path: PathBuf,
}

/// Writes `path` so that a crash or a concurrent writer leaves the old or the new content,
/// never a mix: a temp file of a unique name beside it, synced, renamed over it, and the
/// directory synced so the rename itself survives a power cut.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_replacing(path, bytes, true)
}

/// As [`write_atomic`], synced to disk only with `sync`: without, a crash of the process still
/// leaves the old or the new content, and only a power cut may lose the write (see
/// [`sync_written`]).
fn write_replacing(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        "{name}.{}-{}.tmp",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let mut f = o.open(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if sync {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Syncs to disk what [`write_replacing`] wrote to `path` without syncing: the file, then its
/// directory (the rename).
fn sync_written(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// A persistent sandbox's claim on its directory: the locked `lock` file, held while it lives.
struct Claim {
    _lock: std::fs::File,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// Whether `id` has the shape of our sandbox ids (`wb` + 32 hex digits), so it is safe as a
/// path part.
fn valid_id(id: &str) -> bool {
    has_id_shape(id, "wb")
}

/// Whether `id` is `prefix` (two letters) and 32 lowercase hex digits.
fn has_id_shape(id: &str, prefix: &str) -> bool {
    id.len() == 34
        && id.starts_with(prefix)
        && id[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Takes the directory's lock without waiting; `None` when another live process holds it.
fn claim(dir: &Path) -> std::io::Result<Option<Claim>> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(Claim { _lock: f })),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// One persistent sandbox.
pub struct Sandbox {
    pub id: String,
    pub template: &'static Template,
    /// Who may see and use it: [`LOCAL_OWNER`] over stdio, a token's fingerprint over HTTP.
    pub owner: String,
    claim: Option<Claim>,
    pub created_at: SystemTime,
    lifetime: Mutex<Lifetime>,
    env: Mutex<BTreeMap<String, String>>,
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

    /// Writes `meta.json` (atomically) when the sandbox is persistent; called after every change
    /// of lifetime, pause state or env. A failure is logged: the live sandbox is unaffected, only
    /// a restart would see older settings.
    pub fn save(&self) {
        self.save_with(true);
    }

    /// [`Sandbox::save`], not yet synced to disk without `sync` (then [`Sandbox::sync_saved`]
    /// makes it durable).
    fn save_with(&self, sync: bool) {
        if self.claim.is_none() {
            return;
        }
        let _saving = self.saving.lock().unwrap();
        let meta = {
            let l = self.lifetime.lock().unwrap();
            Meta {
                id: self.id.clone(),
                template: self.template.id.to_string(),
                owner: self.owner.clone(),
                created_at_ms: unix_ms(self.created_at),
                timeout_secs: l.timeout.as_secs(),
                expires_at_ms: unix_ms(l.expires_at),
                paused: l.paused,
                env: self.env.lock().unwrap().clone(),
            }
        };
        let path = self.fs.host_root().join("meta.json");
        let written = serde_json::to_vec_pretty(&meta)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_replacing(&path, &bytes, sync));
        if let Err(e) = written {
            tracing::warn!(sandbox = %self.id, "saving the sandbox's metadata: {e}");
        }
    }

    /// Syncs `meta.json` to disk, after a creation that left that for later (a fork, whose
    /// caller should not wait for the disk). Blocks: call it off the async threads.
    pub fn sync_saved(&self) {
        if self.claim.is_none() {
            return;
        }
        let _saving = self.saving.lock().unwrap();
        match sync_written(&self.fs.host_root().join("meta.json")) {
            // Deleted meanwhile: nothing left to keep.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(sandbox = %self.id, "syncing the sandbox's metadata: {e}"),
            Ok(()) => {}
        }
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

    /// Stops the sandbox's running code and background jobs.
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

/// The registry of live sandboxes.
pub struct Sandboxes {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
    root: Root,
    pub config: SandboxConfig,
    pub snapshots: snapshots::Snapshots,
}

enum Root {
    /// Removed with the registry: sandboxes end with the process.
    Temp(tempfile::TempDir),
    /// The data directory's `sandboxes/`: sandboxes outlive the process.
    Data(PathBuf),
}

impl Sandboxes {
    /// A registry and its reaper thread, which ends with it. With a data directory, unexpired
    /// sandboxes a previous server left there are adopted and expired ones removed.
    pub fn new(config: SandboxConfig) -> std::io::Result<Arc<Self>> {
        let root = match &config.data_dir {
            // Under the process's scratch root, so a killed server's sandboxes are removed by
            // the next start, like its one-shots' directories.
            None => {
                let scratch = crate::lang::guest::scratch_root().map_err(std::io::Error::other)?;
                Root::Temp(
                    tempfile::Builder::new()
                        .prefix("sandboxes-")
                        .tempdir_in(scratch)?,
                )
            }
            Some(d) => {
                let dir = d.join("sandboxes");
                let mut b = std::fs::DirBuilder::new();
                b.recursive(true);
                #[cfg(unix)]
                std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
                b.create(&dir)?;
                Root::Data(dir)
            }
        };
        // Beside `sandboxes/` in a data directory; inside the temporary root otherwise.
        let snapshot_root = match &root {
            Root::Data(d) => d.parent().unwrap_or(d).join("snapshots"),
            Root::Temp(t) => t.path().join("snapshots"),
        };
        let snapshots = snapshots::Snapshots::new(snapshot_root, config.snapshot_bytes);
        let me = Arc::new(Self {
            map: Mutex::new(HashMap::new()),
            root,
            config,
            snapshots,
        });
        me.recover();
        let weak = Arc::downgrade(&me);
        std::thread::Builder::new()
            .name("wasmbox-sandbox-reaper".into())
            .spawn(move || reap(weak))?;
        Ok(me)
    }

    pub fn root(&self) -> PathBuf {
        match &self.root {
            Root::Temp(t) => t.path().to_path_buf(),
            Root::Data(d) => d.clone(),
        }
    }

    /// Whether sandboxes outlive the process (a data directory).
    pub fn persistent(&self) -> bool {
        matches!(self.root, Root::Data(_))
    }

    /// `<data>/quarantine`, beside `<data>/sandboxes`.
    fn quarantine_root(&self) -> Option<PathBuf> {
        match &self.root {
            Root::Data(d) => d.parent().map(|p| p.join("quarantine")),
            Root::Temp(_) => None,
        }
    }

    /// Moves sandbox `id`'s directory (whose lock the caller holds) aside instead of deleting
    /// it: a sandbox that cannot be read may still hold someone's work.
    fn quarantine(&self, id: &str, dir: &Path, why: &str) {
        let Some(root) = self.quarantine_root() else {
            return;
        };
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let dest = root.join(format!("{id}-{secs}"));
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        if let Err(e) = b.create(&root).and_then(|()| std::fs::rename(dir, &dest)) {
            tracing::warn!(sandbox = %id, "could not adopt the sandbox in {} ({why}) nor move it to {}: {e}; it is left where it is", dir.display(), root.display());
            return;
        }
        let note = QuarantineNote {
            id: id.to_string(),
            reason: why.to_string(),
        };
        let noted = serde_json::to_vec_pretty(&note)
            .map_err(std::io::Error::other)
            .and_then(|b| write_atomic(&dest.join("quarantine.json"), &b));
        if let Err(e) = noted {
            tracing::warn!(sandbox = %id, "writing {}: {e}", dest.join("quarantine.json").display());
        }
        tracing::warn!(sandbox = %id, "quarantined a sandbox left by an earlier run: {why}; its files are in {} (list_sandboxes shows it over stdio, delete_sandbox removes it)", dest.display());
    }

    /// The quarantined sandboxes, for `owner`: the local user only, since whose they were is
    /// unknown once their metadata is unreadable (an HTTP token sees none).
    pub fn quarantined(&self, owner: &str) -> Vec<Quarantined> {
        let Some(root) = self.quarantine_root().filter(|_| owner == LOCAL_OWNER) else {
            return Vec::new();
        };
        let mut out: Vec<Quarantined> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (id, secs) = name.split_at_checked(34)?;
                let secs: u64 = secs.strip_prefix('-')?.parse().ok()?;
                if !valid_id(id) || !e.path().is_dir() {
                    return None;
                }
                let reason = std::fs::read(e.path().join("quarantine.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<QuarantineNote>(&b).ok())
                    .map_or_else(
                        || "unknown (quarantine.json unreadable)".into(),
                        |n| n.reason,
                    );
                Some(Quarantined {
                    id: id.to_string(),
                    reason,
                    quarantined_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
                    path: e.path(),
                })
            })
            .collect();
        out.sort_by_key(|q| q.quarantined_at);
        out
    }

    /// Deletes `owner`'s quarantined copies of sandbox `id`; whether there were any.
    fn remove_quarantined(&self, id: &str, owner: &str) -> std::io::Result<bool> {
        let mut found = false;
        for q in self.quarantined(owner).into_iter().filter(|q| q.id == id) {
            std::fs::remove_dir_all(&q.path)?;
            tracing::info!(sandbox = %id, "quarantined sandbox {} deleted", q.path.display());
            found = true;
        }
        Ok(found)
    }

    /// Adopts every unexpired sandbox left in the data directory by a server that is gone.
    fn recover(&self) {
        if !self.persistent() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(self.root()) else {
            return;
        };
        let mut adopted = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            if let Some(id) = name.to_str().filter(|id| valid_id(id))
                && self.adopt(id).is_some()
            {
                adopted += 1;
            }
        }
        if adopted > 0 {
            tracing::info!(
                "found {adopted} sandboxes from an earlier run in {}",
                self.root().display()
            );
        }
    }

    /// Takes over sandbox `id` from the data directory when no live process holds it: its files
    /// and settings come back (interpreter state does not); an expired one is removed, an
    /// unreadable one quarantined.
    fn adopt(&self, id: &str) -> Option<Arc<Sandbox>> {
        if !self.persistent() || !valid_id(id) {
            return None;
        }
        let dir = self.root().join(id);
        if !dir.join("meta.json").is_file() {
            return None;
        }
        let claim = match claim(&dir) {
            Ok(Some(c)) => c,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(sandbox = %id, "locking {}: {e}", dir.display());
                return None;
            }
        };
        let remove = |why: &str| {
            tracing::info!(sandbox = %id, "removing a sandbox left by an earlier run: {why}");
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("removing {}: {e}", dir.display());
            }
        };
        // Temp files of saves a crash interrupted; ours are unique, so any here are stale.
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with("meta.json.") && n.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let meta: Meta = match std::fs::read(dir.join("meta.json"))
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(m) => m,
            Err(e) => {
                self.quarantine(id, &dir, &format!("unreadable meta.json ({e})"));
                return None;
            }
        };
        let expires_at = from_unix_ms(meta.expires_at_ms);
        if expires_at <= SystemTime::now() {
            remove("expired");
            return None;
        }
        let Some(template) = template(&meta.template).filter(|_| meta.id == id) else {
            let why = format!(
                "meta.json does not match (id {:?}, template {:?})",
                meta.id, meta.template
            );
            self.quarantine(id, &dir, &why);
            return None;
        };
        let fs = match Workspace::open(&self.root(), id, self.config.quota) {
            Ok(fs) => fs,
            Err(e) => {
                self.quarantine(id, &dir, &format!("workspace unusable ({e})"));
                return None;
            }
        };
        let sandbox = self.sandbox(
            id.to_string(),
            template,
            meta.owner,
            Some(claim),
            from_unix_ms(meta.created_at_ms),
            Lifetime {
                timeout: Duration::from_secs(meta.timeout_secs),
                expires_at,
                paused: meta.paused,
            },
            meta.env,
            fs,
        );
        tracing::info!(sandbox = %id, "adopted a sandbox from an earlier run (its files, and its saved sessions on their next calls)");
        let mut map = self.map.lock().unwrap();
        // Another request may have adopted it meanwhile; the lock makes that impossible across
        // processes, the map check covers this one.
        Some(map.entry(id.to_string()).or_insert(sandbox).clone())
    }

    /// A sandbox with nothing running yet, new or adopted: what differs between the two is
    /// passed in, the rest (sessions, jobs, limits) starts empty from the registry's config.
    #[allow(clippy::too_many_arguments)]
    fn sandbox(
        &self,
        id: String,
        template: &'static Template,
        owner: String,
        claim: Option<Claim>,
        created_at: SystemTime,
        lifetime: Lifetime,
        env: BTreeMap<String, String>,
        fs: Workspace,
    ) -> Arc<Sandbox> {
        Arc::new(Sandbox {
            id,
            template,
            owner,
            claim,
            created_at,
            lifetime: Mutex::new(lifetime),
            env: Mutex::new(env),
            fs: Arc::new(fs),
            stop: Arc::new(Stop::default()),
            sessions: Default::default(),
            jobs: Mutex::new(Vec::new()),
            executions: AtomicU64::new(0),
            max_running_jobs: self.config.max_running_jobs,
            max_kept_jobs: self.config.max_kept_jobs,
            saving: Mutex::new(()),
            kept_output: jobs::KeptOutput::new(jobs::SANDBOX_KEPT_OUTPUT),
            filled: AtomicBool::new(true),
        })
    }

    /// Creates a sandbox for `owner`; nothing runs until code does.
    pub fn create(
        &self,
        template_name: &str,
        timeout_secs: Option<i64>,
        env: BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        self.create_with(template_name, timeout_secs, env, owner, true)
    }

    /// A sandbox to be filled (a fork, one made from a snapshot): counted against the caps, but
    /// no tool finds it and no restart adopts it until [`Sandboxes::publish`]; on failure,
    /// [`Sandboxes::discard`] it.
    pub fn create_unfilled(
        &self,
        template_name: &str,
        timeout_secs: Option<i64>,
        env: BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        self.create_with(template_name, timeout_secs, env, owner, false)
    }

    /// Makes a filled sandbox visible to tools, its `meta.json` written (synced only with
    /// `sync`; else the caller calls [`Sandbox::sync_saved`] later, off its path).
    pub fn publish(&self, sb: &Sandbox, sync: bool) {
        sb.save_with(sync);
        sb.filled.store(true, Ordering::Release);
    }

    /// Removes a sandbox that was never published.
    pub fn discard(&self, id: &str) {
        let _ = self.remove(id);
    }

    fn create_with(
        &self,
        template_name: &str,
        timeout_secs: Option<i64>,
        env: BTreeMap<String, String>,
        owner: &str,
        filled: bool,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let template = template(template_name)
            .ok_or_else(|| SandboxError::TemplateNotFound(template_name.to_string()))?;
        let timeout = self.timeout(timeout_secs)?;
        check_env_size(&env)?;
        let mut map = self.map.lock().unwrap();
        if map.len() >= self.config.max_live {
            return Err(SandboxError::TooMany(self.config.max_live));
        }
        if map.values().filter(|s| s.owner == owner).count() >= self.config.max_per_owner {
            return Err(SandboxError::TooManyForOwner(self.config.max_per_owner));
        }
        // 122 random bits: ids are capabilities, never guessable.
        let id = format!("wb{}", uuid::Uuid::new_v4().simple());
        let fs = Workspace::create(&self.root(), &id, self.config.quota)?;
        let claim = if self.persistent() {
            match claim(fs.host_root()) {
                Ok(Some(c)) => Some(c),
                Ok(None) => unreachable!("a new random directory is locked by nobody"),
                Err(e) => {
                    fs.destroy();
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let now = SystemTime::now();
        let sandbox = self.sandbox(
            id.clone(),
            template,
            owner.to_string(),
            claim,
            now,
            Lifetime {
                timeout,
                expires_at: now + timeout,
                paused: false,
            },
            env,
            fs,
        );
        if filled {
            sandbox.save_with(true);
        } else {
            sandbox.filled.store(false, Ordering::Release);
        }
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

    /// Sandbox `id` if `owner` owns it; another owner's sandbox is "not found", like one that
    /// never existed.
    pub fn get(&self, id: &str, owner: &str) -> Result<Arc<Sandbox>, SandboxError> {
        let found = self.map.lock().unwrap().get(id).cloned();
        let sb = found
            .or_else(|| self.adopt(id))
            .filter(|sb| sb.owner == owner && sb.filled.load(Ordering::Acquire))
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))?;
        // The reaper runs every second; an expired sandbox is gone from the caller's view now.
        if sb.expires_at() <= SystemTime::now() {
            self.remove(id).ok();
            return Err(SandboxError::NotFound(id.to_string()));
        }
        Ok(sb)
    }

    /// `owner`'s sandboxes, oldest first.
    pub fn list(&self, owner: &str) -> Vec<Arc<Sandbox>> {
        let mut v: Vec<_> = self
            .map
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.owner == owner && s.filled.load(Ordering::Acquire))
            .cloned()
            .collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }

    /// Every owner's live sandboxes (for the server's own upkeep).
    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.map.lock().unwrap().values().cloned().collect()
    }

    /// How many live sandboxes `owner` has (what that owner may be told; [`Sandboxes::len`]
    /// counts every owner's).
    pub fn count(&self, owner: &str) -> usize {
        self.map
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.owner == owner)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes `owner`'s sandbox: its running code is stopped, its files deleted; or its
    /// quarantined copy, if that is what `owner` may see.
    pub fn delete(&self, id: &str, owner: &str) -> Result<(), SandboxError> {
        match self.get(id, owner) {
            Ok(_) => self.remove(id),
            Err(SandboxError::NotFound(_))
                if self
                    .remove_quarantined(id, owner)
                    .map_err(SandboxError::Quarantine)? =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn remove(&self, id: &str) -> Result<(), SandboxError> {
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
    pub fn set_timeout(
        &self,
        id: &str,
        owner: &str,
        secs: i64,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let timeout = self.timeout(Some(secs))?;
        let sb = self.get(id, owner)?;
        {
            let mut l = sb.lifetime.lock().unwrap();
            l.timeout = timeout;
            l.expires_at = SystemTime::now() + timeout;
        }
        sb.save();
        Ok(sb)
    }

    pub fn set_paused(
        &self,
        id: &str,
        owner: &str,
        paused: bool,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let sb = self.get(id, owner)?;
        sb.lifetime.lock().unwrap().paused = paused;
        sb.save();
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
    /// Stops whatever still runs; files go only when they cannot outlive the process.
    fn drop(&mut self) {
        let persistent = self.persistent();
        for sb in self.map.get_mut().unwrap().values() {
            if persistent {
                sb.stop_all(StopReason::SandboxGone);
            } else {
                sb.destroy();
            }
        }
    }
}

/// Removes expired sandboxes once a second, for as long as the registry exists.
fn reap(registry: Weak<Sandboxes>) {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(r) = registry.upgrade() else { return };
        for id in r.expired() {
            if r.remove(&id).is_ok() {
                tracing::info!(sandbox = %id, "sandbox expired");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data: &Path) -> SandboxConfig {
        SandboxConfig {
            default_timeout: Duration::from_secs(600),
            max_timeout: Duration::from_secs(3600),
            max_live: 8,
            quota: Quota {
                max_bytes: 1 << 20,
                max_entries: 100,
            },
            max_running_jobs: 1,
            max_kept_jobs: 1,
            max_per_owner: 2,
            data_dir: Some(data.to_path_buf()),
            save_every_call: false,
            save_idle: None,
            idle_pause: None,
            snapshot_bytes: 1 << 20,
            max_state_bytes: 1 << 20,
            max_live_sessions: 8,
        }
    }

    #[test]
    fn ids_are_checked_before_they_become_paths() {
        assert!(valid_id("wb0123456789abcdef0123456789abcdef"));
        for bad in [
            "",
            "..",
            "wb../../../../etc/passwd000000000000",
            "wb0123456789ABCDEF0123456789abcdef",
            "xx0123456789abcdef0123456789abcdef",
            "wb0123456789abcdef0123456789abcde",
        ] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_new_registry_adopts_what_a_dropped_one_left_and_removes_the_expired() {
        let data = tempfile::tempdir().unwrap();
        let (kept, expired) = {
            let r = Sandboxes::new(config(data.path())).unwrap();
            let mut env = BTreeMap::new();
            env.insert("K".to_string(), "v".to_string());
            let kept = r.create("python", Some(60), env, "token-a").unwrap();
            std::fs::write(kept.fs.host_workspace().join("f.txt"), "data").unwrap();
            let expired = r
                .create("python", Some(1), BTreeMap::new(), "token-a")
                .unwrap();
            // Over the per-owner limit; another owner is not.
            assert!(matches!(
                r.create("python", None, BTreeMap::new(), "token-a"),
                Err(SandboxError::TooManyForOwner(2))
            ));
            r.create("go", None, BTreeMap::new(), "token-b").unwrap();
            (kept.id.clone(), expired.id.clone())
        };
        std::thread::sleep(Duration::from_millis(1100));
        let r = Sandboxes::new(config(data.path())).unwrap();
        let sb = r.get(&kept, "token-a").unwrap();
        assert_eq!(sb.template.id, "python");
        assert_eq!(sb.env()["K"], "v");
        assert_eq!(
            std::fs::read_to_string(sb.fs.host_workspace().join("f.txt")).unwrap(),
            "data"
        );
        assert!(matches!(
            r.get(&kept, "token-b"),
            Err(SandboxError::NotFound(_))
        ));
        assert!(r.get(&expired, "token-a").is_err());
        assert!(!data.path().join("sandboxes").join(&expired).exists());
        assert_eq!(r.list("token-a").len(), 1);
        assert_eq!(r.list("token-b").len(), 1);

        // A second live registry on the same directory cannot take them.
        let other = Sandboxes::new(config(data.path())).unwrap();
        assert!(other.get(&kept, "token-a").is_err());
        assert!(other.list("token-a").is_empty());
    }

    #[test]
    fn unreadable_sandboxes_are_quarantined_never_deleted() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("sandboxes");
        let (bad_meta, bad_ws, other_id, ok) = {
            let r = Sandboxes::new(config(data.path())).unwrap();
            let mk = |owner| {
                let sb = r
                    .create("python", Some(600), BTreeMap::new(), owner)
                    .unwrap();
                std::fs::write(sb.fs.host_workspace().join("f.txt"), "work").unwrap();
                sb.id.clone()
            };
            (
                mk("token-a"),
                mk("token-a"),
                mk(LOCAL_OWNER),
                mk(LOCAL_OWNER),
            )
        };
        // A torn meta.json; a workspace that is a file; a meta.json naming another sandbox; and
        // a stale temp file from an interrupted save beside a good one.
        std::fs::write(root.join(&bad_meta).join("meta.json"), "{\"id\":").unwrap();
        let ws = root.join(&bad_ws).join("workspace");
        std::fs::remove_dir_all(&ws).unwrap();
        std::fs::write(&ws, "not a directory").unwrap();
        let m = root.join(&other_id).join("meta.json");
        let text = std::fs::read_to_string(&m).unwrap().replace(&other_id, &ok);
        std::fs::write(&m, text).unwrap();
        let stale = root.join(&ok).join("meta.json.1234-abcd.tmp");
        std::fs::write(&stale, "{").unwrap();

        let r = Sandboxes::new(config(data.path())).unwrap();
        assert!(r.get(&ok, LOCAL_OWNER).is_ok());
        assert!(!stale.exists(), "stale temp files go");
        let q = r.quarantined(LOCAL_OWNER);
        let reason = |id: &str| {
            q.iter()
                .find(|q| q.id == id)
                .unwrap_or_else(|| panic!("{id} not quarantined: {q:?}"))
                .reason
                .clone()
        };
        assert!(reason(&bad_meta).contains("unreadable meta.json"));
        assert!(reason(&bad_ws).contains("workspace unusable"));
        assert!(reason(&other_id).contains("does not match"));
        assert_eq!(q.len(), 3, "{q:?}");
        for q in &q {
            assert!(!root.join(&q.id).exists());
            assert!(q.path.starts_with(data.path().join("quarantine")));
            assert!(q.path.join("meta.json").is_file(), "{q:?}");
        }
        let kept = q.iter().find(|q| q.id == bad_meta).unwrap();
        assert_eq!(
            std::fs::read_to_string(kept.path.join("workspace/f.txt")).ok(),
            Some("work".to_string())
        );
        // Tokens see none and delete none; the local user deletes them one by one.
        assert!(r.quarantined("token-a").is_empty());
        assert!(matches!(
            r.delete(&bad_meta, "token-a"),
            Err(SandboxError::NotFound(_))
        ));
        r.delete(&bad_meta, LOCAL_OWNER).unwrap();
        assert_eq!(r.quarantined(LOCAL_OWNER).len(), 2);
        assert!(matches!(
            r.delete(&bad_meta, LOCAL_OWNER),
            Err(SandboxError::NotFound(_))
        ));
        // A new registry neither re-adopts nor removes the rest.
        drop(r);
        let r = Sandboxes::new(config(data.path())).unwrap();
        assert_eq!(r.quarantined(LOCAL_OWNER).len(), 2);
    }

    #[test]
    fn saves_replace_meta_json_whole() {
        let data = tempfile::tempdir().unwrap();
        let r = Sandboxes::new(config(data.path())).unwrap();
        let sb = r
            .create("python", Some(600), BTreeMap::new(), LOCAL_OWNER)
            .unwrap();
        // Concurrent saves of growing env: every read parses, the last one wins, no temp left.
        std::thread::scope(|s| {
            for t in 0..4 {
                let sb = &sb;
                s.spawn(move || {
                    for i in 0..25 {
                        sb.env
                            .lock()
                            .unwrap()
                            .insert(format!("K{t}_{i}"), "v".repeat(i));
                        sb.save();
                    }
                });
            }
            let path = sb.fs.host_root().join("meta.json");
            for _ in 0..50 {
                let b = std::fs::read(&path).unwrap();
                serde_json::from_slice::<Meta>(&b).unwrap();
            }
        });
        let b = std::fs::read(sb.fs.host_root().join("meta.json")).unwrap();
        assert_eq!(serde_json::from_slice::<Meta>(&b).unwrap().env.len(), 100);
        let left: Vec<_> = std::fs::read_dir(sb.fs.host_root())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn without_a_data_dir_sandboxes_end_with_the_registry() {
        let mut c = config(Path::new("/nonexistent"));
        c.data_dir = None;
        let r = Sandboxes::new(c).unwrap();
        let sb = r
            .create("python", None, BTreeMap::new(), LOCAL_OWNER)
            .unwrap();
        let root = sb.fs.host_root().to_path_buf();
        assert!(root.is_dir());
        drop(sb);
        drop(r);
        assert!(!root.exists());
    }
}
