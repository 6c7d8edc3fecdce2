//! Host folders lent to guests (`WASMBOX_MOUNTS`, `--mount HOST:GUEST[:ro|rw]`): where they
//! appear and how a guest's path calls reach them.
//!
//! Guests' images bake wasi-libc's preopen table (docs/mounts-design.md), so every guest has the
//! same two slots after `/tmp`: `/data` and `/mnt`. A mount at a slot is that slot's directory;
//! mounts below a slot (`/data/sales`) are preopens the guest's libc does not know, reached by
//! [`Layout::reroute`]: a path call on the slot whose first component names a mount goes to the
//! mount's descriptor with the rest of the path. The slot's own directory then holds an empty
//! directory per mount name, so listing `/data` shows them.

use std::path::{Path, PathBuf};

use super::guest::MOUNT_SLOTS;

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
    pub fn parse(spec: &str, setting: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{setting}: {spec:?}: {why}");
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
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub mounts: Vec<Mount>,
    /// Each mount's folder, opened once: the file tools reach it only through this.
    pub dirs: Vec<std::sync::Arc<cap_std::fs::Dir>>,
}

impl Layout {
    /// Checks that no two mounts overlap (one at a slot leaves no room below it).
    pub fn new(mounts: Vec<Mount>, setting: &str) -> Result<Self, String> {
        for (i, a) in mounts.iter().enumerate() {
            for b in &mounts[..i] {
                let within = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
                if within(&a.guest, &b.guest) || within(&b.guest, &a.guest) {
                    return Err(format!(
                        "{setting}: {} and {} overlap: give each folder its own place",
                        b.guest, a.guest
                    ));
                }
            }
        }
        let dirs = mounts
            .iter()
            .map(|m| {
                cap_std::fs::Dir::open_ambient_dir(&m.host, cap_std::ambient_authority())
                    .map(std::sync::Arc::new)
                    .map_err(|e| format!("{setting}: {}: {e}", m.host.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { mounts, dirs })
    }

    /// The mount at a slot itself, if any.
    pub fn at_slot(&self, slot: &str) -> Option<&Mount> {
        self.mounts.iter().find(|m| m.guest == slot)
    }

    /// The mounts below `slot`, by name.
    pub fn below<'a>(&'a self, slot: &'a str) -> impl Iterator<Item = (&'a str, &'a Mount)> {
        self.mounts.iter().filter_map(move |m| {
            m.guest
                .strip_prefix(slot)
                .and_then(|r| r.strip_prefix('/'))
                .map(|name| (name, m))
        })
    }
}

static SERVER: std::sync::OnceLock<Layout> = std::sync::OnceLock::new();

/// Sets the mounts every guest of this process gets (once, at start).
pub fn set_server_layout(layout: Layout) -> Result<(), String> {
    SERVER
        .set(layout)
        .map_err(|_| "the mounts were already set".to_string())
}

/// The mounts every guest gets (none unless set).
pub fn server_layout() -> &'static Layout {
    static NONE: Layout = Layout {
        mounts: Vec::new(),
        dirs: Vec::new(),
    };
    SERVER.get().unwrap_or(&NONE)
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

/// A guest's slot descriptors and the mounts below them: `(slot, name, descriptor)`.
#[derive(Clone, Debug, Default)]
pub struct Reroutes {
    pub slots: [Option<u32>; 2],
    pub subs: Vec<(usize, Vec<u8>, u32)>,
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

    /// Forgets a descriptor the guest closed or renumbered over.
    pub fn forget(&mut self, fd: u32) {
        for s in &mut self.slots {
            if *s == Some(fd) {
                *s = None;
            }
        }
        self.subs.retain(|(_, _, f)| *f != fd);
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
            assert!(e.starts_with("WASMBOX_MOUNTS: "), "{e}");
        }
        let a = Mount::parse(&format!("{h}:/data"), "X").unwrap();
        let b = Mount::parse(&format!("{h}:/data/x"), "X").unwrap();
        assert!(Layout::new(vec![a.clone(), b], "X").is_err());
        let c = Mount::parse(&format!("{h}:/mnt/x"), "X").unwrap();
        assert!(Layout::new(vec![a, c], "X").is_ok());
    }
}
