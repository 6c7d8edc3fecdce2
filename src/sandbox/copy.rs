//! Copying a sandbox's files (a fork, a snapshot, a sandbox made from a snapshot). The trees
//! were written by guests, and a background job may change them while they are copied, so
//! nothing is reached by path: each entry is opened relative to its parent's descriptor with
//! `O_NOFOLLOW`, checked by `fstat` once open, and created relative to the destination's
//! descriptor with `O_EXCL`. A link is copied as a link (cap-std keeps it inside the sandbox
//! when a guest uses it), a special file is left out, and the walk stops at the quota and at
//! [`MAX_DEPTH`]. A file with several names is copied once and linked again under its other
//! names, as the disk budget counts it: its bytes once, each name an entry.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, FileType, OpenOptions};

use crate::engine::disk::{FileId, Quota};
use crate::platform::fs::{MetaExt, entry_changed as changed, open_entry as open_nofollow};

/// Deepest nesting copied. The walk holds two descriptors per level (the source and the
/// destination directory), so this bounds what one copy holds open; deeper fails like the quota.
pub const MAX_DEPTH: usize = 64;

/// What a copy wrote.
#[derive(Clone, Copy, Debug, Default)]
pub struct Copied {
    pub bytes: u64,
    pub entries: u64,
}

/// Copies the tree under `from` into `to` (which must exist), within `quota`. Regular files
/// share their blocks where the filesystem can (reflinks), and are copied otherwise.
pub fn copy_tree(from: &Path, to: &Path, quota: Quota) -> io::Result<Copied> {
    copy_tree_with(from, to, quota, &mut |_| {})
}

/// One directory being copied: what its listing held and is still to be copied.
struct Level {
    src: Dir,
    dst: Dir,
    rel: PathBuf,
    pending: Vec<(OsString, FileType)>,
}

/// [`copy_tree`], calling `between` with each entry's path (relative to `from`) after its
/// directory was listed and before it is opened: where a racing job would swap it.
fn copy_tree_with(
    from: &Path,
    to: &Path,
    quota: Quota,
    between: &mut dyn FnMut(&Path),
) -> io::Result<Copied> {
    let mut done = Copied::default();
    let src = Dir::open_ambient_dir(from, ambient_authority())?;
    let dst = Dir::open_ambient_dir(to, ambient_authority())?;
    let mut linked = Linked {
        root: dst.try_clone()?,
        first: HashMap::new(),
    };
    let mut stack = vec![list(src, dst, PathBuf::new(), &quota, &done)?];
    while let Some(level) = stack.last_mut() {
        let Some((name, listed)) = level.pending.pop() else {
            stack.pop();
            continue;
        };
        let rel = level.rel.join(&name);
        between(&rel);
        let Some((src, dst)) = copy_entry(level, &name, listed, &quota, &mut done, &mut linked)?
        else {
            continue;
        };
        if stack.len() > MAX_DEPTH {
            return Err(io::Error::other(format!(
                "directories nested more than {MAX_DEPTH} deep"
            )));
        }
        let next = list(src, dst, rel, &quota, &done)?;
        stack.push(next);
    }
    Ok(done)
}

/// Lists `src`, reading no more entries than the quota has left (a listing is sized by the
/// guest).
fn list(src: Dir, dst: Dir, rel: PathBuf, quota: &Quota, done: &Copied) -> io::Result<Level> {
    let room = quota.max_entries.saturating_sub(done.entries);
    let mut pending = Vec::new();
    for entry in src.entries()? {
        let entry = entry?;
        if pending.len() as u64 >= room.saturating_add(1) {
            break;
        }
        pending.push((entry.file_name(), entry.file_type()?));
    }
    pending.reverse();
    Ok(Level {
        src,
        dst,
        rel,
        pending,
    })
}

/// The files with several names copied so far: where each was first written, relative to the
/// destination's root, to link its other names to.
struct Linked {
    root: Dir,
    first: HashMap<FileId, PathBuf>,
}

/// Copies one entry of `level`; a directory comes back opened on both sides, to be walked.
/// An entry that is gone or changed into something the listing did not say is copied as what
/// it is now if that is a link, and otherwise left out: a job was changing it.
fn copy_entry(
    level: &Level,
    name: &OsStr,
    listed: FileType,
    quota: &Quota,
    done: &mut Copied,
    linked: &mut Linked,
) -> io::Result<Option<(Dir, Dir)>> {
    if listed.is_symlink() {
        copy_link(level, name, quota, done)?;
        return Ok(None);
    }
    if !listed.is_dir() && !listed.is_file() {
        return Ok(None);
    }
    let opened = match open_nofollow(&level.src, name, listed.is_dir()) {
        Ok(f) => f,
        Err(e) if changed(&e) => {
            if level
                .src
                .symlink_metadata(name)
                .is_ok_and(|m| m.file_type().is_symlink())
            {
                copy_link(level, name, quota, done)?;
            }
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let meta = opened.metadata()?;
    if meta.is_dir() && listed.is_dir() {
        count_entry(quota, done)?;
        level.dst.create_dir(name)?;
        let dst = Dir::from_std_file(open_nofollow(&level.dst, name, true)?.into_std());
        return Ok(Some((Dir::from_std_file(opened.into_std()), dst)));
    }
    if !meta.is_file() {
        return Ok(None);
    }
    count_entry(quota, done)?;
    if meta.link_count() > 1
        && let Some(id) = meta.file_id()
    {
        if let Some(first) = linked.first.get(&id) {
            return linked
                .root
                .hard_link(first, &level.dst, name)
                .map(|()| None);
        }
        linked.first.insert(id, level.rel.join(name));
    }
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    let out = level.dst.open_with(name, &o)?;
    let left = quota.max_bytes.saturating_sub(done.bytes);
    if meta.len() > left {
        return Err(over_bytes(quota));
    }
    let bytes = copy_file(opened, &out, left)?;
    if bytes > left {
        return Err(over_bytes(quota));
    }
    done.bytes += bytes;
    Ok(None)
}

/// Copies the link `name` as a link; one that is no longer a link (or gone) is left out.
fn copy_link(level: &Level, name: &OsStr, quota: &Quota, done: &mut Copied) -> io::Result<()> {
    let target = match level.src.read_link_contents(name) {
        Ok(t) => t,
        Err(e) if changed(&e) || crate::platform::fs::not_a_link(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    count_entry(quota, done)?;
    crate::platform::fs::copy_link(&level.dst, &target, name).map(|_| ())
}

fn count_entry(quota: &Quota, done: &mut Copied) -> io::Result<()> {
    done.entries += 1;
    if done.entries > quota.max_entries {
        return Err(io::Error::other(format!(
            "more than {} files and directories",
            quota.max_entries
        )));
    }
    Ok(())
}

fn over_bytes(quota: &Quota) -> io::Error {
    io::Error::other(format!("more than {} bytes", quota.max_bytes))
}

/// One file's bytes into `out`: a reflink (`FICLONE`) where the filesystem shares blocks, else
/// a copy of at most `left + 1` bytes (which `copy_file_range` may still share). Returns what
/// `out` holds.
fn copy_file(from: File, out: &File, left: u64) -> io::Result<u64> {
    if crate::platform::fs::reflink(&from, out) {
        return Ok(out.metadata()?.len());
    }
    let mut from = from.into_std().take(left.saturating_add(1));
    let mut out = out.try_clone()?.into_std();
    io::copy(&mut from, &mut out)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn quota(bytes: u64, entries: u64) -> Quota {
        Quota {
            max_bytes: bytes,
            max_entries: entries,
        }
    }

    #[test]
    fn copies_files_dirs_and_links_without_following_links() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        std::fs::create_dir_all(a.path().join("d/e")).unwrap();
        std::fs::write(a.path().join("d/e/f.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink(outside.path(), a.path().join("escape")).unwrap();
        let got = copy_tree(a.path(), b.path(), quota(1 << 20, 100)).unwrap();
        assert_eq!(std::fs::read(b.path().join("d/e/f.txt")).unwrap(), b"hello");
        assert!(
            std::fs::symlink_metadata(b.path().join("escape"))
                .unwrap()
                .file_type()
                .is_symlink(),
            "a link is copied as a link, not followed"
        );
        assert_eq!(got.bytes, 5);
        assert_eq!(got.entries, 4);
    }

    #[test]
    fn a_file_with_several_names_is_copied_once() {
        use std::os::unix::fs::MetadataExt as _;
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::create_dir(a.path().join("d")).unwrap();
        std::fs::write(a.path().join("f"), vec![7u8; 1000]).unwrap();
        for name in ["g", "d/h"] {
            std::fs::hard_link(a.path().join("f"), a.path().join(name)).unwrap();
        }
        // Three names of 1000 bytes each would pass a quota of 2000.
        let got = copy_tree(a.path(), b.path(), quota(2000, 100)).unwrap();
        assert_eq!((got.bytes, got.entries), (1000, 4));
        let ino = |p: &str| std::fs::metadata(b.path().join(p)).unwrap().ino();
        assert_eq!(ino("f"), ino("g"));
        assert_eq!(ino("f"), ino("d/h"));
        assert_eq!(
            std::fs::read(b.path().join("d/h")).unwrap(),
            vec![7u8; 1000]
        );
    }

    #[test]
    fn stops_at_the_quota() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("big"), vec![0u8; 4096]).unwrap();
        assert!(copy_tree(a.path(), b.path(), quota(1000, 100)).is_err());
        let c = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(a.path().join(i.to_string()), b"x").unwrap();
        }
        assert!(copy_tree(a.path(), c.path(), quota(1 << 20, 3)).is_err());
    }

    #[test]
    fn stops_at_the_depth_limit() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let deep: PathBuf = (0..MAX_DEPTH + 1).map(|_| "d").collect();
        std::fs::create_dir_all(a.path().join(&deep)).unwrap();
        let e = copy_tree(a.path(), b.path(), quota(1 << 20, 1000)).unwrap_err();
        assert!(e.to_string().contains("deep"), "{e}");
        let c = tempfile::tempdir().unwrap();
        let ok: PathBuf = (0..MAX_DEPTH).map(|_| "d").collect();
        std::fs::remove_dir_all(a.path().join("d")).unwrap();
        std::fs::create_dir_all(a.path().join(&ok)).unwrap();
        copy_tree(a.path(), c.path(), quota(1 << 20, 1000)).unwrap();
        assert!(c.path().join(&ok).is_dir());
    }

    /// Everything under `dir`, read without following links: what a copy wrote there.
    fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let ty = e.file_type().unwrap();
                if ty.is_dir() {
                    stack.push(e.path());
                } else if ty.is_file() {
                    out.push((e.path(), std::fs::read(e.path()).unwrap()));
                }
            }
        }
        out
    }

    /// A job swaps entries for links that climb out, between the listing and the open, in
    /// the source (a file and a directory) and in the destination (a directory being filled).
    #[test]
    fn entries_swapped_for_outward_links_mid_copy_reach_nothing_outside() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let (secret, landing) = (
            outside.path().join("secret"),
            outside.path().join("landing"),
        );
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("key"), b"host secret").unwrap();
        std::fs::create_dir(&landing).unwrap();
        std::fs::write(a.path().join("f"), b"guest file").unwrap();
        std::fs::create_dir(a.path().join("sub")).unwrap();
        std::fs::write(a.path().join("sub/inner"), b"guest inner").unwrap();
        std::fs::create_dir(a.path().join("out")).unwrap();
        std::fs::write(a.path().join("out/x"), b"written where?").unwrap();
        let climb = |to: &Path| {
            let mut p: PathBuf = (0..40).map(|_| "..").collect();
            p.push(to.strip_prefix("/").unwrap());
            p
        };
        let (src, dst) = (a.path().to_path_buf(), b.path().to_path_buf());
        let mut swapped = Vec::new();
        let mut between = |rel: &Path| {
            let name = rel.to_str().unwrap();
            match name {
                "f" => {
                    std::fs::remove_file(src.join("f")).unwrap();
                    std::os::unix::fs::symlink(climb(&secret.join("key")), src.join("f")).unwrap();
                }
                "sub" => {
                    std::fs::rename(src.join("sub"), src.join("sub.moved")).unwrap();
                    std::os::unix::fs::symlink(climb(&secret), src.join("sub")).unwrap();
                }
                // `out` was made in the destination; its entries are not written yet.
                "out/x" => {
                    std::fs::rename(dst.join("out"), dst.join("out.moved")).unwrap();
                    std::os::unix::fs::symlink(climb(&landing), dst.join("out")).unwrap();
                }
                _ => return,
            }
            swapped.push(name.to_string());
        };
        let r = copy_tree_with(a.path(), b.path(), quota(1 << 20, 100), &mut between);
        swapped.sort();
        assert_eq!(swapped, ["f", "out/x", "sub"], "every swap ran: {r:?}");
        for (path, bytes) in contents(b.path()) {
            assert_ne!(
                bytes,
                b"host secret",
                "{} holds a host file",
                path.display()
            );
        }
        assert!(
            std::fs::read_dir(&landing).unwrap().next().is_none(),
            "the copy wrote outside its destination"
        );
        // What it copied of the swapped entries is the links themselves.
        if r.is_ok() {
            for name in ["f", "sub"] {
                let m = std::fs::symlink_metadata(b.path().join(name)).unwrap();
                assert!(m.file_type().is_symlink(), "{name}");
            }
            assert_eq!(
                std::fs::read(b.path().join("out.moved/x")).unwrap(),
                b"written where?"
            );
        }
    }
}
