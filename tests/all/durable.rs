//! Interpreter state that survives and copies: pause to disk and resume, a SIGTERM and a
//! restart on the same data directory, forks, snapshots, idle and capacity swap-out, and what a
//! damaged state file gives (a note and a fresh session), all over MCP with rmcp's client.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Client, HttpServer, create_sandbox, err, ok};
use serde_json::{Value, json};

async fn stdio(data: &Path, extra: &[(&str, &str)]) -> (Client, u32) {
    let mut env = vec![("WASMBOX_DATA", data.to_str().unwrap())];
    env.extend_from_slice(extra);
    common::server_with_pid(&env).await
}

async fn run(c: &Client, id: &str, language: &str, code: &str) -> Value {
    ok(
        c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": language, "code": code}),
    )
    .await
}

fn state_file(data: &Path, id: &str, language: &str) -> PathBuf {
    data.join("sandboxes")
        .join(id)
        .join("state")
        .join(format!("{language}.state"))
}

fn notes(v: &Value) -> String {
    v["notes"].to_string()
}

/// Python with a DataFrame and a plain variable, JavaScript with a global.
async fn fill(c: &Client, id: &str) {
    let v = run(
        c,
        id,
        "python",
        "import pandas as pd\ndf = pd.DataFrame({'a': range(10000)})\nx = 41",
    )
    .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    let v = run(c, id, "javascript", "var y = 'js kept'; y").await;
    assert_eq!(v["exit_code"], 0, "{v}");
}

/// Both sessions still hold what [`fill`] set.
async fn check_filled(c: &Client, id: &str) {
    let v = run(c, id, "python", "print(x + 1, len(df), int(df.a.sum()))").await;
    assert_eq!(v["stdout"], "42 10000 49995000\n", "{v}");
    let v = run(c, id, "javascript", "console.log(y)").await;
    assert_eq!(v["stdout"], "js kept\n", "{v}");
}

/// Sends `signal` to the server we started and waits until it has exited.
async fn stop_server(pid: u32, signal: i32) {
    // SAFETY: signalling the child server this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    wait_gone(pid).await;
}

async fn wait_gone(pid: u32) {
    for _ in 0..200 {
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid as i32, 0) } != 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server {pid} still running");
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_writes_sessions_to_disk_and_resume_brings_them_back() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    fill(&c, &id).await;

    let v = ok(&c, "pause_sandbox", json!({"id": id})).await;
    assert_eq!(v["status"], "paused", "{v}");
    assert!(notes(&v).contains("Python session was saved"), "{v}");
    assert!(notes(&v).contains("JavaScript session was saved"), "{v}");
    for language in ["python", "javascript"] {
        let f = state_file(data.path(), &id, language);
        let meta = std::fs::metadata(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(meta.len() > 0);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", f.display());
    }
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "print(x)"}),
    )
    .await;
    assert!(e.to_string().contains("paused"), "{e}");

    ok(&c, "resume_sandbox", json!({"id": id})).await;
    check_filled(&c, &id).await;
    // Restored, the sessions go on as before, and the files are spent.
    let v = run(&c, &id, "python", "x += 1\nprint(x)").await;
    assert_eq!(v["stdout"], "42\n", "{v}");
    assert!(!state_file(data.path(), &id, "python").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigterm_and_a_restart_keep_variables() {
    let data = tempfile::tempdir().unwrap();
    let (c, pid) = stdio(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    fill(&c, &id).await;
    stop_server(pid, libc::SIGTERM).await;
    assert!(state_file(data.path(), &id, "python").is_file());

    let (c, _) = stdio(data.path(), &[]).await;
    check_filled(&c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_save_every_call_even_a_killed_server_keeps_variables() {
    let data = tempfile::tempdir().unwrap();
    let (c, pid) = stdio(data.path(), &[("WASMBOX_SAVE_EVERY_CALL", "1")]).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(&c, &id, "python", "x = 'saved'").await;
    run(&c, &id, "python", "x += ' twice'").await;
    // Nothing is saved on the way out.
    stop_server(pid, libc::SIGKILL).await;

    let (c, _) = stdio(data.path(), &[]).await;
    let v = run(&c, &id, "python", "print(x)").await;
    assert_eq!(v["stdout"], "saved twice\n", "{v}");
}

/// Waits for the idle save (`WASMBOX_SAVE_IDLE_MS`) of `id`'s `language` session.
async fn wait_saved(data: &Path, id: &str, language: &str) {
    let f = state_file(data, id, language);
    for _ in 0..200 {
        if f.is_file() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} was not written", f.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_running_at_shutdown_leaves_its_session_as_of_the_turn_before() {
    let data = tempfile::tempdir().unwrap();
    let (c, pid) = stdio(data.path(), &[("WASMBOX_SAVE_IDLE_MS", "200")]).await;
    let id = create_sandbox(&c, json!({})).await;
    fill(&c, &id).await;
    wait_saved(data.path(), &id, "python").await;
    let busy = common::spawn_call(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent",
               "code": "x = 'changed by the cut-off call'\nopen('/workspace/busy','w').write('1')\nimport time; time.sleep(30)"}),
    );
    common::wait_written(&c, &id, "/workspace/busy").await;
    stop_server(pid, libc::SIGTERM).await;
    let _ = busy.await;

    let (c, _) = stdio(data.path(), &[]).await;
    let v = run(&c, &id, "python", "print(x, len(df))").await;
    assert_eq!(v["stdout"], "41 10000\n", "{v}");
    assert!(notes(&v).contains("as of the turn before it"), "{v}");
    check_filled(&c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_server_leaves_the_turn_before_a_running_call_or_says_what_was_lost() {
    let data = tempfile::tempdir().unwrap();
    let (c, pid) = stdio(data.path(), &[("WASMBOX_SAVE_IDLE_MS", "300")]).await;
    // `saved` idles long enough to be saved, then starts a call; `unsaved` never idles.
    let saved = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(&c, &saved, "python", "x = 'before the call'").await;
    wait_saved(data.path(), &saved, "python").await;
    let unsaved = create_sandbox(&c, json!({"template_id": "python"})).await;
    let mut busy = Vec::new();
    for id in [&saved, &unsaved] {
        busy.push(common::spawn_call(
            &c,
            "execute_code",
            json!({"sandbox_id": id, "mode": "persistent",
                   "code": "x = 'in the call'\nopen('/workspace/busy','w').write('1')\nimport time; time.sleep(30)"}),
        ));
    }
    for id in [&saved, &unsaved] {
        common::wait_written(&c, id, "/workspace/busy").await;
    }
    // Nothing is saved on the way out.
    stop_server(pid, libc::SIGKILL).await;
    for b in busy {
        let _ = b.await;
    }

    let (c, _) = stdio(data.path(), &[]).await;
    let v = run(&c, &saved, "python", "print(x)").await;
    assert_eq!(v["stdout"], "before the call\n", "{v}");
    assert!(notes(&v).contains("without shutting down cleanly"), "{v}");
    let v = run(&c, &unsaved, "python", "print('x' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    assert!(notes(&v).contains("killed or crashed"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_running_at_shutdown_ends_its_session_and_the_next_server_says_so() {
    let data = tempfile::tempdir().unwrap();
    // No idle saves: the turn before the call is not on disk.
    let (c, pid) = stdio(data.path(), &[("WASMBOX_SAVE_IDLE_MS", "0")]).await;
    let id = create_sandbox(&c, json!({})).await;
    run(&c, &id, "python", "x = 1").await;
    let busy = common::spawn_call(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent",
               "code": "open('/workspace/busy','w').write('1')\nimport time; time.sleep(30)"}),
    );
    common::wait_written(&c, &id, "/workspace/busy").await;
    stop_server(pid, libc::SIGTERM).await;
    let _ = busy.await;

    let (c, _) = stdio(data.path(), &[]).await;
    let v = run(&c, &id, "python", "print('x' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    assert!(
        notes(&v).contains("not saved when the server last stopped"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_sees_the_parents_variables_and_files_then_each_goes_its_own_way() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[]).await;
    let parent = create_sandbox(&c, json!({"env_vars": {"STAGE": "one"}})).await;
    fill(&c, &parent).await;
    run(
        &c,
        &parent,
        "python",
        "import numpy as np, random\nopen('/workspace/f.txt', 'w').write('parent')",
    )
    .await;

    let v = ok(&c, "fork_sandbox", json!({"sandbox_id": parent})).await;
    let child = v["id"].as_str().unwrap().to_string();
    assert_ne!(child, parent);
    assert_eq!(v["template_id"], "code-interpreter", "{v}");
    check_filled(&c, &child).await;
    let v = run(
        &c,
        &child,
        "python",
        "import os\nprint(open('/workspace/f.txt').read(), os.environ['STAGE'])",
    )
    .await;
    assert_eq!(v["stdout"], "parent one\n", "{v}");

    // Each changes its own copy only.
    run(
        &c,
        &child,
        "python",
        "x = 'child'\nopen('/workspace/f.txt', 'w').write('child')",
    )
    .await;
    run(&c, &parent, "python", "df['a'] = 0").await;
    let v = run(
        &c,
        &parent,
        "python",
        "print(x, open('/workspace/f.txt').read(), int(df.a.sum()))",
    )
    .await;
    assert_eq!(v["stdout"], "41 parent 0\n", "{v}");
    let v = run(
        &c,
        &child,
        "python",
        "print(x, open('/workspace/f.txt').read(), int(df.a.sum()))",
    )
    .await;
    assert_eq!(v["stdout"], "child child 49995000\n", "{v}");

    // A fork draws its own random numbers.
    let draw = "print(random.random(), np.random.rand())";
    let a = run(&c, &parent, "python", draw).await;
    let b = run(&c, &child, "python", draw).await;
    assert_eq!(a["exit_code"], 0, "{a}");
    assert_ne!(
        a["stdout"], b["stdout"],
        "the fork repeats its parent's random numbers"
    );
    let draw = "console.log(Math.random())";
    let a = run(&c, &parent, "javascript", draw).await;
    let b = run(&c, &child, "javascript", draw).await;
    assert_eq!(a["exit_code"], 0, "{a}");
    assert_ne!(
        a["stdout"], b["stdout"],
        "the fork repeats its parent's Math.random"
    );
}

/// The pool counters of `name` in `get_system_metrics`, if it is listed.
async fn pool(c: &Client, name: &str) -> Option<Value> {
    let m = ok(c, "get_system_metrics", json!({})).await;
    m["pools"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
}

/// Waits until the spare instances restores and forks take are made.
async fn wait_spares(c: &Client) -> (u64, u64) {
    for _ in 0..600 {
        let (py, js) = (
            pool(c, "python-spare").await,
            pool(c, "javascript-spare").await,
        );
        if let (Some(py), Some(js)) = (py, js)
            && py["ready"] == 1
            && js["ready"] == 1
        {
            return (py["hits"].as_u64().unwrap(), js["hits"].as_u64().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no spare instances were made");
}

/// A fork or a resume into an instance made ahead of time (grown and faulted in to the last
/// session's measure, then moved into the sandbox) holds exactly what one into a fresh
/// instance holds, in the sandbox's own directories.
#[tokio::test(flavor = "multi_thread")]
async fn forks_and_resumes_into_spare_instances_are_exact() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[("WASMBOX_SAVE_IDLE_MS", "0")]).await;
    let parent = create_sandbox(&c, json!({"env_vars": {"STAGE": "one"}})).await;
    fill(&c, &parent).await;
    run(
        &c,
        &parent,
        "python",
        "open('/workspace/f.txt', 'w').write('parent')",
    )
    .await;
    assert!(
        pool(&c, "python-spare").await.is_none(),
        "no spare before a fork"
    );

    // The first fork makes its instances; it leaves a spare made to its measure.
    let first = ok(&c, "fork_sandbox", json!({"sandbox_id": parent})).await;
    let first = first["id"].as_str().unwrap().to_string();
    let (py_hits, js_hits) = wait_spares(&c).await;

    let v = ok(&c, "fork_sandbox", json!({"sandbox_id": parent})).await;
    let child = v["id"].as_str().unwrap().to_string();
    let py = pool(&c, "python-spare").await.unwrap();
    let js = pool(&c, "javascript-spare").await.unwrap();
    assert_eq!(py["hits"].as_u64().unwrap(), py_hits + 1, "{py}");
    assert_eq!(js["hits"].as_u64().unwrap(), js_hits + 1, "{js}");
    check_filled(&c, &child).await;
    let v = run(
        &c,
        &child,
        "python",
        "import os\nprint(sorted(os.listdir('/workspace')), open('/workspace/f.txt').read(), \
         os.environ['STAGE'], os.getcwd())",
    )
    .await;
    assert_eq!(v["stdout"], "['f.txt'] parent one /workspace\n", "{v}");
    run(
        &c,
        &child,
        "python",
        "x = 'child'\nopen('/workspace/f.txt', 'w').write('child')",
    )
    .await;
    for id in [&parent, &first] {
        let v = run(
            &c,
            id,
            "python",
            "print(x, open('/workspace/f.txt').read())",
        )
        .await;
        assert_eq!(v["stdout"], "41 parent\n", "{id}: {v}");
    }

    // The two forks draw numbers of their own.
    let draw = "import random, numpy as np\nprint(random.random(), np.random.rand())";
    let a = run(&c, &first, "python", draw).await;
    let b = run(&c, &child, "python", draw).await;
    assert_eq!(a["exit_code"], 0, "{a}");
    assert_ne!(a["stdout"], b["stdout"], "two forks drew the same numbers");

    // A resume takes the spare too, and keeps everything.
    wait_spares(&c).await;
    ok(&c, "pause_sandbox", json!({"id": parent})).await;
    ok(&c, "resume_sandbox", json!({"id": parent})).await;
    check_filled(&c, &parent).await;
    let py = pool(&c, "python-spare").await.unwrap();
    assert_eq!(py["hits"].as_u64().unwrap(), py_hits + 2, "{py}");

    // A session of another measure resumes as exactly (into a fresh instance where its memory
    // is smaller than the spare's).
    let small = create_sandbox(&c, json!({})).await;
    run(&c, &small, "python", "z = 7").await;
    wait_spares(&c).await;
    ok(&c, "pause_sandbox", json!({"id": small})).await;
    ok(&c, "resume_sandbox", json!({"id": small})).await;
    let v = run(&c, &small, "python", "print(z)").await;
    assert_eq!(v["stdout"], "7\n", "{v}");
    let v = run(
        &c,
        &small,
        "python",
        "print(sorted(__import__('os').listdir('/workspace')))",
    )
    .await;
    assert_eq!(v["stdout"], "[]\n", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_from_a_snapshot_has_the_snapshots_state_not_the_sources_later_one() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[]).await;
    let src = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(
        &c,
        &src,
        "python",
        "x = 'snap'\nopen('/workspace/f', 'w').write('v1')",
    )
    .await;
    let snap = ok(&c, "snapshot_sandbox", json!({"sandbox_id": src})).await;
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(snap["sandbox_id"], src.as_str(), "{snap}");
    assert_eq!(snap["languages"], json!(["python"]), "{snap}");
    assert!(snap["size_bytes"].as_u64().unwrap() > 0, "{snap}");
    // The source runs on, and moves on.
    run(
        &c,
        &src,
        "python",
        "x = 'later'\nopen('/workspace/f', 'w').write('v2')",
    )
    .await;

    let listed = ok(&c, "list_snapshots", json!({})).await;
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(listed["snapshots"][0]["snapshot_id"], snap_id.as_str());

    let e = err(
        &c,
        "create_sandbox",
        json!({"from_snapshot": snap_id, "template_id": "javascript"}),
    )
    .await;
    assert!(e.to_string().contains("template"), "{e}");
    let v = ok(&c, "create_sandbox", json!({"from_snapshot": snap_id})).await;
    assert_eq!(v["template_id"], "python", "{v}");
    let made = v["id"].as_str().unwrap().to_string();
    let v = run(&c, &made, "python", "print(x, open('/workspace/f').read())").await;
    assert_eq!(v["stdout"], "snap v1\n", "{v}");
    let v = run(&c, &src, "python", "print(x)").await;
    assert_eq!(v["stdout"], "later\n", "{v}");

    let v = ok(&c, "delete_snapshot", json!({"snapshot_id": snap_id})).await;
    assert_eq!(v, json!({"snapshot_id": snap_id, "deleted": true}));
    assert_eq!(ok(&c, "list_snapshots", json!({})).await["count"], 0);
    let e = err(&c, "create_sandbox", json!({"from_snapshot": snap_id})).await;
    assert!(e.to_string().contains("not found"), "{e}");
    // The sandbox made from it does not depend on it.
    let v = run(&c, &made, "python", "print(x)").await;
    assert_eq!(v["stdout"], "snap\n", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_state_file_gives_a_note_and_a_working_fresh_session() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    run(&c, &id, "python", "x = 1").await;
    ok(&c, "pause_sandbox", json!({"id": id})).await;
    let f = state_file(data.path(), &id, "python");
    let mut bytes = std::fs::read(&f).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&f, &bytes).unwrap();
    ok(&c, "resume_sandbox", json!({"id": id})).await;
    let v = run(&c, &id, "python", "print('x' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    assert!(notes(&v).contains("could not be restored"), "{v}");
    assert!(notes(&v).contains("corrupted"), "{v}");
    let v = run(&c, &id, "python", "x = 2\nprint(x)").await;
    assert_eq!(v["stdout"], "2\n", "{v}");
    assert!(v["notes"].as_array().is_none_or(|n| n.is_empty()), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_state_file_of_another_image_is_refused_with_a_note() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[]).await;
    let id = create_sandbox(&c, json!({})).await;
    run(&c, &id, "javascript", "var z = 5").await;
    ok(&c, "pause_sandbox", json!({"id": id})).await;
    // The JavaScript state put where the Python one goes: a well-formed file of another image.
    std::fs::rename(
        state_file(data.path(), &id, "javascript"),
        state_file(data.path(), &id, "python"),
    )
    .unwrap();
    ok(&c, "resume_sandbox", json!({"id": id})).await;
    let v = run(&c, &id, "python", "print('z' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    assert!(notes(&v).contains("another image"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_and_those_past_the_live_cap_go_to_disk_and_come_back() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(
        data.path(),
        &[
            ("WASMBOX_LIVE_SESSIONS", "2"),
            ("WASMBOX_IDLE_PAUSE_S", "1"),
        ],
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let id = create_sandbox(&c, json!({"template_id": "python"})).await;
        run(&c, &id, "python", &format!("mine = {i}")).await;
        ids.push(id);
    }
    // At most two live: the first two were saved to make room.
    assert!(state_file(data.path(), &ids[0], "python").is_file());
    for (i, id) in ids.iter().enumerate() {
        let v = run(&c, id, "python", "print(mine)").await;
        assert_eq!(v["stdout"], format!("{i}\n"), "{v}");
    }
    // Idle for over a second: saved and freed, then back on the next call.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(state_file(data.path(), &ids[3], "python").is_file());
    let v = run(&c, &ids[3], "python", "print(mine)").await;
    assert_eq!(v["stdout"], "3\n", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_and_forks_are_owner_scoped_and_within_quota() {
    let (a_tok, b_tok) = (
        "durable-token-aaaaaaaaaaaaaaaa",
        "durable-token-bbbbbbbbbbbbbbbb",
    );
    let tokens = format!("{a_tok},{b_tok}");
    let server = HttpServer::start(
        &[
            ("WASMBOX_TOKEN", tokens.as_str()),
            ("WASMBOX_SNAPSHOT_DISK_MB", "8"),
        ],
        &[],
    )
    .await;
    let a = server.client(a_tok).await.unwrap();
    let b = server.client(b_tok).await.unwrap();
    let id = create_sandbox(&a, json!({"template_id": "python"})).await;
    run(&a, &id, "python", "x = 1").await;
    let snap = ok(&a, "snapshot_sandbox", json!({"sandbox_id": id})).await;
    let snap_id = snap["snapshot_id"].as_str().unwrap();

    for (tool, args) in [
        ("fork_sandbox", json!({"sandbox_id": id})),
        ("snapshot_sandbox", json!({"sandbox_id": id})),
        ("delete_snapshot", json!({"snapshot_id": snap_id})),
        ("create_sandbox", json!({"from_snapshot": snap_id})),
    ] {
        let e = err(&b, tool, args).await;
        assert!(e.to_string().contains("not found"), "{tool}: {e}");
    }
    assert_eq!(ok(&b, "list_snapshots", json!({})).await["count"], 0);
    assert_eq!(ok(&a, "list_snapshots", json!({})).await["count"], 1);

    // A's snapshots may take 8 MiB in all.
    run(
        &a,
        &id,
        "python",
        "open('/workspace/big', 'wb').write(bytes(9000000))",
    )
    .await;
    let e = err(&a, "snapshot_sandbox", json!({"sandbox_id": id})).await;
    assert!(e.to_string().contains("WASMBOX_SNAPSHOT_DISK_MB"), "{e}");
    assert_eq!(ok(&a, "list_snapshots", json!({})).await["count"], 1);
}

/// 1,000 Python sandboxes on one server, each with pandas imported and a variable of its own,
/// every one answering a later call with its own value; the server's memory at the end stays
/// within twice an idle server's. Slow: run with `--ignored`.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn a_thousand_sandboxes_keep_their_variables() {
    let data = tempfile::tempdir().unwrap();
    let n: usize = std::env::var("WASMBOX_LOAD_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let max = (n + 10).to_string();
    let (c, pid) = stdio(
        data.path(),
        &[
            ("WASMBOX_MAX_SANDBOXES", max.as_str()),
            ("WASMBOX_MAX_SANDBOXES_PER_TOKEN", max.as_str()),
            // Their saved sessions (~2.8 MB each) count against the owner's budget.
            ("WASMBOX_SNAPSHOT_DISK_MB", "8192"),
        ],
    )
    .await;
    // Idle: the runtimes loaded and warm, no sandbox yet.
    common::py(&c, "print(1)").await;
    let warm = create_sandbox(&c, json!({"template_id": "javascript"})).await;
    run(&c, &warm, "javascript", "1").await;
    ok(&c, "delete_sandbox", json!({"id": warm})).await;
    let idle = settled_rss_kib(pid).await;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = create_sandbox(&c, json!({"template_id": "python"})).await;
        let v = run(
            &c,
            &id,
            "python",
            &format!("import pandas as pd\nmine = {i}"),
        )
        .await;
        assert_eq!(v["exit_code"], 0, "{v}");
        ids.push(id);
    }
    for (i, id) in ids.iter().enumerate() {
        let v = run(&c, id, "python", "print(mine, pd.__name__)").await;
        assert_eq!(v["stdout"], format!("{i} pandas\n"), "{v}");
    }
    let end = settled_rss_kib(pid).await;
    eprintln!("{n} sandboxes: idle RSS {idle} KiB, at the end {end} KiB");
    assert!(
        end <= 2 * idle,
        "RSS {end} KiB is over twice the idle {idle} KiB"
    );
}

/// The server's RSS once it stops moving: its pools refill in the background after a call, so a
/// reading taken at once depends on how busy the machine is.
async fn settled_rss_kib(pid: u32) -> u64 {
    let mut last = rss_kib(pid);
    let mut steady = 0;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = rss_kib(pid);
        steady = if now.abs_diff(last) * 100 <= last {
            steady + 1
        } else {
            0
        };
        last = now;
        if steady >= 4 {
            break;
        }
    }
    last
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A call in a session saved as it is leaves the `.lost` marker before its `.before` goes: a
/// server killed after the call and before the next idle save says the variables were lost,
/// never starts fresh silently.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_after_a_call_in_a_saved_session_says_what_was_lost() {
    let data = tempfile::tempdir().unwrap();
    // The next idle save comes 3 s after the call: the kill below comes well before.
    let (c, pid) = stdio(data.path(), &[("WASMBOX_SAVE_IDLE_MS", "3000")]).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(&c, &id, "python", "x = 'saved'").await;
    wait_saved(data.path(), &id, "python").await;
    run(&c, &id, "python", "x = 'after the save'").await;
    let f = state_file(data.path(), &id, "python");
    assert!(!f.with_extension("before").exists());
    assert!(
        f.with_extension("lost").is_file(),
        "no marker for the turn no file holds"
    );
    stop_server(pid, libc::SIGKILL).await;

    let (c, _) = stdio(data.path(), &[]).await;
    let v = run(&c, &id, "python", "print('x' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    assert!(notes(&v).contains("killed or crashed"), "{v}");
}

/// A saved session that no instance can be made for now (the one instance slot is held by a
/// call in another sandbox) is kept, and the call says so; once the slot is free, it restores.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_that_cannot_be_restored_now_is_kept_for_a_later_call() {
    let data = tempfile::tempdir().unwrap();
    let one_slot = [
        ("WASMBOX_POOLED_INSTANCES", "1"),
        ("WASMBOX_POOL_SIZE", "0"),
    ];
    let (c, _) = stdio(data.path(), &one_slot).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    let v = run(&c, &id, "python", "x = 'kept'").await;
    assert_eq!(v["exit_code"], 0, "{v}");
    ok(&c, "pause_sandbox", json!({"id": id})).await;
    ok(&c, "resume_sandbox", json!({"id": id})).await;
    let f = state_file(data.path(), &id, "python");
    assert!(f.is_file());

    let other = create_sandbox(&c, json!({"template_id": "javascript"})).await;
    let busy = common::spawn_call(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": other, "language": "javascript",
               "code": "console.log('holding');\nos.sleep(8000);"}),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "print(x)"}),
    )
    .await;
    assert!(e.to_string().contains("kept on disk"), "{e}");
    assert!(f.is_file(), "the state file is kept");
    let _ = busy.await;

    let v = run(&c, &id, "python", "print(x)").await;
    assert_eq!(v["stdout"], "kept\n", "{v}");
    assert!(!f.exists(), "spent once restored");
}

/// A sandbox made from a snapshot is in no listing until its files are copied: nothing can
/// run in it (a job swapping its directories for links) while the host writes into it.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_being_filled_from_a_snapshot_is_not_listed_until_complete() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[]).await;
    let src = create_sandbox(&c, json!({"template_id": "python"})).await;
    let v = run(
        &c,
        &src,
        "python",
        "import os\nos.mkdir('/workspace/d')\nfor i in range(4000):\n    \
         open(f'/workspace/d/{i}', 'w').write('x' * 100)",
    )
    .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    let snap = ok(&c, "snapshot_sandbox", json!({"sandbox_id": src})).await;
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    // A listing read as the creation ends may show the new sandbox: complete, as every
    // sandbox listed must be (its files counted once they are all copied).
    for _ in 0..3 {
        let creating = common::spawn_call(&c, "create_sandbox", json!({"from_snapshot": snap_id}));
        let mut partial = Vec::new();
        while !creating.is_finished() {
            let l = ok(&c, "list_sandboxes", json!({})).await;
            for s in l["data"].as_array().unwrap() {
                if s["sandbox_id"] != src.as_str() && s["workspace"]["entries"] != 4001 {
                    partial.push(s.clone());
                }
            }
        }
        let made = common::object(&creating.await.unwrap().unwrap());
        let made = made["id"].as_str().unwrap().to_string();
        assert!(partial.is_empty(), "listed while being filled: {partial:?}");
        let v = run(
            &c,
            &made,
            "python",
            "print(len(__import__('os').listdir('/workspace/d')))",
        )
        .await;
        assert_eq!(v["stdout"], "4000\n", "{v}");
    }
}

/// Makes `n` empty directories in sandbox `id`'s workspace (a fresh interpreter: no session).
async fn empty_dirs(c: &Client, id: &str, n: usize) {
    let v = ok(
        c,
        "execute_code",
        json!({"sandbox_id": id, "language": "python", "code":
            format!("import os\nfor i in range({n}): os.mkdir(f'/workspace/d{{i}}')")}),
    )
    .await;
    assert_eq!(v["exit_code"], 0, "{v}");
}

/// Bytes of the blocks under `dir`, as du counts them.
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    common::walk(dir)
        .iter()
        .chain([dir.to_path_buf()].iter())
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_of_empty_directories_are_charged_their_blocks_and_entries() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[("WASMBOX_SNAPSHOT_DISK_MB", "4")]).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    empty_dirs(&c, &id, 300).await;
    let mut charged = Vec::new();
    let mut refusal = None;
    for _ in 0..20 {
        let r = common::call(&c, "snapshot_sandbox", json!({"sandbox_id": id})).await;
        let v = common::object(&r);
        if common::is_error(&r) {
            refusal = Some(v);
            break;
        }
        assert_eq!(v["size_bytes"], 0, "{v}");
        charged.push(v["charged_bytes"].as_u64().unwrap_or(0));
    }
    let used = du(&data.path().join("snapshots"));
    let Some(e) = refusal else {
        panic!(
            "snapshots of 300 empty directories were never refused: {} made, the store takes \
             {used} bytes",
            charged.len()
        );
    };
    assert!(e.to_string().contains("WASMBOX_SNAPSHOT_DISK_MB"), "{e}");
    assert_eq!(
        charged.len(),
        1,
        "a second copy would pass 4 MiB: {charged:?}"
    );
    // A block and an entry per directory.
    assert!(charged[0] >= 300 * 8192, "{charged:?}");
    assert!(used <= 4 * MIB + charged[0], "the store takes {used} bytes");
    let listed = ok(&c, "list_snapshots", json!({})).await;
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(listed["disk_limit_bytes"], 4 * MIB, "{listed}");
    assert!(
        listed["disk_used_bytes"].as_u64().unwrap() >= charged[0],
        "{listed}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_snapshots_cannot_jointly_pass_the_quota() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[("WASMBOX_SNAPSHOT_DISK_MB", "4")]).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = create_sandbox(&c, json!({"template_id": "python"})).await;
        empty_dirs(&c, &id, 300).await;
        ids.push(id);
    }
    // Each fits alone; two do not.
    let calls: Vec<_> = ids
        .iter()
        .map(|id| common::spawn_call(&c, "snapshot_sandbox", json!({"sandbox_id": id})))
        .collect();
    let mut charged = 0;
    let mut made = 0;
    for call in calls {
        let r = call.await.unwrap().unwrap();
        let v = common::object(&r);
        if common::is_error(&r) {
            assert!(v.to_string().contains("WASMBOX_SNAPSHOT_DISK_MB"), "{v}");
        } else {
            made += 1;
            charged += v["charged_bytes"].as_u64().unwrap_or(0);
        }
    }
    let used = du(&data.path().join("snapshots"));
    assert_eq!(
        made, 1,
        "{made} snapshots made; the store takes {used} bytes"
    );
    assert!(used <= 4 * MIB, "the store takes {used} bytes");
    assert!(
        (used..=4 * MIB).contains(&charged),
        "charged {charged}, du {used}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_over_the_state_cap_stays_live_and_writes_nothing() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[("WASMBOX_STATE_MB", "8")]).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(&c, &id, "python", "import os\nb = os.urandom(12_000_000)").await;
    let v = ok(&c, "pause_sandbox", json!({"id": id})).await;
    assert!(notes(&v).contains("WASMBOX_STATE_MB"), "{v}");
    assert!(notes(&v).contains("stays in memory"), "{v}");
    let state = state_file(data.path(), &id, "python");
    assert!(!state.exists());
    let dir = state.parent().unwrap();
    assert!(du(dir) < MIB, "{:?}", common::entries(dir));
    ok(&c, "resume_sandbox", json!({"id": id})).await;
    let v = run(&c, &id, "python", "print(len(b))").await;
    assert_eq!(v["stdout"], "12000000\n", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn saved_sessions_count_against_the_owners_budget() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[("WASMBOX_SNAPSHOT_DISK_MB", "20")]).await;
    let code = "import os\nb = os.urandom(12_000_000)";
    let a = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(&c, &a, "python", code).await;
    let v = ok(&c, "pause_sandbox", json!({"id": a})).await;
    assert!(notes(&v).contains("saved to disk"), "{v}");

    let b = create_sandbox(&c, json!({"template_id": "python"})).await;
    run(&c, &b, "python", code).await;
    let v = ok(&c, "pause_sandbox", json!({"id": b})).await;
    assert!(notes(&v).contains("WASMBOX_SNAPSHOT_DISK_MB"), "{v}");
    assert!(!state_file(data.path(), &b, "python").exists());
    ok(&c, "resume_sandbox", json!({"id": b})).await;
    let v = run(&c, &b, "python", "print(len(b))").await;
    assert_eq!(v["stdout"], "12000000\n", "{v}");
    let listed = ok(&c, "list_snapshots", json!({})).await;
    assert!(
        listed["disk_used_bytes"].as_u64().unwrap() > 12_000_000,
        "{listed}"
    );
    // A snapshot is refused too while the saved session takes the room.
    let e = err(&c, "snapshot_sandbox", json!({"sandbox_id": b})).await;
    assert!(e.to_string().contains("WASMBOX_SNAPSHOT_DISK_MB"), "{e}");

    ok(&c, "delete_sandbox", json!({"id": a})).await;
    let v = ok(&c, "pause_sandbox", json!({"id": b})).await;
    assert!(notes(&v).contains("saved to disk"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn list_snapshots_fits_the_answer_budget() {
    let data = tempfile::tempdir().unwrap();
    let (c, _) = stdio(data.path(), &[("WASMBOX_RESULT_BYTES", "3000")]).await;
    let id = create_sandbox(&c, json!({"template_id": "javascript"})).await;
    for _ in 0..25 {
        ok(&c, "snapshot_sandbox", json!({"sandbox_id": id})).await;
    }
    let r = common::call(&c, "list_snapshots", json!({})).await;
    let text = &r.content[0].as_text().unwrap().text;
    let v = common::object(&r);
    assert!(
        text.len() <= 3000,
        "{} bytes, {} snapshots listed",
        text.len(),
        v["count"]
    );
    assert_eq!(v["truncated"], true, "{v}");
    let n = v["count"].as_u64().unwrap();
    assert!((1..25).contains(&n), "{v}");
    assert_eq!(v["snapshots"].as_array().unwrap().len() as u64, n);
}
