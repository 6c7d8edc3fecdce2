//! Faults: a restarted server finds unexpired sandboxes' files again and reaps expired ones; a
//! dropped client, SIGTERM, a guest trap or a panic inside a host function loses no sandbox's
//! files, and the server (or its successor) keeps serving.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Client, HttpServer, call, create_sandbox, err, is_error, object, ok, spawn_call};
use serde_json::{Value, json};

async fn stdio(data: &Path, extra: &[(&str, &str)]) -> (Client, u32) {
    let mut env = vec![("WASMBOX_DATA", data.to_str().unwrap())];
    env.extend_from_slice(extra);
    common::server_with_pid(&env).await
}

async fn persistent(c: &Client, id: &str, code: &str) -> Value {
    let r = call(
        c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent", "code": code}),
    )
    .await;
    object(&r)
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

async fn wait_gone(pid: u32) {
    for _ in 0..200 {
        if !alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server {pid} still running");
}

/// Files written by a tool and by guest code, and env, in a fresh sandbox.
async fn sandbox_with_state(c: &Client) -> String {
    let id = create_sandbox(
        c,
        json!({"template_id": "code-interpreter", "timeout_seconds": 600}),
    )
    .await;
    ok(
        c,
        "file_write",
        json!({"sandbox_id": id, "path": "/workspace/notes.txt", "content": "from a tool"}),
    )
    .await;
    let v = persistent(
        c,
        &id,
        "open('/workspace/data.csv','w').write('a,b\\n1,2\\n')\nkept = 'in memory'",
    )
    .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    ok(
        c,
        "env_set",
        json!({"sandbox_id": id, "env_vars": {"STAGE": "two"}}),
    )
    .await;
    id
}

/// What a restarted server must show of that sandbox: files and env back, and the interpreter's
/// variables when its session was saved (`kept`: idle when the server stopped), or a fresh one.
async fn check_recovered(c: &Client, id: &str, kept: bool) {
    let info = ok(c, "get_sandbox", json!({"id": id})).await;
    assert_eq!(info["template_id"], "code-interpreter", "{info}");
    let v = ok(
        c,
        "file_read",
        json!({"sandbox_id": id, "path": "/workspace/notes.txt"}),
    )
    .await;
    assert_eq!(v["content"], "from a tool");
    let v = persistent(
        c,
        id,
        "import os\nprint(open('data.csv').read().splitlines()[1], os.environ.get('STAGE'))\nprint('kept' in globals())",
    )
    .await;
    let kept = if kept { "True" } else { "False" };
    assert_eq!(v["stdout"], format!("1,2 two\n{kept}\n"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_server_finds_unexpired_sandboxes_and_reaps_expired_ones() {
    let data = tempfile::tempdir().unwrap();
    let (c, pid) = stdio(data.path(), &[]).await;
    let id = sandbox_with_state(&c).await;
    let short = create_sandbox(&c, json!({"template_id": "python", "timeout_seconds": 2})).await;
    // The client goes away (as when an assistant restarts): the server ends with stdin.
    c.cancel().await.unwrap();
    wait_gone(pid).await;
    assert!(data.path().join("sandboxes").join(&id).is_dir());
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let (c, _) = stdio(data.path(), &[]).await;
    check_recovered(&c, &id, true).await;
    let listed = ok(&c, "list_sandboxes", json!({})).await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandbox_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()], "only the unexpired one is back");
    let e = err(&c, "get_sandbox", json!({"id": short})).await;
    assert!(e.to_string().contains("not found"), "{e}");
    assert!(
        !data.path().join("sandboxes").join(&short).exists(),
        "the expired sandbox's files are removed"
    );
    // And it is a normal sandbox again: delete removes its files.
    ok(&c, "delete_sandbox", json!({"id": id})).await;
    assert!(!data.path().join("sandboxes").join(&id).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_work_loses_no_files() {
    let data = tempfile::tempdir().unwrap();
    // Idle sessions unsaved: the call cut off takes its session's variables with it.
    let (c, pid) = stdio(data.path(), &[("WASMBOX_SAVE_IDLE_MS", "0")]).await;
    let id = sandbox_with_state(&c).await;
    // Work in flight: a foreground call and a background job, both writing.
    let job = ok(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "background",
               "code": "import time\nwhile True:\n    open('/workspace/tick','a').write('.')\n    time.sleep(0.05)"}),
    )
    .await;
    assert!(job["process_id"].is_string(), "{job}");
    let busy = spawn_call(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent",
               "code": "open('/workspace/busy','w').write('1')\nimport time; time.sleep(30)"}),
    );
    // Both at work before the signal: a session still idle then would be saved at exit, and a
    // job not yet started would have written nothing (a fixed wait is too short under load).
    for path in ["/workspace/tick", "/workspace/busy"] {
        common::wait_written(&c, &id, path).await;
    }
    // SAFETY: sending SIGTERM to the child server we started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    wait_gone(pid).await;
    // The stopping server ends the call as a kill does, and answers it if the connection is
    // still there; either way the call is over.
    match busy.await.unwrap() {
        Err(_) => {}
        Ok(r) => assert_eq!(object(&r)["exit_code"], 137, "{:?}", r.content),
    }

    let (c, _) = stdio(data.path(), &[]).await;
    check_recovered(&c, &id, false).await;
    let v = ok(
        &c,
        "file_exists",
        json!({"sandbox_id": id, "path": "/workspace/tick"}),
    )
    .await;
    assert_eq!(v["exists"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_http_client_mid_call_harms_nobody_else() {
    let token_a = "fault-token-aaaaaaaaaaaaaaaa";
    let token_b = "fault-token-bbbbbbbbbbbbbbbb";
    let data = tempfile::tempdir().unwrap();
    let tokens = format!("{token_a},{token_b}");
    let server = HttpServer::start(
        &[
            ("WASMBOX_TOKEN", tokens.as_str()),
            ("WASMBOX_DATA", data.path().to_str().unwrap()),
        ],
        &[],
    )
    .await;
    let a = server.client(token_a).await.unwrap();
    let b = server.client(token_b).await.unwrap();
    let id = sandbox_with_state(&a).await;

    // A starts a long call and vanishes mid-call.
    let inflight = spawn_call(
        &a,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent", "code": "import time; time.sleep(20)"}),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    inflight.abort();
    drop(a);

    // B is served meanwhile.
    for i in 0..5 {
        let v = ok(&b, "execute_code", json!({"code": format!("print({i})")})).await;
        assert_eq!(v["stdout"], format!("{i}\n"));
    }
    // A reconnects: the sandbox and its files are there.
    let a = server.client(token_a).await.unwrap();
    let v = ok(
        &a,
        "file_read",
        json!({"sandbox_id": id, "path": "/workspace/notes.txt"}),
    )
    .await;
    assert_eq!(v["content"], "from a tool");
    assert!(server.child.id().is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_trap_and_a_host_panic_lose_no_files_and_the_server_serves_on() {
    let data = tempfile::tempdir().unwrap();
    // The failpoint makes the host's stdout implementation (behind WASI fd_write) panic when a
    // guest writes the marker: a panic inside a host function, on a guest thread.
    let (c, _) = stdio(data.path(), &[("WASMBOX_FAILPOINTS", "stdout-panic")]).await;
    let id = sandbox_with_state(&c).await;

    let r = call(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent",
               "code": "print('wasmbox-failpoint-panic', flush=True)"}),
    )
    .await;
    assert!(is_error(&r), "{:?}", r.content);
    assert!(
        object(&r).to_string().contains("host panic"),
        "{:?}",
        r.content
    );

    // The same panic in a one-shot (a pooled instance on a guest thread) and in a background
    // job (a thread of its own): each fails alone, with a clear message.
    let r = call(
        &c,
        "execute_code",
        json!({"code": "print('wasmbox-failpoint-panic', flush=True)"}),
    )
    .await;
    assert!(is_error(&r), "{:?}", r.content);
    assert!(object(&r).to_string().contains("host panic"));
    let job = ok(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "background",
               "code": "print('wasmbox-failpoint-panic', flush=True)"}),
    )
    .await;
    let pid = job["process_id"].as_str().unwrap().to_string();
    let mut status = Value::Null;
    for _ in 0..100 {
        let list = ok(&c, "execute_list_processes", json!({"sandbox_id": id})).await;
        status = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["process_id"] == pid.as_str())
            .cloned()
            .unwrap();
        if status["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status["status"], "failed", "{status}");
    assert!(
        status["stderr"].as_str().unwrap().contains("panicked"),
        "{status}"
    );

    // A trap (stack overflow in JavaScript) in the same sandbox.
    let v = object(
        &call(
            &c,
            "execute_code",
            json!({"sandbox_id": id, "mode": "persistent", "language": "javascript",
                   "code": "function f(n) { return f(n + 1) + 1 } f(0)"}),
        )
        .await,
    );
    assert_ne!(v["exit_code"], 0, "{v}");

    // Files, env and the sandbox survive; new sessions start; one-shots are served.
    check_recovered(&c, &id, false).await;
    let v = ok(&c, "execute_code", json!({"code": "print('next')"})).await;
    assert_eq!(v["stdout"], "next\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_servers_on_one_data_dir_never_take_each_others_live_sandboxes() {
    let data = tempfile::tempdir().unwrap();
    let (first, first_pid) = stdio(data.path(), &[]).await;
    let id = sandbox_with_state(&first).await;

    let (second, _) = stdio(data.path(), &[]).await;
    let e = err(&second, "get_sandbox", json!({"id": id})).await;
    assert!(e.to_string().contains("not found"), "{e}");
    assert_eq!(
        ok(&second, "list_sandboxes", json!({})).await["data"],
        json!([])
    );
    // The first keeps using it.
    let v = persistent(&first, &id, "print(kept)").await;
    assert_eq!(v["stdout"], "in memory\n");

    // When the first server is gone, the second adopts the sandbox on its next use.
    first.cancel().await.unwrap();
    wait_gone(first_pid).await;
    check_recovered(&second, &id, true).await;
}

/// Without a data directory, everything a server writes on the host (one-shots' and ready
/// instances' scratch dirs, sandboxes) lives under one `wasmbox-run-<pid>-*` root in its temp
/// dir: gone when it exits, and, when it was killed, removed by the next server to start there.
#[tokio::test]
async fn scratch_of_a_killed_server_is_removed_by_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let tmpdir = tmp.path().to_str().unwrap();
    let roots = |pid: u32| {
        common::entries(tmp.path())
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("wasmbox-run-{pid}-")))
            })
            .collect::<Vec<_>>()
    };
    let (c, pid) = common::server_with_pid(&[("TMPDIR", tmpdir)]).await;
    let id = create_sandbox(&c, json!({"template_id": "code-interpreter"})).await;
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "/workspace/kept.txt", "content": "x"}),
    )
    .await;
    assert_eq!(common::py(&c, "print(1)").await["stdout"], "1\n");
    let mine = roots(pid);
    assert_eq!(mine.len(), 1, "one scratch root per process: {mine:?}");
    let nothing_else = common::entries(tmp.path())
        .into_iter()
        .filter(|p| !mine.contains(p))
        .collect::<Vec<_>>();
    assert!(
        nothing_else.is_empty(),
        "left outside the root: {nothing_else:?}"
    );
    let under_root = common::walk(&mine[0]);
    assert!(
        under_root.iter().any(|p| p.ends_with("kept.txt")),
        "the sandbox's files are under the root: {under_root:?}"
    );
    // SAFETY: kills the server this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    wait_gone(pid).await;
    drop(c);
    assert_eq!(roots(pid).len(), 1, "a killed server cannot clean up");

    let (c2, pid2) = common::server_with_pid(&[("TMPDIR", tmpdir)]).await;
    assert_eq!(common::py(&c2, "print(2)").await["stdout"], "2\n");
    assert!(roots(pid).is_empty(), "the dead server's root must go");
    assert_eq!(roots(pid2).len(), 1);
    c2.cancel().await.unwrap();
    wait_gone(pid2).await;
    assert!(
        roots(pid2).is_empty(),
        "a server that exits removes its root"
    );
}

/// The quarantined entries of `list_sandboxes`.
async fn quarantined(c: &Client) -> Vec<Value> {
    ok(c, "list_sandboxes", json!({})).await["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "quarantined")
        .cloned()
        .collect()
}

/// A sandbox whose `meta.json` no longer parses (a torn write, a disk error, a hand edit) is
/// not deleted at the next start, as it was: its directory is moved to `<data>/quarantine/`,
/// listed to the local user with the reason until they delete it, and hidden from HTTP tokens
/// (whose it was cannot be told any more).
#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_meta_json_is_quarantined_with_its_files_until_deleted() {
    let data = tempfile::tempdir().unwrap();
    let (c, pid) = stdio(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({"template_id": "python", "timeout_seconds": 600})).await;
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "/workspace/precious.txt", "content": "a day of work"}),
    )
    .await;
    c.cancel().await.unwrap();
    wait_gone(pid).await;
    let dir = data.path().join("sandboxes").join(&id);
    std::fs::write(dir.join("meta.json"), r#"{"id": "wb0123", "templ"#).unwrap();

    let (c, pid) = stdio(data.path(), &[]).await;
    let q = quarantined(&c).await;
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["sandbox_id"], id.as_str(), "{q:?}");
    assert!(
        q[0]["reason"].as_str().unwrap().contains("meta.json"),
        "{q:?}"
    );
    let moved = std::path::PathBuf::from(q[0]["path"].as_str().unwrap());
    assert!(
        moved.starts_with(data.path().join("quarantine")),
        "{moved:?}"
    );
    assert_eq!(
        std::fs::read_to_string(moved.join("workspace/precious.txt")).unwrap(),
        "a day of work"
    );
    assert!(!dir.exists(), "moved aside, not left in place");
    let e = err(&c, "get_sandbox", json!({"id": id})).await;
    assert!(e.to_string().contains("not found"), "{e}");
    c.cancel().await.unwrap();
    wait_gone(pid).await;

    // An HTTP token neither sees nor deletes it.
    let token = "quarantine-token-aaaaaaaaaaaa";
    let server = HttpServer::start(
        &[
            ("WASMBOX_TOKEN", token),
            ("WASMBOX_DATA", data.path().to_str().unwrap()),
        ],
        &[],
    )
    .await;
    let h = server.client(token).await.unwrap();
    assert_eq!(ok(&h, "list_sandboxes", json!({})).await["data"], json!([]));
    err(&h, "delete_sandbox", json!({"id": id})).await;
    h.cancel().await.unwrap();
    drop(server);
    assert!(moved.join("workspace/precious.txt").is_file());

    // Still there at the next start (nothing removes it on its own); delete_sandbox does.
    let (c, _) = stdio(data.path(), &[]).await;
    let q = quarantined(&c).await;
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["path"], moved.to_str().unwrap());
    ok(&c, "delete_sandbox", json!({"id": id})).await;
    assert!(!moved.exists(), "deleted on request");
    assert!(quarantined(&c).await.is_empty());
    err(&c, "delete_sandbox", json!({"id": id})).await;
}
