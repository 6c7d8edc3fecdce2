//! The disk budget's count against a fresh walk, after random file calls.
//!
//! Each input is a sequence of file calls, four bytes each (`wasmbox::lang::disk_probe::Op`):
//! opens with and without `O_CREAT`/`O_TRUNC`/`O_EXCL`, writes, sparse writes, resizes,
//! closes, renumbers, unlinks, renames (onto themselves and onto other names of the same file
//! too), hard links, directories and symlinks, in `/workspace`, `/tmp` and a lent `rw` folder
//! (through its slot and its own descriptor). They are made by a
//! real guest in a real wasmtime store, through the real WASI linker and its disk shadows. After
//! each call each budget's count (the guest's, the lent folder's) must be at least what a walk
//! finds (it is what the quota is checked against: below it, a guest holds more than it is
//! charged for), and the directories must hold no more than the quota allows. Until a call is
//! refused, the counts must be exactly what a walk finds.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wasmbox::engine::disk::Quota;
use wasmbox::lang::disk_probe::{self, Harness, Op};
use wasmbox::lang::mounts::{Layout, Mount};

const QUOTA: Quota = Quota {
    max_bytes: 1 << 20,
    max_entries: 16,
};
/// The most one call may write past the quota's check: none (a write reserves first).
const SLACK: u64 = 0;

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| Harness::new().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let lent = tempfile::tempdir().unwrap();
    let mount = Mount {
        host: lent.path().canonicalize().unwrap(),
        guest: "/data/lent".into(),
        writable: true,
    };
    let layout = Layout::new(vec![mount], "fuzz", QUOTA).unwrap();
    let lent_budget = layout.budgets[0].clone().unwrap();
    let mut p = harness().probe_lent(QUOTA, None, &layout).unwrap();
    let mut refused = false;
    for (i, op) in Op::decode(data).iter().take(256).enumerate() {
        refused |= p.apply(op).is_err();
        for budget in [p.budget(), &lent_budget] {
            let (counted, measured) = disk_probe::compare(budget);
            assert!(
                counted.0 >= measured.0 && counted.1 >= measured.1,
                "after call {i} ({op:?}): counted {counted:?}, on disk {measured:?}"
            );
            assert!(
                measured.0 <= QUOTA.max_bytes + SLACK && measured.1 <= QUOTA.max_entries,
                "after call {i} ({op:?}): {measured:?} on disk, over the quota"
            );
            if !refused {
                assert_eq!(counted, measured, "after call {i} ({op:?})");
            }
        }
    }
});
