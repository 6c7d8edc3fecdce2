//! Guest-path resolution and the file operations of a sandbox's workspace.
//!
//! Each input is text, one file operation a line (`read PATH`, `write PATH<TAB>CONTENT`,
//! `list`, `exists`, `remove`, `mkdir`, `cwd` (working_dir), `resolve`; a line without a known
//! operation is only resolved), so the seeds are readable and the dictionary
//! (`fuzz/guest_path.dict`: `/workspace`, `/tmp`, `..`, NUL, the planted symlinks' names) gives
//! the mutator the pieces that matter. For
//! every path, [`Workspace::resolve`] must agree with a small reference model written here:
//! `Ok` means a clean relative path (only normal components, no NUL) whose guest form is
//! `/workspace[/...]`; `Err` is always `FsError::Escape`. Then the operation runs on a real
//! workspace in a temp dir whose guest has planted symlinks that lead out (absolute and relative,
//! in `/workspace` and in `/tmp`), and after each one nothing outside the sandbox may have
//! changed: the canary directory beside it stays as it was, and whatever an operation reports
//! as done lies inside the workspace (or the sandbox's /tmp) once symlinks are resolved.

#![no_main]

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wasmbox::sandbox::fs::{FsError, Quota, Workspace};

const CANARY_FILE: &str = "keep";
const CANARY_BYTES: &[u8] = b"outside the sandbox: must never be read, changed or listed";

struct Fixture {
    /// `<t>/sb/{workspace,tmp}` is the sandbox, `<t>/canary` is outside it.
    _t: tempfile::TempDir,
    top: PathBuf,
    ws: Workspace,
    canary: PathBuf,
    host_ws: PathBuf,
    host_tmp: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().canonicalize().unwrap();
        let ws = Workspace::create(
            &top,
            "sb",
            Quota {
                max_bytes: 1 << 20,
                max_entries: 200,
            },
        )
        .unwrap();
        let canary = top.join("canary");
        std::fs::create_dir(&canary).unwrap();
        std::fs::write(canary.join(CANARY_FILE), CANARY_BYTES).unwrap();
        Fixture {
            host_ws: ws.host_workspace().canonicalize().unwrap(),
            host_tmp: ws.host_tmp().canonicalize().unwrap(),
            _t: t,
            top,
            ws,
            canary,
        }
    })
}

/// Empties the sandbox and plants what a hostile guest could have left: symlinks out (absolute
/// ones, which a host process could also be given, and relative ones that climb out, which a
/// WASI guest can make), a symlink loop, one that stays inside, a directory and a file.
fn reset(f: &Fixture) {
    for dir in [&f.host_ws, &f.host_tmp] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            // Does not follow symlinks: removes the link itself.
            if p.symlink_metadata().unwrap().is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
        let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, dir.join(name));
        link(&f.canary, "abs").unwrap();
        link(Path::new("../../canary"), "up").unwrap();
        link(Path::new("../../canary/keep"), "upfile").unwrap();
        link(Path::new("loop"), "loop").unwrap();
        link(Path::new("d"), "in").unwrap();
        std::fs::create_dir(dir.join("d")).unwrap();
        std::fs::write(dir.join("d").join("f.txt"), b"inside").unwrap();
    }
}

/// Nothing outside the sandbox changed.
fn check_outside(f: &Fixture) {
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&f.top),
        ["canary", "sb"],
        "something appeared beside the sandbox"
    );
    assert_eq!(
        names(&f.top.join("sb")),
        ["tmp", "workspace"],
        "something appeared beside the workspace"
    );
    assert_eq!(
        names(&f.canary),
        [CANARY_FILE],
        "the canary directory changed"
    );
    assert_eq!(
        std::fs::read(f.canary.join(CANARY_FILE)).unwrap(),
        CANARY_BYTES,
        "the canary file changed"
    );
}

/// What an operation reported as done exists, and where it really is lies under `root`.
fn check_inside(root: &Path, host: &Path, what: &str) {
    let real = host
        .canonicalize()
        .unwrap_or_else(|e| panic!("{what}: reported done at {}: {e}", host.display()));
    assert!(
        real.starts_with(root),
        "{what}: reported done at {} which is {}, outside {}",
        host.display(),
        real.display(),
        root.display()
    );
}

/// The reference: `/workspace[/...]` or relative; empty and `.` segments dropped; `..` pops and
/// may not climb above the root; no NUL. Returns the normal segments.
fn model(path: &str) -> Option<Vec<&str>> {
    if path.contains('\0') {
        return None;
    }
    let rest = if path == "/workspace" {
        ""
    } else if let Some(r) = path.strip_prefix("/workspace/") {
        r
    } else if path.starts_with('/') {
        return None;
    } else {
        path
    };
    let mut parts = Vec::new();
    for seg in rest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts)
}

fn check_resolve(ws: &Workspace, path: &str) {
    match (ws.resolve(path), model(path)) {
        (Ok(p), Some(parts)) => {
            let rel = p.rel();
            assert!(!rel.is_absolute(), "{path:?}: absolute {rel:?}");
            assert!(
                !rel.as_os_str().as_encoded_bytes().contains(&0),
                "{path:?}: NUL in {rel:?}"
            );
            if parts.is_empty() {
                assert_eq!(rel, Path::new("."), "{path:?}");
                assert_eq!(p.guest(), "/workspace", "{path:?}");
            } else {
                assert!(
                    rel.components().all(|c| matches!(c, Component::Normal(_))),
                    "{path:?}: {rel:?} has a component that is not a name"
                );
                let want: PathBuf = parts.iter().collect();
                assert_eq!(rel, want, "{path:?}");
                assert_eq!(
                    p.guest(),
                    format!("/workspace/{}", parts.join("/")),
                    "{path:?}"
                );
            }
            // The guest form resolves to itself.
            let again = ws
                .resolve(p.guest())
                .expect("a resolved path resolves again");
            assert_eq!(again.rel(), rel, "{path:?}");
            assert_eq!(again.guest(), p.guest(), "{path:?}");
        }
        (Err(FsError::Escape(_)), None) => {}
        (got, want) => panic!("{path:?}: resolve gave {got:?}, the model {want:?}"),
    }
}

/// One line of the input: `OP PATH`, or `write PATH<TAB>CONTENT`; an unknown OP only resolves.
enum Op<'a> {
    Resolve,
    Read,
    Write(&'a str),
    List,
    Exists,
    Remove,
    Mkdir,
    WorkingDir,
}

fn parse_line(line: &str) -> (Op<'_>, &str) {
    let (op, rest) = line.split_once(' ').unwrap_or(("", line));
    match op {
        "read" => (Op::Read, rest),
        "write" => {
            let (path, content) = rest.split_once('\t').unwrap_or((rest, ""));
            (Op::Write(content), path)
        }
        "list" => (Op::List, rest),
        "exists" => (Op::Exists, rest),
        "remove" => (Op::Remove, rest),
        "mkdir" => (Op::Mkdir, rest),
        "cwd" => (Op::WorkingDir, rest),
        "resolve" => (Op::Resolve, rest),
        _ => (Op::Resolve, line),
    }
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    reset(f);
    let ws = &f.ws;
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n').take(32) {
        let (op, path) = parse_line(line);
        check_resolve(ws, path);
        let host = |g: &wasmbox::sandbox::fs::GuestPath| f.host_ws.join(g.rel());
        match op {
            Op::Resolve => {}
            Op::Read => {
                if let Ok((g, w)) = ws.read_bytes(path, 0, 1 << 20) {
                    check_inside(&f.host_ws, &host(&g), path);
                    assert_eq!(w.data, std::fs::read(host(&g)).unwrap(), "{path:?}");
                }
            }
            Op::Write(content) => {
                if let Ok(g) = ws.write(path, content.as_bytes()) {
                    check_inside(&f.host_ws, &host(&g), path);
                    assert_eq!(
                        std::fs::read(host(&g)).unwrap(),
                        content.as_bytes(),
                        "{path:?}"
                    );
                }
            }
            Op::List => {
                if let Ok((g, entries)) = ws.list(path) {
                    check_inside(&f.host_ws, &host(&g), path);
                    for e in &entries {
                        assert!(e.path.starts_with("/workspace"), "{path:?}: {e:?}");
                    }
                }
            }
            Op::Exists => {
                if let Ok((g, true)) = ws.exists(path) {
                    check_inside(&f.host_ws, &host(&g), path);
                }
            }
            Op::Remove => {
                let _ = ws.remove(path);
            }
            Op::Mkdir => {
                if let Ok(g) = ws.mkdir(path) {
                    check_inside(&f.host_ws, &host(&g), path);
                }
            }
            Op::WorkingDir => {
                if let Ok(cwd) = ws.working_dir(path) {
                    let (root, rest) = if cwd == "/tmp" || cwd.starts_with("/tmp/") {
                        (&f.host_tmp, &cwd[4..])
                    } else {
                        let rest = cwd.strip_prefix("/workspace").unwrap_or_else(|| {
                            panic!("{path:?}: working dir {cwd:?} is neither /workspace nor /tmp")
                        });
                        (&f.host_ws, rest)
                    };
                    assert!(!cwd.contains('\0'), "{path:?}: NUL in {cwd:?}");
                    assert!(
                        !cwd.split('/').any(|c| c == ".."),
                        "{path:?}: '..' in {cwd:?}"
                    );
                    let host = root.join(rest.trim_start_matches('/'));
                    assert!(host.is_dir(), "{path:?}: {cwd:?} is not a directory");
                    check_inside(root, &host, path);
                }
            }
        }
        check_outside(f);
    }
});
