//! `wasmbox serve --http`: MCP's streamable HTTP transport behind bearer tokens, driven by rmcp's
//! streamable HTTP client (and raw HTTP for what a client library would not send).

mod common;

use std::time::Duration;

use common::{HttpServer, call, create_sandbox, err, is_error, object, ok};
use serde_json::json;

const A: &str = "token-alice-0123456789abcdef";
const B: &str = "token-bob-fedcba9876543210";

async fn two_token_server(extra: &[(&str, &str)]) -> HttpServer {
    let tokens = format!("{A},{B}");
    let mut env = vec![("WASMBOX_TOKEN", tokens.as_str())];
    env.extend_from_slice(extra);
    HttpServer::start(&env, &[]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_required_and_each_token_sees_only_its_own_sandboxes() {
    let server = two_token_server(&[]).await;

    // No token, a wrong token: 401 with a reason, before any MCP handling.
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    for auth in [None, Some("Bearer not-a-token"), Some("Basic YTpi")] {
        let mut req = http
            .post(&server.url)
            .header("Accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "auth {auth:?}");
        assert!(
            resp.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer")
        );
        let body: serde_json::Value = resp.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("bearer token"));
    }
    assert!(
        server.client("wrong-token-0000000000").await.is_err(),
        "an MCP client with a wrong token cannot even initialize"
    );

    let alice = server.client(A).await.expect("alice connects");
    let bob = server.client(B).await.expect("bob connects");

    // One-shots work over HTTP as over stdio.
    let v = ok(
        &alice,
        "execute_code",
        json!({"code": "print(6*7)", "language": "python"}),
    )
    .await;
    assert_eq!(v["stdout"], "42\n");

    // Alice's sandbox, with a file and a live variable.
    let id = create_sandbox(&alice, json!({"template_id": "code-interpreter"})).await;
    ok(
        &alice,
        "file_write",
        json!({"sandbox_id": id, "path": "/workspace/secret.txt", "content": "alice's"}),
    )
    .await;
    let v = ok(
        &alice,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent", "code": "x = 41\nx + 1"}),
    )
    .await;
    assert_eq!(v["stdout"], "42\n");

    // Bob cannot see, read, run in, change or delete it: to him it does not exist.
    let listed = ok(&bob, "list_sandboxes", json!({})).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 0, "{listed}");
    for (tool, args) in [
        ("get_sandbox", json!({"id": id})),
        (
            "file_read",
            json!({"sandbox_id": id, "path": "/workspace/secret.txt"}),
        ),
        (
            "execute_code",
            json!({"sandbox_id": id, "mode": "persistent", "code": "print(x)"}),
        ),
        ("env_set", json!({"sandbox_id": id, "env_vars": {"A": "1"}})),
        (
            "update_sandbox_timeout",
            json!({"id": id, "timeout_seconds": 5}),
        ),
        ("delete_sandbox", json!({"id": id})),
    ] {
        let e = err(&bob, tool, args).await;
        assert!(
            e.to_string().contains("not found"),
            "{tool} by another token: {e}"
        );
    }

    // Counts are per token too: Bob's health and metrics do not reveal Alice's sandbox.
    let h = ok(&bob, "health", json!({})).await;
    assert_eq!(h["sandboxes"], 0, "{h}");
    let m = ok(&bob, "get_system_metrics", json!({})).await;
    assert_eq!(m["sandboxes"]["live"], 0, "{m}");
    let h = ok(&alice, "health", json!({})).await;
    assert_eq!(h["sandboxes"], 1, "{h}");

    // Alice still has it, untouched.
    let listed = ok(&alice, "list_sandboxes", json!({})).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    let v = ok(
        &alice,
        "file_read",
        json!({"sandbox_id": id, "path": "/workspace/secret.txt"}),
    )
    .await;
    assert_eq!(v["content"], "alice's");
    ok(&alice, "delete_sandbox", json!({"id": id})).await;

    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn per_token_limits_on_sandboxes_and_concurrent_calls() {
    let server = two_token_server(&[
        ("WASMBOX_MAX_SANDBOXES_PER_TOKEN", "2"),
        ("WASMBOX_TOKEN_CONCURRENCY", "1"),
    ])
    .await;
    let alice = server.client(A).await.unwrap();
    let bob = server.client(B).await.unwrap();

    create_sandbox(&alice, json!({"template_id": "python"})).await;
    create_sandbox(&alice, json!({"template_id": "python"})).await;
    let e = err(&alice, "create_sandbox", json!({"template_id": "python"})).await;
    assert!(
        e["exception"]
            .as_str()
            .unwrap()
            .contains("WASMBOX_MAX_SANDBOXES_PER_TOKEN"),
        "{e}"
    );
    // Bob's allowance is his own.
    create_sandbox(&bob, json!({"template_id": "python"})).await;

    // One call at a time per token: a second call while the first runs is refused at once,
    // another token is unaffected, and the token can call again when the first is done.
    let slow = common::spawn_call(
        &alice,
        "execute_code",
        json!({"code": "import time; time.sleep(3); print('done')"}),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = call(&alice, "execute_code", json!({"code": "print(1)"})).await;
    assert!(is_error(&r), "second concurrent call: {:?}", r.content);
    let e = object(&r);
    assert!(
        e["exception"]
            .as_str()
            .unwrap()
            .contains("WASMBOX_TOKEN_CONCURRENCY"),
        "{e}"
    );
    let v = ok(&bob, "execute_code", json!({"code": "print(2)"})).await;
    assert_eq!(v["stdout"], "2\n");
    let first = slow.await.unwrap().unwrap();
    assert!(!is_error(&first));
    assert_eq!(object(&first)["stdout"], "done\n");
    let v = ok(&alice, "execute_code", json!({"code": "print(3)"})).await;
    assert_eq!(v["stdout"], "3\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_generated_token_is_printed_saved_private_and_reused() {
    let data = tempfile::tempdir().unwrap();
    let d = data.path().to_str().unwrap();
    let first = HttpServer::start(&[("WASMBOX_DATA", d)], &[]).await;
    let token_file = data.path().join("http-token");
    let token = std::fs::read_to_string(&token_file).expect("the token is saved");
    assert!(token.len() >= 32, "{token}");
    assert!(
        first.log.lock().unwrap().contains(&token),
        "the token is printed on first start"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "only the user may read the token file");
    }
    let c = first
        .client(&token)
        .await
        .expect("the generated token works");
    ok(&c, "health", json!({})).await;
    drop(c);
    drop(first);

    // The next start uses the saved token and does not print it again.
    let second = HttpServer::start(&[("WASMBOX_DATA", d)], &[]).await;
    assert!(!second.log.lock().unwrap().contains(&token));
    let c = second.client(&token).await.expect("the same token works");
    ok(&c, "health", json!({})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_http_input_gets_errors_and_the_server_keeps_serving() {
    let server = two_token_server(&[]).await;
    let http = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        http.post(&server.url)
            .header("Authorization", format!("Bearer {A}"))
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .body(body)
    };
    // Malformed JSON and a non-JSON-RPC object: a 4xx answer, not a crash.
    for body in [&b"{not json"[..], br#"{"hello": "world"}"#, b""] {
        let resp = post(body.to_vec()).send().await.unwrap();
        assert!(
            resp.status().is_client_error(),
            "{:?} -> {}",
            String::from_utf8_lossy(body),
            resp.status()
        );
    }
    // An oversized body (over the 16 MiB cap) is refused.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"execute_code","arguments":{{"code":"{}"}}}}}}"#,
        "#".repeat(17 << 20)
    );
    let resp = post(huge.into_bytes()).send().await.unwrap();
    assert_eq!(resp.status(), 413);

    // A real client is still served, and a bad tool call is a tool error.
    let c = server.client(A).await.unwrap();
    let r = call(&c, "execute_code", json!({"code": 5})).await;
    assert!(is_error(&r));
    let v = ok(&c, "execute_code", json!({"code": "print('still here')"})).await;
    assert_eq!(v["stdout"], "still here\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_non_loopback_address_needs_allow_remote() {
    common::prepare();
    let out = tokio::process::Command::new(common::BIN)
        .args(["serve", "--http", "0.0.0.0:0"])
        .env("WASMBOX_TOKEN", A)
        .env("WASMBOX_DATA", "none")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-remote"), "{stderr}");

    // Short tokens are refused rather than guarding sandboxes weakly.
    let out = tokio::process::Command::new(common::BIN)
        .args(["serve", "--http", "127.0.0.1:0"])
        .env("WASMBOX_TOKEN", "short")
        .env("WASMBOX_DATA", "none")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("16 characters"));
}
