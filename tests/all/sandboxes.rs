//! Persistent sandboxes over stdio MCP, through the real binary and a real MCP client: the
//! HOPX surface (sandboxes, sessions, files, env, jobs, webhooks, rich output) used locally.

use crate::common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use serde_json::{Value, json};

async fn run(c: &Client, id: &str, language: &str, code: &str) -> Value {
    ok(
        c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": language, "code": code}),
    )
    .await
}

#[tokio::test]
async fn the_users_story_state_files_env_and_delete() {
    let c = server().await;
    let t = Instant::now();
    let id = create_sandbox(&c, json!({"template_id": "code-interpreter"})).await;
    assert!(id.len() >= 32, "ids are long and random: {id}");
    eprintln!("create_sandbox over stdio: {:?}", t.elapsed());

    // State persists; a final expression is echoed like a notebook cell.
    assert_eq!(run(&c, &id, "python", "x = 41").await["stdout"], "");
    let r = run(&c, &id, "python", "print(x + 1)").await;
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(r["mode"], "persistent");
    assert_eq!(r["sandbox_id"], id.as_str());
    assert_eq!(run(&c, &id, "python", "x * 2").await["stdout"], "82\n");

    // A CSV written with file_write is read by pandas.
    let w = ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "/workspace/data.csv", "content": "a,b\n1,2\n3,4\n"}),
    )
    .await;
    assert_eq!(w["size"], 12);
    let r = run(
        &c,
        &id,
        "python",
        "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(int(df['b'].sum()))",
    )
    .await;
    assert_eq!(r["stdout"], "6\n", "{r}");

    // A file written by Python is read with file_read, and listed.
    run(
        &c,
        &id,
        "python",
        "import os\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write('from python ✓')",
    )
    .await;
    let f = ok(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "out/r.txt"}),
    )
    .await;
    assert_eq!(f["content"], "from python ✓");
    assert_eq!(f["path"], "/workspace/out/r.txt");
    let l = ok(&c, "file_list", json!({"sandbox_id": id})).await;
    let names: Vec<&str> = l["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data.csv", "out"], "{l}");
    assert_eq!(l["files"][1]["is_directory"], true);

    // JavaScript and Go share the workspace.
    let r = run(
        &c,
        &id,
        "javascript",
        "const fs = require('fs'); fs.readFileSync('out/r.txt', 'utf8')",
    )
    .await;
    assert_eq!(r["stdout"], "'from python ✓'\n", "{r}");
    let r = run(
        &c,
        &id,
        "go",
        "package main\nimport (\"fmt\"; \"os\")\nfunc main() { b, _ := os.ReadFile(\"data.csv\"); fmt.Print(len(b)) }",
    )
    .await;
    assert_eq!(r["stdout"], "12", "{r}");

    // env_set: the next execution in every language sees it.
    let e = ok(
        &c,
        "env_set",
        json!({"sandbox_id": id, "env_vars": {"API_MODE": "test", "N": "3"}}),
    )
    .await;
    assert_eq!(e["variables_set"], json!(["API_MODE", "N"]));
    let r = run(
        &c,
        &id,
        "python",
        "import os\nprint(os.environ['API_MODE'], os.environ.get(HOST))"
            .replace("HOST", &format!("{:?}", HOST_CANARY.0))
            .as_str(),
    )
    .await;
    assert_eq!(r["stdout"], "test None\n", "{r}");
    let r = run(
        &c,
        &id,
        "javascript",
        "console.log(process.env.API_MODE + process.env.N)",
    )
    .await;
    assert_eq!(r["stdout"], "test3\n");
    let g = ok(&c, "env_get", json!({"sandbox_id": id})).await;
    assert_eq!(g["env_vars"]["N"], "3");
    // Per-call env goes on top for that call only.
    let r = ok(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "import os; os.environ['N']", "env": {"N": "9"}}),
    )
    .await;
    assert_eq!(r["stdout"], "'9'\n");
    assert_eq!(
        run(&c, &id, "python", "os.environ['N']").await["stdout"],
        "'3'\n"
    );
    ok(&c, "env_clear", json!({"sandbox_id": id})).await;
    assert_eq!(
        run(&c, &id, "python", "os.environ.get('N')").await["stdout"],
        ""
    );

    // The sandbox is listed, then deleted; calls on its id fail clearly.
    let l = ok(&c, "list_sandboxes", json!({})).await;
    assert!(
        l["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["sandbox_id"] == id.as_str())
    );
    let d = ok(&c, "delete_sandbox", json!({"id": id})).await;
    assert_eq!(d["status"], "deleted");
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "print(1)"}),
    )
    .await;
    assert_eq!(e["error"], "Sandbox not found");
    assert!(e["message"].as_str().unwrap().contains("create_sandbox"));
    let e = err(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "data.csv"}),
    )
    .await;
    assert_eq!(e["error"], "Sandbox not found");
    assert_eq!(e["sandbox_id"], id.as_str());
    let e = err(&c, "get_sandbox", json!({"id": id})).await;
    assert_eq!(e["id"], id.as_str());
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn expiry_removes_the_sandbox_and_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let c = server_with_env(&[("TMPDIR", tmp.path().to_str().unwrap())]).await;
    let id = create_sandbox(&c, json!({"timeout_seconds": 2})).await;
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "keep.txt", "content": "x"}),
    )
    .await;
    // Without a data directory: `<TMPDIR>/wasmbox-run-<pid>-*/sandboxes-*/<id>`.
    let find = || {
        entries(tmp.path())
            .iter()
            .flat_map(|root| entries(root))
            .map(|p| p.join(&id))
            .find(|p| p.exists())
    };
    let dir = find().expect("the sandbox's directory exists on the host while it lives");
    assert!(dir.join("workspace/keep.txt").is_file());
    // The reaper runs every second: within a few seconds of expiry everything is gone.
    let deadline = Instant::now() + Duration::from_secs(15);
    while dir.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!dir.exists(), "the expired sandbox's files are removed");
    let e = err(&c, "get_sandbox", json!({"id": id})).await;
    assert_eq!(e["error"], "Sandbox not found");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn paths_that_escape_the_workspace_are_refused() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    for path in [
        "../x",
        "a/../../x",
        "/etc/passwd",
        "/workspace/../etc/passwd",
        "/tmp/../etc",
    ] {
        let e = err(&c, "file_read", json!({"sandbox_id": id, "path": path})).await;
        assert_eq!(e["error"], "Path not allowed", "{path}: {e}");
        assert!(e["message"].as_str().unwrap().contains("/workspace"), "{e}");
        err(
            &c,
            "file_write",
            json!({"sandbox_id": id, "path": path, "content": "x"}),
        )
        .await;
    }
    // A guest makes symlinks pointing out; the host-side tools refuse to follow them.
    let r = run(
        &c,
        &id,
        "python",
        "import os\nfor name, target in [('abs', '/etc'), ('up', '../../../../../../etc')]:\n    try:\n        os.symlink(target, name); print(name, 'made')\n    except OSError as e:\n        print(name, 'refused', e.errno)",
    )
    .await;
    eprintln!("guest symlinks: {}", r["stdout"]);
    for path in ["abs/passwd", "up/passwd", "abs", "up/hostname"] {
        let r = call(&c, "file_read", json!({"sandbox_id": id, "path": path})).await;
        let text = format!("{:?}", r.content);
        assert!(is_error(&r), "{path}: {text}");
        assert!(!text.contains("root:"), "{path} leaked the host's file");
        let r = call(&c, "file_list", json!({"sandbox_id": id, "path": path})).await;
        assert!(is_error(&r), "{path}");
    }
    // Nor can the guest itself read through them.
    let r = run(
        &c,
        &id,
        "python",
        "import os\nfor p in ['abs/passwd', 'up/passwd', '/etc/passwd']:\n    try:\n        print(p, open(p).read()[:4])\n    except OSError:\n        print(p, 'no')",
    )
    .await;
    assert!(!r["stdout"].as_str().unwrap().contains("root"), "{r}");
    // Working directories obey the same rule.
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "1", "working_dir": "/etc"}),
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("outside"), "{e}");
    c.cancel().await.unwrap();
}

/// A guest may plant a symlink in its /tmp whose relative target climbs out (WASI refuses only
/// absolute targets); a `working_dir` through it must not make a directory on the host.
#[tokio::test]
async fn tmp_working_dir_through_a_guest_symlink_is_refused() {
    let host = tempfile::tempdir().unwrap();
    let c = server_with_env(&[("TMPDIR", host.path().to_str().unwrap())]).await;
    let id = create_sandbox(&c, json!({})).await;
    // Up to the host's / from wherever the sandbox lives, then down to the test's directory.
    let target = format!(
        "{}{}",
        "../".repeat(32),
        host.path().to_str().unwrap().trim_start_matches('/')
    );
    let code =
        format!("import os\nos.symlink({target:?}, '/tmp/out')\nprint(os.readlink('/tmp/out'))");
    let r = run(&c, &id, "python", &code).await;
    assert_eq!(r["stdout"], format!("{target}\n"), "{r}");
    for wd in ["/tmp/out/escaped", "/tmp/out/escaped/deeper", "/tmp/out"] {
        let e = err(
            &c,
            "execute_code",
            json!({"mode": "persistent", "sandbox_id": id, "code": "1", "working_dir": wd}),
        )
        .await;
        assert_eq!(e["error"], "Path not allowed", "{wd}: {e}");
    }
    assert!(
        !host.path().join("escaped").exists(),
        "a directory was made outside the sandbox"
    );
    // A working directory inside /tmp still works.
    let r = ok(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "import os; print(os.getcwd())", "working_dir": "/tmp/w/x"}),
    )
    .await;
    assert_eq!(r["stdout"], "/tmp/w/x\n", "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn background_jobs_complete_are_listed_and_can_be_killed() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    let started = ok(
        &c,
        "execute_code",
        json!({"mode": "background", "sandbox_id": id, "name": "squares",
               "code": "import time\nfor i in range(3):\n    print(i * i, flush=True)\n    time.sleep(0.1)\nopen('done.txt', 'w').write('yes')"}),
    )
    .await;
    let pid = started["process_id"].as_str().unwrap().to_string();
    assert_eq!(started["status"], "running");
    let looping = ok(
        &c,
        "execute_code_background",
        json!({"sandbox_id": id, "code": "while True:\n    pass"}),
    )
    .await;
    let loop_pid = looping["process_id"].as_str().unwrap().to_string();

    let find = |list: &Value, pid: &str| {
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["process_id"] == pid)
            .cloned()
            .unwrap_or_else(|| panic!("{pid} not listed: {list}"))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let list = ok(&c, "execute_list_processes", json!({"sandbox_id": id})).await;
        let p = find(&list, &pid);
        if p["status"] != "running" {
            break p;
        }
        assert!(Instant::now() < deadline, "the job never ended: {p}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["exit_code"], 0);
    assert_eq!(done["stdout"], "0\n1\n4\n");
    assert_eq!(done["name"], "squares");
    let f = ok(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "done.txt"}),
    )
    .await;
    assert_eq!(f["content"], "yes");

    // The looping job is still running; killing it ends it.
    let list = ok(&c, "list_processes", json!({"sandbox_id": id})).await;
    assert_eq!(find(&list, &loop_pid)["status"], "running");
    let k = ok(
        &c,
        "execute_kill_process",
        json!({"sandbox_id": id, "process_id": loop_pid}),
    )
    .await;
    assert_eq!(k["status"], "killed");
    let deadline = Instant::now() + Duration::from_secs(10);
    let killed = loop {
        let list = ok(&c, "execute_list_processes", json!({"sandbox_id": id})).await;
        let p = find(&list, &loop_pid);
        if p["status"] != "running" {
            break p;
        }
        assert!(Instant::now() < deadline, "the kill did not stop it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(killed["exit_code"], 137);
    // The session was never involved: it still works.
    assert_eq!(run(&c, &id, "python", "1 + 1").await["stdout"], "2\n");
    let e = err(
        &c,
        "execute_kill_process",
        json!({"sandbox_id": id, "process_id": "proc_nope"}),
    )
    .await;
    assert!(e["exception"].as_str().unwrap().contains("not found"));
    c.cancel().await.unwrap();
}

fn header<'a>(head: &'a str, name: &str) -> &'a str {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then_some(v.trim())
        })
        .unwrap_or_else(|| panic!("no {name} header in {head}"))
}

#[tokio::test]
async fn async_execution_posts_a_signed_result_to_a_local_webhook() {
    use hmac::Mac;
    const SECRET: &str = "test-secret-0123456789";
    let c = server_with_env(&[("WASMBOX_WEBHOOK_SECRET", SECRET)]).await;
    let id = create_sandbox(&c, json!({})).await;
    run(&c, &id, "python", "open('in.txt', 'w').write('21')").await;
    for sandbox in [Some(id.as_str()), None] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let code = if sandbox.is_some() {
            "print(int(open('in.txt').read()) * 2)"
        } else {
            "print(6 * 7)"
        };
        let server = tokio::spawn(receive_one(listener));
        let r = ok(
            &c,
            "execute_code_async",
            json!({"code": code, "callback_url": url, "sandbox_id": sandbox}),
        )
        .await;
        assert_eq!(r["status"], "queued");
        let exec_id = r["execution_id"].as_str().unwrap().to_string();
        let (head, body) = tokio::time::timeout(Duration::from_secs(60), server)
            .await
            .expect("the webhook was called")
            .unwrap();
        assert!(head.starts_with("POST /hook "), "{head}");
        let payload: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(payload["stdout"], "42\n", "{payload}");
        assert_eq!(payload["execution_id"], exec_id.as_str());
        assert_eq!(payload["status"], "completed");
        let ts = header(&head, "x-wasmbox-timestamp");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(format!("{ts}.").as_bytes());
        mac.update(&body);
        let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(header(&head, "x-wasmbox-signature"), expected);
    }
    // Remote hosts and other schemes are refused unless the server allows them.
    for bad in ["http://example.com/hook", "file:///etc/passwd"] {
        let e = err(
            &c,
            "execute_code_async",
            json!({"code": "1", "callback_url": bad}),
        )
        .await;
        assert_eq!(e["error"], "Invalid callback_url", "{e}");
    }
    c.cancel().await.unwrap();
}

/// A loopback HTTP server that answers every request with `reply` and counts requests.
async fn counting_server(
    reply: String,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 65536];
                let _ = sock.read(&mut buf).await;
                let _ = sock.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, hits)
}

/// A webhook that answers with a redirect gets nothing more: the signed result is not re-sent
/// where the redirect points (a 307 would re-POST it), and the delivery is not retried.
#[tokio::test]
async fn webhook_redirects_are_not_followed() {
    use std::sync::atomic::Ordering;
    let c = server().await;
    let (thief, stolen) = counting_server(
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".into(),
    )
    .await;
    let (hook, hits) = counting_server(format!(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: {thief}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    ))
    .await;
    ok(
        &c,
        "execute_code_async",
        json!({"code": "print(42)", "callback_url": hook}),
    )
    .await;
    let t = Instant::now();
    while hits.load(Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the webhook was never called"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Retries come after 1 s and 2 s; a followed redirect at once.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        stolen.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1, "a redirect is not retried");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn rich_mode_returns_plots_as_png_images_and_dataframes_as_html() {
    let c = server().await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    let r = call(
        &c,
        "execute_code",
        json!({"mode": "rich", "sandbox_id": id,
               "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()\nprint('plotted')"}),
    )
    .await;
    assert!(!is_error(&r), "{:?}", r.content);
    let v = object(&r);
    assert_eq!(v["stdout"], "plotted\n", "{v}");
    assert_eq!(v["stderr"], "", "plt.show() is quiet");
    assert_eq!(v["rich_outputs"][0]["type"], "image/png", "{v}");
    let images: Vec<_> = r.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.len(), 1, "one image block");
    assert_eq!(images[0].mime_type, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&images[0].data)
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a valid PNG");
    assert!(png.len() > 1000);
    // Figures are closed once returned.
    let r = ok(
        &c,
        "execute_code_rich",
        json!({"sandbox_id": id, "code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"}),
    )
    .await;
    let outs = r["rich_outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 1, "{r}");
    assert_eq!(outs[0]["type"], "text/html");
    assert!(
        outs[0]["data"]["text/html"]
            .as_str()
            .unwrap()
            .contains("<table")
    );
    assert!(r["stdout"].as_str().unwrap().contains("a  b"), "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_session_that_hits_a_limit_is_replaced_and_the_result_says_so() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    run(&c, &id, "python", "x = 1").await;
    let r = ok(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "while True:\n    pass", "timeout": 1}),
    )
    .await;
    assert_eq!(r["limit"], "timeout", "{r}");
    assert!(
        r["notes"][0]
            .as_str()
            .unwrap()
            .contains("next call starts a fresh one"),
        "{r}"
    );
    let r = run(&c, &id, "python", "print('x' in globals())").await;
    assert_eq!(r["stdout"], "False\n");
    assert!(
        r["notes"][0]
            .as_str()
            .unwrap()
            .contains("previous Python session ended"),
        "{r}"
    );
    // JavaScript: the same, after process.exit.
    run(&c, &id, "javascript", "var y = 5").await;
    let r = run(&c, &id, "javascript", "process.exit(3)").await;
    assert_eq!(r["exit_code"], 3);
    let r = run(&c, &id, "javascript", "typeof y").await;
    assert_eq!(r["stdout"], "'undefined'\n");
    assert!(r["notes"].is_array(), "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn quotas_and_limits_give_clear_errors() {
    let c = server_with_env(&[
        ("WASMBOX_SANDBOX_DISK_MB", "1"),
        ("WASMBOX_MAX_SANDBOXES", "2"),
    ])
    .await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    // The file tools refuse to go over the quota.
    let big = "x".repeat(1_100_000);
    let e = err(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "big.txt", "content": big}),
    )
    .await;
    assert_eq!(e["error"], "Disk quota exceeded", "{e}");
    assert!(e["message"].as_str().unwrap().contains("quota"));
    // A guest that keeps writing is stopped, and told why.
    let r = ok(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "timeout": 20,
               "code": "import time\nf = open('grow.bin', 'wb')\nwhile True:\n    f.write(b'x' * 65536); f.flush(); time.sleep(0.001)"}),
    )
    .await;
    assert_eq!(r["limit"], "disk", "{r}");
    assert_eq!(r["success"], false);
    ok(
        &c,
        "file_remove",
        json!({"sandbox_id": id, "path": "grow.bin"}),
    )
    .await;
    assert_eq!(
        run(&c, &id, "python", "print('ok')").await["stdout"],
        "ok\n"
    );

    // A python-only template runs python only.
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": "javascript", "code": "1"}),
    )
    .await;
    assert!(
        e["message"].as_str().unwrap().contains("code-interpreter"),
        "{e}"
    );
    // The live-sandbox limit.
    create_sandbox(&c, json!({})).await;
    let e = err(&c, "create_sandbox", json!({})).await;
    assert!(
        e["exception"]
            .as_str()
            .unwrap()
            .contains("too many live sandboxes"),
        "{e}"
    );
    let e = err(&c, "create_sandbox", json!({"template_id": "nope"})).await;
    assert_eq!(e["details"]["error_type"], "TemplateNotFoundError");
    // Modes other than isolated need a sandbox id; unknown ids are named.
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "code": "1"}),
    )
    .await;
    assert_eq!(e["error"], "Missing sandbox_id");
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "rich", "sandbox_id": "wbnope", "code": "1"}),
    )
    .await;
    assert_eq!(e["error"], "Sandbox not found");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn sandbox_lifecycle_tools() {
    let c = server().await;
    let t = Instant::now();
    let id = create_sandbox(
        &c,
        json!({"template_id": "code-interpreter", "timeout_seconds": 100, "env_vars": {"A": "1"}}),
    )
    .await;
    eprintln!("create_sandbox round trip: {:?}", t.elapsed());
    let g = ok(&c, "get_sandbox", json!({"id": id})).await;
    assert_eq!(g["id"], id.as_str());
    assert_eq!(g["status"], "running");
    assert_eq!(g["timeout_seconds"], 100);
    assert_eq!(g["template_name"], "code-interpreter");
    let u = ok(
        &c,
        "update_sandbox_timeout",
        json!({"id": id, "timeout_seconds": 3000}),
    )
    .await;
    assert_eq!(u["status"], "updated");
    assert_eq!(
        ok(&c, "get_sandbox", json!({"id": id})).await["timeout_seconds"],
        3000
    );
    ok(&c, "pause_sandbox", json!({"id": id})).await;
    let e = err(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "1"}),
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("resume_sandbox"));
    let r = ok(&c, "resume_sandbox", json!({"id": id})).await;
    assert_eq!(r["status"], "running");
    assert_eq!(
        run(&c, &id, "python", "import os; os.environ['A']").await["stdout"],
        "'1'\n"
    );
    let p = ok(&c, "ping_vm", json!({"sandbox_id": id})).await;
    assert_eq!(p["status"], "ok");
    let m = ok(&c, "get_system_metrics", json!({"sandbox_id": id})).await;
    assert_eq!(m["sandbox"]["sandbox_id"], id.as_str());
    assert!(m["sandboxes"]["live"].as_u64().unwrap() >= 1);
    let s = ok(&c, "cache_stats", json!({})).await;
    assert!(s["modules"]["in_use"].as_u64().unwrap() >= 1, "{s}");
    let t = ok(&c, "get_template", json!({"name": "go"})).await;
    assert_eq!(t["languages"], json!(["go"]));
    // Binary files round-trip through base64.
    let bytes: Vec<u8> = (0..=255).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    ok(
        &c,
        "file_upload",
        json!({"sandbox_id": id, "path": "bin/all.bytes", "content_base64": b64}),
    )
    .await;
    let d = ok(
        &c,
        "file_download",
        json!({"sandbox_id": id, "path": "/workspace/bin/all.bytes"}),
    )
    .await;
    assert_eq!(d["content_base64"], b64.as_str());
    let r = run(&c, &id, "python", "len(open('bin/all.bytes','rb').read())").await;
    assert_eq!(r["stdout"], "256\n");
    let e = err(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "bin/all.bytes"}),
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("file_download"));
    assert!(
        ok(&c, "file_exists", json!({"sandbox_id": id, "path": "bin"})).await["exists"] == true
    );
    ok(&c, "file_mkdir", json!({"sandbox_id": id, "path": "a/b/c"})).await;
    ok(&c, "file_remove", json!({"sandbox_id": id, "path": "a"})).await;
    assert!(
        ok(&c, "file_exists", json!({"sandbox_id": id, "path": "a/b"})).await["exists"] == false
    );
    c.cancel().await.unwrap();
}

/// #54: `get_sandbox` and `delete_sandbox` (and pause/resume, which share their arguments) take
/// `sandbox_id` as every other sandbox tool does, beside HOPX's `id`, and their schemas show
/// both; two ids that disagree, or none, are refused saying so. Before, `sandbox_id` alone was
/// refused as a missing `id`.
#[tokio::test]
async fn sandbox_tools_taking_id_also_take_sandbox_id() {
    let c = server().await;
    let tools = c.list_all_tools().await.unwrap();
    for name in [
        "get_sandbox",
        "delete_sandbox",
        "pause_sandbox",
        "resume_sandbox",
    ] {
        let t = tools.iter().find(|t| t.name == name).unwrap();
        let props = &t.input_schema["properties"];
        assert!(
            props.get("id").is_some() && props.get("sandbox_id").is_some(),
            "{name}: {:?}",
            t.input_schema
        );
    }
    let id = create_sandbox(&c, json!({})).await;
    let got = ok(&c, "get_sandbox", json!({"sandbox_id": id})).await;
    assert_eq!(got["id"], id.as_str(), "{got}");
    let got = ok(&c, "get_sandbox", json!({"id": id, "sandbox_id": id})).await;
    assert_eq!(got["id"], id.as_str(), "{got}");
    for (args, says) in [
        (
            json!({"id": id, "sandbox_id": "other"}),
            "name different sandboxes",
        ),
        (json!({}), "missing field `id`"),
    ] {
        let e = err(&c, "get_sandbox", args).await;
        assert!(e.to_string().contains(says), "{e}");
    }
    let gone = ok(&c, "delete_sandbox", json!({"sandbox_id": id})).await;
    assert_eq!(gone["status"], "deleted", "{gone}");
    let e = err(&c, "get_sandbox", json!({"sandbox_id": id})).await;
    assert!(e.to_string().contains("not found"), "{e}");
    c.cancel().await.unwrap();
}
