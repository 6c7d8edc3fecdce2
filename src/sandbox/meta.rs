//! What a persistent sandbox keeps on disk beside its files: `meta.json`, written whole, and
//! the `lock` its process holds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::Sandbox;
use crate::platform::fs::{sync_written, write_replacing};

/// What `meta.json` keeps of a sandbox: enough to adopt its files after a restart.
#[derive(Serialize, Deserialize)]
pub(super) struct Meta {
    pub(super) id: String,
    pub(super) template: String,
    pub(super) owner: String,
    pub(super) created_at_ms: u64,
    pub(super) timeout_secs: u64,
    pub(super) expires_at_ms: u64,
    pub(super) paused: bool,
    pub(super) env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) allow_hosts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) packages: Vec<crate::lang::python::PackageTree>,
}

/// A persistent sandbox's claim on its directory: the locked `lock` file, held while it lives.
pub(super) struct Claim {
    _lock: std::fs::File,
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// Whether `id` has the shape of our sandbox ids (`wb` + 32 hex digits), so it is safe as a
/// path part.
pub(crate) fn valid_id(id: &str) -> bool {
    has_id_shape(id, "wb")
}

/// Whether `id` is `prefix` (two letters) and 32 lowercase hex digits.
pub(crate) fn has_id_shape(id: &str, prefix: &str) -> bool {
    id.len() == 34
        && id.starts_with(prefix)
        && id[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Takes the directory's lock without waiting; `None` when another live process holds it.
pub(crate) fn claim(dir: &Path) -> std::io::Result<Option<Claim>> {
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

impl Sandbox {
    /// Writes `meta.json` (atomically) when the sandbox is persistent; called after every change
    /// of lifetime, pause state or env. A failure is logged: the live sandbox is unaffected, only
    /// a restart would see older settings.
    pub fn save(&self) {
        self.save_with(true);
    }

    /// [`Sandbox::save`], not yet synced to disk without `sync` (then [`Sandbox::sync_saved`]
    /// makes it durable).
    pub(super) fn save_with(&self, sync: bool) {
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
                allow_hosts: self.allow_hosts.lock().unwrap().clone(),
                packages: self.packages.lock().unwrap().clone(),
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
}
