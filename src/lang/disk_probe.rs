//! A guest that makes the file calls it is told to, one at a time, through the real WASI linker
//! and its disk shadows: the property tests and the `disk_count` fuzz target drive it with
//! random sequences and compare the budget's count with a fresh walk of the directories.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, Instance, Memory, Module, Store, TypedFunc};

use super::guest::{Guest, GuestSpec, GuestState};
use super::mounts::Layout;
use super::{ExecRequest, Language, Place};
use crate::engine::disk::{DiskBudget, Quota};

/// The guest's own two directories: its preopens, `/workspace` and `/tmp`.
const DIRS: [(i32, &str); 2] = [(3, ""), (4, "")];
/// Names the calls use: few, so that sequences meet the same files again.
const NAMES: [&str; 8] = ["a", "b", "c", "d", "d/a", "d/b", "e", "e/d/a"];
/// Where the path arguments go in the guest's memory.
const PATH_AT: i32 = 0;
const PATH2_AT: i32 = 256;
/// Where an opened descriptor or a count of bytes written is answered.
const OUT_AT: i32 = 512;
/// One iovec, and the bytes it writes.
const IOV_AT: i32 = 1024;
const DATA_AT: i32 = 4096;
const DATA_MAX: u32 = 128 << 10;

const OFLAGS_CREAT: i32 = 1;
const OFLAGS_EXCL: i32 = 4;
const OFLAGS_TRUNC: i32 = 8;
/// Every right: the preopens' inheriting rights cap what is granted.
const RIGHTS: i64 = 0x1fff_ffff;

/// One file call.
#[derive(Clone, Debug)]
pub enum Op {
    Open {
        dir: usize,
        name: usize,
        oflags: i32,
    },
    Write {
        fd: usize,
        len: u32,
    },
    Pwrite {
        fd: usize,
        offset: u64,
        len: u32,
    },
    SetSize {
        fd: usize,
        size: u64,
    },
    Close {
        fd: usize,
    },
    Renumber {
        from: usize,
        to: usize,
    },
    Unlink {
        dir: usize,
        name: usize,
    },
    Rename {
        from: (usize, usize),
        to: (usize, usize),
    },
    Link {
        from: (usize, usize),
        to: (usize, usize),
    },
    Mkdir {
        dir: usize,
        name: usize,
    },
    Rmdir {
        dir: usize,
        name: usize,
    },
    Symlink {
        target: usize,
        dir: usize,
        name: usize,
    },
}

impl Op {
    /// The call's name, for tallies.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Open { .. } => "open",
            Op::Write { .. } => "write",
            Op::Pwrite { .. } => "pwrite",
            Op::SetSize { .. } => "set_size",
            Op::Close { .. } => "close",
            Op::Renumber { .. } => "renumber",
            Op::Unlink { .. } => "unlink",
            Op::Rename { .. } => "rename",
            Op::Link { .. } => "link",
            Op::Mkdir { .. } => "mkdir",
            Op::Rmdir { .. } => "rmdir",
            Op::Symlink { .. } => "symlink",
        }
    }

    /// The calls `bytes` spell, four bytes each (a fuzzer's input, or a seeded generator's).
    pub fn decode(bytes: &[u8]) -> Vec<Op> {
        bytes
            .chunks_exact(4)
            .map(|b| {
                let (x, y, z) = (b[1] as usize, b[2] as usize, b[3]);
                // Mostly /workspace (or a lent folder, when the probe has one) and the first few
                // names, so that calls meet existing files.
                let dir = |v: usize| [0, 0, 1, 2, 3, 0, 2, 1][v % 8];
                let name = |v: usize| [0, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 0, 1, 2, 0][v % 16];
                let dn = |v: usize| (dir(v), name(v / 4));
                match b[0] % 14 {
                    0 | 1 => Op::Open {
                        dir: dir(x),
                        name: name(y),
                        oflags: [
                            OFLAGS_CREAT,
                            OFLAGS_CREAT | OFLAGS_TRUNC,
                            OFLAGS_CREAT | OFLAGS_EXCL,
                            0,
                            OFLAGS_TRUNC,
                        ][z as usize % 5],
                    },
                    2 | 3 => Op::Write {
                        fd: x,
                        len: (y as u32 * 512 + z as u32).min(DATA_MAX),
                    },
                    4 => Op::Pwrite {
                        fd: x,
                        offset: y as u64 * 4096,
                        len: z as u32 * 256,
                    },
                    5 => Op::SetSize {
                        fd: x,
                        size: y as u64 * 4096 + z as u64,
                    },
                    6 => Op::Close { fd: x },
                    7 => Op::Renumber { from: x, to: y },
                    8 => Op::Unlink {
                        dir: dir(x),
                        name: name(y),
                    },
                    9 => Op::Rename {
                        from: dn(x),
                        to: dn(y),
                    },
                    10 => Op::Link {
                        from: dn(x),
                        to: dn(y),
                    },
                    11 => Op::Mkdir {
                        dir: dir(x),
                        name: name(y),
                    },
                    12 => Op::Rmdir {
                        dir: dir(x),
                        name: name(y),
                    },
                    _ => Op::Symlink {
                        target: name(x),
                        dir: dir(y),
                        name: name(z as usize),
                    },
                }
            })
            .collect()
    }
}

type Call<P> = TypedFunc<P, i32>;
/// `path_open`'s parameters.
type OpenArgs = (i32, i32, i32, i32, i32, i64, i64, i32, i32);

/// A guest armed with a disk budget, and its exports.
pub struct Probe {
    guest: Guest,
    memory: Memory,
    /// Descriptors it opened and has not closed.
    fds: Vec<i32>,
    /// The directories calls name: a descriptor, and what goes before each name.
    dirs: Vec<(i32, &'static str)>,
    budget: Arc<DiskBudget>,
    path_open: Call<OpenArgs>,
    fd_write: Call<(i32, i32, i32, i32)>,
    fd_pwrite: Call<(i32, i32, i32, i64, i32)>,
    fd_filestat_set_size: Call<(i32, i64)>,
    fd_close: Call<(i32,)>,
    fd_renumber: Call<(i32, i32)>,
    path_unlink_file: Call<(i32, i32, i32)>,
    path_rename: Call<(i32, i32, i32, i32, i32, i32)>,
    path_link: Call<(i32, i32, i32, i32, i32, i32, i32)>,
    path_create_directory: Call<(i32, i32, i32)>,
    path_remove_directory: Call<(i32, i32, i32)>,
    path_symlink: Call<(i32, i32, i32, i32, i32)>,
}

/// An engine and the probe's module compiled for it, to make probes with.
pub struct Harness {
    engine: Engine,
    module: Module,
}

impl Harness {
    pub fn new() -> super::Result<Self> {
        let engine = crate::engine::build_engine_with(wasmtime::Strategy::Cranelift)?;
        let module =
            Module::new(&engine, super::wasi::calls_wat()).map_err(super::guest::engine_err)?;
        Ok(Self { engine, module })
    }

    /// A guest in fresh scratch directories under `quota` or, with `place`, in those
    /// directories and under their budget (guests sharing a place share its budget).
    pub fn probe(&self, quota: Quota, place: Option<Place>) -> super::Result<Probe> {
        Probe::new(&self.engine, &self.module, quota, place, &Layout::default())
    }

    /// As [`Harness::probe`], with `mounts` lent to it: calls name lent folder `mounts[0]`
    /// both through its slot (rerouted) and through its own descriptor.
    pub fn probe_lent(
        &self,
        quota: Quota,
        place: Option<Place>,
        mounts: &Layout,
    ) -> super::Result<Probe> {
        Probe::new(&self.engine, &self.module, quota, place, mounts)
    }
}

impl Probe {
    fn new(
        engine: &Engine,
        module: &Module,
        quota: Quota,
        place: Option<Place>,
        mounts: &Layout,
    ) -> super::Result<Self> {
        let req = ExecRequest {
            language: Language::Python,
            code: String::new(),
            env: BTreeMap::new(),
            timeout: Duration::from_secs(3600),
            memory_bytes: 1 << 20,
            output_bytes: 1 << 10,
            echo: false,
            place,
            scratch_quota: quota,
            cancel: None,
            progress: None,
            images: None,
            owner: "probe".into(),
            reach: None,
            packages: Vec::new(),
            audit: None,
        };
        let spec = GuestSpec {
            argv: &["probe"],
            base_env: &[],
            read_only: Vec::new(),
            mounts,
            after_slots: Vec::new(),
        };
        let mut guest = Guest::new(engine, &req, &spec)?;
        let budget = guest.disk_budget().expect("an armed guest has a budget");
        let linker = super::guest::wasi_linker(engine)?;
        let err = super::guest::engine_err;
        let inst: Instance = linker.instantiate(&mut guest.store, module).map_err(err)?;
        let s = &mut guest.store;
        let memory = inst.get_memory(&mut *s, "memory").expect("exported memory");
        macro_rules! f {
            ($name:literal) => {
                inst.get_typed_func(&mut *s, $name).map_err(err)?
            };
        }
        let mut dirs = DIRS.to_vec();
        if let Some(m) = mounts.mounts.first() {
            // After /workspace and /tmp: the slots /data and /mnt, then the mounts below them.
            let slot = super::guest::MOUNT_SLOTS
                .iter()
                .position(|s| m.guest.starts_with(s))
                .expect("a mount is in a slot") as i32;
            match m.guest.rsplit_once('/') {
                Some((_, name)) if m.guest.matches('/').count() == 2 => {
                    let prefix: &'static str = format!("{name}/").leak();
                    dirs.push((5 + slot, prefix));
                    dirs.push((7, ""));
                }
                _ => dirs.push((5 + slot, "")),
            }
        }
        Ok(Self {
            dirs,
            path_open: f!("path_open"),
            fd_write: f!("fd_write"),
            fd_pwrite: f!("fd_pwrite"),
            fd_filestat_set_size: f!("fd_filestat_set_size"),
            fd_close: f!("fd_close"),
            fd_renumber: f!("fd_renumber"),
            path_unlink_file: f!("path_unlink_file"),
            path_rename: f!("path_rename"),
            path_link: f!("path_link"),
            path_create_directory: f!("path_create_directory"),
            path_remove_directory: f!("path_remove_directory"),
            path_symlink: f!("path_symlink"),
            memory,
            fds: Vec::new(),
            budget,
            guest,
        })
    }

    pub fn budget(&self) -> &Arc<DiskBudget> {
        &self.budget
    }

    /// Makes the call: its errno, or the trap that ended it (the disk quota).
    pub fn apply(&mut self, op: &Op) -> Result<i32, String> {
        let s = &mut self.guest.store;
        let mem = self.memory;
        let fd = |fds: &[i32], i: usize| fds.get(i % fds.len().max(1)).copied().unwrap_or(99);
        let dirs = self.dirs.clone();
        let dir = |i: usize| dirs[i % dirs.len()].0;
        let path = |s: &mut Store<GuestState>, at: i32, (d, name): (usize, usize)| -> (i32, i32) {
            let n = format!("{}{}", dirs[d % dirs.len()].1, NAMES[name]);
            mem.data_mut(s)[at as usize..][..n.len()].copy_from_slice(n.as_bytes());
            (at, n.len() as i32)
        };
        let iov = |s: &mut Store<GuestState>, len: u32| {
            let mut iov = [0u8; 8];
            iov[..4].copy_from_slice(&(DATA_AT as u32).to_le_bytes());
            iov[4..].copy_from_slice(&len.to_le_bytes());
            mem.data_mut(s)[IOV_AT as usize..][..8].copy_from_slice(&iov);
        };
        let r = match *op {
            Op::Open {
                dir: d,
                name,
                oflags,
            } => {
                let (p, l) = path(&mut *s, PATH_AT, (d, name));
                let r = self.path_open.call(
                    &mut *s,
                    (dir(d), 0, p, l, oflags, RIGHTS, RIGHTS, 0, OUT_AT),
                );
                if let Ok(0) = r {
                    let b = &self.memory.data(&*s)[OUT_AT as usize..][..4];
                    self.fds.push(i32::from_le_bytes(b.try_into().unwrap()));
                }
                r
            }
            Op::Write { fd: i, len } => {
                iov(&mut *s, len);
                let fd = fd(&self.fds, i);
                self.fd_write.call(&mut *s, (fd, IOV_AT, 1, OUT_AT))
            }
            Op::Pwrite { fd: i, offset, len } => {
                iov(&mut *s, len);
                let fd = fd(&self.fds, i);
                self.fd_pwrite
                    .call(&mut *s, (fd, IOV_AT, 1, offset as i64, OUT_AT))
            }
            Op::SetSize { fd: i, size } => {
                let fd = fd(&self.fds, i);
                self.fd_filestat_set_size.call(&mut *s, (fd, size as i64))
            }
            Op::Close { fd: i } => {
                let fd = fd(&self.fds, i);
                let r = self.fd_close.call(&mut *s, (fd,));
                if let Ok(0) = r {
                    self.fds.retain(|f| *f != fd);
                }
                r
            }
            Op::Renumber { from, to } => {
                let (from, to) = (fd(&self.fds, from), fd(&self.fds, to));
                let r = self.fd_renumber.call(&mut *s, (from, to));
                if let Ok(0) = r
                    && from != to
                {
                    self.fds.retain(|f| *f != from);
                }
                r
            }
            Op::Unlink { dir: d, name } => {
                let (p, l) = path(&mut *s, PATH_AT, (d, name));
                self.path_unlink_file.call(&mut *s, (dir(d), p, l))
            }
            Op::Rename { from, to } => {
                let (p, l) = path(&mut *s, PATH_AT, from);
                let (q, m) = path(&mut *s, PATH2_AT, to);
                self.path_rename
                    .call(&mut *s, (dir(from.0), p, l, dir(to.0), q, m))
            }
            Op::Link { from, to } => {
                let (p, l) = path(&mut *s, PATH_AT, from);
                let (q, m) = path(&mut *s, PATH2_AT, to);
                self.path_link
                    .call(&mut *s, (dir(from.0), 0, p, l, dir(to.0), q, m))
            }
            Op::Mkdir { dir: d, name } => {
                let (p, l) = path(&mut *s, PATH_AT, (d, name));
                self.path_create_directory.call(&mut *s, (dir(d), p, l))
            }
            Op::Rmdir { dir: d, name } => {
                let (p, l) = path(&mut *s, PATH_AT, (d, name));
                self.path_remove_directory.call(&mut *s, (dir(d), p, l))
            }
            Op::Symlink {
                target,
                dir: d,
                name,
            } => {
                // The target is a name as the guest wrote it, not a path in a directory.
                let t = NAMES[target].as_bytes();
                mem.data_mut(&mut *s)[PATH_AT as usize..][..t.len()].copy_from_slice(t);
                let (q, m) = path(&mut *s, PATH2_AT, (d, name));
                self.path_symlink
                    .call(&mut *s, (PATH_AT, t.len() as i32, dir(d), q, m))
            }
        };
        r.map_err(|e| format!("{e:#}"))
    }

    /// Closes every descriptor it holds.
    pub fn close_all(&mut self) {
        for fd in std::mem::take(&mut self.fds) {
            let _ = self.fd_close.call(&mut self.guest.store, (fd,));
        }
    }
}

/// What the budget counts against what is there: (counted, measured) bytes and entries.
pub fn compare(budget: &DiskBudget) -> ((u64, u64), (u64, u64)) {
    let counted = budget.counted();
    let measured = budget
        .usage()
        .expect("the probe's directories can be walked");
    (counted, measured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn harness() -> &'static Harness {
        static H: OnceLock<Harness> = OnceLock::new();
        H.get_or_init(|| Harness::new().unwrap())
    }

    fn probe(max_bytes: u64, max_entries: u64) -> Probe {
        let q = Quota {
            max_bytes,
            max_entries,
        };
        harness().probe(q, None).unwrap()
    }

    const KIB: u64 = 1 << 10;

    #[test]
    fn a_rename_onto_itself_frees_nothing() {
        let mut p = probe(1 << 20, 100);
        let create = Op::Open {
            dir: 0,
            name: 0,
            oflags: OFLAGS_CREAT,
        };
        assert_eq!(p.apply(&create), Ok(0));
        let mut refused = None;
        for i in 0..40 {
            let write = Op::Write {
                fd: 0,
                len: DATA_MAX,
            };
            match p.apply(&write) {
                Ok(0) => {}
                Ok(e) => panic!("write {i}: errno {e}"),
                Err(trap) => {
                    refused = Some((i, trap));
                    break;
                }
            }
            let onto_itself = Op::Rename {
                from: (0, 0),
                to: (0, 0),
            };
            assert_eq!(p.apply(&onto_itself), Ok(0));
        }
        let (i, trap) = refused.expect("a 1 MiB quota stops 40 writes of 128 KiB");
        assert_eq!(i, 8, "the ninth 128 KiB write is over 1 MiB: {trap}");
        let (_, measured) = compare(p.budget());
        assert!(measured.0 <= 1 << 20, "{measured:?}");
    }

    #[test]
    fn a_files_bytes_count_once_whatever_its_names() {
        let mut p = probe(1 << 30, 1000);
        let ops = [
            Op::Open {
                dir: 0,
                name: 0,
                oflags: OFLAGS_CREAT,
            },
            Op::Write {
                fd: 0,
                len: 100 * KIB as u32,
            },
            // /workspace/a is /workspace/b and /tmp/a too.
            Op::Link {
                from: (0, 0),
                to: (0, 1),
            },
            Op::Link {
                from: (0, 0),
                to: (1, 0),
            },
            Op::Write {
                fd: 0,
                len: 10 * KIB as u32,
            },
        ];
        for op in &ops {
            assert_eq!(p.apply(op), Ok(0), "{op:?}");
        }
        assert_eq!(compare(p.budget()), ((110 * KIB, 3), (110 * KIB, 3)));
        // Renaming one of its names onto another changes nothing.
        let onto_another = Op::Rename {
            from: (0, 0),
            to: (0, 1),
        };
        assert_eq!(p.apply(&onto_another), Ok(0));
        assert_eq!(compare(p.budget()), ((110 * KIB, 3), (110 * KIB, 3)));
        for (dir, name, left) in [(0, 0, 110 * KIB), (0, 1, 110 * KIB), (1, 0, 0)] {
            assert_eq!(p.apply(&Op::Unlink { dir, name }), Ok(0));
            p.close_all();
            let (counted, measured) = compare(p.budget());
            assert_eq!(counted, measured);
            assert_eq!(counted.0, left, "after unlinking {dir}/{name}");
        }
    }

    /// A seeded generator for the property tests (no fuzzer in `cargo test`).
    fn random_ops(seed: u64, n: usize) -> Vec<Op> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let bytes: Vec<u8> = (0..n * 4)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        Op::decode(&bytes)
    }

    #[test]
    fn the_count_is_what_a_walk_finds_after_random_calls() {
        // How many calls of each kind succeeded: the sequences must exercise every one.
        let mut done = std::collections::BTreeMap::<&str, u32>::new();
        for seed in 0..60 {
            let mut p = probe(1 << 30, 10_000);
            for (i, op) in random_ops(seed, 120).iter().enumerate() {
                let r = p.apply(op);
                assert!(r.is_ok(), "seed {seed} op {i} {op:?}: {r:?}");
                if r == Ok(0) {
                    *done.entry(op.kind()).or_default() += 1;
                }
                let (counted, measured) = compare(p.budget());
                assert_eq!(counted, measured, "seed {seed} after op {i} {op:?}");
            }
            p.close_all();
            let (counted, measured) = compare(p.budget());
            assert_eq!(counted, measured, "seed {seed} after closing");
        }
        assert_eq!(done.len(), 12, "every kind of call succeeded: {done:?}");
        assert!(done.values().all(|n| *n >= 10), "{done:?}");
    }

    #[test]
    fn the_count_never_falls_below_a_walk_under_a_small_quota() {
        for seed in 100..160 {
            let mut p = probe(512 * KIB, 12);
            for (i, op) in random_ops(seed, 80).iter().enumerate() {
                let _ = p.apply(op);
                let (counted, measured) = compare(p.budget());
                assert!(
                    counted.0 >= measured.0 && counted.1 >= measured.1,
                    "seed {seed} after op {i} {op:?}: counted {counted:?}, on disk {measured:?}"
                );
                assert!(measured.0 <= 512 * KIB + DATA_MAX as u64, "{measured:?}");
            }
        }
    }

    #[test]
    fn guests_sharing_a_budget_cannot_talk_its_count_down() {
        let h = harness();
        let ws = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let q = Quota {
            max_bytes: 1 << 30,
            max_entries: 10_000,
        };
        let budget = DiskBudget::empty(vec![ws.path().into(), tmp.path().into()], q);
        let place = Place {
            workspace: ws.path().into(),
            tmp: tmp.path().into(),
            cwd: "/workspace".into(),
            stop: Default::default(),
            disk: Some(budget.clone()),
            output: None,
        };
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let place = place.clone();
                s.spawn(move || {
                    let mut p = h.probe(q, Some(place)).unwrap();
                    for seed in 0..300 {
                        for op in random_ops(1000 + t * 100 + seed, 60) {
                            let _ = p.apply(&op);
                        }
                    }
                    p.close_all();
                });
            }
        });
        let (counted, measured) = compare(&budget);
        assert!(
            counted.0 >= measured.0 && counted.1 >= measured.1,
            "counted {counted:?}, on disk {measured:?}"
        );
    }

    /// A lent folder at `guest` in a fresh directory holding a file of its owner's.
    fn lent(guest: &str, room: Quota) -> (tempfile::TempDir, Layout) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("owners.csv"), vec![b'x'; 5000]).unwrap();
        let m = crate::lang::mounts::Mount {
            host: d.path().canonicalize().unwrap(),
            guest: guest.into(),
            writable: true,
        };
        let layout = Layout::new(vec![m], "test", room).unwrap();
        (d, layout)
    }

    #[test]
    fn a_lent_folders_count_is_what_a_walk_finds_and_nothing_crosses_into_it() {
        let room = Quota {
            max_bytes: 1 << 30,
            max_entries: 10_000,
        };
        let mut done = std::collections::BTreeMap::<String, u32>::new();
        for guest in ["/data/sales", "/mnt"] {
            let (_d, layout) = lent(guest, room);
            let lent = layout.budgets[0].clone().unwrap();
            for seed in 0..40 {
                let mut p = harness().probe_lent(room, None, &layout).unwrap();
                for (i, op) in random_ops(500 + seed, 120).iter().enumerate() {
                    let r = p.apply(op);
                    assert!(r.is_ok(), "{guest} seed {seed} op {i} {op:?}: {r:?}");
                    let r = r.unwrap();
                    *done.entry(format!("{} {r}", op.kind())).or_default() += 1;
                    for (what, b) in [("own", p.budget()), ("lent", &lent)] {
                        let (counted, measured) = compare(b);
                        assert_eq!(
                            counted, measured,
                            "{what}: {guest} seed {seed} op {i} {op:?}"
                        );
                    }
                }
                p.close_all();
            }
            let (counted, measured) = compare(&lent);
            assert_eq!(counted, measured, "{guest} after every guest");
        }
        // Renames and links between a lent folder and the rest were tried and refused (EXDEV);
        // symlinks in a lent folder too (EPERM); and every kind of call succeeded.
        for k in ["rename 75", "link 75", "symlink 63"] {
            assert!(done.get(k).is_some_and(|n| *n >= 5), "{k}: {done:?}");
        }
        for k in [
            "open", "write", "pwrite", "set_size", "close", "renumber", "unlink", "rename", "link",
            "mkdir", "rmdir", "symlink",
        ] {
            assert!(
                done.get(&format!("{k} 0")).is_some_and(|n| *n >= 5),
                "{k}: {done:?}"
            );
        }
    }

    #[test]
    fn a_lent_folder_stops_at_its_room_whoever_writes() {
        let room = Quota {
            max_bytes: 256 * KIB,
            max_entries: 12,
        };
        let own = Quota {
            max_bytes: 1 << 30,
            max_entries: 10_000,
        };
        let (_d, layout) = lent("/data/out", room);
        let lent = layout.budgets[0].clone().unwrap();
        let limit = lent.quota();
        assert_eq!(
            limit.max_bytes,
            5000 + 256 * KIB,
            "what it held, plus the room"
        );
        let mut refused = 0;
        for seed in 0..40 {
            let mut p = harness().probe_lent(own, None, &layout).unwrap();
            for (i, op) in random_ops(900 + seed, 80).iter().enumerate() {
                refused += p.apply(op).is_err() as u32;
                let (counted, measured) = compare(&lent);
                assert!(
                    counted.0 >= measured.0 && counted.1 >= measured.1,
                    "seed {seed} after op {i} {op:?}: counted {counted:?}, on disk {measured:?}"
                );
                assert!(
                    measured.0 <= limit.max_bytes && measured.1 <= limit.max_entries,
                    "seed {seed} after op {i} {op:?}: {measured:?} over {limit:?}"
                );
            }
            p.close_all();
        }
        assert!(refused > 0, "the room ran out");
    }
}
