//! MCP progress: a call whose request carries a progress token gets `notifications/progress`
//! for a runtime loading, a Go build, and about once a second while its code runs, with
//! strictly increasing `progress`; a call without a token gets none.
//!
//! rmcp's client gives every request a progress token, so the recording client here sees what
//! any token-giving client would; the no-token case speaks raw JSON-RPC on stdio.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{BIN, HOST_CANARY, is_error, object, prepare};
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

/// A client that keeps every progress notification it receives.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<ProgressNotificationParam>>>);

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(params);
    }
}

impl Recorder {
    fn take(&self) -> Vec<ProgressNotificationParam> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

type Client = RunningService<RoleClient, Recorder>;

/// `wasmbox serve` over stdio with `env`, driven by a recording client.
async fn server(env: &[(&str, &str)]) -> (Client, Recorder) {
    let rec = Recorder::default();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let transport = TokioChildProcess::new(tokio::process::Command::new(BIN).configure(|cmd| {
        cmd.arg("serve")
            .env(HOST_CANARY.0, HOST_CANARY.1)
            .env("WASMBOX_DATA", "none");
        for (k, v) in &env {
            cmd.env(k, v);
        }
    }))
    .expect("spawning wasmbox serve");
    let client = rec.clone().serve(transport).await.expect("MCP handshake");
    (client, rec)
}

/// Calls a tool (rmcp's client sends a progress token with it) and returns its result and the
/// progress notifications received for it.
async fn call(c: &Client, rec: &Recorder, tool: &str, args: Value) -> (Value, Vec<String>) {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    rec.take();
    let r: CallToolResult = c
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .expect("tools/call");
    assert!(!is_error(&r), "{tool} failed: {:?}", r.content);
    // Notifications sent before the result are handled by the client's own task: give it a
    // moment to record the last of them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let notes = rec.take();
    let progress: Vec<f64> = notes.iter().map(|n| n.progress).collect();
    assert!(
        progress.windows(2).all(|w| w[0] < w[1]),
        "progress must increase: {progress:?}"
    );
    assert!(notes.iter().all(|n| n.progress > 0.0));
    let tokens: std::collections::HashSet<_> = notes.iter().map(|n| &n.progress_token).collect();
    assert!(tokens.len() <= 1, "one call, one token: {tokens:?}");
    let messages = notes.into_iter().map(|n| n.message.unwrap()).collect();
    (object(&r), messages)
}

#[tokio::test]
async fn a_running_call_reports_its_time_output_and_last_line_each_second() {
    prepare();
    let (c, rec) = server(&[]).await;
    // The runtime loads at start; a first call must not count its load.
    call(&c, &rec, "execute_code", json!({"code": "print(1)"})).await;
    let code = "import time\nfor i in range(7):\n    print(f'step {i} of 7', flush=True)\n    time.sleep(0.5)\n";
    let (r, messages) = call(&c, &rec, "execute_code", json!({"code": code})).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let running: Vec<&String> = messages
        .iter()
        .filter(|m| m.starts_with("running: "))
        .collect();
    assert!(
        running.len() >= 2,
        "a 3.5 s run reports at least twice: {messages:?}"
    );
    for m in &running {
        assert!(m.contains(" s elapsed, "), "{m}");
        assert!(m.contains(" bytes of output; last line: step "), "{m}");
    }
    // The elapsed seconds grow, and so does the output.
    let secs: Vec<u64> = running
        .iter()
        .map(|m| {
            m["running: ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        secs.windows(2).all(|w| w[0] <= w[1]) && secs[0] >= 1,
        "{secs:?}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_go_call_reports_its_build_then_its_run() {
    prepare();
    let (c, rec) = server(&[]).await;
    // A program no cache has seen: it is built now.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let code = format!(
        "package main\n\nimport \"fmt\"\n\nfunc main() {{\n\tfmt.Println(\"{nonce}\")\n}}\n"
    );
    let (r, messages) = call(
        &c,
        &rec,
        "execute_code",
        json!({"code": code, "language": "go", "timeout": 120}),
    )
    .await;
    assert_eq!(r["stdout"], format!("{nonce}\n"), "{r}");
    let compiling = messages
        .iter()
        .position(|m| m == "compiling the Go program");
    let running = messages.iter().position(|m| m == "running the Go program");
    assert!(
        compiling.is_some() && running > compiling,
        "compile, then run: {messages:?}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cold_server_reports_the_runtime_load_and_image_build() {
    // A cache of its own, empty: the JavaScript image is built on this call (a few seconds).
    // Only QuickJS is offered, so the start-up warm-up builds nothing else meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let runtimes = dir.path().join("runtimes");
    std::fs::create_dir(&runtimes).unwrap();
    let quickjs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("runtimes/quickjs");
    std::os::unix::fs::symlink(&quickjs, runtimes.join("quickjs")).unwrap();
    let cache = dir.path().join("cache");
    let (c, rec) = server(&[
        ("WASMBOX_RUNTIMES", runtimes.to_str().unwrap()),
        ("WASMBOX_CACHE", cache.to_str().unwrap()),
    ])
    .await;
    let (r, messages) = call(
        &c,
        &rec,
        "execute_code",
        json!({"code": "console.log('cold')", "language": "javascript"}),
    )
    .await;
    assert_eq!(r["stdout"], "cold\n", "{r}");
    assert_eq!(
        messages.first().map(String::as_str),
        Some("loading the javascript runtime"),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("compiling javascript image")),
        "the image build is reported: {messages:?}"
    );
    // Loaded now: the next call reports no load.
    let (_, messages) = call(
        &c,
        &rec,
        "execute_code",
        json!({"code": "console.log('warm')", "language": "javascript"}),
    )
    .await;
    assert!(
        !messages.iter().any(|m| m.contains("loading")),
        "{messages:?}"
    );
    c.cancel().await.unwrap();
}

/// One JSON-RPC message a line on the raw stdio stream.
fn send(stdin: &mut impl Write, msg: Value) {
    stdin.write_all(format!("{msg}\n").as_bytes()).unwrap();
    stdin.flush().unwrap();
}

/// Reads messages until the response to `id`; returns the messages before it.
fn until_response(out: &mut impl BufRead, id: u64) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the server hung up");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["id"] == id {
            return seen;
        }
        seen.push(v);
    }
}

#[test]
fn a_call_without_a_progress_token_gets_no_notifications() {
    prepare();
    let mut child = Command::new(BIN)
        .arg("serve")
        .env("WASMBOX_DATA", "none")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
    );
    until_response(&mut out, 1);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let code = "import time\nprint('a', flush=True)\ntime.sleep(2.5)\nprint('b')";
    let args = json!({"code": code});
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": args}}),
    );
    let before = until_response(&mut out, 2);
    assert!(
        !before
            .iter()
            .any(|m| m["method"] == "notifications/progress"),
        "{before:?}"
    );
    // The same call with a token is reported on: the silence above is the token's absence.
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": args,
                "_meta": {"progressToken": "t-3"}}}),
    );
    let before = until_response(&mut out, 3);
    let progress: Vec<&Value> = before
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty(), "{before:?}");
    assert!(
        progress
            .iter()
            .all(|m| m["params"]["progressToken"] == "t-3"),
        "{progress:?}"
    );
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}
