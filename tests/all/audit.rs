//! The audit log (#56): a line for every tool call, whichever way it ended, from the real server
//! over stdio and HTTP; secrets, the host's environment and tokens never in it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::get;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::*;

const VALUE: &str = "s3cr3t-value-9f2c";

/// The lines of `dir`'s audit log once there are at least `n` (the writer batches every 0.1 s).
async fn lines(dir: &Path, n: usize) -> Vec<Value> {
    let path = dir.join("audit.jsonl");
    for _ in 0..100 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "fewer than {n} audit lines in {}: {}",
        path.display(),
        std::fs::read_to_string(&path).unwrap_or_default()
    );
}

/// A site that answers `/auth` with 200, whatever it is sent.
async fn site() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/auth", get(|_: HeaderMap| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn sha256(code: &str) -> String {
    Sha256::digest(code.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Over stdio: a success, a failure, a limit stop, a bad request and an unknown tool each leave
/// one line with what they were and how they ended; a run's HTTP request is noted by host and
/// status; the secret's value (lent to the host, and pasted into the code), the host's own
/// environment and the code's output are not in the file. A restart appends.
#[tokio::test(flavor = "multi_thread")]
async fn every_call_leaves_a_line_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let a = site().await;
    let env = [
        ("WASMBOX_DATA", data.as_str()),
        ("WASMBOX_ALLOW_HOSTS", &format!("127.0.0.1:{}", a.port())),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS", "1"),
        ("WASMBOX_SECRETS", &format!("TOKEN@127.0.0.1:{}", a.port())),
        ("TOKEN", VALUE),
    ];
    let c = server_with_env(&env).await;
    let fetch = format!(
        "import os, urllib.request\n# pasted by mistake: {VALUE}\nr = urllib.request.urlopen(urllib.request.Request('http://{a}/auth?key=' + os.environ['TOKEN'], headers={{'Authorization': os.environ['TOKEN']}}))\nprint('out-' + 'marker', r.status)"
    );
    let v = ok(&c, "execute_code", json!({"code": fetch})).await;
    assert_eq!(v["stdout"], "out-marker 200\n", "{v}");
    let v = ok(
        &c,
        "execute_code",
        json!({"code": "import sys; sys.exit(3)"}),
    )
    .await;
    assert_eq!(v["exit_code"], 3, "{v}");
    let v = ok(
        &c,
        "execute_code",
        json!({"code": "while True: pass", "timeout": 1}),
    )
    .await;
    assert_eq!(v["limit"], "timeout", "{v}");
    err(
        &c,
        "execute_code",
        json!({"code": "x", "language": "cobol"}),
    )
    .await;
    let r = call(&c, "no_such_tool", json!({})).await;
    assert!(is_error(&r));
    let js = "console.log(1)";
    ok(
        &c,
        "execute_code",
        json!({"code": js, "language": "javascript"}),
    )
    .await;
    let all = lines(dir.path(), 6).await;
    assert_eq!(all.len(), 6, "{all:#?}");
    for (i, l) in all.iter().enumerate() {
        assert_eq!(l["v"], 1);
        assert_eq!(l["seq"], i as u64 + 1, "{l}");
        assert_eq!(l["owner"], "local", "{l}");
        assert_eq!(l["transport"], "stdio", "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
        assert!(l["duration_ms"].as_f64().unwrap() >= 0.0, "{l}");
        assert!(l["call_id"].as_str().is_some_and(|s| !s.is_empty()));
    }
    let [fetched, exited, stopped, refused, unknown, javascript] = &all[..] else {
        unreachable!()
    };
    assert_eq!(fetched["tool"], "execute_code");
    assert_eq!(fetched["status"], "ok", "{fetched}");
    assert_eq!(fetched["exit_code"], 0);
    assert_eq!(fetched["language"], "python");
    assert_eq!(fetched["bytes_out"], "out-marker 200\n".len());
    assert_eq!(fetched["code_sha256"], sha256(&fetch));
    let head = fetched["code_head"].as_str().unwrap();
    assert!(
        head.starts_with("import os, urllib.request\n# pasted by mistake: "),
        "{head}"
    );
    assert_eq!(
        fetched["host_calls"],
        json!([{"kind": "http", "host": format!("127.0.0.1:{}", a.port()), "status": 200, "outcome": "ok"}]),
        "{fetched}"
    );
    assert_eq!(exited["status"], "failed", "{exited}");
    assert_eq!(exited["exit_code"], 3);
    assert_eq!(stopped["status"], "limit", "{stopped}");
    assert_eq!(stopped["limit"], "timeout");
    assert_eq!(refused["status"], "error", "{refused}");
    assert!(refused["error_type"].is_string(), "{refused}");
    assert_eq!(unknown["tool"], "no_such_tool");
    assert_eq!(unknown["status"], "error", "{unknown}");
    assert_eq!(javascript["language"], "javascript", "{javascript}");
    assert_eq!(javascript["code_head"], js);

    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(
        !text.contains(VALUE),
        "the secret's value is in the log:\n{text}"
    );
    assert!(
        !text.contains(HOST_CANARY.1),
        "the host's environment is in the log"
    );
    assert!(
        !text.contains("out-marker"),
        "the code's output is in the log"
    );
    let noted = fetched["host_calls"].to_string();
    assert!(
        !noted.contains("/auth"),
        "a request's path is noted: {noted}"
    );
    c.cancel().await.unwrap();

    // The next server appends to the same file.
    let c = server_with_env(&env).await;
    ok(&c, "execute_code", json!({"code": "print(1)"})).await;
    let again = lines(dir.path(), 7).await;
    assert_eq!(again.len(), 7);
    assert_eq!(again[..6], all[..]);
    assert_ne!(again[6]["call_id"], all[0]["call_id"]);
    c.cancel().await.unwrap();
}

/// Over HTTP a call the token's limits refuse is logged as refused, under the token's short
/// hash (never the token), and the calls that ran under the same owner.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_call_is_logged_under_the_tokens_hash() {
    const TOKEN: &str = "audit-token-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let server = HttpServer::start(
        &[
            ("WASMBOX_DATA", dir.path().to_str().unwrap()),
            ("WASMBOX_TOKEN", TOKEN),
            ("WASMBOX_TOKEN_CONCURRENCY", "1"),
            ("WASMBOX_TOKEN_QUEUE", "0"),
        ],
        &[],
    )
    .await;
    let c = server.client(TOKEN).await.unwrap();
    // It computes (a sleeping guest gives its CPU slot back), so it is seen at work: a fixed
    // wait can pass before a loaded machine has started it.
    let slow = spawn_call(
        &c,
        "execute_code",
        json!({"code": "import time\nt = time.time()\nwhile time.time() - t < 3: pass\nprint('done')"}),
    );
    wait_metric(&server, TOKEN, BUSY, 1.0).await;
    let e = err(&c, "execute_code", json!({"code": "print(9)"})).await;
    assert_eq!(e["error_type"], "RateLimitError", "{e}");
    assert!(!is_error(&slow.await.unwrap().unwrap()));
    let all = lines(dir.path(), 2).await;
    let [refused, ran] = &all[..] else {
        panic!("{all:#?}")
    };
    assert_eq!(refused["status"], "refused", "{refused}");
    assert_eq!(refused["error_type"], "RateLimitError");
    assert_eq!(refused["code_sha256"], sha256("print(9)"));
    assert_eq!(ran["status"], "ok", "{ran}");
    for l in &all {
        assert_eq!(l["transport"], "http", "{l}");
        let owner = l["owner"].as_str().unwrap();
        assert!(owner.starts_with("token-"), "{l}");
    }
    assert_eq!(refused["owner"], ran["owner"]);
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(!text.contains(TOKEN), "the token is in the log");
}

/// `WASMBOX_AUDIT=0`: no file, and calls are served as ever.
#[tokio::test]
async fn audit_off_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = server_with_env(&[
        ("WASMBOX_DATA", dir.path().to_str().unwrap()),
        ("WASMBOX_AUDIT", "0"),
    ])
    .await;
    let v = ok(&c, "execute_code", json!({"code": "print(5)"})).await;
    assert_eq!(v["stdout"], "5\n");
    c.cancel().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!dir.path().join("audit.jsonl").exists());
}

/// A background job's or async execution's end is a line of its own, naming the call that
/// started it (its request id and `run_id`): the call answered at once, so only this line can
/// say which limit stopped the run, that it was killed or cut short by the server's exit, and
/// what it reached after the answer. Before, the audit log knew nothing of a run once its call
/// had answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_runs_end_is_logged_with_its_host_calls() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let a = site().await;
    let hook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", hook.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = hook.accept().await {
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                .await;
        }
    });
    let c = server_with_env(&[
        ("WASMBOX_DATA", dir.path().to_str().unwrap()),
        ("WASMBOX_ALLOW_HOSTS", &format!("127.0.0.1:{}", a.port())),
        ("WASMBOX_ALLOW_PRIVATE_HOSTS", "1"),
    ])
    .await;
    let id = create_sandbox(&c, json!({})).await;
    let reaches = format!(
        "import time, urllib.request\ntime.sleep(0.3)\nr = urllib.request.urlopen('http://{a}/auth')\nprint('got', r.status, flush=True)\nwhile True: pass"
    );
    let r = ok(
        &c,
        "execute_code_background",
        json!({"sandbox_id": id, "code": reaches, "timeout": 2}),
    )
    .await;
    let stopped = r["process_id"].as_str().unwrap().to_string();
    let r = ok(
        &c,
        "execute_code_background",
        json!({"sandbox_id": id, "code": "import time\ntime.sleep(60)", "timeout": 60}),
    )
    .await;
    let killed = r["process_id"].as_str().unwrap().to_string();
    ok(
        &c,
        "execute_kill_process",
        json!({"sandbox_id": id, "process_id": killed}),
    )
    .await;
    let r = ok(
        &c,
        "execute_code_async",
        json!({"code": "print('async')", "callback_url": url}),
    )
    .await;
    let async_id = r["execution_id"].as_str().unwrap().to_string();
    // Three ends (two jobs at a time are the default), then one the server's exit ends.
    let ended = |l: &Value| l["event"] == "run_end";
    for _ in 0..100 {
        if lines(dir.path(), 6)
            .await
            .iter()
            .filter(|l| ended(l))
            .count()
            >= 3
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = ok(
        &c,
        "execute_code_background",
        json!({"sandbox_id": id, "code": "import time\ntime.sleep(60)", "timeout": 60}),
    )
    .await;
    let cut_short = r["process_id"].as_str().unwrap().to_string();
    c.cancel().await.unwrap();

    // Six calls and four ends.
    let all = lines(dir.path(), 10).await;
    let find = |event: &str, run: &str| {
        all.iter()
            .find(|l| l["event"] == event && l["run_id"] == run)
            .unwrap_or_else(|| panic!("no {event} line for {run}: {all:#?}"))
            .clone()
    };
    assert_eq!(all.len(), 10, "{all:#?}");
    assert_eq!(all.iter().filter(|l| l["event"] == "call").count(), 6);
    for l in &all {
        assert_eq!(l["owner"], "local", "{l}");
        assert_eq!(l["transport"], "stdio", "{l}");
    }
    let started = find("call", &stopped);
    let end = find("run_end", &stopped);
    assert_eq!(started["tool"], "execute_code_background", "{started}");
    assert_eq!(end["tool"], "execute_code_background", "{end}");
    assert_eq!(end["request_id"], started["request_id"]);
    assert_eq!(end["sandbox_id"], id.as_str());
    assert_eq!(end["language"], "python");
    assert_eq!(end["mode"], "background");
    assert_eq!(end["status"], "limit", "{end}");
    assert_eq!(end["limit"], "timeout", "{end}");
    assert!(end["duration_ms"].as_f64().unwrap() >= 1000.0, "{end}");
    assert!(end["bytes_out"].as_u64().unwrap() >= "got 200\n".len() as u64);
    assert!(end.get("code_sha256").is_none(), "{end}");
    assert_eq!(
        end["host_calls"],
        json!([{"kind": "http", "host": format!("127.0.0.1:{}", a.port()), "status": 200, "outcome": "ok"}]),
        "{end}"
    );
    let end = find("run_end", &killed);
    assert_eq!(end["status"], "killed", "{end}");
    assert_eq!(
        end["request_id"],
        find("call", &killed)["request_id"],
        "{end}"
    );
    let end = find("run_end", &async_id);
    assert_eq!(end["tool"], "execute_code_async", "{end}");
    assert_eq!(end["mode"], "async");
    assert_eq!(end["status"], "ok", "{end}");
    assert_eq!(end["exit_code"], 0);
    assert_eq!(end["bytes_out"], "async\n".len());
    assert!(end.get("sandbox_id").is_none(), "{end}");
    let end = find("run_end", &cut_short);
    assert_eq!(end["status"], "shutdown", "{end}");
    assert!(end.get("exit_code").is_none(), "{end}");
    assert_eq!(all.last().unwrap(), &end, "the exit's line is the last");
}
