//! Host-side reads and answers a guest could size (issue #22): a sparse 1 TiB file, a FIFO,
//! oversized downloads and process lists, and host paths in error messages. Every call has a
//! deadline, so a hang fails the test instead of stalling the suite; sparse files take no disk.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

const TIB: u64 = 1 << 40;
/// The default `WASMBOX_RESULT_BYTES`.
const BUDGET: usize = 80_000;

/// A tool call that must answer within `secs`: a server blocked on a read is a failure.
async fn timed(c: &Client, tool: &str, args: Value, secs: u64) -> CallToolResult {
    tokio::time::timeout(Duration::from_secs(secs), call(c, tool, args.clone()))
        .await
        .unwrap_or_else(|_| panic!("{tool} {args} did not answer within {secs} s"))
}

fn text(r: &CallToolResult) -> &str {
    &r.content[0].as_text().expect("a text block").text
}

/// A server whose sandboxes live in `data`, so a test can reach a workspace from the host.
async fn server_in(data: &Path, env: &[(&str, &str)]) -> Client {
    let mut env = env.to_vec();
    env.push(("WASMBOX_DATA", data.to_str().unwrap()));
    server_with_env(&env).await
}

fn host_workspace(data: &Path, id: &str) -> PathBuf {
    data.join("sandboxes").join(id).join("workspace")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[tokio::test]
async fn a_sparse_terabyte_file_is_read_in_bounded_windows() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    // Guests can no longer make one (the disk limit counts apparent sizes: tests/all/disk.rs), but a
    // sparse file can still come from the host side.
    for n in ["big", "big.js", "big.go", "big.py"] {
        let f = std::fs::File::create(host_workspace(data.path(), &id).join(n)).unwrap();
        f.set_len(TIB).unwrap();
    }
    let l = ok(&c, "file_list", json!({"sandbox_id": id})).await;
    let sizes: Vec<(&str, u64)> = l["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap(), f["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        sizes,
        [
            ("big", TIB),
            ("big.go", TIB),
            ("big.js", TIB),
            ("big.py", TIB)
        ],
        "{l}"
    );

    // file_read: a window within the result budget, counted as JSON text (a NUL is "\u0000").
    let r = timed(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "big"}),
        30,
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).len() <= BUDGET, "{} bytes", text(&r).len());
    let v = object(&r);
    assert_eq!(v["size_bytes"], TIB);
    assert_eq!(v["offset"], 0);
    assert_eq!(v["truncated"], true);
    let content = v["content"].as_str().unwrap();
    assert!(!content.is_empty() && content.bytes().all(|b| b == 0));
    assert_eq!(v["next_offset"], content.len());
    // The end of the file, through offset.
    let v = ok(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "/workspace/big", "offset": TIB - 5}),
    )
    .await;
    assert_eq!(v["content"], "\0\0\0\0\0");
    assert_eq!(v["truncated"], false);
    assert_eq!(v["offset"], TIB - 5);

    // file_download: at most WASMBOX_DOWNLOAD_BYTES (4 MiB) by default, less when asked.
    let r = timed(
        &c,
        "file_download",
        json!({"sandbox_id": id, "path": "big"}),
        60,
    )
    .await;
    assert!(!is_error(&r), "{}", &text(&r)[..200]);
    let v = object(&r);
    assert_eq!(v["size_bytes"], TIB);
    assert_eq!(v["size"], 4 << 20);
    assert_eq!(v["truncated"], true);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v["content_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes.len(), 4 << 20);
    let v = ok(
        &c,
        "file_download",
        json!({"sandbox_id": id, "path": "big", "offset": TIB / 2, "max_bytes": 100}),
    )
    .await;
    assert_eq!(v["content_base64"], "A".repeat(134) + "==");
    assert_eq!(v["offset"], TIB / 2);
    assert_eq!(v["next_offset"], TIB / 2 + 100);

    // run_command reads a script on the host: bounded by the code-size limit.
    for cmd in ["node big.js", "go run big.go", "python big.py"] {
        let r = timed(
            &c,
            "run_command",
            json!({"sandbox_id": id, "command": cmd}),
            30,
        )
        .await;
        assert!(is_error(&r), "{cmd}: {}", text(&r));
        let e = object(&r);
        let msg = e["stderr"].as_str().unwrap();
        assert!(
            msg.contains("too large") && msg.contains("/workspace/big."),
            "{cmd}: {e}"
        );
    }
    // The server is still there.
    let v = ok(&c, "file_exists", json!({"sandbox_id": id, "path": "big"})).await;
    assert_eq!(v["exists"], true);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_fifo_is_refused_at_once() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    let ws = host_workspace(data.path(), &id);
    for name in ["pipe", "pipe.js", "pipe.py", "pipe.go"] {
        mkfifo(&ws.join(name));
    }
    for (tool, args) in [
        ("file_read", json!({"sandbox_id": id, "path": "pipe"})),
        ("file_download", json!({"sandbox_id": id, "path": "pipe"})),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "node pipe.js"}),
        ),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "python pipe.py"}),
        ),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "go run pipe.go"}),
        ),
        (
            "file_write",
            json!({"sandbox_id": id, "path": "pipe", "content": "x"}),
        ),
        (
            "file_upload",
            json!({"sandbox_id": id, "path": "pipe.js", "content_base64": "eA=="}),
        ),
    ] {
        let r = timed(&c, tool, args.clone(), 20).await;
        assert!(is_error(&r), "{tool} {args}: {}", text(&r));
        assert!(
            text(&r).contains("not a regular file"),
            "{tool} {args}: {}",
            text(&r)
        );
    }
    // Listing, checking and removing it are fine.
    let v = ok(&c, "file_exists", json!({"sandbox_id": id, "path": "pipe"})).await;
    assert_eq!(v["exists"], true);
    ok(&c, "file_remove", json!({"sandbox_id": id, "path": "pipe"})).await;
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn offsets_and_limits_page_through_text_at_character_boundaries() {
    let c = server_with_env(&[
        ("WASMBOX_RESULT_BYTES", "4096"),
        ("WASMBOX_DOWNLOAD_BYTES", "5000"),
    ])
    .await;
    let id = create_sandbox(&c, json!({})).await;
    // 1 + 2 + 3 + 4 bytes a round.
    let original = "aé€😀".repeat(1000);
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "u.txt", "content": original}),
    )
    .await;
    let read = |offset: u64, max: u64| json!({"sandbox_id": id, "path": "u.txt", "offset": offset, "max_bytes": max});
    // A character that does not fit whole is left for the next window.
    let v = ok(&c, "file_read", read(0, 8)).await;
    assert_eq!(v["content"], "aé€");
    assert_eq!(v["size_bytes"], 10_000);
    assert_eq!(v["truncated"], true);
    assert_eq!(v["next_offset"], 6);
    // An offset inside a character starts at the next one.
    let v = ok(&c, "file_read", read(2, 7)).await;
    assert_eq!(v["content"], "€😀");
    assert_eq!(v["offset"], 3);
    // Window by window, the file comes back whole.
    let mut got = String::new();
    let mut offset = 0;
    loop {
        let v = ok(&c, "file_read", read(offset, 999)).await;
        let part = v["content"].as_str().unwrap();
        assert!(part.len() <= 999);
        got.push_str(part);
        if v["truncated"] == false {
            break;
        }
        offset = v["next_offset"].as_u64().unwrap();
    }
    assert_eq!(got, original);
    // max_bytes is capped at the budget; past the end is empty.
    let r = call(&c, "file_read", read(0, 1 << 30)).await;
    assert!(text(&r).len() <= 4096, "{}", text(&r).len());
    assert!(object(&r)["content"].as_str().unwrap().len() > 3000);
    let v = ok(&c, "file_read", read(20_000, 10)).await;
    assert_eq!(v["content"], "");
    assert_eq!(v["truncated"], false);
    // The budget counts the JSON text: a newline is sent as two bytes.
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "nl.txt", "content": "\n".repeat(10_000)}),
    )
    .await;
    let r = call(&c, "file_read", json!({"sandbox_id": id, "path": "nl.txt"})).await;
    assert!(text(&r).len() <= 4096, "{}", text(&r).len());
    assert_eq!(object(&r)["truncated"], true);

    // Binary files: file_read refuses the window that is not UTF-8 and names file_download.
    let b64 = base64::engine::general_purpose::STANDARD.encode(b"abc\xff\xfe");
    ok(
        &c,
        "file_upload",
        json!({"sandbox_id": id, "path": "b.bin", "content_base64": b64}),
    )
    .await;
    let v = ok(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "b.bin", "max_bytes": 3}),
    )
    .await;
    assert_eq!(v["content"], "abc");
    let e = err(&c, "file_read", json!({"sandbox_id": id, "path": "b.bin"})).await;
    assert!(
        e["message"].as_str().unwrap().contains("file_download"),
        "{e}"
    );
    // file_download: WASMBOX_DOWNLOAD_BYTES is its default and its cap.
    let d = ok(
        &c,
        "file_download",
        json!({"sandbox_id": id, "path": "u.txt", "max_bytes": 1 << 30}),
    )
    .await;
    assert_eq!(d["size"], 5000);
    assert_eq!(d["size_bytes"], 10_000);
    assert_eq!(d["truncated"], true);
    let d2 = ok(
        &c,
        "file_download",
        json!({"sandbox_id": id, "path": "u.txt", "offset": 5000}),
    )
    .await;
    assert_eq!(d2["truncated"], false);
    let mut all = Vec::new();
    for d in [&d, &d2] {
        all.extend(
            base64::engine::general_purpose::STANDARD
                .decode(d["content_base64"].as_str().unwrap())
                .unwrap(),
        );
    }
    assert_eq!(all, original.as_bytes());
    c.cancel().await.unwrap();
}

/// Runs a Python background job; returns once its last line has run (it writes `marker`).
async fn job(c: &Client, id: &str, code: &str, marker: &str) {
    let code = format!("{code}\nopen('{marker}', 'w').write('1')");
    ok(
        c,
        "execute_code",
        json!({"mode": "background", "sandbox_id": id, "code": code}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ok(c, "file_exists", json!({"sandbox_id": id, "path": marker})).await["exists"] != true {
        assert!(Instant::now() < deadline, "job {marker} never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no listed job runs any more.
async fn settled(c: &Client, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = ok(c, "execute_list_processes", json!({"sandbox_id": id})).await;
        if v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"] != "running")
        {
            return;
        }
        assert!(Instant::now() < deadline, "jobs still running: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn process_lists_fit_the_result_budget() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    for i in 0..3 {
        job(&c, &id, "print('x' * 100_000)", &format!("done{i}")).await;
        // Ended, not only written its marker: the next job must not meet the per-client limit.
        settled(&c, &id).await;
    }
    for tool in ["execute_list_processes", "list_processes"] {
        let r = call(&c, tool, json!({"sandbox_id": id})).await;
        assert!(text(&r).len() <= BUDGET, "{tool}: {} bytes", text(&r).len());
        let v = object(&r);
        assert_eq!(v["count"], 3, "{tool}");
        assert_eq!(v["truncated"], false, "{tool}");
        for p in v["processes"].as_array().unwrap() {
            assert_eq!(p["status"], "completed");
            assert_eq!(p["output_truncated"], true);
            let out = p["stdout"].as_str().unwrap();
            assert!(out.len() > 1000 && out.bytes().all(|b| b == b'x'), "{tool}");
        }
    }
    c.cancel().await.unwrap();

    // A small budget: fewer entries, and the answer says so.
    // Room for all eight at once: a truncated list may not show the newest job, so this part
    // cannot wait for each to end.
    let c = server_with_env(&[
        ("WASMBOX_RESULT_BYTES", "3000"),
        ("WASMBOX_MAX_JOBS", "16"),
        ("WASMBOX_MAX_JOBS_PER_TOKEN", "16"),
        ("WASMBOX_SANDBOX_JOBS", "16"),
    ])
    .await;
    let id = create_sandbox(&c, json!({})).await;
    for i in 0..8 {
        job(
            &c,
            &id,
            &format!("print('{i}' * 50_000)"),
            &format!("done{i}"),
        )
        .await;
    }
    let r = call(&c, "list_processes", json!({"sandbox_id": id})).await;
    assert!(text(&r).len() <= 3000, "{} bytes", text(&r).len());
    let v = object(&r);
    let n = v["count"].as_u64().unwrap();
    assert!((1..8).contains(&n), "{v}");
    assert_eq!(v["processes"].as_array().unwrap().len() as u64, n);
    assert_eq!(v["truncated"], true);
    assert_eq!(v["total_processes"], Value::Null);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn file_tool_errors_name_guest_paths_only() {
    let data = tempfile::tempdir().unwrap();
    let c = server_in(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    let ws = host_workspace(data.path(), &id);
    mkfifo(&ws.join("pipe.py"));
    std::fs::create_dir(ws.join("dir.js")).unwrap();
    std::fs::write(ws.join("f.txt"), "x").unwrap();
    // A symlink to the host's own data directory: refused, and not named.
    std::os::unix::fs::symlink(data.path(), ws.join("out")).unwrap();
    let cases = [
        (
            "file_read",
            json!({"sandbox_id": id, "path": "missing.txt"}),
        ),
        ("file_read", json!({"sandbox_id": id, "path": "dir.js"})),
        ("file_read", json!({"sandbox_id": id, "path": "pipe.py"})),
        (
            "file_download",
            json!({"sandbox_id": id, "path": "pipe.py"}),
        ),
        ("file_download", json!({"sandbox_id": id, "path": "out/x"})),
        ("file_read", json!({"sandbox_id": id, "path": "out"})),
        ("file_list", json!({"sandbox_id": id, "path": "f.txt"})),
        (
            "file_write",
            json!({"sandbox_id": id, "path": "f.txt/x", "content": "y"}),
        ),
        ("file_mkdir", json!({"sandbox_id": id, "path": "f.txt/d"})),
        ("file_remove", json!({"sandbox_id": id, "path": "missing"})),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "python missing.py"}),
        ),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "node dir.js"}),
        ),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "python pipe.py"}),
        ),
        (
            "execute_code",
            json!({"mode": "persistent", "sandbox_id": id, "code": "1", "working_dir": "/workspace/f.txt"}),
        ),
    ];
    let home = std::env::var("HOME").unwrap_or_default();
    let data_dir = data.path().to_str().unwrap().to_string();
    let tmp = std::env::temp_dir().to_str().unwrap().to_string();
    for (tool, args) in cases {
        let r = timed(&c, tool, args.clone(), 20).await;
        assert!(is_error(&r), "{tool} {args} should fail: {}", text(&r));
        let t = text(&r);
        assert!(t.contains("/workspace/"), "{tool} {args}: {t}");
        for host in [data_dir.as_str(), home.as_str(), tmp.as_str(), "/tmp/"] {
            assert!(
                host.len() < 2 || !t.contains(host),
                "{tool} {args} names the host path {host}: {t}"
            );
        }
    }
    c.cancel().await.unwrap();
}
