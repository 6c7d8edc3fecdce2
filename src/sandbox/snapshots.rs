//! Snapshots: a sandbox's files, env and saved sessions, kept under an id of their own so new
//! sandboxes can start from them (`create_sandbox(from_snapshot=...)`). Each lives in
//! `<snapshots>/<id>/` (`meta.json`, `workspace/`, `tmp/`, `state/`), private to this user,
//! owned like a sandbox, and counted against its owner's `WASMBOX_SNAPSHOT_DISK_MB`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{from_unix_ms, unix_ms, write_atomic};
use crate::lang::Language;

/// What `meta.json` of a snapshot keeps.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub snapshot_id: String,
    pub sandbox_id: String,
    pub owner: String,
    pub template: String,
    pub env: BTreeMap<String, String>,
    pub created_at_ms: u64,
    /// The languages whose sessions it holds.
    pub languages: Vec<Language>,
    pub size_bytes: u64,
}

impl SnapshotMeta {
    pub fn created_at(&self) -> SystemTime {
        from_unix_ms(self.created_at_ms)
    }
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "Snapshot not found: no snapshot with id {0:?} (it was deleted, or never existed). List them with list_snapshots."
    )]
    NotFound(String),
    #[error(
        "the snapshot would take {size} bytes, and this owner's snapshots already take {used} of {limit} (WASMBOX_SNAPSHOT_DISK_MB): delete some with delete_snapshot"
    )]
    Quota { size: u64, used: u64, limit: u64 },
    #[error("the snapshot could not be written: {0}")]
    Io(String),
}

/// The snapshot store.
pub struct Snapshots {
    root: PathBuf,
    /// Bytes one owner's snapshots may take together.
    max_bytes: u64,
}

/// Whether `id` has the shape of our snapshot ids (`ws` + 32 hex digits): safe as a path part.
fn valid_id(id: &str) -> bool {
    super::has_id_shape(id, "ws")
}

impl Snapshots {
    pub fn new(root: PathBuf, max_bytes: u64) -> Self {
        Self { root, max_bytes }
    }

    /// A new, empty snapshot directory and its id.
    pub fn start(&self) -> Result<(String, PathBuf), SnapshotError> {
        // 122 random bits: ids are capabilities, like sandbox ids.
        let id = format!("ws{}", uuid::Uuid::new_v4().simple());
        let dir = self.root.join(&id);
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        for sub in ["workspace", "tmp", "state"] {
            b.create(dir.join(sub))
                .map_err(|e| SnapshotError::Io(e.to_string()))?;
        }
        Ok((id, dir))
    }

    /// Records a finished snapshot, within its owner's quota; removes it otherwise.
    pub fn finish(&self, meta: &SnapshotMeta) -> Result<(), SnapshotError> {
        let dir = self.root.join(&meta.snapshot_id);
        let used: u64 = self
            .list(&meta.owner)
            .iter()
            .filter(|m| m.snapshot_id != meta.snapshot_id)
            .map(|m| m.size_bytes)
            .sum();
        if used + meta.size_bytes > self.max_bytes {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(SnapshotError::Quota {
                size: meta.size_bytes,
                used,
                limit: self.max_bytes,
            });
        }
        let written = serde_json::to_vec_pretty(meta)
            .map_err(std::io::Error::other)
            .and_then(|b| write_atomic(&dir.join("meta.json"), &b));
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(SnapshotError::Io(e.to_string()));
        }
        Ok(())
    }

    /// Removes an unfinished snapshot's directory.
    pub fn abandon(&self, id: &str) {
        if valid_id(id) {
            let _ = std::fs::remove_dir_all(self.root.join(id));
        }
    }

    /// `owner`'s snapshots, oldest first. Unreadable ones are skipped.
    pub fn list(&self, owner: &str) -> Vec<SnapshotMeta> {
        let mut out: Vec<SnapshotMeta> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let id = e.file_name().to_string_lossy().into_owned();
                self.read(&id).filter(|m| m.owner == owner)
            })
            .collect();
        out.sort_by_key(|m| m.created_at_ms);
        out
    }

    fn read(&self, id: &str) -> Option<SnapshotMeta> {
        if !valid_id(id) {
            return None;
        }
        let bytes = std::fs::read(self.root.join(id).join("meta.json")).ok()?;
        serde_json::from_slice::<SnapshotMeta>(&bytes)
            .ok()
            .filter(|m| m.snapshot_id == id)
    }

    /// Snapshot `id` if `owner` owns it; another owner's is "not found".
    pub fn get(&self, id: &str, owner: &str) -> Result<(SnapshotMeta, PathBuf), SnapshotError> {
        self.read(id)
            .filter(|m| m.owner == owner)
            .map(|m| (m, self.root.join(id)))
            .ok_or_else(|| SnapshotError::NotFound(id.to_string()))
    }

    pub fn delete(&self, id: &str, owner: &str) -> Result<(), SnapshotError> {
        let (_, dir) = self.get(id, owner)?;
        std::fs::remove_dir_all(dir).map_err(|e| SnapshotError::Io(e.to_string()))
    }
}

/// The state file of `language` in a snapshot directory.
pub fn state_path(dir: &Path, language: Language) -> PathBuf {
    dir.join("state")
        .join(format!("{}.state", language.as_str()))
}

pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}
