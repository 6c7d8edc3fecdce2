//! The registry of live sandboxes: creation within the caps, lookup by owner, adoption of what
//! an earlier server left, and the reaper.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use super::fs::Workspace;
use super::meta::{Claim, Meta, claim, from_unix_ms, valid_id};
use super::templates::{Template, template};
use super::*;

/// The registry of live sandboxes.
pub struct Sandboxes {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
    pub(super) root: Root,
    pub config: SandboxConfig,
    pub snapshots: snapshots::Snapshots,
}

pub(super) enum Root {
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
                let scratch =
                    crate::lang::scratch::scratch_root().map_err(std::io::Error::other)?;
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
                crate::platform::fs::private_dir(&mut b);
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

    /// The audit log: in the data directory, beside `sandboxes/` (so it outlives the
    /// process); inside the temporary root without one.
    pub fn audit_path(&self) -> PathBuf {
        match &self.root {
            Root::Data(d) => d.parent().unwrap_or(d).join("audit.jsonl"),
            Root::Temp(t) => t.path().join("audit.jsonl"),
        }
    }

    /// Whether sandboxes outlive the process (a data directory).
    pub fn persistent(&self) -> bool {
        matches!(self.root, Root::Data(_))
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
            Ok(fs) => fs.lent(&meta.owner),
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
        *sandbox.allow_hosts.lock().unwrap() = meta.allow_hosts;
        *sandbox.packages.lock().unwrap() = meta.packages;
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
            allow_hosts: Mutex::new(None),
            packages: Mutex::new(Vec::new()),
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
        let fs = Workspace::create(&self.root(), &id, self.config.quota)?.lent(owner);
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
