//! A sandbox's workspace as the host sees it: a directory opened once as a cap-std [`Dir`], so
//! every host-side file operation resolves inside it by construction. A guest path is
//! `/workspace/...` or relative to it; anything else, a `..` that climbs out, or a symlink that
//! leads out is refused with an error that names the rule. A quota (bytes and entries) holds for
//! the file tools and, checked while they run, for guests.

use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder};
use serde::Serialize;

use crate::lang::guest::WORKSPACE_GUEST;

/// The most a sandbox's workspace may hold.
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    pub max_bytes: u64,
    /// Files and directories.
    pub max_entries: u64,
}

/// What went wrong with a file operation, in terms the caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(
        "path {0:?} is outside the sandbox: use a path under /workspace (absolute, or relative to it); '..' may not climb out of it"
    )]
    Escape(String),
    #[error("path {0:?} leads outside the sandbox through a symlink; refused")]
    SymlinkEscape(String),
    #[error("File not found: {0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsADirectory(String),
    #[error("{0} is not a directory")]
    NotADirectory(String),
    #[error(
        "{path}: disk quota exceeded: the workspace would hold {would} of its {limit} allowed {what}; remove files (file_remove) first"
    )]
    Quota {
        path: String,
        what: &'static str,
        would: u64,
        limit: u64,
    },
    #[error("{0} is not UTF-8 text; use file_download to get its bytes as base64")]
    NotText(String),
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
    rel: PathBuf,
    guest: String,
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
    root: PathBuf,
    dir: Dir,
    quota: Quota,
}

impl Workspace {
    /// Creates `<parent>/<id>/{workspace,tmp}` (private to this user) and opens the workspace.
    pub fn create(parent: &Path, id: &str, quota: Quota) -> io::Result<Self> {
        let root = parent.join(id);
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(root.join("workspace"))?;
        b.create(root.join("tmp"))?;
        let dir = Dir::open_ambient_dir(root.join("workspace"), ambient_authority())?;
        Ok(Self { root, dir, quota })
    }

    /// Opens the workspace a previous server left at `<parent>/<id>` (restart recovery).
    pub fn open(parent: &Path, id: &str, quota: Quota) -> io::Result<Self> {
        let root = parent.join(id);
        std::fs::create_dir_all(root.join("tmp"))?;
        let dir = Dir::open_ambient_dir(root.join("workspace"), ambient_authority())?;
        Ok(Self { root, dir, quota })
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
        self.quota
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
        let rest = if let Some(rest) = path.strip_prefix(WORKSPACE_GUEST) {
            if !(rest.is_empty() || rest.starts_with('/')) {
                return Err(escape());
            }
            rest.trim_start_matches('/')
        } else if path.starts_with('/') {
            return Err(escape());
        } else {
            path
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
            WORKSPACE_GUEST.to_string()
        } else {
            format!("{WORKSPACE_GUEST}/{}", parts.join("/"))
        };
        Ok(GuestPath { rel, guest })
    }

    pub fn read(&self, path: &str) -> Result<(GuestPath, Vec<u8>), FsError> {
        let p = self.resolve(path)?;
        if self.is_dir(&p)? {
            return Err(FsError::IsADirectory(p.guest));
        }
        let bytes = self.dir.read(&p.rel).map_err(|e| io_err(&p, e))?;
        Ok((p, bytes))
    }

    pub fn read_text(&self, path: &str) -> Result<(GuestPath, String), FsError> {
        let (p, bytes) = self.read(path)?;
        let text = String::from_utf8(bytes).map_err(|_| FsError::NotText(p.guest.clone()))?;
        Ok((p, text))
    }

    /// Writes a file (parents created), within the quota.
    pub fn write(&self, path: &str, bytes: &[u8]) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        if p.rel == Path::new(".") {
            return Err(FsError::IsADirectory(p.guest));
        }
        let old = match self.dir.symlink_metadata(&p.rel) {
            Ok(m) if m.is_dir() => return Err(FsError::IsADirectory(p.guest)),
            Ok(m) => Some(m.len()),
            Err(_) => None,
        };
        let (used, entries) = self.usage();
        let would = used.saturating_sub(old.unwrap_or(0)) + bytes.len() as u64;
        if would > self.quota.max_bytes {
            return Err(FsError::Quota {
                path: p.guest,
                what: "bytes",
                would,
                limit: self.quota.max_bytes,
            });
        }
        if old.is_none() && entries + 1 > self.quota.max_entries {
            return Err(FsError::Quota {
                path: p.guest,
                what: "files and directories",
                would: entries + 1,
                limit: self.quota.max_entries,
            });
        }
        if let Some(parent) = p.rel.parent().filter(|d| !d.as_os_str().is_empty()) {
            self.dir.create_dir_all(parent).map_err(|e| io_err(&p, e))?;
        }
        self.dir.write(&p.rel, bytes).map_err(|e| io_err(&p, e))?;
        Ok(p)
    }

    pub fn list(&self, path: &str) -> Result<(GuestPath, Vec<Entry>), FsError> {
        let p = self.resolve(path)?;
        if !self.is_dir(&p)? {
            return Err(FsError::NotADirectory(p.guest));
        }
        let mut out = Vec::new();
        for entry in self.dir.read_dir(&p.rel).map_err(|e| io_err(&p, e))? {
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
        match self.dir.metadata(&p.rel) {
            Ok(_) => Ok((p, true)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((p, false)),
            Err(e) => Err(io_err(&p, e)),
        }
    }

    /// Removes a file, or a directory with everything in it.
    pub fn remove(&self, path: &str) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        if p.rel == Path::new(".") {
            return Err(FsError::Escape(format!(
                "{path} (the workspace itself cannot be removed)"
            )));
        }
        let meta = self
            .dir
            .symlink_metadata(&p.rel)
            .map_err(|e| io_err(&p, e))?;
        if meta.is_dir() {
            self.dir.remove_dir_all(&p.rel)
        } else {
            self.dir.remove_file(&p.rel)
        }
        .map_err(|e| io_err(&p, e))?;
        Ok(p)
    }

    pub fn mkdir(&self, path: &str) -> Result<GuestPath, FsError> {
        let p = self.resolve(path)?;
        let (_, entries) = self.usage();
        if entries + 1 > self.quota.max_entries {
            return Err(FsError::Quota {
                path: p.guest,
                what: "files and directories",
                would: entries + 1,
                limit: self.quota.max_entries,
            });
        }
        let mut b = DirBuilder::new();
        b.recursive(true);
        self.dir
            .create_dir_with(&p.rel, &b)
            .map_err(|e| io_err(&p, e))?;
        Ok(p)
    }

    /// Bytes and entries under the workspace (symlinks count as entries, not followed).
    pub fn usage(&self) -> (u64, u64) {
        let mut bytes = 0;
        let mut entries = 0;
        let mut stack = vec![PathBuf::from(".")];
        while let Some(d) = stack.pop() {
            let Ok(rd) = self.dir.read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                entries += 1;
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(d.join(e.file_name()));
                } else if ft.is_file()
                    && let Ok(m) = e.metadata()
                {
                    bytes += m.len();
                }
            }
        }
        (bytes, entries)
    }

    /// Whether the workspace holds more than its quota allows.
    pub fn over_quota(&self) -> bool {
        let (bytes, entries) = self.usage();
        bytes > self.quota.max_bytes || entries > self.quota.max_entries
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
        if p.rel != Path::new(".") {
            self.dir.create_dir_all(&p.rel).map_err(|e| io_err(&p, e))?;
        }
        Ok(p.guest)
    }

    fn is_dir(&self, p: &GuestPath) -> Result<bool, FsError> {
        match self.dir.metadata(&p.rel) {
            Ok(m) => Ok(m.is_dir()),
            Err(e) => Err(io_err(p, e)),
        }
    }
}

fn io_err(p: &GuestPath, e: io::Error) -> FsError {
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

fn permissions(meta: &cap_std::fs::Metadata) -> String {
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
        let (_t, w) = ws();
        std::os::unix::fs::symlink("/etc", w.host_workspace().join("out")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc", w.host_workspace().join("up")).unwrap();
        for p in ["out/passwd", "up/passwd"] {
            let e = w.read(p).unwrap_err();
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
        std::os::unix::fs::symlink("../../outside", w.host_tmp().join("up")).unwrap();
        std::os::unix::fs::symlink(&outside, w.host_tmp().join("abs")).unwrap();
        for p in ["/tmp/up/x", "/tmp/abs/x", "/tmp/up", "/tmp/abs/"] {
            let r = w.working_dir(p);
            assert!(matches!(r, Err(FsError::SymlinkEscape(_))), "{p}: {r:?}");
        }
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // Inside /tmp, directories are still created, also through a symlink that stays in.
        std::fs::create_dir(w.host_tmp().join("real")).unwrap();
        std::os::unix::fs::symlink("real", w.host_tmp().join("in")).unwrap();
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
        assert_eq!(w.read_text("d/x.txt").unwrap().1, "héllo");
        let (_, list) = w.list("/workspace").unwrap();
        assert_eq!(list.len(), 1);
        assert!(list[0].is_directory);
        assert_eq!(list[0].path, "/workspace/d");
        assert!(w.exists("d/x.txt").unwrap().1);
        assert!(!w.exists("nope").unwrap().1);
        assert!(matches!(w.read("nope"), Err(FsError::NotFound(_))));
        assert!(matches!(w.read("d"), Err(FsError::IsADirectory(_))));
    }
}
