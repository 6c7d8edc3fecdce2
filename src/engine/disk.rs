//! Disk budgets: what guests may hold on the host, counted as it is written.
//!
//! A budget covers the host directories a guest can write (a sandbox's `/workspace` and `/tmp`,
//! or a one-shot's pair of scratch dirs). Every change that can add bytes or entries reserves
//! room first, so concurrent writers (guests of one sandbox, the file tools) cannot jointly pass
//! one check. The count is an upper bound: deletions the write path does not see keep counting
//! until a walk of the directories (made only when a reservation would not fit) corrects it.
//! Sizes are apparent sizes: a sparse file claims all it says.
//!
//! Bytes belong to files, not names: a file's bytes count once however many hard links it has,
//! entries count once per name. So a new link adds an entry and no bytes, and removing a name
//! frees bytes only when it was the file's last (a rename onto the same file frees nothing).
//! What a change did is read from the file's identity before and after it, under
//! [`DiskBudget::change`], which keeps the budget's other writers from changing the same files
//! in between.
//!
//! A file deleted while a guest holds it open is invisible to a walk but still on disk; the
//! budget keeps the open files' identities, and such "orphans" stay counted until closed.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use crate::platform::fs::MetaExt;

/// The most a budget's directories may hold.
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    pub max_bytes: u64,
    /// Files and directories.
    pub max_entries: u64,
}

/// A file by identity: (device, inode).
pub type FileId = (u64, u64);

/// Directories a walk holds open at once; deeper ones are read by path from the deepest open.
const OPEN_DIRS: usize = 32;

/// A reservation that does not fit: what the directories would hold with it.
#[derive(Clone, Debug)]
pub struct Over {
    pub bytes: u64,
    pub entries: u64,
    pub quota: Quota,
    /// The walk failed (unreadable or too deep): counted as over.
    pub unmeasured: bool,
    /// The lent folder that is full and the room guests had in it past what it held when it was
    /// lent (`None`: a sandbox's or one-shot's own directories).
    pub folder: Option<(Arc<str>, Quota)>,
}

pub struct DiskBudget {
    roots: Vec<PathBuf>,
    quota: Quota,
    /// A lent folder's guest path and room, for what a refusal says.
    folder: Option<(Arc<str>, Quota)>,
    state: Mutex<Count>,
    /// Held by a writer from its look at the files before a change to its look after.
    changing: Mutex<()>,
}

#[derive(Default)]
struct Count {
    /// The last walk's bytes and entries, plus every change since, plus what is reserved.
    bytes: u64,
    entries: u64,
    /// Reserved for changes in progress (counted in `bytes` and `entries` too): a walk made
    /// meanwhile may or may not see them, so they are added to what it finds.
    pending_bytes: u64,
    pending_entries: u64,
    /// No walk yet: the count is unknown.
    stale: bool,
    /// Guests' open regular files, with how many descriptors hold each.
    open: HashMap<FileId, u32>,
    /// Open files whose last name is gone, and their sizes: on disk until closed, unseen by walks.
    orphans: HashMap<FileId, u64>,
}

impl Count {
    fn orphan_bytes(&self) -> u64 {
        self.orphans.values().sum()
    }
}

impl DiskBudget {
    /// A budget over `roots` whose contents are not known yet (measured at the first need).
    pub fn new(roots: Vec<PathBuf>, quota: Quota) -> Arc<Self> {
        Self::with(roots, quota, true)
    }

    /// A budget over empty directories.
    pub fn empty(roots: Vec<PathBuf>, quota: Quota) -> Arc<Self> {
        Self::with(roots, quota, false)
    }

    /// A budget over lent folder `folder` at `root` that lets it grow by `room` past what it
    /// holds now (its owner's files are theirs; only what guests add is bounded). Walks it once.
    pub fn growth(root: PathBuf, folder: &str, room: Quota) -> io::Result<Arc<Self>> {
        let roots = vec![root];
        let mut linked = HashSet::new();
        let (mut bytes, mut entries) = (0u64, 0u64);
        for root in &roots {
            let (b, e) = walk(root, u64::MAX, &mut linked)?;
            bytes = bytes.saturating_add(b);
            entries = entries.saturating_add(e);
        }
        let quota = Quota {
            max_bytes: bytes.saturating_add(room.max_bytes),
            max_entries: entries.saturating_add(room.max_entries),
        };
        Ok(Arc::new(Self {
            roots,
            quota,
            folder: Some((folder.into(), room)),
            state: Mutex::new(Count {
                bytes,
                entries,
                ..Count::default()
            }),
            changing: Mutex::new(()),
        }))
    }

    fn with(roots: Vec<PathBuf>, quota: Quota, stale: bool) -> Arc<Self> {
        Arc::new(Self {
            roots,
            quota,
            folder: None,
            state: Mutex::new(Count {
                stale,
                ..Count::default()
            }),
            changing: Mutex::new(()),
        })
    }

    /// Held while a writer looks at what a change will replace, makes it and counts it: the
    /// budget's other writers (guests of the same sandbox, the file tools) wait, so what it saw
    /// before is still so when it changes it.
    pub fn change(&self) -> MutexGuard<'_, ()> {
        self.changing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes and entries as counted now (reservations included), without a walk.
    pub fn counted(&self) -> (u64, u64) {
        let c = self.state.lock().unwrap();
        (c.bytes, c.entries)
    }

    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Room for up to `bytes` more bytes and `entries` more entries, held until the
    /// [`Reservation`] is settled with what the change really did.
    pub fn reserve(&self, bytes: u64, entries: u64) -> Result<Reservation<'_>, Over> {
        let mut c = self.state.lock().unwrap();
        let fits = |c: &Count| {
            c.bytes.saturating_add(bytes) <= self.quota.max_bytes
                && c.entries.saturating_add(entries) <= self.quota.max_entries
        };
        if c.stale || !fits(&c) {
            self.walk_locked(&mut c)?;
            if !fits(&c) {
                let mut over = self.over(&c, false);
                over.bytes = over.bytes.saturating_add(bytes);
                over.entries = over.entries.saturating_add(entries);
                return Err(over);
            }
        }
        c.bytes += bytes;
        c.entries += entries;
        c.pending_bytes += bytes;
        c.pending_entries += entries;
        Ok(Reservation {
            budget: self,
            bytes,
            entries,
            settled: false,
        })
    }

    /// Counts a change the write path saw after the fact (never refused: it has happened).
    pub fn changed(&self, bytes: i64, entries: i64) {
        let mut c = self.state.lock().unwrap();
        c.bytes = c.bytes.saturating_add_signed(bytes);
        c.entries = c.entries.saturating_add_signed(entries);
    }

    /// Bytes and entries held now, measured (one directory at a time).
    pub fn usage(&self) -> io::Result<(u64, u64)> {
        let mut total = (0, 0);
        let mut linked = HashSet::new();
        for root in &self.roots {
            let (b, e) = walk(root, u64::MAX, &mut linked)?;
            total.0 += b;
            total.1 += e;
        }
        let orphans = self.state.lock().unwrap().orphan_bytes();
        Ok((total.0 + orphans, total.1))
    }

    /// Whether more is held than the quota allows: the count, confirmed by a walk when it
    /// says so.
    pub fn over_quota(&self) -> Option<Over> {
        let mut c = self.state.lock().unwrap();
        let over = |c: &Count| c.bytes > self.quota.max_bytes || c.entries > self.quota.max_entries;
        if !c.stale && !over(&c) {
            return None;
        }
        if let Err(o) = self.walk_locked(&mut c) {
            return Some(o);
        }
        over(&c).then(|| self.over(&c, false))
    }

    fn over(&self, c: &Count, unmeasured: bool) -> Over {
        Over {
            bytes: c.bytes,
            entries: c.entries,
            quota: self.quota,
            unmeasured,
            folder: self.folder.clone(),
        }
    }

    /// Replaces the count with a walk's, plus what is reserved and orphaned. A walk that fails
    /// counts as over: the budget cannot tell, and the guest's own tree made it so.
    fn walk_locked(&self, c: &mut Count) -> Result<(), Over> {
        let stop_above = self.quota.max_entries.saturating_add(1);
        let mut bytes = 0u64;
        let mut entries = 0u64;
        let mut linked = HashSet::new();
        for root in &self.roots {
            match walk(root, stop_above.saturating_sub(entries), &mut linked) {
                Ok((b, e)) => {
                    bytes = bytes.saturating_add(b);
                    entries += e;
                }
                Err(e) => {
                    tracing::debug!("measuring {}: {e}", root.display());
                    c.stale = true;
                    return Err(self.over(c, true));
                }
            }
        }
        c.bytes = bytes
            .saturating_add(c.pending_bytes)
            .saturating_add(c.orphan_bytes());
        c.entries = entries.saturating_add(c.pending_entries);
        c.stale = false;
        Ok(())
    }

    /// A guest opened `id` (a regular file).
    pub fn opened(&self, id: FileId) {
        *self.state.lock().unwrap().open.entry(id).or_default() += 1;
    }

    /// A guest closed a descriptor of `id`; an orphan's bytes are freed with its last one.
    pub fn closed(&self, id: FileId) {
        let mut c = self.state.lock().unwrap();
        let Some(n) = c.open.get_mut(&id) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            c.open.remove(&id);
            if let Some(size) = c.orphans.remove(&id) {
                c.bytes = c.bytes.saturating_sub(size);
            }
        }
    }

    /// A name of `id` (`size` bytes) is gone. Its bytes go with its last name, unless a guest
    /// holds the file open: then they stay on disk, out of a walk's sight, until it is closed.
    pub fn unlinked(&self, id: FileId, size: u64, last_name: bool) {
        let mut c = self.state.lock().unwrap();
        c.entries = c.entries.saturating_sub(1);
        if !last_name {
            return;
        }
        if c.open.contains_key(&id) {
            c.orphans.insert(id, size);
        } else {
            c.bytes = c.bytes.saturating_sub(size);
        }
    }

    /// An orphan's size changed by a write.
    pub fn orphan_resized(&self, id: FileId, size: u64) {
        let mut c = self.state.lock().unwrap();
        if let Some(s) = c.orphans.get_mut(&id) {
            *s = size;
        } else if c.open.contains_key(&id) {
            // Unlinked by a path the budget did not see (another budget's guest, or the host).
            c.orphans.insert(id, size);
        }
    }
}

/// Room held for a change; [`Reservation::settle`] says what the change did.
pub struct Reservation<'a> {
    budget: &'a DiskBudget,
    bytes: u64,
    entries: u64,
    settled: bool,
}

impl Reservation<'_> {
    /// The change is done: it added `bytes` and `entries` (negative: it freed some).
    pub fn settle(mut self, bytes: i64, entries: i64) {
        self.settled = true;
        let mut c = self.budget.state.lock().unwrap();
        c.pending_bytes -= self.bytes;
        c.pending_entries -= self.entries;
        c.bytes = c
            .bytes
            .saturating_sub(self.bytes)
            .saturating_add_signed(bytes);
        c.entries = c
            .entries
            .saturating_sub(self.entries)
            .saturating_add_signed(entries);
    }
}

impl Drop for Reservation<'_> {
    /// Unsettled (the change failed midway): what was reserved stays counted until a walk.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut c = self.budget.state.lock().unwrap();
        c.pending_bytes -= self.bytes;
        c.pending_entries -= self.entries;
    }
}

/// Apparent bytes of regular files (once per file, however many names it has) and number of
/// entries (symlinks are entries, not followed) under `root`, reading one directory at a time
/// (no path grows past `PATH_MAX`, at most [`OPEN_DIRS`] descriptors held). Stops once more
/// than `stop_above` entries are seen. `linked` holds the files with several names seen so far
/// (by this walk or one of another root), whose bytes are not counted again.
fn walk(root: &Path, stop_above: u64, linked: &mut HashSet<FileId>) -> io::Result<(u64, u64)> {
    struct Frame {
        /// An open ancestor (or the directory itself) and the path from it.
        anchor: Rc<Dir>,
        rel: PathBuf,
        depth: usize,
    }
    let top = Rc::new(Dir::open_ambient_dir(root, ambient_authority())?);
    let mut stack = vec![Frame {
        anchor: top,
        rel: PathBuf::from("."),
        depth: 0,
    }];
    let (mut bytes, mut entries) = (0u64, 0u64);
    while let Some(f) = stack.pop() {
        let mut subdirs: Vec<OsString> = Vec::new();
        for e in f.anchor.read_dir(&f.rel)? {
            let e = e?;
            entries += 1;
            if entries > stop_above {
                return Ok((bytes, entries));
            }
            let ft = e.file_type()?;
            if ft.is_dir() {
                subdirs.push(e.file_name());
            } else if ft.is_file() {
                let m = e.metadata()?;
                let again = m.link_count() > 1 && m.file_id().is_some_and(|id| !linked.insert(id));
                if !again {
                    bytes = bytes.saturating_add(m.len());
                }
            }
        }
        for name in subdirs {
            let child = if f.depth % OPEN_DIRS == OPEN_DIRS - 1 {
                Frame {
                    anchor: Rc::new(f.anchor.open_dir(f.rel.join(&name))?),
                    rel: PathBuf::from("."),
                    depth: f.depth + 1,
                }
            } else {
                Frame {
                    anchor: f.anchor.clone(),
                    rel: f.rel.join(&name),
                    depth: f.depth + 1,
                }
            };
            stack.push(child);
        }
    }
    Ok((bytes, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(max_bytes: u64, max_entries: u64) -> Quota {
        Quota {
            max_bytes,
            max_entries,
        }
    }

    #[test]
    fn reservations_cannot_jointly_pass_one_check() {
        let d = tempfile::tempdir().unwrap();
        let b = DiskBudget::new(vec![d.path().into()], quota(100, 10));
        let r1 = b.reserve(60, 1).unwrap();
        assert!(
            b.reserve(60, 1).is_err(),
            "the first reservation still holds"
        );
        r1.settle(60, 1);
        // Settled but not on disk: the count says 60, a walk says 0.
        let r2 = b.reserve(60, 1).unwrap();
        r2.settle(60, 1);
        assert!(b.reserve(0, 9).is_ok());
    }

    #[test]
    fn a_walk_counts_apparent_sizes_and_entries_deep_down() {
        let d = tempfile::tempdir().unwrap();
        let mut p = d.path().to_path_buf();
        for i in 0..(OPEN_DIRS * 3) {
            p.push(format!("d{i}"));
        }
        std::fs::create_dir_all(&p).unwrap();
        let f = std::fs::File::create(p.join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        let b = DiskBudget::new(vec![d.path().into()], quota(1 << 30, 1000));
        let (bytes, entries) = b.usage().unwrap();
        assert_eq!(bytes, 1 << 40);
        assert_eq!(entries, OPEN_DIRS as u64 * 3 + 1);
        assert!(b.over_quota().is_some());
        assert!(b.reserve(1, 0).is_err());
    }

    #[test]
    fn orphans_count_until_closed() {
        let d = tempfile::tempdir().unwrap();
        let b = DiskBudget::empty(vec![d.path().into()], quota(100, 10));
        let id = (1, 2);
        b.reserve(80, 1).unwrap().settle(80, 1);
        b.opened(id);
        b.unlinked(id, 80, true);
        // A walk sees nothing, but the orphan's 80 bytes still count.
        assert!(b.reserve(30, 0).is_err());
        b.closed(id);
        assert!(b.reserve(30, 0).is_ok());
    }
}
