//! Sandboxes that cannot be adopted are moved aside with the reason, never deleted: a
//! sandbox that cannot be read may still hold someone's work.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::Sandboxes;
use super::meta::valid_id;
use super::registry::Root;
use crate::engine::cpu::LOCAL_OWNER;
use crate::platform::fs::write_atomic;

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

impl Sandboxes {
    /// `<data>/quarantine`, beside `<data>/sandboxes`.
    pub(super) fn quarantine_root(&self) -> Option<PathBuf> {
        match &self.root {
            Root::Data(d) => d.parent().map(|p| p.join("quarantine")),
            Root::Temp(_) => None,
        }
    }

    /// Moves sandbox `id`'s directory (whose lock the caller holds) aside instead of deleting
    /// it: a sandbox that cannot be read may still hold someone's work.
    pub(super) fn quarantine(&self, id: &str, dir: &Path, why: &str) {
        let Some(root) = self.quarantine_root() else {
            return;
        };
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let dest = root.join(format!("{id}-{secs}"));
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        crate::platform::fs::private_dir(&mut b);
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
    pub(super) fn remove_quarantined(&self, id: &str, owner: &str) -> std::io::Result<bool> {
        let mut found = false;
        for q in self.quarantined(owner).into_iter().filter(|q| q.id == id) {
            std::fs::remove_dir_all(&q.path)?;
            tracing::info!(sandbox = %id, "quarantined sandbox {} deleted", q.path.display());
            found = true;
        }
        Ok(found)
    }
}
