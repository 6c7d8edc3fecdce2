//! Every guest-writable byte on the host counts against a disk limit as it is written (issue
//! #22, class 3): a sandbox's quota covers `/tmp` as well as `/workspace`, one-shots have their
//! own cap on their scratch directories, sizes are apparent sizes (a sparse file counts in
//! full), and concurrent writers cannot jointly pass one check. Quotas are small and every call
//! has a deadline, so a test that is not stopped ends instead of filling the disk or hanging.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
/// The sandbox quota most tests use (`WASMBOX_SANDBOX_DISK_MB`).
const QUOTA_MB: &str = "50";
/// What may be on the host once a writer is stopped: the quota plus 10%.
const QUOTA_SLACK: u64 = 55 * MIB;

/// A server whose sandboxes live in `data`, so a test can measure them from the host.
async fn server_in(data: &Path, env: &[(&str, &str)]) -> Client {
    let mut env = env.to_vec();
    env.push(("WASMBOX_DATA", data.to_str().unwrap()));
    server_with_env(&env).await
}

/// The host directories behind a sandbox's `/workspace` and `/tmp`.
fn sandbox_dirs(data: &Path, id: &str) -> [PathBuf; 2] {
    let root = data.join("sandboxes").join(id);
    let dirs = [root.join("workspace"), root.join("tmp")];
    for d in &dirs {
        assert!(d.is_dir(), "{} is not a directory", d.display());
    }
    dirs
}

/// Apparent sizes (not blocks) of the regular files under `dirs` (a file with several names
/// once: it is on disk once), and their largest.
fn apparent(dirs: &[PathBuf]) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut largest = 0;
    let mut seen = std::collections::HashSet::new();
    for d in dirs {
        for p in walk(d) {
            if let Ok(m) = std::fs::symlink_metadata(&p)
                && m.is_file()
                && seen.insert((m.dev(), m.ino()))
            {
                total += m.len();
                largest = largest.max(m.len());
            }
        }
    }
    (total, largest)
}

/// Files and directories under `dirs`.
fn entry_count(dirs: &[PathBuf]) -> usize {
    dirs.iter().map(|d| walk(d).len()).sum()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// A tool call that must succeed within `secs`.
async fn timed_ok(c: &Client, tool: &str, args: Value, secs: u64) -> Value {
    tokio::time::timeout(Duration::from_secs(secs), ok(c, tool, args.clone()))
        .await
        .unwrap_or_else(|_| panic!("{tool} {args} did not answer within {secs} s"))
}

/// Runs `code` in sandbox `id` (persistent mode) with a 50 s execution deadline; the call must
/// answer within 60 s (Go: 170 s, its build on the host comes first).
async fn run(c: &Client, id: &str, language: &str, code: &str) -> Value {
    let secs = if language == "go" { 170 } else { 60 };
    timed_ok(
        c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": language,
               "code": code, "timeout": 50}),
        secs,
    )
    .await
}

/// Python writing `mb` MiB to `path` in 1 MiB chunks, flushing each.
fn py_writer(path: &str, mb: u32) -> String {
    format!(
        "chunk = b'x' * (1 << 20)\n\
         with open('{path}', 'wb') as f:\n\
         \x20   for i in range({mb}):\n\
         \x20       f.write(chunk)\n\
         \x20       f.flush()\n\
         print('wrote {mb} MiB')"
    )
}

/// The run was stopped by the disk limit.
fn assert_disk_limit(r: &Value, what: &str) {
    assert_eq!(
        r["limit"], "disk",
        "{what}: not stopped by the disk limit: {r}"
    );
    assert_eq!(r["success"], false, "{what}: {r}");
}

/// The sandbox still runs code after it was stopped.
async fn still_serves(c: &Client, id: &str, cleanup: &str) {
    let code = format!("{cleanup}\nprint(1)");
    let r = run(c, id, "python", &code).await;
    assert_eq!(r["stdout"], "1\n", "the sandbox serves on: {r}");
    assert_eq!(r["success"], true, "{r}");
}

#[tokio::test]
async fn sandbox_tmp_counts_against_the_quota() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let r = run(&c, &id, "python", &py_writer("/tmp/big", 200)).await;
    let (total, _) = apparent(&dirs);
    assert_disk_limit(&r, &format!("200 MiB to /tmp, {} on the host", mib(total)));
    assert!(
        total <= QUOTA_SLACK,
        "{} on the host under a 50 MiB quota",
        mib(total)
    );
    // /tmp cannot be reached by the file tools: the guest removes it.
    still_serves(&c, &id, "import os\nos.remove('/tmp/big')").await;
    c.cancel().await.unwrap();
}

/// A guest in `language` writing 200 MiB to `/workspace/big` under a 50 MiB quota.
async fn workspace_write_is_stopped(language: &str, code: &str) {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let r = run(&c, &id, language, code).await;
    let (total, _) = apparent(&dirs);
    let what = format!(
        "{language}: 200 MiB to /workspace, {} on the host",
        mib(total)
    );
    assert_disk_limit(&r, &what);
    assert!(
        total <= QUOTA_SLACK,
        "{what}: over the quota plus 10% ({})",
        mib(QUOTA_SLACK)
    );
    ok(&c, "file_remove", json!({"sandbox_id": id, "path": "big"})).await;
    still_serves(&c, &id, "").await;
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn sandbox_workspace_write_is_stopped_within_the_quota_python() {
    workspace_write_is_stopped("python", &py_writer("/workspace/big", 200)).await;
}

#[tokio::test]
async fn sandbox_workspace_write_is_stopped_within_the_quota_javascript() {
    workspace_write_is_stopped(
        "javascript",
        "const fs = require('fs');\n\
         const chunk = new Uint8Array(1 << 20).fill(120);\n\
         fs.writeFileSync('/workspace/big', '');\n\
         for (let i = 0; i < 200; i++) fs.appendFileSync('/workspace/big', chunk);\n\
         console.log('wrote 200 MiB');",
    )
    .await;
}

#[tokio::test]
async fn sandbox_workspace_write_is_stopped_within_the_quota_go() {
    workspace_write_is_stopped(
        "go",
        r#"package main

import (
	"fmt"
	"os"
)

func main() {
	f, err := os.Create("/workspace/big")
	if err != nil {
		panic(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 'x'
	}
	for i := 0; i < 200; i++ {
		if _, err := f.Write(chunk); err != nil {
			fmt.Println("write error:", err)
			os.Exit(3)
		}
	}
	f.Close()
	fmt.Println("wrote 200 MiB")
}
"#,
    )
    .await;
}

#[tokio::test]
async fn a_sparse_file_is_over_any_quota() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    // A truncating resize (fd_filestat_set_size), os.truncate on a path, a write far past the
    // end (seek + fd_write) and a positioned write (fd_pwrite), in /workspace and /tmp.
    for (name, code) in [
        (
            "truncate /workspace",
            "open('/workspace/s', 'wb').truncate(1 << 40)",
        ),
        (
            "os.truncate /tmp",
            "import os\nopen('/tmp/s', 'wb').close()\nos.truncate('/tmp/s', 1 << 40)",
        ),
        (
            "seek + write /workspace",
            "f = open('/workspace/p', 'wb')\nf.seek(1 << 40)\nf.write(b'x')\nf.close()",
        ),
        (
            "os.pwrite /tmp",
            "import os\nfd = os.open('/tmp/p', os.O_WRONLY | os.O_CREAT)\nos.pwrite(fd, b'x', 1 << 40)\nos.close(fd)",
        ),
    ] {
        let id = create_sandbox(&c, json!({})).await;
        let dirs = sandbox_dirs(data.path(), &id);
        let r = run(&c, &id, "python", code).await;
        let (_, largest) = apparent(&dirs);
        let what = format!("{name}: largest file on the host {largest} bytes");
        assert_disk_limit(&r, &what);
        assert!(largest <= QUOTA_SLACK, "{what}: a sparse file stayed");
        still_serves(
            &c,
            &id,
            "import os\nfor p in ('/workspace/s', '/workspace/p', '/tmp/s', '/tmp/p'):\n    if os.path.exists(p): os.remove(p)",
        )
        .await;
    }
    c.cancel().await.unwrap();
}

/// Whether `path` lies in a one-shot's scratch directory.
fn in_scratch(path: &Path) -> bool {
    path.components().any(|c| {
        let c = c.as_os_str().to_string_lossy();
        c.starts_with("wasmbox-ws-") || c.starts_with("wasmbox-tmp-")
    })
}

/// Runs `code` as a Python one-shot (answering within 60 s) while a thread watches the scratch
/// directories under `root` (they are removed after it): the answer, and the most they held.
async fn oneshot_peak(c: &Client, root: &Path, code: &str) -> (Value, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, most, root) = (stop.clone(), most.clone(), root.to_path_buf());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let held: u64 = walk(&root)
                    .iter()
                    .filter(|p| in_scratch(p))
                    .filter_map(|p| std::fs::symlink_metadata(p).ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum();
                most.fetch_max(held, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let r = tokio::time::timeout(Duration::from_secs(60), py(c, code))
        .await
        .expect("the one-shot answers within 60 s");
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    (r, most.load(Ordering::Relaxed))
}

#[tokio::test]
async fn oneshot_scratch_is_capped() {
    let tmp = tempfile::tempdir().unwrap();
    let c = server_with_env(&[
        ("WASMBOX_ONESHOT_DISK_MB", "20"),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ])
    .await;
    let (r, most) = oneshot_peak(&c, tmp.path(), &py_writer("/tmp/big", 100)).await;
    let what = format!(
        "a one-shot writing 100 MiB under a 20 MiB cap; its scratch held up to {}",
        mib(most)
    );
    assert_disk_limit(&r, &what);
    assert!(most <= 22 * MIB, "{what}");
    // The server goes on.
    let r = py(&c, "print(1)").await;
    assert_eq!(r["stdout"], "1\n", "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn an_unlinked_open_file_still_counts() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    let id = create_sandbox(&c, json!({})).await;
    // The file has no name on the host while it grows: a walk never sees it.
    let r = run(
        &c,
        &id,
        "python",
        "import os\n\
         f = open('/tmp/x', 'wb')\n\
         os.unlink('/tmp/x')\n\
         chunk = b'x' * (1 << 20)\n\
         for i in range(200):\n\
         \x20   f.write(chunk)\n\
         \x20   f.flush()\n\
         print('wrote 200 MiB')",
    )
    .await;
    assert_disk_limit(&r, "200 MiB to an unlinked file");
    still_serves(&c, &id, "").await;
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn many_empty_files_hit_the_entries_limit() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_FILES", "200")]).await;
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let r = run(
        &c,
        &id,
        "python",
        "made = 0\n\
         try:\n\
         \x20   for i in range(1000):\n\
         \x20       open(f'/tmp/e{i}', 'w').close()\n\
         \x20       made += 1\n\
         except OSError as e:\n\
         \x20   print('refused after', made, e.errno)\n\
         print('made', made)",
    )
    .await;
    let n = entry_count(&dirs);
    let stopped = r["limit"] == "disk" || r["stdout"].as_str().unwrap().contains("refused after");
    assert!(
        stopped,
        "1000 empty files under a 200-entry quota, {n} entries on the host: {r}"
    );
    assert!(
        n <= 220,
        "{n} entries on the host under a 200-entry quota: {r}"
    );
    still_serves(
        &c,
        &id,
        "import os\nfor n in os.listdir('/tmp'): os.remove('/tmp/' + n)",
    )
    .await;
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn concurrent_file_writes_cannot_jointly_pass_one_check() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", "10")]).await;

    // Eight 3 MiB writes at once under a 10 MiB quota: three fit. Thousands of empty files make
    // each measurement of the workspace slow, so that a check-then-write leaves a wide window
    // (the race is there without them, just narrower); eight rounds, the files removed between.
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let r = run(
        &c,
        &id,
        "python",
        "import os\nos.mkdir('/workspace/many')\nfor i in range(5000):\n    open(f'/workspace/many/e{i}', 'w').close()",
    )
    .await;
    assert_eq!(r["success"], true, "{r}");
    let content = "x".repeat(3 << 20);
    for round in 0..8 {
        let calls: Vec<_> = (0..8)
            .map(|i| {
                spawn_call(
                    &c,
                    "file_write",
                    json!({"sandbox_id": id, "path": format!("f{i}"), "content": content}),
                )
            })
            .collect();
        let mut written = Vec::new();
        for (i, h) in calls.into_iter().enumerate() {
            let r = tokio::time::timeout(Duration::from_secs(60), h)
                .await
                .expect("file_write answers within 60 s")
                .unwrap()
                .expect("file_write at the protocol level");
            if is_error(&r) {
                let e = object(&r);
                assert_eq!(e["error"], "Disk quota exceeded", "{e}");
            } else {
                written.push(i);
            }
        }
        let (total, _) = apparent(&dirs);
        assert!(
            (1..=3).contains(&written.len()) && total <= 10 * MIB,
            "round {round}: {} of eight 3 MiB writes succeeded under a 10 MiB quota; {} on \
             the host",
            written.len(),
            mib(total)
        );
        for i in written {
            ok(
                &c,
                "file_remove",
                json!({"sandbox_id": id, "path": format!("f{i}")}),
            )
            .await;
        }
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_background_guest_and_file_writes_cannot_jointly_pass_the_quota() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", "10")]).await;
    // A guest writing 40 MiB to /tmp in the background while the file tools write 12 MiB to
    // /workspace: the two together stay within the quota (plus 10%).
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let job = ok(
        &c,
        "execute_code",
        json!({"mode": "background", "sandbox_id": id, "timeout": 60,
               "code": "import time\n\
                        chunk = b'x' * (256 << 10)\n\
                        with open('/tmp/bg', 'wb') as f:\n\
                        \x20   for i in range(160):\n\
                        \x20       f.write(chunk)\n\
                        \x20       f.flush()\n\
                        \x20       time.sleep(0.01)\n\
                        print('wrote 40 MiB')"}),
    )
    .await;
    let pid = job["process_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dirs[1].join("bg").exists() {
        assert!(Instant::now() < deadline, "the background job never wrote");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut most = 0;
    let one = "y".repeat(1 << 20);
    for i in 0..12 {
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            call(
                &c,
                "file_write",
                json!({"sandbox_id": id, "path": format!("w{i}"), "content": one}),
            ),
        )
        .await
        .expect("file_write answers within 60 s");
        if is_error(&r) {
            assert_eq!(
                object(&r)["error"],
                "Disk quota exceeded",
                "{:?}",
                r.content
            );
        }
        most = most.max(apparent(&dirs).0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let ended = loop {
        let list = timed_ok(&c, "execute_list_processes", json!({"sandbox_id": id}), 60).await;
        let p = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["process_id"] == pid.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{pid} not listed: {list}"));
        most = most.max(apparent(&dirs).0);
        if p["status"] != "running" {
            break p;
        }
        assert!(Instant::now() < deadline, "the job never ended: {p}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (total, _) = apparent(&dirs);
    assert!(
        most.max(total) <= 11 * MIB,
        "a background guest and file_write together held up to {} ({} at the end) under a \
         10 MiB quota; the job: {ended}",
        mib(most),
        mib(total)
    );
    assert_eq!(ended["limit"], "disk", "the guest is stopped: {ended}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn quota_is_still_usable_after_deleting() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);

    // Over the quota in /tmp; the guest removes the file and the space is there again, within
    // the same run.
    let r = run(&c, &id, "python", &py_writer("/tmp/big", 200)).await;
    assert_disk_limit(
        &r,
        &format!("200 MiB to /tmp, {} on the host", mib(apparent(&dirs).0)),
    );
    let r = run(
        &c,
        &id,
        "python",
        &format!(
            "import os\nos.remove('/tmp/big')\n{}",
            py_writer("/tmp/ten", 10)
        ),
    )
    .await;
    assert_eq!(r["stdout"], "wrote 10 MiB\n", "{r}");
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(r["limit"], Value::Null, "{r}");

    // Over the quota in /workspace; file_remove frees it for the file tools and the guest.
    let r = run(&c, &id, "python", &py_writer("/workspace/big", 200)).await;
    assert_disk_limit(
        &r,
        &format!(
            "200 MiB to /workspace, {} on the host",
            mib(apparent(&dirs).0)
        ),
    );
    ok(&c, "file_remove", json!({"sandbox_id": id, "path": "big"})).await;
    let v = timed_ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "ten.txt", "content": "z".repeat(10 << 20)}),
        60,
    )
    .await;
    assert_eq!(v["bytes"], 10 << 20, "{v}");
    let r = run(&c, &id, "python", &py_writer("/workspace/more", 10)).await;
    assert_eq!(r["stdout"], "wrote 10 MiB\n", "{r}");
    assert_eq!(r["success"], true, "{r}");
    let (total, _) = apparent(&dirs);
    assert_eq!(total, 30 * MIB, "/tmp/ten, ten.txt and more");
    c.cancel().await.unwrap();
}

/// A guest in `language` appending 16 MiB at a time to `/workspace/a` and renaming it onto
/// itself after each append, 20 times, under a 50 MiB quota: the rename changes nothing, so it
/// must free nothing (issue #31: it freed the file's size, and 320 MiB stayed on the host).
async fn rename_onto_itself_is_stopped(language: &str, code: &str) {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let r = run(&c, &id, language, code).await;
    let (total, _) = apparent(&dirs);
    let what = format!(
        "{language}: 20 x (16 MiB appended, rename onto itself), {} on the host",
        mib(total)
    );
    assert_disk_limit(&r, &what);
    assert!(total <= QUOTA_SLACK, "{what}");
    ok(&c, "file_remove", json!({"sandbox_id": id, "path": "a"})).await;
    still_serves(&c, &id, "").await;
    c.cancel().await.unwrap();
}

const PY_RENAME_ONTO_ITSELF: &str = "import os\n\
    chunk = b'x' * (16 << 20)\n\
    for i in range(20):\n\
    \x20   with open('/workspace/a', 'ab') as f:\n\
    \x20       f.write(chunk)\n\
    \x20   os.rename('/workspace/a', '/workspace/a')\n\
    print('held', os.path.getsize('/workspace/a'))";

#[tokio::test]
async fn a_rename_onto_itself_frees_nothing_python() {
    rename_onto_itself_is_stopped("python", PY_RENAME_ONTO_ITSELF).await;
}

#[tokio::test]
async fn a_rename_onto_itself_frees_nothing_javascript() {
    rename_onto_itself_is_stopped(
        "javascript",
        "const fs = require('fs');\n\
         const chunk = new Uint8Array(16 << 20).fill(120);\n\
         for (let i = 0; i < 20; i++) {\n\
         \x20 fs.appendFileSync('/workspace/a', chunk);\n\
         \x20 fs.renameSync('/workspace/a', '/workspace/a');\n\
         }\n\
         console.log('held', fs.statSync('/workspace/a').size);",
    )
    .await;
}

#[tokio::test]
async fn a_rename_onto_itself_frees_nothing_go() {
    rename_onto_itself_is_stopped(
        "go",
        r#"package main

import (
	"fmt"
	"os"
)

func main() {
	chunk := make([]byte, 16<<20)
	for i := 0; i < 20; i++ {
		f, err := os.OpenFile("/workspace/a", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			panic(err)
		}
		if _, err := f.Write(chunk); err != nil {
			fmt.Println("write error:", err)
			os.Exit(3)
		}
		f.Close()
		if err := os.Rename("/workspace/a", "/workspace/a"); err != nil {
			panic(err)
		}
	}
	st, _ := os.Stat("/workspace/a")
	fmt.Println("held", st.Size())
}
"#,
    )
    .await;
}

/// Growth after a hard link is one file's growth, and removing one of two names frees nothing:
/// a guest that links, grows and unlinks in turn is held to the quota (before, each unlink
/// freed the file's size while its other name kept it).
#[tokio::test]
async fn hard_links_free_bytes_only_with_the_last_name() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[("WASMBOX_SANDBOX_DISK_MB", QUOTA_MB)]).await;
    let id = create_sandbox(&c, json!({})).await;
    let dirs = sandbox_dirs(data.path(), &id);
    let r = run(
        &c,
        &id,
        "python",
        "import os\n\
         chunk = b'x' * (16 << 20)\n\
         open('/workspace/a', 'wb').close()\n\
         for i in range(20):\n\
         \x20   os.link('/workspace/a', '/workspace/b')\n\
         \x20   with open('/workspace/a', 'ab') as f:\n\
         \x20       f.write(chunk)\n\
         \x20   os.unlink('/workspace/b')\n\
         print('held', os.path.getsize('/workspace/a'))",
    )
    .await;
    let (total, _) = apparent(&dirs);
    let what = format!("link, grow, unlink x 20: {} on the host", mib(total));
    assert_disk_limit(&r, &what);
    assert!(total <= QUOTA_SLACK, "{what}");
    // One file with two names is counted once: 40 MiB under two names fits 50 MiB.
    let r = run(
        &c,
        &id,
        "python",
        "import os\n\
         for n in ('/workspace/a', '/workspace/b'):\n\
         \x20   if os.path.exists(n):\n\
         \x20       os.remove(n)\n\
         with open('/workspace/a', 'wb') as f:\n\
         \x20   f.write(b'x' * (40 << 20))\n\
         os.link('/workspace/a', '/tmp/a')\n\
         with open('/workspace/c', 'wb') as f:\n\
         \x20   f.write(b'x' * (5 << 20))\n\
         print('ok')",
    )
    .await;
    assert_eq!(
        r["stdout"], "ok\n",
        "40 MiB with two names and 5 MiB fit 50 MiB: {r}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_rename_onto_itself_frees_nothing_in_a_oneshot() {
    let tmp = tempfile::tempdir().unwrap();
    let c = server_with_env(&[
        ("WASMBOX_ONESHOT_DISK_MB", "50"),
        ("TMPDIR", tmp.path().to_str().unwrap()),
    ])
    .await;
    let code = PY_RENAME_ONTO_ITSELF.replace("/workspace/", "/tmp/");
    let (r, most) = oneshot_peak(&c, tmp.path(), &code).await;
    let what = format!(
        "a one-shot renaming a growing file onto itself under a 50 MiB cap; its scratch held up to {}",
        mib(most)
    );
    assert_disk_limit(&r, &what);
    assert!(most <= QUOTA_SLACK, "{what}");
    c.cancel().await.unwrap();
}
