//! Files: what a file costs on disk and who it is, private modes, opening a directory's entry
//! without following it, and writes that replace a file whole. Unix (Linux and macOS) gives all
//! of it; Windows has no block counts, no inode numbers from a listing and no modes, and each
//! has a named fallback here.

use std::ffi::OsStr;
use std::io;
use std::path::Path;

use cap_std::fs::{Dir, File};

/// What the disk accounting needs of an entry's metadata, from std or cap-std alike.
pub trait MetaExt {
    /// 512-byte blocks allocated. Windows: 0, so the cost is the size rounded up to blocks
    /// (a sparse file counts its whole length: more, never less).
    fn disk_blocks(&self) -> u64;
    /// Device and inode. Windows: none from a listing, so a file's other names are not
    /// recognised: each counts and copies as a file of its own (more, never less).
    fn file_id(&self) -> Option<(u64, u64)>;
    /// Names the file has. Windows: 1 (as above).
    fn link_count(&self) -> u64;
}

macro_rules! meta_ext {
    ($t:ty, $unix:path) => {
        impl MetaExt for $t {
            fn disk_blocks(&self) -> u64 {
                #[cfg(unix)]
                return <$t as $unix>::blocks(self);
                #[cfg(not(unix))]
                0
            }
            fn file_id(&self) -> Option<(u64, u64)> {
                #[cfg(unix)]
                return Some((<$t as $unix>::dev(self), <$t as $unix>::ino(self)));
                #[cfg(not(unix))]
                None
            }
            fn link_count(&self) -> u64 {
                #[cfg(unix)]
                return <$t as $unix>::nlink(self);
                #[cfg(not(unix))]
                1
            }
        }
    };
}
#[cfg(unix)]
meta_ext!(std::fs::Metadata, std::os::unix::fs::MetadataExt);
#[cfg(unix)]
meta_ext!(cap_std::fs::Metadata, cap_std::fs::MetadataExt);
#[cfg(not(unix))]
meta_ext!(std::fs::Metadata, std::any::Any);
#[cfg(not(unix))]
meta_ext!(cap_std::fs::Metadata, std::any::Any);

/// A directory only its owner may enter (0700). Windows: the parent's ACL, which under the
/// user's profile (where the data dir is) is the user's, SYSTEM's and administrators'.
pub fn private_dir(b: &mut std::fs::DirBuilder) {
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(b, 0o700);
    #[cfg(not(unix))]
    let _ = b;
}

/// A file only its owner may read (0600). Windows: as [`private_dir`].
pub fn private_file(o: &mut std::fs::OpenOptions) {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(o, 0o600);
    #[cfg(not(unix))]
    let _ = o;
}

/// Marks an unpacked program runnable (0755). Windows: nothing; a program is runnable by its
/// `.exe` name.
pub fn set_executable(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// An `open` that cannot block on a FIFO (`O_NONBLOCK`) or take a terminal (`O_NOCTTY`).
/// Windows: nothing; a directory holds no FIFOs (named pipes live in their own namespace).
pub fn no_block(o: &mut cap_std::fs::OpenOptions) {
    #[cfg(unix)]
    cap_std::fs::OpenOptionsExt::custom_flags(o, libc::O_NONBLOCK | libc::O_NOCTTY);
    #[cfg(not(unix))]
    let _ = o;
}

/// A file's mode as the tools show it (`0644`). Windows: `0444` or `0644` by its read-only
/// attribute.
pub fn mode_string(meta: &cap_std::fs::Metadata) -> String {
    #[cfg(unix)]
    {
        use cap_std::fs::PermissionsExt;
        format!("{:04o}", meta.permissions().mode() & 0o7777)
    }
    #[cfg(not(unix))]
    {
        if meta.permissions().readonly() {
            "0444".into()
        } else {
            "0644".into()
        }
    }
}

/// Opens `name`, one entry of `dir`'s listing, for reading, without following it if it is a
/// link and without blocking if it is a FIFO. A link (or an entry that is no longer what was
/// listed) fails with an error [`entry_changed`] recognises.
pub fn open_entry(dir: &Dir, name: &OsStr, directory: bool) -> io::Result<File> {
    let separators: &[char] = if cfg!(windows) { &['/', '\\'] } else { &['/'] };
    if name == ".." || name == "." || name.to_string_lossy().contains(separators) {
        // A listed name is one component; anything else would be resolved further.
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not one name"));
    }
    #[cfg(unix)]
    {
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(name.as_bytes())?;
        let mut flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NOCTTY;
        flags |= if directory {
            libc::O_DIRECTORY
        } else {
            libc::O_NONBLOCK
        };
        // SAFETY: an open descriptor and a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(File::from_std(unsafe { std::fs::File::from_raw_fd(fd) }))
    }
    #[cfg(windows)]
    {
        // The reparse point itself rather than its target; backup semantics to open a
        // directory at all. What was opened is then checked, as O_NOFOLLOW's ELOOP would.
        use cap_std::fs::OpenOptionsExt;
        use windows_sys::Win32::Storage::FileSystem::{
            FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT,
        };
        let mut o = cap_std::fs::OpenOptions::new();
        o.read(true)
            .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS);
        let f = dir.open_with(name, &o)?;
        let m = f.metadata()?;
        if m.file_type().is_symlink() || m.is_dir() != directory {
            return Err(io::Error::new(io::ErrorKind::NotADirectory, "changed"));
        }
        Ok(f)
    }
}

/// An [`open_entry`] (or a link read) that failed because the entry is no longer what its
/// listing said: a link now, gone, or another kind.
pub fn entry_changed(e: &io::Error) -> bool {
    #[cfg(unix)]
    return matches!(
        e.raw_os_error(),
        Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT)
    );
    #[cfg(not(unix))]
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// A link read that failed because the entry is not a link (any more).
pub fn not_a_link(e: &io::Error) -> bool {
    #[cfg(unix)]
    return e.raw_os_error() == Some(libc::EINVAL);
    #[cfg(not(unix))]
    matches!(e.kind(), io::ErrorKind::InvalidInput)
}

/// Makes `name` in `dir` a link to `target`, as a copy of a guest's link; false where a link
/// cannot be made without privileges (Windows): the copy leaves it out.
pub fn copy_link(dir: &Dir, target: &Path, name: &OsStr) -> io::Result<bool> {
    #[cfg(unix)]
    {
        dir.symlink_contents(target, name)?;
        Ok(true)
    }
    #[cfg(not(unix))]
    {
        let _ = (dir, target, name);
        Ok(false)
    }
}

/// Shares `from`'s blocks with the empty `out` (Linux's `FICLONE`, where the filesystem can).
/// False where it cannot, or elsewhere: the caller copies the bytes.
pub fn reflink(from: &File, out: &File) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: two open descriptors; FICLONE only reads `from` and fills `out`.
        unsafe { libc::ioctl(out.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (from, out);
        false
    }
}

/// Writes `path` so that a crash or a concurrent writer leaves the old or the new content,
/// never a mix: a temp file of a unique name beside it, synced, renamed over it, and the
/// directory synced so the rename itself survives a power cut.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_replacing(path, bytes, true)
}

/// As [`write_atomic`], synced to disk only with `sync`: without, a crash of the process still
/// leaves the old or the new content, and only a power cut may lose the write (see
/// [`sync_written`]).
pub fn write_replacing(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        "{name}.{}-{}.tmp",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        private_file(&mut o);
        let mut f = o.open(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if sync {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Syncs to disk what [`write_replacing`] wrote to `path` without syncing: the file, then its
/// directory (the rename).
pub fn sync_written(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::ambient_authority;

    fn dir() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let d = Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap();
        (t, d)
    }

    #[test]
    fn an_entry_opens_but_a_link_to_outside_does_not() {
        let (t, d) = dir();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "no").unwrap();
        std::fs::write(t.path().join("plain"), "yes").unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        let mut s = String::new();
        use std::io::Read;
        open_entry(&d, OsStr::new("plain"), false)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "yes");
        assert!(open_entry(&d, OsStr::new("sub"), true).is_ok());
        // The other kind than listed is refused as changed.
        let e = open_entry(&d, OsStr::new("plain"), true).unwrap_err();
        assert!(entry_changed(&e), "{e}");
        for bad in ["..", ".", "sub/../plain"] {
            assert!(open_entry(&d, OsStr::new(bad), false).is_err(), "{bad}");
        }
        if crate::testing::symlink(outside.path().join("secret"), t.path().join("f")) {
            let e = open_entry(&d, OsStr::new("f"), false).unwrap_err();
            assert!(entry_changed(&e), "a file link: {e}");
        }
        if crate::testing::symlink(outside.path(), t.path().join("d")) {
            let e = open_entry(&d, OsStr::new("d"), true).unwrap_err();
            assert!(entry_changed(&e), "a directory link: {e}");
        }
    }

    #[test]
    fn a_second_name_is_recognised_where_the_os_tells_and_never_counts_less() {
        let (t, d) = dir();
        std::fs::write(t.path().join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::hard_link(t.path().join("a"), t.path().join("b")).unwrap();
        let (a, b) = (d.metadata("a").unwrap(), d.metadata("b").unwrap());
        match (a.file_id(), b.file_id()) {
            (Some(x), Some(y)) => {
                assert_eq!(x, y);
                assert_eq!(a.link_count(), 2);
            }
            // Windows: each name counts as a file of its own.
            (None, None) => assert_eq!(a.link_count(), 1),
            other => panic!("{other:?}"),
        }
        // What a file costs is never less than its length.
        assert!(a.disk_blocks() * 512 >= 10_000 || a.disk_blocks() == 0);
    }

    #[test]
    fn private_files_and_directories_are_the_owners() {
        let t = tempfile::tempdir().unwrap();
        let mut b = std::fs::DirBuilder::new();
        private_dir(&mut b);
        b.create(t.path().join("d")).unwrap();
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        private_file(&mut o);
        o.open(t.path().join("d").join("token")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&t.path().join("d")), 0o700);
            assert_eq!(mode(&t.path().join("d").join("token")), 0o600);
        }
        let m = cap_std::fs::Dir::open_ambient_dir(t.path().join("d"), ambient_authority())
            .unwrap()
            .metadata("token")
            .unwrap();
        assert!(["0600", "0644"].contains(&mode_string(&m).as_str()));
    }
}
