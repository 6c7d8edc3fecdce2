//! Snapshots: a sandbox's files, env and saved sessions, kept under an id of their own so new
//! sandboxes can start from them (`create_sandbox(from_snapshot=...)`). Each lives in
//! `<snapshots>/<id>/` (`meta.json`, `workspace/`, `tmp/`, `state/`), private to this user,
//! owned like a sandbox, and charged what its directory costs on disk against its owner's
//! `WASMBOX_SNAPSHOT_DISK_MB` (see [`super::budget`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::budget::{self, Ledger, Over, Reservation};
use super::{from_unix_ms, unix_ms};
use crate::lang::Language;
use crate::platform::fs::write_atomic;

/// What `meta.json` of a snapshot keeps.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub snapshot_id: String,
    pub sandbox_id: String,
    pub owner: String,
    pub template: String,
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<crate::lang::python::PackageTree>,
    pub created_at_ms: u64,
    /// The languages whose sessions it holds.
    pub languages: Vec<Language>,
    /// Bytes of its files and saved sessions.
    pub size_bytes: u64,
    /// What its directory costs on disk (blocks and entries, [`budget::measure`]), but for
    /// this `meta.json`, whose own cost follows from its length. `None` in snapshots made
    /// before it was kept: measured when first counted.
    #[serde(default)]
    pub cost_bytes: Option<u64>,
    /// What its owner is charged for it: `cost_bytes` and this file.
    #[serde(skip)]
    pub charged_bytes: u64,
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
        "the snapshot would take {size} bytes on disk (blocks, and a block per file or directory), and this owner's snapshots and saved sessions already take {used} of {limit} (WASMBOX_SNAPSHOT_DISK_MB): delete some with delete_snapshot"
    )]
    Quota { size: u64, used: u64, limit: u64 },
    #[error("the snapshot could not be written: {0}")]
    Io(String),
}

impl From<Over> for SnapshotError {
    fn from(o: Over) -> Self {
        SnapshotError::Quota {
            size: o.need,
            used: o.used,
            limit: o.limit,
        }
    }
}

/// The snapshot store.
pub struct Snapshots {
    root: PathBuf,
    /// What one owner's snapshots and saved sessions may take together, and what copies and
    /// saves in flight have reserved of it.
    ledger: Arc<Ledger>,
    /// Finished snapshots' owners and charges, by id, each read once from its `meta.json`
    /// (another server on the same data directory may add some).
    known: Mutex<HashMap<String, (String, u64)>>,
}

/// Whether `id` has the shape of our snapshot ids (`ws` + 32 hex digits): safe as a path part.
fn valid_id(id: &str) -> bool {
    super::has_id_shape(id, "ws")
}

impl Snapshots {
    pub fn new(root: PathBuf, max_bytes: u64) -> Self {
        Self {
            root,
            ledger: Ledger::new(max_bytes),
            known: Mutex::new(HashMap::new()),
        }
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// What `owner`'s finished snapshots are charged, together.
    pub fn charged(&self, owner: &str) -> u64 {
        self.refresh()
            .values()
            .filter(|(o, _)| o == owner)
            .map(|(_, c)| *c)
            .sum()
    }

    /// What every owner's finished snapshots are charged, together (reads the directory).
    pub fn charged_total(&self) -> u64 {
        self.refresh().values().map(|(_, c)| *c).sum()
    }

    /// The known snapshots, brought up to date with the directory: gone ones dropped, new ones
    /// read. One without a `meta.json` is not finished (this server's are reserved meanwhile).
    fn refresh(&self) -> MutexGuard<'_, HashMap<String, (String, u64)>> {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let ids: std::collections::HashSet<String> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|id| valid_id(id))
            .collect();
        known.retain(|id, _| ids.contains(id));
        for id in ids {
            if known.contains_key(&id) {
                continue;
            }
            if let Some(m) = self.read(&id) {
                let charge = if m.cost_bytes.is_some() {
                    m.charged_bytes
                } else {
                    budget::measure(&self.root.join(&id)).unwrap_or(m.charged_bytes)
                };
                known.insert(id, (m.owner, charge));
            }
        }
        known
    }

    /// A new, empty snapshot directory and its id.
    pub fn start(&self) -> Result<(String, PathBuf), SnapshotError> {
        // 122 random bits: ids are capabilities, like sandbox ids.
        let id = format!("ws{}", uuid::Uuid::new_v4().simple());
        let dir = self.root.join(&id);
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        crate::platform::fs::private_dir(&mut b);
        for sub in ["workspace", "tmp", "state"] {
            b.create(dir.join(sub))
                .map_err(|e| SnapshotError::Io(e.to_string()))?;
        }
        Ok((id, dir))
    }

    /// Records a finished snapshot, whose copy `r` reserved room for: settled with what its
    /// directory measures, within its owner's budget (`states`: what the owner's saved
    /// sessions take, measured under the ledger's lock); removed otherwise.
    pub fn finish(
        &self,
        meta: &mut SnapshotMeta,
        r: &Reservation,
        states: impl FnOnce() -> u64,
    ) -> Result<(), SnapshotError> {
        let dir = self.root.join(&meta.snapshot_id);
        let fail = |e: SnapshotError| {
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        };
        let cost = match budget::measure(&dir) {
            Ok(c) => c,
            Err(e) => return fail(SnapshotError::Io(format!("measuring it: {e}"))),
        };
        meta.cost_bytes = Some(cost);
        let bytes = match serde_json::to_vec_pretty(meta) {
            Ok(b) => b,
            Err(e) => return fail(SnapshotError::Io(e.to_string())),
        };
        meta.charged_bytes = cost + budget::file_cost(bytes.len() as u64);
        let mut books = self.ledger.books();
        let used = self.charged(&meta.owner).saturating_add(states());
        if let Err(o) = books.fits(&meta.owner, used, meta.charged_bytes, Some(r)) {
            drop(books);
            return fail(o.into());
        }
        if let Err(e) = write_atomic(&dir.join("meta.json"), &bytes) {
            drop(books);
            return fail(SnapshotError::Io(e.to_string()));
        }
        self.known.lock().unwrap_or_else(|e| e.into_inner()).insert(
            meta.snapshot_id.clone(),
            (meta.owner.clone(), meta.charged_bytes),
        );
        books.release(r);
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
        let mut m = serde_json::from_slice::<SnapshotMeta>(&bytes)
            .ok()
            .filter(|m| m.snapshot_id == id)?;
        m.charged_bytes = m.cost_bytes.map_or(m.size_bytes, |c| {
            c.saturating_add(budget::file_cost(bytes.len() as u64))
        });
        Some(m)
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
        // Charged until it is gone.
        let removed = std::fs::remove_dir_all(dir).map_err(|e| SnapshotError::Io(e.to_string()));
        if removed.is_ok() {
            self.known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(id);
        }
        removed
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::disk::Quota;

    use crate::testing::Rng;

    fn meta(id: &str, owner: &str) -> SnapshotMeta {
        SnapshotMeta {
            snapshot_id: id.into(),
            sandbox_id: "sb".into(),
            owner: owner.into(),
            template: "python".into(),
            env: BTreeMap::new(),
            allow_hosts: None,
            packages: Vec::new(),
            created_at_ms: now_ms(),
            languages: Vec::new(),
            size_bytes: 0,
            cost_bytes: None,
            charged_bytes: 0,
        }
    }

    /// Snapshots of a tree that changes between them, made and deleted at random by two owners:
    /// after every step each owner's charge equals a fresh measurement of its snapshots'
    /// directories, and stays within the budget.
    #[test]
    fn the_charge_equals_a_fresh_measurement_after_random_snapshots_and_deletes() {
        for seed in [1u64, 7, 0x5eed] {
            let mut rng = Rng(seed);
            let d = tempfile::tempdir().unwrap();
            let src = d.path().join("src");
            std::fs::create_dir(&src).unwrap();
            let store = Snapshots::new(d.path().join("snapshots"), 600 * budget::BLOCK);
            let mut made: Vec<(String, &str)> = Vec::new();
            let mut refused = 0;
            for step in 0..40 {
                // The tree grows: directories, empty files, files of a few blocks.
                for i in 0..rng.below(12) {
                    let p = src.join(format!("{step}-{i}"));
                    match rng.below(3) {
                        0 => std::fs::create_dir(&p).unwrap(),
                        1 => std::fs::write(&p, b"").unwrap(),
                        _ => std::fs::write(&p, vec![7u8; rng.below(20_000) as usize]).unwrap(),
                    }
                }
                let owner = ["a", "b"][rng.below(2) as usize];
                if rng.below(3) == 0 && !made.is_empty() {
                    let (id, o) = made.swap_remove(rng.below(made.len() as u64) as usize);
                    store.delete(&id, o).unwrap();
                } else {
                    let estimate = budget::measure(&src).unwrap() + 4 * budget::file_cost(0);
                    let r = match store
                        .ledger()
                        .reserve(owner, estimate, || store.charged(owner))
                    {
                        Ok(r) => r,
                        Err(_) => {
                            refused += 1;
                            continue;
                        }
                    };
                    let (id, dir) = store.start().unwrap();
                    let quota = Quota {
                        max_bytes: 1 << 30,
                        max_entries: 1 << 20,
                    };
                    crate::sandbox::copy::copy_tree(&src, &dir.join("workspace"), quota).unwrap();
                    let mut m = meta(&id, owner);
                    match store.finish(&mut m, &r, || 0) {
                        Ok(()) => made.push((id, owner)),
                        Err(SnapshotError::Quota { .. }) => {
                            refused += 1;
                            assert!(!dir.exists(), "a refused snapshot is removed");
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                for o in ["a", "b"] {
                    let fresh: u64 = store
                        .list(o)
                        .iter()
                        .map(|m| budget::measure(&store.root.join(&m.snapshot_id)).unwrap())
                        .sum();
                    let charged = store.charged(o);
                    assert_eq!(charged, fresh, "seed {seed}, step {step}, owner {o}");
                    assert!(charged <= store.ledger().max(), "seed {seed}, step {step}");
                }
                // Nothing stays reserved once settled or dropped.
                assert!(store.ledger().reserve("a", 0, || 0).is_ok());
            }
            assert!(refused > 0, "seed {seed}: the budget was never reached");
            // A second store on the same directory (a restart) charges the same.
            let again = Snapshots::new(d.path().join("snapshots"), 600 * budget::BLOCK);
            for o in ["a", "b"] {
                assert_eq!(again.charged(o), store.charged(o));
            }
        }
    }
}
