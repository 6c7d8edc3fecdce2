//! Scratch directories: a one-shot's private `/workspace` and `/tmp`, under one root per
//! process that is removed at exit (and by the next server, when a process dies without exiting).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{LangError as Error, Result};

/// A one-shot's own `/workspace` and `/tmp`. Making and removing two directories costs about
/// a quarter of a millisecond on ext4 (a tenth of a one-shot's CPU), so a pair its guest left
/// empty is kept for a later one-shot; a pair with anything in it is removed.
pub(super) struct Scratch {
    /// `/workspace` and `/tmp`; taken out only when dropped.
    dirs: Option<(tempfile::TempDir, tempfile::TempDir)>,
}

/// Empty pairs kept for reuse (more are removed).
const SPARE_SCRATCH: usize = 32;
type Pair = (tempfile::TempDir, tempfile::TempDir);
static SPARE: std::sync::Mutex<Vec<Pair>> = std::sync::Mutex::new(Vec::new());

impl Scratch {
    pub(super) fn take() -> Result<Self> {
        let spare = SPARE.lock().unwrap().pop();
        let dirs = match spare {
            Some(pair) => pair,
            None => (scratch_dir("wasmbox-ws-")?, scratch_dir("wasmbox-tmp-")?),
        };
        Ok(Self { dirs: Some(dirs) })
    }

    pub(super) fn paths(&self) -> (&Path, &Path) {
        let (w, t) = self.dirs.as_ref().expect("taken only when dropped");
        (w.path(), t.path())
    }
}

/// Whether a directory can serve another guest: it is empty. (Its times then tell only of its
/// last change, moments before a fresh one would have been made.)
fn reusable(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(pair) = self.dirs.take() else { return };
        if !(reusable(pair.0.path()) && reusable(pair.1.path())) {
            return; // each TempDir removes itself
        }
        let mut spare = SPARE.lock().unwrap();
        let extra = if spare.len() < SPARE_SCRATCH {
            spare.push(pair);
            None
        } else {
            Some(pair)
        };
        drop(spare);
        drop(extra); // removed after the lock is released
    }
}

/// An empty directory that stays empty (guests get it read-only): what a mount slot shows when
/// nothing is lent there.
pub(crate) fn empty_dir() -> Result<&'static Path> {
    static EMPTY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    if let Some(dir) = EMPTY.get() {
        return Ok(dir);
    }
    let dir = scratch_root()?.join("empty");
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(&dir, e)),
    }
    Ok(EMPTY.get_or_init(|| dir))
}

/// A fresh private directory, removed when dropped.
fn scratch_dir(prefix: &str) -> Result<tempfile::TempDir> {
    let root = scratch_root()?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(root)
        .map_err(|e| Error::io(root, e))
}

/// The directory all of this process's scratch directories (and, without a data directory, its
/// sandboxes) live in: `wasmbox-run-<pid>-*` in the temp dir. It is removed at exit, with
/// whatever ready instances and spare pairs still hold; roots of processes that died without
/// exiting are removed by the next to start.
pub(crate) fn scratch_root() -> Result<&'static Path> {
    static ROOT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    /// Set as the process exits: threads still at work (a pool's refill) make nothing more
    /// under the root while it is removed.
    static LEAVING: AtomicBool = AtomicBool::new(false);
    if let Some(root) = ROOT.get() {
        if LEAVING.load(Ordering::Acquire) {
            return Err(Error::io(
                root,
                std::io::Error::other("the server is exiting"),
            ));
        }
        return Ok(root);
    }
    let tmp = std::env::temp_dir();
    remove_stale_roots(&tmp);
    let made = tempfile::Builder::new()
        .prefix(&format!("wasmbox-run-{}-", std::process::id()))
        .tempdir_in(&tmp)
        .map_err(|e| Error::io(&tmp, e))?
        .keep();
    let root = ROOT.get_or_init(|| made.clone());
    if *root == made {
        extern "C" fn remove_root() {
            LEAVING.store(true, Ordering::Release);
            let Some(root) = ROOT.get() else { return };
            // A thread that took the root just before may still add a directory while it
            // goes (the removal then finds the root not empty): a few more tries.
            for _ in 0..20 {
                match std::fs::remove_dir_all(root) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    _ => return,
                }
            }
        }
        crate::platform::process::at_exit(remove_root);
    } else {
        // Another thread won the race; ours is unused.
        let _ = std::fs::remove_dir(&made);
    }
    Ok(root)
}

/// Removes the scratch roots of processes that are gone (killed, or crashed).
fn remove_stale_roots(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("wasmbox-run-"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if crate::platform::process::process_gone(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
