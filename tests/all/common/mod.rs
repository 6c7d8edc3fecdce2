//! Shared helpers: the real `wasmbox` binary, spawned as an MCP server over stdio and driven by
//! rmcp's client, exactly as an assistant would.
#![allow(dead_code)]

pub mod fake_hopx;

use std::process::Stdio;
use std::sync::OnceLock;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_wasmbox");

/// A package index nothing listens on (the discard port on loopback): refused at once.
pub const NO_INDEX: &str = "http://127.0.0.1:9";

/// A variable set on the server process only: no guest may ever see it.
pub const HOST_CANARY: (&str, &str) = ("WASMBOX_TEST_HOST_SECRET", "canary-6c1f0e2b");

/// Compiles the runtimes once per test binary (the module cache is shared across binaries and
/// guarded by a lock file), so servers start warm.
pub fn prepare() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let status = std::process::Command::new(BIN)
            .arg("prepare")
            .stdout(Stdio::null())
            .status()
            .expect("running wasmbox prepare");
        assert!(
            status.success(),
            "wasmbox prepare failed; run ./fetch-runtimes.sh first"
        );
    });
}

pub type Client = RunningService<RoleClient, ()>;

/// Starts `wasmbox serve` with extra environment and connects an MCP client to it.
pub async fn server_with_env(env: &[(&str, &str)]) -> Client {
    server_with_pid(env).await.0
}

pub async fn server() -> Client {
    server_with_env(&[]).await
}

/// Calls a tool with JSON arguments (from any client: some tests answer the server's requests).
pub async fn call<H: rmcp::ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be a JSON object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("tools/call {tool} failed at the protocol level: {e}"))
}

/// The result object: the JSON text block, checked to be the same as `structuredContent`, which
/// a success always has and an error never (clients validate it against the output schema).
pub fn object(r: &CallToolResult) -> Value {
    let text = r
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .expect("a text content block");
    let parsed: Value = serde_json::from_str(&text).expect("the text block is JSON");
    if is_error(r) {
        assert!(
            r.structured_content.is_none(),
            "an error carries no structuredContent: {parsed}"
        );
    } else {
        let structured = r
            .structured_content
            .clone()
            .expect("structuredContent is set");
        assert_eq!(parsed, structured, "text block and structuredContent agree");
    }
    parsed
}

pub fn is_error(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
}

/// Runs Python as a one-shot and returns the result object, asserting it is not a tool error.
pub async fn py(client: &Client, code: &str) -> Value {
    let r = call(
        client,
        "execute_code",
        serde_json::json!({"code": code, "language": "python"}),
    )
    .await;
    assert!(!is_error(&r), "unexpected tool error: {:?}", r.content);
    object(&r)
}

/// Calls a tool that must succeed and returns its object.
pub async fn ok(c: &Client, tool: &str, args: Value) -> Value {
    let r = call(c, tool, args).await;
    assert!(!is_error(&r), "{tool} failed: {:?}", r.content);
    object(&r)
}

/// Calls a tool that must fail (`isError`) and returns its object.
pub async fn err(c: &Client, tool: &str, args: Value) -> Value {
    let r = call(c, tool, args).await;
    assert!(is_error(&r), "{tool} should have failed: {:?}", r.content);
    object(&r)
}

/// Creates a sandbox with `args` and returns its id.
pub async fn create_sandbox(c: &Client, args: Value) -> String {
    let v = ok(c, "create_sandbox", args).await;
    v["id"].as_str().expect("an id").to_string()
}

/// `wasmbox serve` over stdio with extra environment, and its process id (for signals).
pub async fn server_with_pid(env: &[(&str, &str)]) -> (Client, u32) {
    prepare();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let transport = TokioChildProcess::new(tokio::process::Command::new(BIN).configure(|cmd| {
        // Sandboxes in a temporary directory of the server's own unless a test asks for a data
        // directory (restart tests): no test sees another's leftovers. No package index unless
        // a test names one: a missing module's note asks nothing of the network.
        cmd.arg("serve")
            .env(HOST_CANARY.0, HOST_CANARY.1)
            .env("WASMBOX_DATA", "none")
            .env("WASMBOX_PACKAGE_INDEX", NO_INDEX);
        for (k, v) in &env {
            cmd.env(k, v);
        }
    }))
    .expect("spawning wasmbox serve");
    let pid = transport.id().expect("the server's pid");
    let client = ().serve(transport).await.expect("MCP handshake with wasmbox serve");
    (client, pid)
}

/// The `/metrics` sample a foreground guest computing shows in (a sleeping guest gives its CPU
/// slot back), and the one of HTTP calls waiting in their token's queue.
pub const BUSY: &str = "wasmbox_cpu_slots_busy{class=\"foreground\"}";
pub const TOKEN_QUEUE: &str = "wasmbox_queue_length{queue=\"token\"}";

/// Waits until `server`'s `/metrics` shows `sample` at `least` or more: how a test knows a
/// call it started is at work or waiting (a fixed wait can pass before a loaded machine has
/// started it).
pub async fn wait_metric(server: &HttpServer, token: &str, sample: &str, least: f64) {
    let url = server.url.replace("/mcp", "/metrics");
    let mut last = None;
    for _ in 0..600 {
        let text = reqwest::Client::new()
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        last = text
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.trim().parse::<f64>().ok());
        if last.is_some_and(|v| v >= least) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{sample} never reached {least} (last {last:?})");
}

/// Waits until guest code has written `path` in sandbox `id`: how a test knows a call it
/// started is at work (a fixed wait can pass before a loaded machine has started it).
pub async fn wait_written(c: &Client, id: &str, path: &str) {
    for _ in 0..600 {
        let v = ok(
            c,
            "file_exists",
            serde_json::json!({"sandbox_id": id, "path": path}),
        )
        .await;
        if v["exists"] == true {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{path} was never written in {id}");
}

/// Starts a tool call and returns at once: the call stays in flight (for tests that drop the
/// client, signal the server or call again meanwhile).
pub fn spawn_call(
    client: &Client,
    tool: &str,
    args: Value,
) -> tokio::task::JoinHandle<Result<CallToolResult, rmcp::ServiceError>> {
    let Value::Object(args) = args else {
        panic!("arguments must be a JSON object")
    };
    let peer = client.peer().clone();
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    tokio::spawn(async move { peer.call_tool(params).await })
}

/// `wasmbox serve --http 127.0.0.1:0` as a child process, with its URL read from its stderr.
pub struct HttpServer {
    pub child: tokio::process::Child,
    pub url: String,
    /// Everything the server wrote to stderr so far.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl HttpServer {
    pub async fn start(env: &[(&str, &str)], args: &[&str]) -> Self {
        prepare();
        use tokio::io::AsyncBufReadExt;
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["serve", "--http", "127.0.0.1:0"])
            .args(args)
            .env("WASMBOX_DATA", "none")
            .env("WASMBOX_PACKAGE_INDEX", NO_INDEX)
            .env(HOST_CANARY.0, HOST_CANARY.1)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning wasmbox serve --http");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let url = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                log.lock().unwrap().push_str(&(line.clone() + "\n"));
                if let Some(url) = line.strip_prefix("wasmbox: listening on ") {
                    return url.trim().to_string();
                }
            }
            panic!("the server ended before listening: {}", log.lock().unwrap());
        })
        .await
        .expect("the server listens within 60 s");
        // Keep draining stderr so the server never blocks on a full pipe.
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        Self { child, url, log }
    }

    /// An MCP client of rmcp's streamable HTTP transport, with `token` as its bearer token.
    pub async fn client(&self, token: &str) -> Result<Client, String> {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        // rmcp's HTTP client brings no crypto library of its own (as in wasmbox): ring's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(self.url.as_str()).auth_header(token),
        );
        ().serve(transport).await.map_err(|e| e.to_string())
    }
}

/// A one-request HTTP server on 127.0.0.1: returns the request's headers and body.
pub async fn receive_one(listener: tokio::net::TcpListener) -> (String, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = sock.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed early");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = sock.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                .await
                .unwrap();
            return (head, buf[end + 4..end + 4 + len].to_vec());
        }
    }
}

/// The entries of `dir`; none if it cannot be read.
pub fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Everything under `dir`, files and directories.
pub fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for p in entries(dir) {
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// Page faults the calling thread has taken so far.
#[cfg(target_os = "linux")]
pub fn thread_faults() -> i64 {
    // SAFETY: getrusage only writes the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut u), 0);
        u.ru_minflt + u.ru_majflt
    }
}

/// Runs `f` on a thread with a guest's stack (synchronous wasm calls need one), returning its
/// result; a panic in it fails the caller.
pub fn on_guest_stack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::Builder::new()
        .stack_size(wasmbox::engine::GUEST_THREAD_STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// The page faults each of 7 calls of `one` takes on a guest's stack, each once `ready`
/// returns (untimed, uncounted), sorted.
#[cfg(target_os = "linux")]
pub fn faults_per_call(
    ready: impl Fn() + Send + 'static,
    one: impl Fn() + Send + 'static,
) -> Vec<i64> {
    let mut faults = on_guest_stack(move || {
        (0..7)
            .map(|_| {
                ready();
                let before = thread_faults();
                one();
                thread_faults() - before
            })
            .collect::<Vec<_>>()
    });
    faults.sort_unstable();
    faults
}
