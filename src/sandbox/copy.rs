//! Copying a sandbox's files (a fork, a snapshot, a sandbox made from a snapshot). The trees
//! were written by guests, so the walk follows no symlink (each is copied as a link, which
//! cap-std keeps inside the sandbox when a guest uses it), keeps no special file, needs no
//! recursion (nesting depth is the guest's choice) and stops at the quota.

use std::io;
use std::path::Path;

use crate::engine::disk::Quota;

/// What a copy wrote.
#[derive(Clone, Copy, Debug, Default)]
pub struct Copied {
    pub bytes: u64,
    pub entries: u64,
}

/// Copies the tree under `from` into `to` (which must exist), within `quota`. Regular files
/// share their blocks where the filesystem can (reflinks), and are copied otherwise.
pub fn copy_tree(from: &Path, to: &Path, quota: Quota) -> io::Result<Copied> {
    let mut done = Copied::default();
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            let ty = entry.file_type()?;
            let target = dst.join(entry.file_name());
            done.entries += 1;
            if done.entries > quota.max_entries {
                return Err(io::Error::other(format!(
                    "more than {} files and directories",
                    quota.max_entries
                )));
            }
            if ty.is_dir() {
                std::fs::create_dir(&target)?;
                stack.push((entry.path(), target));
            } else if ty.is_symlink() {
                let link = std::fs::read_link(entry.path())?;
                std::os::unix::fs::symlink(link, &target)?;
            } else if ty.is_file() {
                let size = entry.metadata()?.len();
                done.bytes += size;
                if done.bytes > quota.max_bytes {
                    return Err(io::Error::other(format!(
                        "more than {} bytes",
                        quota.max_bytes
                    )));
                }
                copy_file(&entry.path(), &target)?;
            } else {
                done.entries -= 1;
            }
        }
    }
    Ok(done)
}

/// One file: a reflink (`FICLONE`) where the filesystem shares blocks, else a copy (which
/// `copy_file_range` may still share on some filesystems).
fn copy_file(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let src = std::fs::File::open(from)?;
        let dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(to)?;
        // SAFETY: two open descriptors; FICLONE only reads `src` and fills `dst`.
        if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
            return Ok(());
        }
        drop(dst);
        std::fs::remove_file(to)?;
    }
    std::fs::copy(from, to).map(|_| ())
}

#[cfg(test)]
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
}
