//! Code mode (#33): guest code calls the tools of the person's other MCP servers. The
//! downstream servers are real: an rmcp server over streamable HTTP on 127.0.0.1 started here,
//! and `wasmbox serve` itself over stdio (an rmcp server too); the client is rmcp's, with and
//! without elicitation.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    Implementation, ProtocolVersion,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::common::*;

#[derive(Deserialize, JsonSchema)]
struct Key {
    key: String,
}

#[derive(Serialize, JsonSchema)]
struct Found {
    key: String,
    value: i64,
}

#[derive(Deserialize, JsonSchema)]
struct Text {
    text: String,
}

/// The downstream server: a read tool with a structured result, a tool that changes things,
/// one that never answers in time and one that answers too much.
#[derive(Clone)]
struct Notes {
    notes: Arc<Mutex<Vec<String>>>,
}

#[tool_router(server_handler)]
impl Notes {
    #[tool(description = "Looks a key up.", annotations(read_only_hint = true))]
    async fn lookup(&self, Parameters(k): Parameters<Key>) -> Json<Found> {
        Json(Found {
            value: k.key.len() as i64 * 10,
            key: k.key,
        })
    }

    #[tool(description = "Adds a note.")]
    async fn add_note(&self, Parameters(t): Parameters<Text>) -> String {
        let mut n = self.notes.lock().unwrap();
        n.push(t.text);
        format!("{} notes", n.len())
    }

    #[tool(description = "Takes a minute.", annotations(read_only_hint = true))]
    async fn slow(&self) -> String {
        tokio::time::sleep(Duration::from_secs(60)).await;
        "late".into()
    }

    #[tool(description = "Answers 1.5 MB.", annotations(read_only_hint = true))]
    async fn huge(&self) -> String {
        "x".repeat(3 << 19)
    }
}

/// Starts the downstream server on 127.0.0.1; its URL and the notes it was given.
async fn downstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let notes = Arc::new(Mutex::new(Vec::new()));
    let server = Notes {
        notes: notes.clone(),
    };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().nest_service("/mcp", service);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/mcp"), notes)
}

/// A client that answers elicitation with `approve` (as a person clicking yes or no would)
/// and counts the questions.
#[derive(Clone)]
struct Asked {
    approve: bool,
    asked: Arc<Mutex<Vec<String>>>,
    /// The protocol spoken: before 2026-07-28 the server asks with a request of its own; from
    /// it, its call answers `input_required` and rmcp's client retries with the answer.
    protocol: ProtocolVersion,
}

impl ClientHandler for Asked {
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        Ok(ElicitResult::new(ElicitationAction::Accept)
            .with_content(json!({ "approve": self.approve })))
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_elicitation().build(),
            Implementation::new("asked", "1"),
        )
        .with_protocol_version(self.protocol.clone())
    }
}

/// The config file: the HTTP server twice (read tools only; and its writer, which asks), and
/// wasmbox over stdio (started through a shell that leaves its pid in `pidfile`), a server
/// that cannot start and one that never answers its handshake.
fn config(dir: &std::path::Path, url: &str) -> std::path::PathBuf {
    let pidfile = dir.join("pid");
    let cfg = json!({"mcpServers": {
        "notes": {"type": "http", "url": url},
        "notes-rw": {"url": url, "allow": ["add_note", "lookup"]},
        "wb": {"command": "sh", "args": ["-c", format!("echo $$ > {}; exec {BIN} serve", pidfile.display())],
               "env": {"WASMBOX_DATA": "none"}},
        "broken": {"command": "/nonexistent/server"},
        "hangs": {"command": "sh", "args": ["-c", format!("echo $$ > {}; exec sleep 3600", dir.join("hangpid").display())]},
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

fn env_for(path: &std::path::Path) -> Vec<(String, String)> {
    vec![
        ("WASMBOX_MCP_CONFIG".into(), path.display().to_string()),
        ("WASMBOX_TOOL_BYTES".into(), "1000000".into()),
        ("WASMBOX_HOST_CALLS".into(), "40".into()),
    ]
}

async fn run(c: &RunningServiceAny, language: &str, code: &str, timeout: u64) -> Value {
    let args = json!({"code": code, "language": language, "timeout": timeout});
    let r = call(c, "execute_code", args).await;
    assert_ne!(r.is_error, Some(true), "{:?}", r.content);
    object(&r)
}

type RunningServiceAny = rmcp::service::RunningService<RoleClient, Asked>;

async fn connect(
    env: &[(String, String)],
    approve: bool,
    protocol: ProtocolVersion,
) -> (RunningServiceAny, Arc<Mutex<Vec<String>>>) {
    prepare();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let transport = TokioChildProcess::new(tokio::process::Command::new(BIN).configure(|cmd| {
        cmd.arg("serve").env("WASMBOX_DATA", "none");
        for (k, v) in env {
            cmd.env(k, v);
        }
    }))
    .unwrap();
    let client = Asked {
        approve,
        asked: asked.clone(),
        protocol,
    }
    .serve(transport)
    .await
    .unwrap();
    (client, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_calls_allowed_tools_and_asks_before_destructive_ones() {
    let (url, notes) = downstream().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&config(dir.path(), &url));
    let (c, asked) = connect(&env, true, ProtocolVersion::V_2025_11_25).await;

    // list_code_tools: compact signatures, the hidden writer, the server that failed.
    let list = object(&call(&c, "list_code_tools", json!({})).await);
    let sigs: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["signature"].as_str().unwrap())
        .collect();
    assert!(sigs.contains(&"notes.lookup(key: string)"), "{sigs:?}");
    assert!(
        sigs.contains(&"notes_rw.add_note(text: string)"),
        "{sigs:?}"
    );
    assert!(
        !sigs.iter().any(|s| s.starts_with("notes.add_note")),
        "{sigs:?}"
    );
    assert!(sigs.iter().any(|s| s.starts_with("wb.health(")), "{sigs:?}");
    let server = |name: &str| {
        list["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no server {name} in {list}"))
    };
    let broken = server("broken");
    assert_eq!(broken["state"], "failed");
    let hangs = server("hangs");
    assert!(
        hangs["error"].as_str().unwrap().contains("still starting"),
        "{hangs}"
    );
    assert!(
        broken["error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/server"),
        "{broken}"
    );

    // A read tool from Python and JavaScript, structured results as the language's values.
    let out = run(&c, "python", "from wasmbox import tools\nr = tools.notes.lookup(key='abc')\nprint(r['value'], type(r).__name__)\nprint(tools.wb.health()['status'])", 30).await;
    assert_eq!(out["stdout"], "30 dict\nok\n", "{out}");
    let out = run(
        &c,
        "javascript",
        "const r = await tools.notes.lookup({key: 'abcd'});\nconsole.log(r.value, typeof r);",
        30,
    )
    .await;
    assert_eq!(out["stdout"], "40 object\n", "{out}");

    // A tool outside `allow` does not exist for code; the writer asks, and with consent runs.
    let out = run(&c, "python", "from wasmbox import tools\ntry:\n    tools.notes.add_note\nexcept AttributeError as e:\n    print('hidden')\nprint(tools.notes_rw.add_note(text='hi'))", 30).await;
    assert_eq!(out["stdout"], "hidden\n1 notes\n", "{out}");
    assert_eq!(*notes.lock().unwrap(), ["hi"]);
    let q = asked.lock().unwrap().clone();
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(
        q[0].contains("notes_rw.add_note") && q[0].contains("\"hi\""),
        "{q:?}"
    );

    // Too large an answer is an error for the guest; the next call works.
    let out = run(&c, "python", "from wasmbox import tools, ToolError\ntry:\n    tools.notes.huge()\nexcept ToolError as e:\n    print(e.kind)\nprint(tools.notes.lookup(key='a')['value'])", 30).await;
    assert_eq!(out["stdout"], "too_large\n10\n", "{out}");

    // The budget: WASMBOX_HOST_CALLS=40 per run, the list included.
    let out = run(&c, "python", "from wasmbox import tools, ToolError\nn = 0\ntry:\n    while True:\n        tools.notes.lookup(key='a'); n += 1\nexcept ToolError as e:\n    print(n, e.kind)", 30).await;
    assert_eq!(out["stdout"], "39 budget_exceeded\n", "{out}");

    // A downstream that dies: the guest gets an error, the next call starts it again.
    run(
        &c,
        "python",
        "from wasmbox import tools\ntools.wb.health()",
        30,
    )
    .await;
    let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
    std::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = run(&c, "python", "from wasmbox import tools, ToolError\ntry:\n    tools.wb.health()\nexcept ToolError as e:\n    print(e.kind, 'starts it again' in str(e))\nprint(tools.wb.health()['status'])", 30).await;
    assert_eq!(out["stdout"], "tool_error True\nok\n", "{out}");

    // A tool that hangs: the run's deadline stops the guest; the server goes on.
    let t = Instant::now();
    let out = run(
        &c,
        "python",
        "from wasmbox import tools\ntools.notes.slow()",
        2,
    )
    .await;
    assert_eq!(out["limit"], "timeout", "{out}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let out = run(
        &c,
        "javascript",
        "console.log((await tools.notes.lookup({key: 'xy'})).value)",
        30,
    )
    .await;
    assert_eq!(out["stdout"], "20\n", "{out}");

    // The servers wasmbox started end with it, however it ends: even one that ignores its
    // stdin closing.
    let pid = std::fs::read_to_string(dir.path().join("hangpid")).unwrap();
    let alive = || std::path::Path::new(&format!("/proc/{}", pid.trim())).exists();
    assert!(alive());
    drop(c);
    let t = Instant::now();
    while alive() && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its state says which way it failed: never signalled (S), or ended but not reaped (Z).
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    assert!(!alive(), "the stdio server outlived wasmbox: {stat}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_tools_are_refused_without_consent() {
    let (url, notes) = downstream().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&config(dir.path(), &url));

    // A person who says no.
    let (c, asked) = connect(&env, false, ProtocolVersion::V_2025_11_25).await;
    let out = run(&c, "python", "from wasmbox import tools, ToolDenied\ntry:\n    tools.notes_rw.add_note(text='no')\nexcept ToolDenied as e:\n    print(e.kind, 'declined' in str(e))", 30).await;
    assert_eq!(out["stdout"], "denied True\n", "{out}");
    assert_eq!(asked.lock().unwrap().len(), 1);

    // A client that cannot be asked (no elicitation): refused, naming the setting.
    let plain = server_with_env(
        &env.iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
    )
    .await;
    let r = call(&plain, "execute_code", json!({"language": "javascript",
        "code": "try { await tools.notes_rw.add_note({text: 'no'}) } catch (e) { console.log(e.name, e.kind, e.message) }"})).await;
    let out = object(&r);
    let s = out["stdout"].as_str().unwrap();
    assert!(
        s.starts_with("ToolError denied") && s.contains("\"confirm\": false"),
        "{out}"
    );
    assert!(notes.lock().unwrap().is_empty());

    // Without a config, code sees no tools and is told why.
    let none = server().await;
    let out = py(&none, "from wasmbox import tools\ntry:\n    tools.notes\nexcept AttributeError as e:\n    print(e)").await;
    assert!(
        out["stdout"].as_str().unwrap().contains("--mcp-config"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_protocol_2026_07_28_consent_comes_back_with_the_retried_call() {
    let (url, notes) = downstream().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&config(dir.path(), &url));
    for approve in [true, false] {
        let (c, asked) = connect(&env, approve, ProtocolVersion::V_2026_07_28).await;
        let out = run(&c, "python", "from wasmbox import tools, ToolDenied\ntry:\n    print(tools.notes_rw.add_note(text='x'))\nexcept ToolDenied as e:\n    print(e.kind)\nprint(tools.notes.lookup(key='abc')['value'])", 30).await;
        let want = if approve {
            "1 notes\n30\n"
        } else {
            "denied\n30\n"
        };
        assert_eq!(out["stdout"], want, "{out}");
        assert_eq!(asked.lock().unwrap().len(), 1);
    }
    assert_eq!(*notes.lock().unwrap(), ["x"]);
}

/// The official Python MCP SDK, pinned: it wraps a tool's primitive or list return as
/// `{"result": x}`, which rmcp's `Json<T>` never does, so only its own server shows the wrapper.
const PYTHON_SDK: &str = "mcp==2.3.0";

/// A Python with [`PYTHON_SDK`]: a venv under the target dir, made once with the machine's
/// `python3` and pip from PyPI (the dev machines and CI have both).
fn python_with_sdk() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-mcp-sdk");
    let python = dir.join("bin/python");
    let stamp = dir.join(PYTHON_SDK);
    if stamp.exists() {
        return python;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let run = |cmd: &mut std::process::Command| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir));
    run(std::process::Command::new(&python).args(["-m", "pip", "install", "-q", PYTHON_SDK]));
    std::fs::write(&stamp, "").unwrap();
    python
}

/// A server as people write them with the SDK: each tool returns what its annotation says.
const CALC_SERVER: &str = r#"
from pydantic import BaseModel
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("calc")

class Scored(BaseModel):
    result: int
    note: str

@mcp.tool()
def add(a: int, b: int) -> int:
    return a + b

@mcp.tool()
def greet(name: str) -> str:
    return "hi " + name

@mcp.tool()
def squares(n: int) -> list[int]:
    return [i * i for i in range(n)]

@mcp.tool()
def scored() -> Scored:
    return Scored(result=1, note="x")

mcp.run()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_sdk_servers_wrapped_results_come_back_as_the_value() {
    let python = python_with_sdk();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("calc.py");
    std::fs::write(&script, CALC_SERVER).unwrap();
    let cfg = json!({"mcpServers": {"calc": {"command": python, "args": [script],
        "allow": "*", "confirm": false}}});
    let path = dir.path().join("mcp.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let (c, _) = connect(&env_for(&path), true, ProtocolVersion::V_2025_11_25).await;

    // The wrapped int, str and list are the values; a model whose field is named `result`
    // comes back whole. What code is told they return says the same.
    let out = run(&c, "python", "import inspect\nfrom wasmbox import tools\nc = tools.calc\nprint(repr(c.add(a=2, b=3)), c.add(a=2, b=3) + 1 == 6)\nprint(repr(c.greet(name='ann')))\nprint(repr(c.squares(n=4)))\nprint(c.scored() == {'result': 1, 'note': 'x'})\nfor f in (c.add, c.greet, c.squares, c.scored):\n    print(inspect.signature(f))", 60).await;
    assert_eq!(
        out["stdout"],
        "5 True\n'hi ann'\n[0, 1, 4, 9]\nTrue\n(a: int, b: int) -> int\n(name: str) -> str\n(n: int) -> list[int]\n() -> dict\n",
        "{out}"
    );
    let out = run(
        &c,
        "javascript",
        "const c = tools.calc;\nconst sum = await c.add({a: 2, b: 3});\nconsole.log(JSON.stringify([sum, sum + 1 === 6, await c.greet({name: 'ann'}), await c.squares({n: 4}), await c.scored()]));",
        60,
    )
    .await;
    assert_eq!(
        out["stdout"], "[5,true,\"hi ann\",[0,1,4,9],{\"note\":\"x\",\"result\":1}]\n",
        "{out}"
    );
}
