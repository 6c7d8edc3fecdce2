//! Host folders lent to guests (`WASMBOX_MOUNTS`, `--mount HOST:GUEST[:ro|rw]`): where they
//! appear and how a guest's path calls reach them.
//!
//! Guests' images bake wasi-libc's preopen table (docs/mounts-design.md), so every guest has the
//! same two slots after `/tmp`: `/data` and `/mnt`. A mount at a slot is that slot's directory;
//! mounts below a slot (`/data/sales`) are preopens the guest's libc does not know, reached by
//! [`Layout::reroute`]: a path call on the slot whose first component names a mount goes to the
//! mount's descriptor with the rest of the path. The slot's own directory then holds an empty
//! directory per mount name, so listing `/data` shows them.
//!
//! What guests add to an `rw` folder counts against that folder's own [`DiskBudget`], shared by
//! every guest and the file tools: each descriptor opened in a lent folder is known as such
//! ([`Reroutes::opened`]), changes through it are counted there, and a rename or link between
//! a lent folder and anything else answers `EXDEV` (its bytes would leave one count unseen and
//! enter another). Guests cannot make symlinks in lent folders: the folder's owner would follow
//! them on the host.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::guest::MOUNT_SLOTS;
use crate::engine::disk::{DiskBudget, Quota};

/// Why folders could not be lent; each names the setting (or `--mount`) at fault, and stops the
/// server at start.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{setting}: {spec:?}: {why}")]
    Spec {
        setting: String,
        spec: String,
        why: String,
    },
    #[error("{setting}: {first} and {second} overlap: give each folder its own place")]
    Overlap {
        setting: String,
        first: String,
        second: String,
    },
    #[error("{setting}: {}: {source}", host.display())]
    Open {
        setting: String,
        host: PathBuf,
        source: std::io::Error,
    },
    #[error("{setting}: measuring {}: {source}", host.display())]
    Measure {
        setting: String,
        host: PathBuf,
        source: std::io::Error,
    },
    #[error("{name}: {value:?} is not a whole number")]
    NotANumber { name: &'static str, value: String },
    #[error("{which}: expected TOKEN=HOST_DIR:GUEST_PATH[:ro|rw],...")]
    TokenEntry { which: String },
    #[error("{which}: its token is not one of WASMBOX_TOKEN's (the tokens this server serves)")]
    UnknownToken { which: String },
    #[error(
        "{which}: {} is lent rw to two tokens, whose rooms would add up: lend it rw to one",
        host.display()
    )]
    SharedRw { which: String, host: PathBuf },
    #[error("{which}: the token has an entry already")]
    TokenTwice { which: String },
    /// The server's mounts (`"mounts"`) or the tokens' (`"token mounts"`) were set before.
    #[error("the {0} were already set")]
    AlreadySet(&'static str),
}

/// One lent folder.
#[derive(Clone, Debug, PartialEq)]
pub struct Mount {
    pub host: PathBuf,
    /// `/data`, `/mnt`, or one level below one of them.
    pub guest: String,
    pub writable: bool,
}

impl Mount {
    /// `HOST:GUEST[:ro|rw]`; the host folder must exist (named in the error with `setting`).
    pub fn parse(spec: &str, setting: &str) -> Result<Self, MountError> {
        let bad = |why: &str| MountError::Spec {
            setting: setting.to_string(),
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let (rest, writable) = match spec.rsplit_once(':') {
            Some((rest, "rw")) => (rest, true),
            Some((rest, "ro")) => (rest, false),
            _ => (spec, false),
        };
        let (host, guest) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected HOST_DIR:GUEST_PATH[:ro|rw]"))?;
        let guest = guest.trim_end_matches('/');
        let mut parts = guest.split('/').skip(1);
        let slot = parts.next().unwrap_or_default();
        let name = parts.next();
        if !guest.starts_with('/')
            || !MOUNT_SLOTS.contains(&format!("/{slot}").as_str())
            || parts.next().is_some()
            || name.is_some_and(|n| n.is_empty() || n == "." || n == "..")
        {
            return Err(bad(
                "the guest path must be /data or /mnt, or one folder below them (/data/NAME)",
            ));
        }
        let host = std::fs::canonicalize(host)
            .map_err(|e| bad(&format!("the host folder cannot be opened: {e}")))?;
        if !host.is_dir() {
            return Err(bad("the host path is not a folder"));
        }
        Ok(Self {
            host,
            guest: guest.to_string(),
            writable,
        })
    }
}

/// The mounts every guest of this server gets, arranged into slots.
#[derive(Clone, Default)]
pub struct Layout {
    pub mounts: Vec<Mount>,
    /// Each mount's folder, opened once: the file tools reach it only through this.
    pub dirs: Vec<Arc<cap_std::fs::Dir>>,
    /// Each `rw` mount's budget (`None`: read-only): what guests may add to it.
    pub budgets: Vec<Option<Arc<DiskBudget>>>,
}

/// What guests may add to an `rw` folder unless `WASMBOX_MOUNT_DISK_MB` / `WASMBOX_MOUNT_FILES`
/// say otherwise.
const ROOM_MB: u64 = 1024;
const ROOM_FILES: u64 = 10_000;

/// The environment's mount settings as given (part of [`crate::Config`]): they are checked
/// when the folders are lent, where a bad one stops the start naming itself.
#[derive(Clone, Debug, Default)]
pub struct MountSettings {
    /// `WASMBOX_MOUNTS`: comma-separated `HOST:GUEST[:ro|rw]`.
    pub mounts: Option<String>,
    /// `WASMBOX_MOUNT_DISK_MB`: what guests may add to each `rw` folder, in MiB.
    pub room_mb: Option<String>,
    /// `WASMBOX_MOUNT_FILES`: how many entries guests may add to each `rw` folder.
    pub room_files: Option<String>,
}

impl MountSettings {
    pub fn from_env() -> Self {
        Self {
            mounts: std::env::var("WASMBOX_MOUNTS").ok(),
            room_mb: std::env::var("WASMBOX_MOUNT_DISK_MB").ok(),
            room_files: std::env::var("WASMBOX_MOUNT_FILES").ok(),
        }
    }

    /// What guests may add to each `rw` folder.
    fn room(&self) -> Result<Quota, MountError> {
        let num = |name: &'static str, given: &Option<String>, default: u64| match given {
            Some(v) => v.trim().parse::<u64>().map_err(|_| MountError::NotANumber {
                name,
                value: v.clone(),
            }),
            None => Ok(default),
        };
        Ok(Quota {
            max_bytes: num("WASMBOX_MOUNT_DISK_MB", &self.room_mb, ROOM_MB)?
                .saturating_mul(1 << 20),
            max_entries: num("WASMBOX_MOUNT_FILES", &self.room_files, ROOM_FILES)?,
        })
    }
}

impl Layout {
    /// The server's mounts: `WASMBOX_MOUNTS` (comma-separated) and then `--mount` flags, each
    /// `rw` one with room for `WASMBOX_MOUNT_DISK_MB` and `WASMBOX_MOUNT_FILES` more.
    pub fn from_settings(settings: &MountSettings, flags: &[String]) -> Result<Self, MountError> {
        let mut mounts = Vec::new();
        if let Some(v) = &settings.mounts {
            for spec in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                mounts.push(Mount::parse(spec, "WASMBOX_MOUNTS")?);
            }
        }
        for spec in flags {
            mounts.push(Mount::parse(spec, "--mount")?);
        }
        Self::new(mounts, "WASMBOX_MOUNTS/--mount", settings.room()?)
    }

    /// Checks that no two mounts overlap (one at a slot leaves no room below it), opens each
    /// folder, and measures each `rw` one: guests may add `room` to what it holds now.
    pub fn new(mounts: Vec<Mount>, setting: &str, room: Quota) -> Result<Self, MountError> {
        for (i, a) in mounts.iter().enumerate() {
            for b in &mounts[..i] {
                let within = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
                if within(&a.guest, &b.guest) || within(&b.guest, &a.guest) {
                    return Err(MountError::Overlap {
                        setting: setting.to_string(),
                        first: b.guest.clone(),
                        second: a.guest.clone(),
                    });
                }
            }
        }
        let dirs = mounts
            .iter()
            .map(|m| {
                cap_std::fs::Dir::open_ambient_dir(&m.host, cap_std::ambient_authority())
                    .map(std::sync::Arc::new)
                    .map_err(|source| MountError::Open {
                        setting: setting.to_string(),
                        host: m.host.clone(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        let budgets = mounts
            .iter()
            .map(|m| {
                m.writable
                    .then(|| DiskBudget::growth(m.host.clone(), &m.guest, room))
                    .transpose()
                    .map_err(|source| MountError::Measure {
                        setting: setting.to_string(),
                        host: m.host.clone(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            mounts,
            dirs,
            budgets,
        })
    }

    /// Where the lent folders are, for an error that tells where paths may go: `, or in a lent
    /// folder (/data/sales, /mnt)`, or nothing.
    pub fn places(&self) -> String {
        if self.mounts.is_empty() {
            return String::new();
        }
        let at: Vec<&str> = self.mounts.iter().map(|m| m.guest.as_str()).collect();
        format!(", or in a lent folder ({})", at.join(", "))
    }

    /// The mount at a slot itself, if any, and its index.
    pub fn at_slot(&self, slot: &str) -> Option<(usize, &Mount)> {
        self.mounts
            .iter()
            .enumerate()
            .find(|(_, m)| m.guest == slot)
    }

    /// The mounts below `slot`: name, index, mount.
    pub fn below<'a>(&'a self, slot: &'a str) -> impl Iterator<Item = (&'a str, usize, &'a Mount)> {
        self.mounts.iter().enumerate().filter_map(move |(i, m)| {
            m.guest
                .strip_prefix(slot)
                .and_then(|r| r.strip_prefix('/'))
                .map(|name| (name, i, m))
        })
    }
}

/// Over HTTP, each token's lent folders (`WASMBOX_TOKEN_MOUNTS`): `TOKEN=MOUNT,MOUNT;TOKEN=...`,
/// each mount as in `WASMBOX_MOUNTS`. Keyed by the token's owner id (`owner_of`), which is
/// what calls carry; a token the server does not serve, or an `rw` folder lent to two tokens
/// (whose rooms would add up), stops the server at start. Each `rw` folder has the room
/// `settings` give.
pub fn token_layouts(
    spec: &str,
    tokens: &[String],
    owner_of: impl Fn(&str) -> String,
    settings: &MountSettings,
) -> Result<HashMap<String, Layout>, MountError> {
    const SETTING: &str = "WASMBOX_TOKEN_MOUNTS";
    let room = settings.room()?;
    let mut out = HashMap::new();
    let mut rw: Vec<PathBuf> = Vec::new();
    for (n, entry) in spec.split(';').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        let which = format!("{SETTING} entry {}", n + 1);
        let (token, mounts) = entry
            .split_once('=')
            .ok_or_else(|| MountError::TokenEntry {
                which: which.clone(),
            })?;
        if !tokens.iter().any(|t| t == token.trim()) {
            return Err(MountError::UnknownToken { which });
        }
        let mounts = mounts
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(|m| Mount::parse(m, &which))
            .collect::<Result<Vec<_>, _>>()?;
        for m in mounts.iter().filter(|m| m.writable) {
            if rw
                .iter()
                .any(|h| h.starts_with(&m.host) || m.host.starts_with(h))
            {
                return Err(MountError::SharedRw {
                    which,
                    host: m.host.clone(),
                });
            }
            rw.push(m.host.clone());
        }
        let owner = owner_of(token.trim());
        if out.contains_key(&owner) {
            return Err(MountError::TokenTwice { which });
        }
        out.insert(owner, Layout::new(mounts, &which, room)?);
    }
    Ok(out)
}

static SERVER: std::sync::OnceLock<Layout> = std::sync::OnceLock::new();
static TOKENS: std::sync::OnceLock<HashMap<String, Layout>> = std::sync::OnceLock::new();

/// Sets each HTTP token's lent folders, by owner id (once, at start).
pub fn set_token_layouts(layouts: HashMap<String, Layout>) -> Result<(), MountError> {
    TOKENS
        .set(layouts)
        .map_err(|_| MountError::AlreadySet("token mounts"))
}

/// The folders lent to `owner`'s code and file tools: the server's for the local user, a
/// token's own over HTTP (none unless `WASMBOX_TOKEN_MOUNTS` gives it some).
pub fn for_owner(owner: &str) -> &'static Layout {
    if owner == crate::engine::cpu::LOCAL_OWNER {
        return server_layout();
    }
    TOKENS.get().and_then(|t| t.get(owner)).unwrap_or(&EMPTY)
}

/// `owner`'s folders when they differ from the server's, which pooled and spare instances
/// are made with (`None`: those instances fit).
pub fn unlike_pooled(owner: &str) -> Option<&'static Layout> {
    let lent = for_owner(owner);
    let pooled = server_layout();
    let same = std::ptr::eq(lent, pooled) || lent.mounts.is_empty() && pooled.mounts.is_empty();
    (!same).then_some(lent)
}

/// No folders lent: what images are built with (their baked preopen tables hold only the
/// slots, so one image serves every layout).
pub fn none() -> &'static Layout {
    &EMPTY
}

static EMPTY: Layout = Layout {
    mounts: Vec::new(),
    dirs: Vec::new(),
    budgets: Vec::new(),
};

/// Sets the mounts every guest of this process gets (once, at start).
pub fn set_server_layout(layout: Layout) -> Result<(), MountError> {
    SERVER
        .set(layout)
        .map_err(|_| MountError::AlreadySet("mounts"))
}

/// The mounts the local user's guests get, and pooled instances are made with (none unless set).
pub fn server_layout() -> &'static Layout {
    SERVER.get().unwrap_or(&EMPTY)
}

/// A slot's host directory: the empty directory, or (with mounts below it) one holding an
/// empty directory per mount name, made once per process.
pub fn slot_dir(slot: &str, names: &[&str]) -> super::Result<PathBuf> {
    let root = super::scratch::scratch_root()?;
    if names.is_empty() {
        return Ok(super::scratch::empty_dir()?.to_path_buf());
    }
    skeleton(root, slot, names).map_err(|e| super::LangError::io(root, e))
}

/// A guest's descriptors in lent folders: the slots, the mounts below them `(slot, name,
/// descriptor)`, and every open descriptor's folder.
#[derive(Clone, Default)]
pub struct Reroutes {
    pub slots: [Option<u32>; 2],
    pub subs: Vec<(usize, Vec<u8>, u32)>,
    /// Descriptors in a lent folder, by the folder's index in the layout.
    trees: HashMap<u32, usize>,
    /// Each lent folder's budget, by index (`None`: read-only).
    budgets: Vec<Option<Arc<DiskBudget>>>,
}

/// Where a change through a descriptor counts.
pub enum Tree<'a> {
    /// The guest's own `/workspace` and `/tmp` (or a runtime's read-only files).
    Own,
    /// A lent folder: its index and budget (`None`: read-only).
    Lent(usize, Option<&'a Arc<DiskBudget>>),
}

/// Where a path call goes instead: a descriptor, and where the rest of the path starts and how
/// long it is (a suffix of the guest's own string); `dot` when the path named the mount itself
/// (the call must be given `.`).
#[derive(Debug, PartialEq)]
pub struct Rerouted {
    pub fd: u32,
    pub skip: usize,
    pub len: usize,
    pub dot: bool,
}

impl Reroutes {
    /// A guest's view of `layout`, with no descriptors yet.
    pub fn new(layout: &Layout) -> Self {
        Self {
            budgets: layout.budgets.clone(),
            ..Self::default()
        }
    }

    /// `fd` is lent folder `mount`'s preopen.
    pub fn preopened(&mut self, fd: u32, mount: usize) {
        self.trees.insert(fd, mount);
    }

    /// Whether any descriptor is in a lent folder (else [`Reroutes::opened`] has nothing to do).
    pub fn lends(&self) -> bool {
        !self.trees.is_empty()
    }

    /// The folder `fd` was opened in.
    pub fn tree(&self, fd: u32) -> Tree<'_> {
        match self.trees.get(&fd) {
            Some(&i) => Tree::Lent(i, self.budgets[i].as_ref()),
            None => Tree::Own,
        }
    }

    /// `fd` was opened through `dir`: it is in `dir`'s folder.
    pub fn opened(&mut self, dir: u32, fd: u32) {
        match self.trees.get(&dir) {
            Some(&i) => self.trees.insert(fd, i),
            None => self.trees.remove(&fd),
        };
    }

    /// `from` now answers as `to` (`fd_renumber`): `to`'s old descriptor is closed.
    pub fn renumbered(&mut self, from: u32, to: u32) {
        self.forget(to);
        let tree = self.trees.remove(&from);
        self.forget(from);
        if let Some(i) = tree {
            self.trees.insert(to, i);
        }
    }

    /// Where a call on `fd` with `path` goes, when `fd` is a slot and the path's first
    /// component names a mount below it.
    pub fn reroute(&self, fd: u32, path: &[u8]) -> Option<Rerouted> {
        if self.subs.is_empty() {
            return None;
        }
        let slot = self.slots.iter().position(|s| *s == Some(fd))?;
        let start = path.iter().take_while(|b| **b == b'/').count();
        let rest = &path[start..];
        let end = rest.iter().position(|b| *b == b'/').unwrap_or(rest.len());
        let (_, _, to) = self
            .subs
            .iter()
            .find(|(s, name, _)| *s == slot && name.as_slice() == &rest[..end])?;
        let tail = &rest[end..];
        let slashes = tail.iter().take_while(|b| **b == b'/').count();
        let skip = start + end + slashes;
        let len = path.len() - skip;
        Some(Rerouted {
            fd: *to,
            skip,
            len,
            dot: len == 0,
        })
    }

    /// Forgets a descriptor the guest closed.
    pub fn forget(&mut self, fd: u32) {
        for s in &mut self.slots {
            if *s == Some(fd) {
                *s = None;
            }
        }
        self.subs.retain(|(_, _, f)| *f != fd);
        self.trees.remove(&fd);
    }
}

/// A slot's host directory when mounts sit below it: empty directories named after them, under
/// `root` (made once per layout).
pub fn skeleton(root: &Path, slot: &str, names: &[&str]) -> std::io::Result<PathBuf> {
    let dir = root.join(format!("slot{}", slot.replace('/', "-")));
    std::fs::create_dir_all(&dir)?;
    for n in names {
        std::fs::create_dir_all(dir.join(n))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_name_the_setting() {
        let d = tempfile::tempdir().unwrap();
        let h = d.path().display().to_string();
        let m = Mount::parse(&format!("{h}:/data"), "X").unwrap();
        assert_eq!((m.guest.as_str(), m.writable), ("/data", false));
        let m = Mount::parse(&format!("{h}:/mnt/sales/:rw"), "X").unwrap();
        assert_eq!((m.guest.as_str(), m.writable), ("/mnt/sales", true));
        for bad in [
            format!("{h}:/workspace"),
            format!("{h}:/tmp/x"),
            format!("{h}:/data/a/b"),
            format!("{h}:/data/.."),
            format!("{h}:data"),
            "/no/such/dir:/data".to_string(),
            h.clone(),
        ] {
            let e = Mount::parse(&bad, "WASMBOX_MOUNTS").unwrap_err();
            assert!(e.to_string().starts_with("WASMBOX_MOUNTS: "), "{e}");
        }
        let a = Mount::parse(&format!("{h}:/data"), "X").unwrap();
        let b = Mount::parse(&format!("{h}:/data/x"), "X").unwrap();
        let room = Quota {
            max_bytes: 1,
            max_entries: 1,
        };
        assert!(Layout::new(vec![a.clone(), b], "X", room).is_err());
        let c = Mount::parse(&format!("{h}:/mnt/x"), "X").unwrap();
        assert!(Layout::new(vec![a, c], "X", room).is_ok());
    }
}
