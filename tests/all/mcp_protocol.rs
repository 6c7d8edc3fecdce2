//! The MCP surface itself: tool list, bad arguments, unknown tools, health, templates, and
//! protocol faults on the raw stdio stream.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;
use serde_json::{Value, json};

#[tokio::test]
async fn lists_the_hopx_compatible_tools() {
    let c = server().await;
    let tools = c.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    // All 35 tools of hopx-mcp 0.2.1 (../shared/hopx-mcp-tools.md §6), plus our extras.
    let hopx = "create_sandbox list_sandboxes get_sandbox delete_sandbox update_sandbox_timeout \
        resume_sandbox list_templates get_template execute_code execute_code_isolated \
        execute_code_persistent execute_code_rich execute_code_background run_command \
        run_command_background file_read file_write file_list file_exists file_remove file_mkdir \
        env_get env_set env_clear execute_list_processes execute_kill_process list_processes \
        health ping_vm get_vm_info get_system_metrics get_preview_url get_agent_url cache_stats \
        cache_clear";
    let hopx: Vec<&str> = hopx.split_whitespace().collect();
    assert_eq!(hopx.len(), 35);
    for want in hopx.iter().chain(&[
        "execute_code_async",
        "pause_sandbox",
        "file_upload",
        "file_download",
        "fork_sandbox",
        "snapshot_sandbox",
        "list_snapshots",
        "delete_snapshot",
    ]) {
        assert!(names.contains(want), "{want} missing from {names:?}");
    }
    let exec = tools.iter().find(|t| t.name == "execute_code").unwrap();
    let props = exec.input_schema.get("properties").unwrap();
    for p in [
        "code",
        "mode",
        "sandbox_id",
        "language",
        "timeout",
        "env",
        "working_dir",
    ] {
        assert!(props.get(p).is_some(), "execute_code lacks parameter {p}");
    }
    assert_eq!(exec.input_schema["required"], json!(["code"]));
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn bad_arguments_and_unknown_tools_are_tool_errors() {
    let c = server().await;
    let r = call(&c, "execute_code", json!({"language": "python"})).await;
    assert!(is_error(&r));
    assert!(
        object(&r)["message"]
            .as_str()
            .unwrap()
            .contains("missing field `code`")
    );
    let r = call(&c, "execute_code", json!({"code": "1", "timeout": "soon"})).await;
    assert!(is_error(&r));
    let r = call(&c, "execute_code", json!({"code": "1", "timeout": 0})).await;
    assert!(is_error(&r));
    assert!(
        object(&r)["message"]
            .as_str()
            .unwrap()
            .contains("timeout must be positive")
    );
    let r = call(&c, "execute_code", json!({"code": "1", "timeout": 100000})).await;
    assert!(is_error(&r));
    let r = call(
        &c,
        "execute_code",
        json!({"code": "1", "mode": "persistent"}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(object(&r)["error"], "Missing sandbox_id");
    let r = call(&c, "no_such_tool", json!({})).await;
    assert!(is_error(&r));
    assert!(
        object(&r)["message"]
            .as_str()
            .unwrap()
            .starts_with("Unknown tool: no_such_tool")
    );
    let big = "x = 1\n".repeat(1 << 20);
    let r = call(&c, "execute_code", json!({"code": big})).await;
    assert!(is_error(&r));
    assert!(object(&r)["message"].as_str().unwrap().contains("limit"));
    // Still serving.
    assert_eq!(py(&c, "print('ok')").await["stdout"], "ok\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn health_and_templates() {
    let c = server().await;
    let h = object(&call(&c, "health", json!({})).await);
    assert_eq!(h["status"], "ok");
    assert_eq!(h["server"], "wasmbox");
    assert!(h["runtimes"]["python"].is_string());
    let t = object(&call(&c, "list_templates", json!({})).await);
    assert!(t["count"].as_u64().unwrap() >= 1);
    let first = &t["data"][0];
    assert_eq!(first["id"], "code-interpreter");
    assert_eq!(first["language"], "python");
    assert!(
        first.get("tags").is_none(),
        "fields filter applies by default"
    );
    let all = object(&call(&c, "list_templates", json!({"fields": "all", "limit": 1})).await);
    assert_eq!(all["count"], 1);
    assert!(all["data"][0]["default_resources"]["timeout_seconds"].is_number());
    c.cancel().await.unwrap();
}

/// Raw JSON-RPC on the wire: garbage gets a JSON-RPC error or is dropped, never a crash, and the
/// next well-formed request is answered.
#[test]
fn malformed_json_rpc_does_not_kill_the_server() {
    prepare();
    let mut child = Command::new(BIN)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut send = |v: &str| {
        stdin.write_all(v.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    };
    send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#,
    );
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let init: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(init["id"], 1);
    assert_eq!(init["result"]["serverInfo"]["name"], "wasmbox");
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    send("this is not json {{{");
    send(r#"{"jsonrpc":"2.0","id":2,"method":"no/such/method"}"#);
    send(
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"print(2+2)"}}}"#,
    );
    let mut seen_method_error = false;
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "server closed stdout"
        );
        let v: Value = serde_json::from_str(&line).expect("server writes only JSON-RPC to stdout");
        if v["id"] == 2 {
            assert!(v["error"]["code"].is_number(), "{v}");
            seen_method_error = true;
        }
        if v["id"] == 3 {
            assert_eq!(v["result"]["structuredContent"]["stdout"], "4\n", "{v}");
            break;
        }
    }
    assert!(seen_method_error);
    drop(stdin);
    let _ = child.wait();
}

/// Node's `child_process` (Claude Desktop, Cursor, VS Code, the Inspector) hands a server
/// sockets, not pipes, for stdin and stdout. The server drives them on its reactor, answers over
/// them, and exits when the client closes its end.
#[test]
fn serves_over_sockets_as_node_launchers_give_them() {
    use std::os::unix::net::UnixStream;
    prepare();
    let (client_in, server_in) = UnixStream::pair().unwrap();
    let (client_out, server_out) = UnixStream::pair().unwrap();
    let mut child = Command::new(BIN)
        .arg("serve")
        .env("RUST_LOG", "wasmbox=debug")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(server_in)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(server_out)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = client_in;
    let mut out = BufReader::new(client_out);
    let mut ask = |id: u64, method: &str, params: Value| -> Value {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        stdin.write_all(format!("{msg}\n").as_bytes()).unwrap();
        if method == "initialize" {
            stdin
                .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
                .unwrap();
        }
        loop {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "server closed stdout"
            );
            let v: Value = serde_json::from_str(&line).expect("only JSON-RPC on stdout");
            if v["id"] == id {
                return v;
            }
        }
    };
    let init = ask(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "sockets", "version": "0"}}),
    );
    assert_eq!(init["result"]["serverInfo"]["name"], "wasmbox", "{init}");
    for (id, code, want) in [(2, "print(6*7)", "42\n"), (3, "print('again')", "again\n")] {
        let r = ask(
            id,
            "tools/call",
            json!({"name": "execute_code", "arguments": {"code": code}}),
        );
        assert_eq!(r["result"]["structuredContent"]["stdout"], want, "{r}");
    }
    drop(stdin);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server did not exit when its stdin socket closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
    assert!(
        log.contains("stdio: non-blocking sockets"),
        "the sockets were not driven by the reactor:\n{log}"
    );
}

/// The protocol versions clients speak: what `initialize` answers for each. A version with the
/// handshake is echoed; 2026-07-28, which dropped it for per-request `_meta`, is answered with
/// the newest that has it.
const VERSIONS: [(&str, &str); 3] = [
    ("2025-06-18", "2025-06-18"),
    ("2025-11-25", "2025-11-25"),
    ("2026-07-28", "2025-11-25"),
];

/// 2026-07-28's per-request lifecycle: every request says its version and capabilities.
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    })
}

/// `wasmbox serve` over raw JSON-RPC lines.
struct Wire {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

impl Wire {
    fn spawn() -> Self {
        prepare();
        let mut child = Command::new(BIN)
            .arg("serve")
            .env("WASMBOX_DATA", "none")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Self { child, stdin, out }
    }

    fn send(&mut self, msg: Value) {
        self.stdin.write_all(format!("{msg}\n").as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and returns the answer with its id.
    fn ask(&mut self, msg: Value) -> Value {
        let id = msg["id"].clone();
        self.send(msg);
        loop {
            let mut line = String::new();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "server closed stdout"
            );
            let v: Value = serde_json::from_str(&line).expect("only JSON-RPC on stdout");
            if v["id"] == id {
                return v;
            }
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// tools/list and a tools/call, as `ask` sends them, work; `meta` goes in each request's `_meta`.
async fn tools_work(what: &str, meta: &Value, mut ask: impl AsyncFnMut(&str, Value) -> Value) {
    let with_meta = |mut params: Value| {
        if !meta.is_null() {
            params["_meta"] = meta.clone();
        }
        params
    };
    let list = ask("tools/list", with_meta(json!({}))).await;
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: tools/list: {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"execute_code"), "{what}: {names:?}");
    let r = ask(
        "tools/call",
        with_meta(json!({"name": "execute_code", "arguments": {"code": "print(6*7)"}})),
    )
    .await;
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "42\n",
        "{what}: tools/call: {r}"
    );
}

#[tokio::test]
async fn each_protocol_version_is_negotiated_and_served_over_stdio() {
    for (asked, answered) in VERSIONS {
        let mut w = Wire::spawn();
        let init = w.ask(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": asked, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        );
        assert_eq!(
            init["result"]["protocolVersion"], answered,
            "{asked}: {init}"
        );
        w.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let mut id = 1;
        tools_work(asked, &Value::Null, async |method, params| {
            id += 1;
            w.ask(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        })
        .await;
    }

    // A 2026-07-28 client skips the handshake: it discovers, then sends self-contained requests.
    let mut w = Wire::spawn();
    let meta = modern_meta();
    let found = w.ask(
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": meta}}),
    );
    let versions = found["result"]["supportedVersions"].to_string();
    for (v, _) in VERSIONS {
        assert!(versions.contains(v), "{v} not in {found}");
    }
    let mut id = 1;
    tools_work(
        "2026-07-28 without initialize",
        &meta,
        async |method, params| {
            id += 1;
            w.ask(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        },
    )
    .await;
}

/// The one JSON-RPC answer in an HTTP response, SSE or plain JSON.
async fn answer(resp: reqwest::Response) -> Value {
    let text = resp.text().await.unwrap();
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or_else(|| panic!("no answer in {text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn each_protocol_version_is_negotiated_and_served_over_http() {
    const TOKEN: &str = "token-versions-0123456789";
    let server = HttpServer::start(&[("WASMBOX_TOKEN", TOKEN)], &[]).await;
    let http = reqwest::Client::new();
    let post = async |headers: &[(&str, &str)], body: Value| {
        let mut r = http
            .post(&server.url)
            .header("Authorization", format!("Bearer {TOKEN}"))
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send().await.unwrap()
    };
    for (asked, answered) in VERSIONS {
        let resp = post(
            &[],
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": asked, "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}}),
        )
        .await;
        assert_eq!(resp.status(), 200, "{asked}");
        let sid = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let init = answer(resp).await;
        assert_eq!(
            init["result"]["protocolVersion"], answered,
            "{asked}: {init}"
        );
        let session = [
            ("Mcp-Session-Id", sid.as_str()),
            ("MCP-Protocol-Version", answered),
        ];
        let resp = post(
            &session,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        assert_eq!(resp.status(), 202);
        let mut id = 1;
        tools_work(asked, &Value::Null, async |method, params| {
            id += 1;
            let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            answer(post(&session, msg).await).await
        })
        .await;
    }

    // 2026-07-28 without the handshake: each request stands alone, with the SEP-2243 headers.
    let meta = modern_meta();
    let modern = |method: &'static str, name: Option<&'static str>| {
        let mut h = vec![
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
        ];
        h.extend(name.map(|n| ("Mcp-Name", n)));
        h
    };
    let found = answer(
        post(
            &modern("server/discover", None),
            json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
        )
        .await,
    )
    .await;
    assert!(
        found["result"]["supportedVersions"]
            .to_string()
            .contains("2026-07-28"),
        "{found}"
    );
    let mut id = 1;
    tools_work("2026-07-28 over HTTP", &meta, async |method, params| {
        id += 1;
        let name = (method == "tools/call").then_some("execute_code");
        let method: &'static str = if name.is_some() {
            "tools/call"
        } else {
            "tools/list"
        };
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        answer(post(&modern(method, name), msg).await).await
    })
    .await;
}
