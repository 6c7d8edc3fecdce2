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
