//! A sandbox's workspace as the host sees it: a directory opened once as a cap-std [`Dir`], so
//! every host-side file operation resolves inside it by construction. A guest path is
//! `/workspace/...` or relative to it; anything else, a `..` that climbs out, or a symlink that
//! leads out is refused with an error that names the rule. A quota (bytes and entries) holds for
//! the file tools and, checked while they run, for guests.
//!
//! Reads are sized by the caller, never by the file: a guest can make a sparse file that claims a
//! terabyte, and the host may hold a FIFO or a device in a workspace. Only regular files are
//! opened for reading, and every read goes through `take`.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder, File, OpenOptions};
use serde::Serialize;

use crate::lang::guest::WORKSPACE_GUEST;

use super::host_folders::{lent_at, list_slot};
pub use crate::engine::disk::Quota;
use crate::engine::disk::{DiskBudget, Over};
pub use crate::fit::{json_prefix, text_window};

/// What went wrong with a file operation, in terms the caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(
        "path {0:?} is outside the sandbox: use a path under /workspace (absolute, or relative to it){lent}; '..' may not climb out of it",
        lent = crate::lang::mounts::server_layout().places()
    )]
    Escape(String),
    #[error("path {0:?} leads outside the sandbox through a symlink; refused")]
    SymlinkEscape(String),
    #[error("File not found: {0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsADirectory(String),
    #[error("{0} is in a folder the server lends read-only; nothing there can be changed")]
    ReadOnly(String),
    #[error("{0} is not a directory")]
    NotADirectory(String),
    #[error(
        "{path}: disk quota exceeded: /workspace and /tmp would hold {would} of their {limit} allowed {what}; remove files (file_remove) first"
    )]
    Quota {
        path: String,
        what: &'static str,
        would: u64,
        limit: u64,
    },
    #[error(
        "{path}: the lent folder {folder} is full: it would hold {would} {what}, and {limit} are allowed (what it held when the server started, plus WASMBOX_MOUNT_DISK_MB and WASMBOX_MOUNT_FILES); remove files there first"
    )]
    MountFull {
        path: String,
        folder: String,
        what: &'static str,
        would: u64,
        limit: u64,
    },
    #[error("{0} is not UTF-8 text; use file_download to get its bytes as base64")]
    NotText(String),
    #[error(
        "{0} is not a regular file (a FIFO, socket or device); the file tools read and write regular files only"
    )]
    NotRegular(String),
    #[error("{path} is too large: {size} bytes, and at most {limit} are allowed")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A resolved path: relative to the workspace root ("." for the root), and its guest form.
#[derive(Clone, Debug)]
pub struct GuestPath {
    pub(super) rel: PathBuf,
    pub(super) guest: String,
    /// A lent folder's index in the server's mounts (`None`: the workspace).
    pub(super) mount: Option<usize>,
}

impl GuestPath {
    pub fn guest(&self) -> &str {
        &self.guest
    }

    /// The path relative to the workspace root ("." for the root), as the `Dir` is given it.
    #[doc(hidden)]
    pub fn rel(&self) -> &Path {
        &self.rel
    }
}

/// Part of a file, as read: never more than the caller asked for, whatever size the file claims.
#[derive(Clone, Debug)]
pub struct Window<T> {
    pub data: T,
    /// Where `data` starts in the file.
    pub offset: u64,
    /// The file's size when it was opened.
    pub size: u64,
    /// Whether the file goes on after `data`.
    pub truncated: bool,
}

impl<T: AsRef<[u8]>> Window<T> {
    /// Where the next window starts.
    pub fn next_offset(&self) -> u64 {
        self.offset + self.data.as_ref().len() as u64
    }
}

/// One directory entry, in the shape of HOPX's `file_list`.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub name: String,
    pub path: String,
    pub size: u64,
    pub is_directory: bool,
    pub modified_time: Option<String>,
    pub permissions: String,
}

/// The workspace of one sandbox.
pub struct Workspace {
    /// Host directory holding `workspace/` and `tmp/`; removed with the sandbox.
    pub(super) root: PathBuf,
    pub(super) dir: Dir,
    /// `workspace/` and `tmp/` together, shared with the sandbox's guests.
    pub(super) budget: Arc<DiskBudget>,
    /// Whose folders are lent beside it (none until [`Workspace::lent`]); looked up at each
    /// use, as HTTP tokens' folders are set once the server knows its tokens.
    pub(super) owner: Option<Arc<str>>,
}

impl Workspace {
    /// Creates `<parent>/<id>/{workspace,tmp}` (private to this user) and opens the workspace.
    pub fn create(parent: &Path, id: &str, quota: Quota) -> io::Result<Self> {
        let root = parent.join(id);
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        crate::platform::fs::private_dir(&mut b);
        b.create(root.join("workspace"))?;
        b.create(root.join("tmp"))?;
        let dir = Dir::open_ambient_dir(root.join("workspace"), ambient_authority())?;
        let budget = DiskBudget::empty(vec![root.join("workspace"), root.join("tmp")], quota);
        Ok(Self {
            root,
            dir,
            budget,
            owner: None,
        })
    }

    /// Opens the workspace a previous server left at `<parent>/<id>` (restart recovery).
    pub fn open(parent: &Path, id: &str, quota: Quota) -> io::Result<Self> {
        let root = parent.join(id);
        std::fs::create_dir_all(root.join("tmp"))?;
        let dir = Dir::open_ambient_dir(root.join("workspace"), ambient_authority())?;
        let budget = DiskBudget::new(vec![root.join("workspace"), root.join("tmp")], quota);
        Ok(Self {
            root,
            dir,
            budget,
            owner: None,
        })
    }

    /// The host directory holding `workspace/`, `tmp/` and the registry's files.
    pub fn host_root(&self) -> &Path {
        &self.root
    }

    pub fn host_workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }

    pub fn host_tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn quota(&self) -> Quota {
        self.budget.quota()
    }

    /// The disk budget of `/workspace` and `/tmp`, which the sandbox's guests write against.
    pub fn budget(&self) -> &Arc<DiskBudget> {
        &self.budget
    }

    /// Deletes everything of the sandbox on the host.
    pub fn destroy(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!("removing {}: {e}", self.root.display());
        }
    }

    /// Resolves a guest path lexically: `/workspace/...` or relative to it; `.` and inner `..`
    /// are folded, and a `..` above the root is refused. Symlinks are left to cap-std, which
    /// refuses any that lead out when the path is used.
    pub fn resolve(&self, path: &str) -> Result<GuestPath, FsError> {
        let escape = || FsError::Escape(path.to_string());
        if path.contains('\0') {
            return Err(escape());
        }
        let (root, mount, rest) = if let Some(rest) = path
            .strip_prefix(WORKSPACE_GUEST)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        {
            (WORKSPACE_GUEST, None, rest.trim_start_matches('/'))
        } else if let Some((i, m, rest)) = lent_at(self.mounts(), path) {
            (m, Some(i), rest)
        } else if path.starts_with('/') {
            return Err(escape());
        } else {
            (WORKSPACE_GUEST, None, path)
        };
        let mut parts: Vec<&str> = Vec::new();
        for c in Path::new(rest).components() {
            match c {
                Component::Normal(s) => parts.push(s.to_str().ok_or_else(escape)?),
                Component::CurDir => {}
                Component::ParentDir => {
                    parts.pop().ok_or_else(escape)?;
                }
                Component::RootDir | Component::Prefix(_) => return Err(escape()),
            }
        }
        let rel: PathBuf = if parts.is_empty() {
            PathBuf::from(".")
        } else {
            parts.iter().collect()
        };
        let guest = if parts.is_empty() {
            root.to_string()
        } else {
            format!("{root}/{}", parts.join("/"))
        };
        Ok(GuestPath { rel, guest, mount })
    }

    /// Up to `max` bytes from `offset`.
    pub fn read_bytes(
        &self,
        path: &str,
        offset: u64,
        max: usize,
    ) -> Result<(GuestPath, Window<Vec<u8>>), FsError> {
        let p = self.resolve(path)?;
        let (file, size) = self.open_regular(&p)?;
        let mut data = read_at(&p, file, offset, max as u64 + 1)?;
        let truncated = data.len() > max;
        data.truncate(max);
        let w = Window {
            data,
            offset,
            size,
            truncated,
        };
        Ok((p, w))
    }

    /// Text from `offset` that takes at most `budget` bytes as a JSON string (see
    /// [`text_window`]). A window that is not UTF-8 is refused, as a binary file always was:
    /// file_download is the way to its bytes.
    pub fn read_text(
        &self,
        path: &str,
        offset: u64,
        budget: usize,
    ) -> Result<(GuestPath, Window<String>), FsError> {
        let p = self.resolve(path)?;
        let (file, size) = self.open_regular(&p)?;
        // Enough to fill the budget and tell whether more follows (a character takes at least
        // its own length in JSON): `budget` bytes (at least 4, for the one character always
        // given), up to 3 skipped at the start and 3 of a last character that does not fit.
        let limit = budget.max(4) as u64 + 7;
        let buf = read_at(&p, file, offset, limit)?;
        let at_end = (buf.len() as u64) < limit;
        let (skip, text, truncated) = text_window(&buf, offset == 0, at_end, budget)
            .ok_or_else(|| FsError::NotText(p.guest.clone()))?;
        let w = Window {
            data: text.to_string(),
            offset: offset + skip as u64,
            size,
            truncated,
        };
        Ok((p, w))
    }

    /// A script's text for a command to run, refused above `limit` bytes (the code-size limit).
    pub fn read_script(&self, path: &str, limit: usize) -> Result<(GuestPath, String), FsError> {
        let p = self.resolve(path)?;
        let (file, size) = self.open_regular(&p)?;
        let too_large = |size: u64| FsError::TooLarge {
            path: p.guest.clone(),
            size,
            limit: limit as u64,
        };
        if size > limit as u64 {
            return Err(too_large(size));
        }
        // The size was read before: the file may have grown since.
        let bytes = read_at(&p, file, 0, limit as u64 + 1)?;
        if bytes.len() > limit {
            return Err(too_large(bytes.len() as u64));
        }
        let text = String::from_utf8(bytes).map_err(|_| FsError::NotText(p.guest.clone()))?;
        Ok((p, text))
    }

    /// Checks a script the guest reads itself (Python's runpy): a regular file within `limit`.
    pub fn check_script(&self, path: &str, limit: usize) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        let (_, size) = self.open_regular(&p)?;
        if size > limit as u64 {
            return Err(FsError::TooLarge {
                path: p.guest,
                size,
                limit: limit as u64,
            });
        }
        Ok(p)
    }

    /// Opens a regular file to read, and its size. A FIFO would block `open` until a writer
    /// came and a device may never end, so anything else is refused before opening and again
    /// once open: the path may have been swapped in between, and `O_NONBLOCK` keeps that
    /// `open` from blocking.
    fn open_regular(&self, p: &GuestPath) -> Result<(File, u64), FsError> {
        let meta = self.dir_of(p).metadata(&p.rel).map_err(|e| io_err(p, e))?;
        regular(p, &meta)?;
        self.open_checked(p)
    }

    fn open_checked(&self, p: &GuestPath) -> Result<(File, u64), FsError> {
        let mut o = OpenOptions::new();
        o.read(true);
        nonblocking(&mut o);
        let file = self
            .dir_of(p)
            .open_with(&p.rel, &o)
            .map_err(|e| io_err(p, e))?;
        let meta = file.metadata().map_err(|e| io_err(p, e))?;
        regular(p, &meta)?;
        Ok((file, meta.len()))
    }

    /// Writes a file (parents created), within the quota.
    pub fn write(&self, path: &str, bytes: &[u8]) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        let (dir, budget) = self.writable(&p)?;
        if p.rel == Path::new(".") {
            return Err(FsError::IsADirectory(p.guest));
        }
        // The file's size before is what the write replaces: no guest changes it meanwhile.
        let _change = budget.change();
        let old = match dir.symlink_metadata(&p.rel) {
            Ok(m) if m.is_dir() => return Err(FsError::IsADirectory(p.guest)),
            Ok(m) => Some(m.len()),
            Err(_) => None,
        };
        // Where a symlink inside leads counts: opening a FIFO to write blocks until a reader comes.
        if let Ok(m) = dir.metadata(&p.rel) {
            regular(&p, &m)?;
        }
        let len = bytes.len() as u64;
        let grow = len.saturating_sub(old.unwrap_or(0));
        let reserved = budget
            .reserve(grow, old.is_none() as u64)
            .map_err(|o| quota_err(&p, o))?;
        if let Some(parent) = p.rel.parent().filter(|d| !d.as_os_str().is_empty()) {
            dir.create_dir_all(parent).map_err(|e| io_err(&p, e))?;
        }
        let mut o = OpenOptions::new();
        o.write(true).create(true).truncate(true);
        nonblocking(&mut o);
        let mut file = dir.open_with(&p.rel, &o).map_err(|e| io_err(&p, e))?;
        regular(&p, &file.metadata().map_err(|e| io_err(&p, e))?)?;
        file.write_all(bytes).map_err(|e| io_err(&p, e))?;
        reserved.settle(len as i64 - old.unwrap_or(0) as i64, old.is_none() as i64);
        Ok(p)
    }

    pub fn list(&self, path: &str) -> Result<(GuestPath, Vec<Entry>), FsError> {
        if let Some(listed) = list_slot(self.mounts(), path) {
            return listed;
        }
        let p = self.resolve(path)?;
        if !self.is_dir(&p)? {
            return Err(FsError::NotADirectory(p.guest));
        }
        let mut out = Vec::new();
        for entry in self
            .dir_of(&p)
            .read_dir(&p.rel)
            .map_err(|e| io_err(&p, e))?
        {
            let entry = entry.map_err(|e| io_err(&p, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta
                .modified()
                .ok()
                .map(|t| humantime::format_rfc3339_seconds(t.into_std()).to_string());
            out.push(Entry {
                path: format!("{}/{name}", p.guest.trim_end_matches('/')),
                name,
                size: meta.len(),
                is_directory: meta.is_dir(),
                modified_time: modified,
                permissions: permissions(&meta),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((p, out))
    }

    pub fn exists(&self, path: &str) -> Result<(GuestPath, bool), FsError> {
        let p = self.resolve(path)?;
        match self.dir_of(&p).metadata(&p.rel) {
            Ok(_) => Ok((p, true)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((p, false)),
            Err(e) => Err(io_err(&p, e)),
        }
    }

    /// Removes a file, or a directory with everything in it.
    pub fn remove(&self, path: &str) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        let (dir, _) = self.writable(&p)?;
        if p.rel == Path::new(".") {
            return Err(FsError::Escape(format!(
                "{path} ({} itself cannot be removed)",
                p.guest
            )));
        }
        let meta = dir.symlink_metadata(&p.rel).map_err(|e| io_err(&p, e))?;
        if meta.is_dir() {
            dir.remove_dir_all(&p.rel)
        } else {
            dir.remove_file(&p.rel)
        }
        .map_err(|e| io_err(&p, e))?;
        Ok(p)
    }

    pub fn mkdir(&self, path: &str) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        let (dir, budget) = self.writable(&p)?;
        let reserved = budget.reserve(0, 1).map_err(|o| quota_err(&p, o))?;
        let mut b = DirBuilder::new();
        b.recursive(true);
        dir.create_dir_with(&p.rel, &b).map_err(|e| io_err(&p, e))?;
        reserved.settle(0, 1);
        Ok(p)
    }

    /// Bytes and entries under `/workspace` and `/tmp` (symlinks count as entries, not
    /// followed); a tree that cannot be measured counts as full.
    pub fn usage(&self) -> (u64, u64) {
        let q = self.budget.quota();
        self.budget.usage().unwrap_or((
            q.max_bytes.saturating_add(1),
            q.max_entries.saturating_add(1),
        ))
    }

    /// Whether `/workspace` and `/tmp` hold more than the quota allows (a walk only when the
    /// count says so).
    pub fn over_quota(&self) -> Option<Over> {
        self.budget.over_quota()
    }

    /// Makes sure a working directory exists: under `/workspace` (created if missing) or `/tmp`.
    pub fn working_dir(&self, path: &str) -> Result<String, FsError> {
        if path == "/tmp" || path.starts_with("/tmp/") {
            if path.split('/').any(|c| c == "..") {
                return Err(FsError::Escape(path.to_string()));
            }
            // Through a cap-std `Dir` like the workspace: the guest can plant symlinks in its
            // /tmp (relative ones that climb out), which an ambient create_dir_all would follow.
            // The prefix once: trim_start_matches("/tmp") would make "/tmp/tmp/x" "x".
            let rel = path.strip_prefix("/tmp").unwrap_or_default();
            let rel = rel.trim_start_matches('/');
            let p = GuestPath {
                rel: PathBuf::from(if rel.is_empty() { "." } else { rel }),
                guest: path.trim_end_matches('/').to_string(),
                mount: None,
            };
            let tmp = Dir::open_ambient_dir(self.host_tmp(), ambient_authority())
                .map_err(|e| io_err(&p, e))?;
            if let Err(e) = tmp.create_dir_all(&p.rel)
                && e.kind() != io::ErrorKind::AlreadyExists
            {
                return Err(io_err(&p, e));
            }
            // An existing entry (or a symlink) must be a directory inside /tmp.
            return match tmp.metadata(&p.rel) {
                Ok(m) if m.is_dir() => Ok(p.guest),
                Ok(_) => Err(FsError::NotADirectory(p.guest)),
                Err(e) => Err(io_err(&p, e)),
            };
        }
        let p = self.resolve(path)?;
        if p.mount.is_some() {
            // A lent folder's directories are the host's: used as they are, never made.
            return match self.is_dir(&p)? {
                true => Ok(p.guest),
                false => Err(FsError::NotADirectory(p.guest)),
            };
        }
        if p.rel != Path::new(".") {
            self.dir.create_dir_all(&p.rel).map_err(|e| io_err(&p, e))?;
        }
        Ok(p.guest)
    }

    fn is_dir(&self, p: &GuestPath) -> Result<bool, FsError> {
        match self.dir_of(p).metadata(&p.rel) {
            Ok(m) => Ok(m.is_dir()),
            Err(e) => Err(io_err(p, e)),
        }
    }
}

fn quota_err(p: &GuestPath, o: Over) -> FsError {
    let (what, would, limit) = if o.entries > o.quota.max_entries {
        ("files and directories", o.entries, o.quota.max_entries)
    } else {
        ("bytes", o.bytes, o.quota.max_bytes)
    };
    match o.folder {
        Some((folder, _)) => FsError::MountFull {
            path: p.guest.clone(),
            folder: folder.to_string(),
            what,
            would,
            limit,
        },
        None => FsError::Quota {
            path: p.guest.clone(),
            what,
            would,
            limit,
        },
    }
}

/// An `open` that cannot block: a FIFO swapped in after a check opens (or fails) at once, and is
/// then refused by the check of the opened file. No effect on regular files.
fn nonblocking(o: &mut OpenOptions) {
    crate::platform::fs::no_block(o);
}

fn regular(p: &GuestPath, meta: &cap_std::fs::Metadata) -> Result<(), FsError> {
    if meta.is_dir() {
        Err(FsError::IsADirectory(p.guest.clone()))
    } else if !meta.is_file() {
        Err(FsError::NotRegular(p.guest.clone()))
    } else {
        Ok(())
    }
}

/// At most `limit` bytes from `offset`, into a buffer that grows with what is read: the file's
/// size may be a sparse terabyte, so it sizes nothing.
fn read_at(p: &GuestPath, mut file: File, offset: u64, limit: u64) -> Result<Vec<u8>, FsError> {
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| io_err(p, e))?;
    let mut buf = Vec::new();
    file.take(limit)
        .read_to_end(&mut buf)
        .map_err(|e| io_err(p, e))?;
    Ok(buf)
}

pub(super) fn io_err(p: &GuestPath, e: io::Error) -> FsError {
    match e.kind() {
        io::ErrorKind::NotFound => FsError::NotFound(p.guest.clone()),
        // cap-std's answer to a path that leads out of the directory (a symlink, mostly).
        io::ErrorKind::PermissionDenied if e.to_string().contains("outside") => {
            FsError::SymlinkEscape(p.guest.clone())
        }
        _ => FsError::Io {
            path: p.guest.clone(),
            source: e,
        },
    }
}

pub(super) fn permissions(meta: &cap_std::fs::Metadata) -> String {
    crate::platform::fs::mode_string(meta)
}

/// Seconds since the Unix epoch as RFC 3339 (for sandbox timestamps).
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let t = tempfile::tempdir().unwrap();
        let w = Workspace::create(
            t.path(),
            "sb",
            Quota {
                max_bytes: 100,
                max_entries: 5,
            },
        )
        .unwrap();
        (t, w)
    }

    #[test]
    fn resolves_inside_only() {
        let (_t, w) = ws();
        assert_eq!(w.resolve("/workspace").unwrap().guest(), "/workspace");
        assert_eq!(w.resolve("a/./b/../c").unwrap().guest(), "/workspace/a/c");
        assert_eq!(w.resolve("/workspace/x").unwrap().guest(), "/workspace/x");
        for bad in [
            "..",
            "../x",
            "a/../../x",
            "/etc/passwd",
            "/workspacex/a",
            "/tmp/x",
            "a\0b",
        ] {
            assert!(
                matches!(w.resolve(bad), Err(FsError::Escape(_))),
                "{bad} must be refused"
            );
        }
    }

    #[test]
    fn symlinks_out_are_refused() {
        let (t, w) = ws();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("passwd"), "host").unwrap();
        if !crate::testing::symlink(&outside, w.host_workspace().join("out"))
            || !crate::testing::symlink("../../outside", w.host_workspace().join("up"))
        {
            return;
        }
        for p in ["out/passwd", "up/passwd"] {
            let e = w.read_bytes(p, 0, 10).unwrap_err();
            assert!(matches!(e, FsError::SymlinkEscape(_)), "{p}: {e}");
            assert!(w.write(p, b"x").is_err(), "{p}");
        }
        assert!(w.list("out").is_err());
    }

    #[test]
    fn tmp_working_dir_does_not_follow_symlinks_out() {
        // A guest can plant a symlink in its /tmp (a relative target that climbs out); a
        // working directory under it must not create anything outside the sandbox.
        let (t, w) = ws();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        if !crate::testing::symlink("../../outside", w.host_tmp().join("up"))
            || !crate::testing::symlink(&outside, w.host_tmp().join("abs"))
        {
            return;
        }
        for p in ["/tmp/up/x", "/tmp/abs/x", "/tmp/up", "/tmp/abs/"] {
            let r = w.working_dir(p);
            assert!(matches!(r, Err(FsError::SymlinkEscape(_))), "{p}: {r:?}");
        }
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // Inside /tmp, directories are still created, also through a symlink that stays in.
        std::fs::create_dir(w.host_tmp().join("real")).unwrap();
        assert!(crate::testing::symlink("real", w.host_tmp().join("in")));
        assert_eq!(w.working_dir("/tmp/a/b/").unwrap(), "/tmp/a/b");
        assert!(w.host_tmp().join("a/b").is_dir());
        assert_eq!(w.working_dir("/tmp/in/c").unwrap(), "/tmp/in/c");
        assert!(w.host_tmp().join("real/c").is_dir());
        assert_eq!(w.working_dir("/tmp").unwrap(), "/tmp");
        // The directory made is the one named, also when a name repeats the prefix.
        assert_eq!(w.working_dir("/tmp/tmp/x").unwrap(), "/tmp/tmp/x");
        assert!(w.host_tmp().join("tmp/x").is_dir());
        assert!(matches!(
            w.working_dir("/tmp/../x"),
            Err(FsError::Escape(_))
        ));
    }

    #[test]
    fn quota_holds_for_bytes_and_entries() {
        let (_t, w) = ws();
        w.write("a", &[0; 60]).unwrap();
        assert!(matches!(w.write("b", &[0; 60]), Err(FsError::Quota { .. })));
        // Rewriting a file counts its new size only.
        w.write("a", &[0; 90]).unwrap();
        w.remove("a").unwrap();
        for i in 0..5 {
            w.write(&format!("f{i}"), b"x").unwrap();
        }
        assert!(matches!(w.write("f9", b"x"), Err(FsError::Quota { .. })));
        assert!(matches!(w.mkdir("d"), Err(FsError::Quota { .. })));
    }

    #[test]
    fn round_trip_and_listing() {
        let (_t, w) = ws();
        w.write("/workspace/d/x.txt", "héllo".as_bytes()).unwrap();
        assert_eq!(w.read_text("d/x.txt", 0, 100).unwrap().1.data, "héllo");
        let (_, list) = w.list("/workspace").unwrap();
        assert_eq!(list.len(), 1);
        assert!(list[0].is_directory);
        assert_eq!(list[0].path, "/workspace/d");
        assert!(w.exists("d/x.txt").unwrap().1);
        assert!(!w.exists("nope").unwrap().1);
        assert!(matches!(
            w.read_bytes("nope", 0, 1),
            Err(FsError::NotFound(_))
        ));
        assert!(matches!(
            w.read_text("d", 0, 1),
            Err(FsError::IsADirectory(_))
        ));
    }

    #[test]
    fn a_sparse_terabyte_is_read_in_windows() {
        let (_t, w) = ws();
        let f = std::fs::File::create(w.host_workspace().join("big")).unwrap();
        f.set_len(1 << 40).unwrap();
        let (_, b) = w.read_bytes("big", 0, 100).unwrap();
        assert_eq!((b.data, b.size, b.truncated), (vec![0; 100], 1 << 40, true));
        let (_, b) = w.read_bytes("big", (1 << 40) - 3, 100).unwrap();
        assert_eq!(
            (b.data.len(), b.truncated, b.next_offset()),
            (3, false, 1 << 40)
        );
        // NULs go out as "\u0000": six bytes each.
        let (_, t) = w.read_text("big", 7, 60).unwrap();
        assert_eq!((t.data.as_str(), t.offset), ("\0".repeat(10).as_str(), 7));
        assert!(t.truncated);
        for e in [
            w.read_script("big", 4096).unwrap_err(),
            w.check_script("big", 4096).unwrap_err(),
        ] {
            assert!(
                matches!(e, FsError::TooLarge { size, .. } if size == 1 << 40),
                "{e}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn fifos_are_refused_without_blocking() {
        let (_t, w) = ws();
        let path = w.host_workspace().join("pipe");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let not_regular = |r: Result<(), FsError>| matches!(r, Err(FsError::NotRegular(_)));
        assert!(not_regular(w.read_bytes("pipe", 0, 1).map(drop)));
        assert!(not_regular(w.read_text("pipe", 0, 1).map(drop)));
        assert!(not_regular(w.read_script("pipe", 1).map(drop)));
        assert!(not_regular(w.check_script("pipe", 1).map(drop)));
        assert!(not_regular(w.write("pipe", b"x").map(drop)));
        // A FIFO swapped in after the first check: the open itself does not block, and the
        // opened file is checked again.
        let p = w.resolve("pipe").unwrap();
        assert!(not_regular(w.open_checked(&p).map(drop)));
    }

    #[test]
    fn scripts_are_read_within_the_limit() {
        let (_t, w) = ws();
        w.write("s.js", b"console.log(1)").unwrap();
        assert_eq!(w.read_script("s.js", 14).unwrap().1, "console.log(1)");
        assert!(matches!(
            w.read_script("s.js", 13),
            Err(FsError::TooLarge { size: 14, .. })
        ));
        assert_eq!(
            w.check_script("s.js", 14).unwrap().guest(),
            "/workspace/s.js"
        );
        w.write("b.js", b"\xff").unwrap();
        assert!(matches!(w.read_script("b.js", 9), Err(FsError::NotText(_))));
    }
}
