use std::path::Path;
use std::time::Duration;

use super::fs::Quota;
use super::meta::{Meta, valid_id};
use super::*;
use crate::engine::cpu::LOCAL_OWNER;

fn config(data: &Path) -> SandboxConfig {
    SandboxConfig {
        default_timeout: Duration::from_secs(600),
        max_timeout: Duration::from_secs(3600),
        max_live: 8,
        quota: Quota {
            max_bytes: 1 << 20,
            max_entries: 100,
        },
        max_running_jobs: 1,
        max_kept_jobs: 1,
        max_per_owner: 2,
        data_dir: Some(data.to_path_buf()),
        save_every_call: false,
        save_idle: None,
        idle_pause: None,
        snapshot_bytes: 1 << 20,
        max_state_bytes: 1 << 20,
        max_live_sessions: 8,
    }
}

#[test]
fn ids_are_checked_before_they_become_paths() {
    assert!(valid_id("wb0123456789abcdef0123456789abcdef"));
    for bad in [
        "",
        "..",
        "wb../../../../etc/passwd000000000000",
        "wb0123456789ABCDEF0123456789abcdef",
        "xx0123456789abcdef0123456789abcdef",
        "wb0123456789abcdef0123456789abcde",
    ] {
        assert!(!valid_id(bad), "{bad:?}");
    }
}

#[test]
fn a_new_registry_adopts_what_a_dropped_one_left_and_removes_the_expired() {
    let data = tempfile::tempdir().unwrap();
    let (kept, expired) = {
        let r = Sandboxes::new(config(data.path())).unwrap();
        let mut env = BTreeMap::new();
        env.insert("K".to_string(), "v".to_string());
        let kept = r.create("python", Some(60), env, "token-a").unwrap();
        std::fs::write(kept.fs.host_workspace().join("f.txt"), "data").unwrap();
        let expired = r
            .create("python", Some(1), BTreeMap::new(), "token-a")
            .unwrap();
        // Over the per-owner limit; another owner is not.
        assert!(matches!(
            r.create("python", None, BTreeMap::new(), "token-a"),
            Err(SandboxError::TooManyForOwner(2))
        ));
        r.create("go", None, BTreeMap::new(), "token-b").unwrap();
        (kept.id.clone(), expired.id.clone())
    };
    std::thread::sleep(Duration::from_millis(1100));
    let r = Sandboxes::new(config(data.path())).unwrap();
    let sb = r.get(&kept, "token-a").unwrap();
    assert_eq!(sb.template.id, "python");
    assert_eq!(sb.env()["K"], "v");
    assert_eq!(
        std::fs::read_to_string(sb.fs.host_workspace().join("f.txt")).unwrap(),
        "data"
    );
    assert!(matches!(
        r.get(&kept, "token-b"),
        Err(SandboxError::NotFound(_))
    ));
    assert!(r.get(&expired, "token-a").is_err());
    assert!(!data.path().join("sandboxes").join(&expired).exists());
    assert_eq!(r.list("token-a").len(), 1);
    assert_eq!(r.list("token-b").len(), 1);

    // A second live registry on the same directory cannot take them.
    let other = Sandboxes::new(config(data.path())).unwrap();
    assert!(other.get(&kept, "token-a").is_err());
    assert!(other.list("token-a").is_empty());
}

#[test]
fn unreadable_sandboxes_are_quarantined_never_deleted() {
    let data = tempfile::tempdir().unwrap();
    let root = data.path().join("sandboxes");
    let (bad_meta, bad_ws, other_id, ok) = {
        let r = Sandboxes::new(config(data.path())).unwrap();
        let mk = |owner| {
            let sb = r
                .create("python", Some(600), BTreeMap::new(), owner)
                .unwrap();
            std::fs::write(sb.fs.host_workspace().join("f.txt"), "work").unwrap();
            sb.id.clone()
        };
        (
            mk("token-a"),
            mk("token-a"),
            mk(LOCAL_OWNER),
            mk(LOCAL_OWNER),
        )
    };
    // A torn meta.json; a workspace that is a file; a meta.json naming another sandbox; and
    // a stale temp file from an interrupted save beside a good one.
    std::fs::write(root.join(&bad_meta).join("meta.json"), "{\"id\":").unwrap();
    let ws = root.join(&bad_ws).join("workspace");
    std::fs::remove_dir_all(&ws).unwrap();
    std::fs::write(&ws, "not a directory").unwrap();
    let m = root.join(&other_id).join("meta.json");
    let text = std::fs::read_to_string(&m).unwrap().replace(&other_id, &ok);
    std::fs::write(&m, text).unwrap();
    let stale = root.join(&ok).join("meta.json.1234-abcd.tmp");
    std::fs::write(&stale, "{").unwrap();

    let r = Sandboxes::new(config(data.path())).unwrap();
    assert!(r.get(&ok, LOCAL_OWNER).is_ok());
    assert!(!stale.exists(), "stale temp files go");
    let q = r.quarantined(LOCAL_OWNER);
    let reason = |id: &str| {
        q.iter()
            .find(|q| q.id == id)
            .unwrap_or_else(|| panic!("{id} not quarantined: {q:?}"))
            .reason
            .clone()
    };
    assert!(reason(&bad_meta).contains("unreadable meta.json"));
    assert!(reason(&bad_ws).contains("workspace unusable"));
    assert!(reason(&other_id).contains("does not match"));
    assert_eq!(q.len(), 3, "{q:?}");
    for q in &q {
        assert!(!root.join(&q.id).exists());
        assert!(q.path.starts_with(data.path().join("quarantine")));
        assert!(q.path.join("meta.json").is_file(), "{q:?}");
    }
    let kept = q.iter().find(|q| q.id == bad_meta).unwrap();
    assert_eq!(
        std::fs::read_to_string(kept.path.join("workspace/f.txt")).ok(),
        Some("work".to_string())
    );
    // Tokens see none and delete none; the local user deletes them one by one.
    assert!(r.quarantined("token-a").is_empty());
    assert!(matches!(
        r.delete(&bad_meta, "token-a"),
        Err(SandboxError::NotFound(_))
    ));
    r.delete(&bad_meta, LOCAL_OWNER).unwrap();
    assert_eq!(r.quarantined(LOCAL_OWNER).len(), 2);
    assert!(matches!(
        r.delete(&bad_meta, LOCAL_OWNER),
        Err(SandboxError::NotFound(_))
    ));
    // A new registry neither re-adopts nor removes the rest.
    drop(r);
    let r = Sandboxes::new(config(data.path())).unwrap();
    assert_eq!(r.quarantined(LOCAL_OWNER).len(), 2);
}

#[test]
fn saves_replace_meta_json_whole() {
    let data = tempfile::tempdir().unwrap();
    let r = Sandboxes::new(config(data.path())).unwrap();
    let sb = r
        .create("python", Some(600), BTreeMap::new(), LOCAL_OWNER)
        .unwrap();
    // Concurrent saves of growing env: every read parses, the last one wins, no temp left.
    std::thread::scope(|s| {
        for t in 0..4 {
            let sb = &sb;
            s.spawn(move || {
                for i in 0..25 {
                    sb.env
                        .lock()
                        .unwrap()
                        .insert(format!("K{t}_{i}"), "v".repeat(i));
                    sb.save();
                }
            });
        }
        let path = sb.fs.host_root().join("meta.json");
        for _ in 0..50 {
            let b = std::fs::read(&path).unwrap();
            serde_json::from_slice::<Meta>(&b).unwrap();
        }
    });
    let b = std::fs::read(sb.fs.host_root().join("meta.json")).unwrap();
    assert_eq!(serde_json::from_slice::<Meta>(&b).unwrap().env.len(), 100);
    let left: Vec<_> = std::fs::read_dir(sb.fs.host_root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn without_a_data_dir_sandboxes_end_with_the_registry() {
    let mut c = config(Path::new("/nonexistent"));
    c.data_dir = None;
    let r = Sandboxes::new(c).unwrap();
    let sb = r
        .create("python", None, BTreeMap::new(), LOCAL_OWNER)
        .unwrap();
    let root = sb.fs.host_root().to_path_buf();
    assert!(root.is_dir());
    drop(sb);
    drop(r);
    assert!(!root.exists());
}
