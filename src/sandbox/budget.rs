//! What an owner's snapshots and saved sessions take on disk, charged at what they cost rather
//! than their files' bytes: blocks, and a fixed cost per entry, so that a tree of empty
//! directories or empty files is not free. Both count against the owner's
//! `WASMBOX_SNAPSHOT_DISK_MB`; a session's saved state is also capped on its own
//! (`WASMBOX_STATE_MB`). A [`Ledger`] holds what copies and saves in flight reserved, so that
//! concurrent ones cannot jointly pass the budget: each reserves before it writes and is settled
//! with the measured figure.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use crate::platform::fs::MetaExt;

use super::Sandboxes;

/// The allocation unit charged: what most filesystems give a directory or a non-empty file.
pub const BLOCK: u64 = 4096;
/// Charged per entry on top of its blocks (its inode and its name in the parent): an empty
/// directory or file is never free.
pub const PER_ENTRY: u64 = BLOCK;

/// Directories a walk holds open at once; deeper ones are opened by path from the deepest open.
const OPEN_DIRS: usize = 32;

/// What an entry of `size` bytes holding `blocks` 512-byte blocks costs: its blocks or its size
/// rounded up to [`BLOCK`]s, whichever is more, plus [`PER_ENTRY`].
pub fn cost(size: u64, blocks: u64) -> u64 {
    let data = size.div_ceil(BLOCK).saturating_mul(BLOCK);
    blocks
        .saturating_mul(512)
        .max(data)
        .saturating_add(PER_ENTRY)
}

/// What a file of `len` bytes will cost once written.
pub fn file_cost(len: u64) -> u64 {
    cost(len, 0)
}

fn entry_cost(m: &cap_std::fs::Metadata) -> u64 {
    cost(m.len(), m.disk_blocks())
}

/// What the directory `root` and everything under it costs (0 when it does not exist), a file
/// with several names counted as copies make it (its blocks once). Follows no link (a link is
/// an entry of its own), checks that each directory opened is the one that
/// was listed, and needs no recursion.
pub fn measure(root: &Path) -> io::Result<u64> {
    let top = match Dir::open_ambient_dir(root, ambient_authority()) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut total = entry_cost(&top.dir_metadata()?);
    let mut linked = std::collections::HashSet::new();
    struct Frame {
        /// An open ancestor (or the directory itself) and the path from it.
        anchor: Rc<Dir>,
        rel: PathBuf,
        depth: usize,
    }
    let mut stack = vec![Frame {
        anchor: Rc::new(top),
        rel: PathBuf::from("."),
        depth: 0,
    }];
    while let Some(f) = stack.pop() {
        let mut subdirs: Vec<(OsString, Option<(u64, u64)>)> = Vec::new();
        for e in f.anchor.read_dir(&f.rel)? {
            let e = e?;
            // Not followed: the entry's own metadata.
            let m = e.metadata()?;
            // A file's other names are copied as links: an entry each, its blocks once.
            let again = m.is_file()
                && m.link_count() > 1
                && m.file_id().is_some_and(|id| !linked.insert(id));
            let c = if again { PER_ENTRY } else { entry_cost(&m) };
            total = total.saturating_add(c);
            if m.is_dir() {
                subdirs.push((e.file_name(), m.file_id()));
            }
        }
        for (name, id) in subdirs {
            let rel = f.rel.join(&name);
            // A directory swapped for a link after it was listed is not walked.
            let opened = f.anchor.open_dir(&rel)?;
            let m = opened.dir_metadata()?;
            if m.file_id() != id {
                return Err(io::Error::other(format!(
                    "{} changed while it was measured",
                    rel.display()
                )));
            }
            stack.push(if f.depth % OPEN_DIRS == OPEN_DIRS - 1 {
                Frame {
                    anchor: Rc::new(opened),
                    rel: PathBuf::from("."),
                    depth: f.depth + 1,
                }
            } else {
                Frame {
                    anchor: f.anchor.clone(),
                    rel,
                    depth: f.depth + 1,
                }
            });
        }
    }
    Ok(total)
}

/// A reservation or settlement that does not fit: what it needed, what the owner's snapshots,
/// saved sessions and reservations took, and the limit.
#[derive(Clone, Copy, Debug)]
pub struct Over {
    pub need: u64,
    pub used: u64,
    pub limit: u64,
}

impl std::fmt::Display for Over {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it would take {} bytes on disk, and this owner's snapshots and saved sessions \
             already take {} of {} (WASMBOX_SNAPSHOT_DISK_MB): delete snapshots \
             (delete_snapshot) or sandboxes",
            self.need, self.used, self.limit
        )
    }
}

/// What each owner's copies and saves in flight have reserved, against one budget per owner.
pub struct Ledger {
    max: u64,
    pending: Mutex<HashMap<String, u64>>,
}

/// Room held for one owner's copy or save until it is settled (or dropped).
pub struct Reservation {
    ledger: Arc<Ledger>,
    owner: String,
    amount: AtomicU64,
    released: AtomicBool,
}

impl Reservation {
    pub fn amount(&self) -> u64 {
        self.amount.load(Ordering::Relaxed)
    }
}

/// The ledger, locked: what is reserved cannot change until it is dropped.
pub struct Books<'a> {
    max: u64,
    pending: MutexGuard<'a, HashMap<String, u64>>,
}

impl Ledger {
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(Self {
            max,
            pending: Mutex::new(HashMap::new()),
        })
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// Locks the ledger. What an owner's files take must be measured while it is held: a
    /// reservation is released only under it, after its files are written, so they are
    /// counted once or (conservatively) twice, never not at all.
    pub fn books(&self) -> Books<'_> {
        Books {
            max: self.max,
            pending: self.pending.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Holds `amount` for `owner` if it fits beside what the owner's files take (`used`,
    /// measured under the lock) and what is reserved.
    pub fn reserve(
        self: &Arc<Self>,
        owner: &str,
        amount: u64,
        used: impl FnOnce() -> u64,
    ) -> Result<Reservation, Over> {
        let mut books = self.books();
        books.fits(owner, used(), amount, None)?;
        *books.pending.entry(owner.to_string()).or_default() += amount;
        Ok(Reservation {
            ledger: self.clone(),
            owner: owner.to_string(),
            amount: AtomicU64::new(amount),
            released: AtomicBool::new(false),
        })
    }

    /// Adds `more` to `r` if it still fits.
    pub fn grow(&self, r: &Reservation, more: u64, used: impl FnOnce() -> u64) -> Result<(), Over> {
        let mut books = self.books();
        books.fits(&r.owner, used(), r.amount().saturating_add(more), Some(r))?;
        *books.pending.entry(r.owner.clone()).or_default() += more;
        r.amount.fetch_add(more, Ordering::Relaxed);
        Ok(())
    }
}

impl Books<'_> {
    /// Whether `amount` more fits for `owner`, whose files take `used`, besides what the owner
    /// has reserved (but for `except`).
    pub fn fits(
        &self,
        owner: &str,
        used: u64,
        amount: u64,
        except: Option<&Reservation>,
    ) -> Result<(), Over> {
        let reserved = self
            .pending
            .get(owner)
            .copied()
            .unwrap_or(0)
            .saturating_sub(except.map_or(0, |r| {
                if r.released.load(Ordering::Relaxed) {
                    0
                } else {
                    r.amount()
                }
            }));
        let used = used.saturating_add(reserved);
        if used.saturating_add(amount) > self.max {
            return Err(Over {
                need: amount,
                used,
                limit: self.max,
            });
        }
        Ok(())
    }

    /// Gives back what `r` held: its files now count as they are.
    pub fn release(&mut self, r: &Reservation) {
        if r.released.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(p) = self.pending.get_mut(&r.owner) {
            *p = p.saturating_sub(r.amount());
            if *p == 0 {
                self.pending.remove(&r.owner);
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.released.load(Ordering::Relaxed) {
            let ledger = self.ledger.clone();
            ledger.books().release(self);
        }
    }
}

/// Admits a session's state file before it is written (or refuses it, saying why): what it
/// returns holds the room until the file is in place.
pub trait StateGate: Send + Sync {
    fn admit(&self, path: &Path, bytes: u64) -> Result<Option<Reservation>, StateRefused>;
}

/// Why a session's state may not be saved.
#[derive(Clone, Copy, Debug, thiserror::Error)]
pub enum StateRefused {
    #[error(
        "its state would take {bytes} bytes, over the {max} one session may save \
         (WASMBOX_STATE_MB)"
    )]
    OverCap { bytes: u64, max: u64 },
    /// Over the owner's budget, saving a sandbox's own session.
    #[error("the saved state is refused: {0}")]
    Saved(Over),
    /// Over the owner's budget, saving a session into a snapshot.
    #[error("the snapshot is refused: {0}")]
    Snapshot(Over),
}

impl From<StateRefused> for String {
    fn from(e: StateRefused) -> Self {
        e.to_string()
    }
}

/// The one cap every saved session has, whatever else its gate checks.
fn within_cap(bytes: u64, max_state: u64) -> Result<(), StateRefused> {
    if bytes > max_state {
        return Err(StateRefused::OverCap {
            bytes,
            max: max_state,
        });
    }
    Ok(())
}

/// A sandbox's own state files: the per-session cap and the owner's budget.
pub struct OwnerGate {
    sandboxes: Arc<Sandboxes>,
    owner: String,
}

impl StateGate for OwnerGate {
    fn admit(&self, path: &Path, bytes: u64) -> Result<Option<Reservation>, StateRefused> {
        within_cap(bytes, self.sandboxes.config.max_state_bytes)?;
        let sbs = &self.sandboxes;
        sbs.snapshots
            .ledger()
            .reserve(&self.owner, file_cost(bytes), || {
                sbs.owner_used(&self.owner, Some(path))
            })
            .map(Some)
            .map_err(StateRefused::Saved)
    }
}

/// A session saved into a snapshot: the per-session cap, and the snapshot's reservation grown
/// by the file (settled with the snapshot).
pub struct SnapshotGate {
    pub sandboxes: Arc<Sandboxes>,
    pub reservation: Arc<Reservation>,
}

impl StateGate for SnapshotGate {
    fn admit(&self, _path: &Path, bytes: u64) -> Result<Option<Reservation>, StateRefused> {
        within_cap(bytes, self.sandboxes.config.max_state_bytes)?;
        let r = &self.reservation;
        self.sandboxes
            .snapshots
            .ledger()
            .grow(r, file_cost(bytes), || {
                self.sandboxes.owner_used(&r.owner, None)
            })
            .map(|()| None)
            .map_err(StateRefused::Snapshot)
    }
}

impl Sandboxes {
    /// What `owner`'s snapshots and sandboxes' saved sessions take on disk, but for the file at
    /// `except` (one about to be replaced). The state directories are the host's own: their
    /// entries are stat'ed, not walked.
    pub fn owner_used(&self, owner: &str, except: Option<&Path>) -> u64 {
        self.snapshots
            .charged(owner)
            .saturating_add(self.states_used(owner, except))
    }

    /// What `owner`'s sandboxes' saved sessions take, but for the file at `except`.
    pub fn states_used(&self, owner: &str, except: Option<&Path>) -> u64 {
        self.all()
            .iter()
            .filter(|sb| sb.owner == owner)
            .map(|sb| state_dir_cost(&sb.fs.host_root().join("state"), except))
            .sum()
    }

    /// The gate for saves into `owner`'s sandboxes.
    pub fn state_gate(self: &Arc<Self>, owner: &str) -> OwnerGate {
        OwnerGate {
            sandboxes: self.clone(),
            owner: owner.to_string(),
        }
    }
}

/// A state directory and its files (saved sessions, markers; their temporary files too).
fn state_dir_cost(dir: &Path, except: Option<&Path>) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut total = cost(m.len(), m.disk_blocks());
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if except.is_some_and(|p| p == e.path()) {
            continue;
        }
        if let Ok(m) = e.metadata() {
            total = total.saturating_add(cost(m.len(), m.disk_blocks()));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_directories_and_files_are_charged_and_links_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("t");
        std::fs::create_dir(&root).unwrap();
        let empty = measure(&root).unwrap();
        assert!(empty >= BLOCK + PER_ENTRY, "{empty}");
        for i in 0..10 {
            std::fs::create_dir(root.join(format!("d{i}"))).unwrap();
        }
        std::fs::write(root.join("e"), b"").unwrap();
        std::fs::write(root.join("one"), b"x").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        assert!(crate::testing::symlink(outside.path(), root.join("out")));
        let got = measure(&root).unwrap();
        // 10 directories (a block and an entry each), an empty file (an entry), a one-byte file
        // (a block and an entry), a link (at least an entry); nothing of what it points at.
        let least = empty + 10 * (BLOCK + PER_ENTRY) + PER_ENTRY + (BLOCK + PER_ENTRY) + PER_ENTRY;
        assert!(got >= least, "{got} < {least}");
        assert!(got < least + 4 * BLOCK, "{got}: the link was followed");
        assert_eq!(measure(&d.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn deep_trees_are_measured_without_recursion() {
        let d = tempfile::tempdir().unwrap();
        let mut p = d.path().to_path_buf();
        for _ in 0..200 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        assert!(measure(d.path()).unwrap() >= 201 * (BLOCK + PER_ENTRY));
    }

    #[test]
    fn reservations_cannot_jointly_pass_the_budget() {
        let ledger = Ledger::new(10 * BLOCK);
        let a = ledger.reserve("o", 6 * BLOCK, || 0).unwrap();
        assert!(ledger.reserve("o", 6 * BLOCK, || 0).is_err());
        // Another owner's budget is its own.
        let _b = ledger.reserve("p", 6 * BLOCK, || 0).unwrap();
        assert!(ledger.grow(&a, 5 * BLOCK, || 0).is_err());
        ledger.grow(&a, 4 * BLOCK, || 0).unwrap();
        assert!(ledger.reserve("o", 1, || 0).is_err());
        drop(a);
        let c = ledger.reserve("o", 10 * BLOCK, || 0).unwrap();
        // Released once its files count: they are then in `used`, not reserved.
        ledger.books().release(&c);
        assert!(ledger.reserve("o", 1, || 10 * BLOCK).is_err());
        ledger.reserve("o", 10 * BLOCK, || 0).unwrap();
    }
}
