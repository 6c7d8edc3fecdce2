//! The HOPX-compatible tool surface (see `../shared/hopx-mcp-tools.md`), mapped onto the library.
//!
//! Tool calls are routed by hand rather than through rmcp's macros so that every failure — bad
//! arguments, an unknown tool, an unknown language — comes back as a tool result with
//! `isError: true` and a message that says what to do, as HOPX's server does, instead of an
//! opaque protocol error.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::handler::server::common::schema_for_type;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::{Error, ExecOptions, ExecResult, Wasmbox};

const INSTRUCTIONS: &str = "wasmbox runs code locally in WebAssembly sandboxes, offline, with \
the HOPX MCP tool surface. execute_code (mode 'isolated', the default) runs a one-shot in a fresh \
sandbox that is discarded afterwards; execute_code_isolated is the same. Languages: python (with \
numpy, pandas, scipy, scikit-learn and matplotlib), javascript (QuickJS: ES2023, promises, \
timers, console, process, require('fs'); no npm, no network) and go (a real Go toolchain builds \
the snippet for wasip1: `package main` in one file, standard library only; a snippet without a \
package clause is wrapped; compile errors come back with stage 'compile' and ./main.go:LINE:COL \
positions). Each run sees only its own empty /workspace (the working \
directory), no network and no host environment, and runs under limits (timeout seconds, default \
30, max 300; memory; output). Results carry stdout, stderr, exit_code, execution_time and success, \
plus 'limit' when a limit stopped the run, 'truncated' when output was cut and, for go, 'stage' \
(compile or run).";

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The MCP server: a thin front over [`Wasmbox`].
#[derive(Clone)]
pub struct WasmboxServer {
    wasmbox: Wasmbox,
    tools: Arc<Vec<Tool>>,
}

#[derive(Deserialize, JsonSchema)]
struct ExecuteCodeIsolatedArgs {
    /// The code to run.
    code: String,
    /// python (default), javascript (js, node), go (golang) or bash. python, javascript and go
    /// run locally.
    #[serde(default = "default_language")]
    language: String,
    /// Deadline in seconds (default 30, max 300).
    #[serde(default)]
    timeout: Option<f64>,
    /// Environment variables for this run only.
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// Print the value of a final expression, notebook style (default false, like `python -c`).
    #[serde(default)]
    echo: Option<bool>,
    /// Accepted for HOPX compatibility; local one-shots use the code-interpreter template.
    #[serde(default)]
    #[allow(dead_code)]
    template_name: Option<String>,
    /// Accepted for HOPX compatibility; ignored locally.
    #[serde(default)]
    #[allow(dead_code)]
    region: Option<String>,
}

#[derive(Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Isolated,
    Persistent,
    Rich,
    Background,
}

#[derive(Deserialize, JsonSchema)]
struct ExecuteCodeArgs {
    /// The code to run.
    code: String,
    /// isolated (default): a one-shot in a fresh sandbox, discarded afterwards.
    #[serde(default)]
    mode: Option<Mode>,
    /// Required by the persistent, rich and background modes.
    #[serde(default)]
    sandbox_id: Option<String>,
    /// python (default), javascript (js, node), go (golang) or bash. python, javascript and go
    /// run locally.
    #[serde(default = "default_language")]
    language: String,
    /// Deadline in seconds (default 30, max 300).
    #[serde(default)]
    timeout: Option<f64>,
    /// Environment variables for this run only.
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// Print the value of a final expression, notebook style (default false, like `python -c`).
    #[serde(default)]
    echo: Option<bool>,
    /// Working directory (persistent modes); one-shots run in /workspace.
    #[serde(default)]
    #[allow(dead_code)]
    working_dir: Option<String>,
    /// Background job name (background mode).
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    /// Accepted for HOPX compatibility.
    #[serde(default)]
    #[allow(dead_code)]
    template_name: Option<String>,
    /// Accepted for HOPX compatibility; ignored locally.
    #[serde(default)]
    #[allow(dead_code)]
    region: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct ListTemplatesArgs {
    /// How many templates to return (<= 0: all).
    #[serde(default = "default_template_limit")]
    limit: i64,
    /// Comma-separated keys to keep, or "all".
    #[serde(default = "default_fields")]
    fields: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

#[derive(Deserialize, JsonSchema)]
struct MetricsArgs {
    /// Accepted for HOPX compatibility; local metrics are server-wide.
    #[serde(default)]
    #[allow(dead_code)]
    sandbox_id: Option<String>,
}

fn default_language() -> String {
    "python".into()
}
fn default_template_limit() -> i64 {
    10
}
fn default_fields() -> Option<String> {
    Some("id,name,description,category,language".into())
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(name, description, schema_for_type::<T>())
}

impl WasmboxServer {
    pub fn new(wasmbox: Wasmbox) -> Self {
        let tools = vec![
            tool::<ExecuteCodeArgs>(
                "execute_code",
                "Run code. mode 'isolated' (default): a one-shot in a fresh WebAssembly sandbox with an \
                 empty /workspace, no network and no host environment, discarded afterwards. Returns \
                 stdout, stderr, exit_code, execution_time, success, mode, sandbox_id (plus limit and \
                 truncated when a limit applied).",
            ),
            tool::<ExecuteCodeIsolatedArgs>(
                "execute_code_isolated",
                "Run code as a one-shot in a fresh sandbox (same as execute_code with mode 'isolated').",
            ),
            tool::<NoArgs>(
                "health",
                "Server health: version, uptime and the state of each runtime.",
            ),
            tool::<MetricsArgs>(
                "get_system_metrics",
                "Server metrics: executions, instance pools (ready, hits, misses), memory (RSS).",
            ),
            tool::<ListTemplatesArgs>(
                "list_templates",
                "List the sandbox templates available locally, with their languages and limits.",
            ),
        ];
        Self {
            wasmbox,
            tools: Arc::new(tools),
        }
    }

    /// Dispatches one tool call; every failure is a tool result with `isError: true`.
    pub async fn dispatch(&self, name: &str, args: JsonObject) -> CallToolResult {
        match name {
            "execute_code" => match parse::<ExecuteCodeArgs>(name, args) {
                Ok(a) => self.execute_code(a).await,
                Err(r) => r,
            },
            "execute_code_isolated" => match parse::<ExecuteCodeIsolatedArgs>(name, args) {
                Ok(a) => {
                    self.one_shot(
                        a.code,
                        a.language,
                        a.timeout,
                        a.env.unwrap_or_default(),
                        a.echo,
                    )
                    .await
                }
                Err(r) => r,
            },
            "health" => self.health(),
            "get_system_metrics" => match parse::<MetricsArgs>(name, args) {
                Ok(_) => self.metrics(),
                Err(r) => r,
            },
            "list_templates" => match parse::<ListTemplatesArgs>(name, args) {
                Ok(a) => self.list_templates(a),
                Err(r) => r,
            },
            other => error_result(json!({
                "error": "Unknown tool",
                "message": format!(
                    "Unknown tool: {other}. Available tools: {}",
                    self.tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>().join(", ")
                ),
            })),
        }
    }

    async fn execute_code(&self, a: ExecuteCodeArgs) -> CallToolResult {
        let mode = a.mode.unwrap_or(Mode::Isolated);
        if mode != Mode::Isolated {
            let name = match mode {
                Mode::Persistent => "persistent",
                Mode::Rich => "rich",
                _ => "background",
            };
            if a.sandbox_id.is_none() {
                return error_result(json!({
                    "error": "Missing sandbox_id",
                    "message": format!("Mode '{name}' requires sandbox_id. Create sandbox first with create_sandbox() or use mode='isolated'."),
                    "mode": name,
                }));
            }
            return error_result(json!({
                "error": "Mode not available",
                "message": format!("Mode '{name}' needs persistent sandboxes, which are not available in this build of wasmbox yet. Use mode='isolated'."),
                "mode": name,
            }));
        }
        if a.sandbox_id.as_deref().is_some_and(|s| !s.is_empty()) {
            return error_result(json!({
                "error": "Sandbox not found",
                "sandbox_id": a.sandbox_id,
                "message": "This build of wasmbox has no persistent sandboxes; omit sandbox_id to run a one-shot.",
            }));
        }
        self.one_shot(
            a.code,
            a.language,
            a.timeout,
            a.env.unwrap_or_default(),
            a.echo,
        )
        .await
    }

    async fn one_shot(
        &self,
        code: String,
        language: String,
        timeout: Option<f64>,
        env: BTreeMap<String, String>,
        echo: Option<bool>,
    ) -> CallToolResult {
        let provided = language.clone();
        let req = match self.wasmbox.request(ExecOptions {
            language,
            code,
            env,
            timeout_secs: timeout,
            memory_mb: None,
            echo: echo.unwrap_or(false),
        }) {
            Ok(r) => r,
            Err(e) => return exec_error("isolated", &e, Some(&provided)),
        };
        match self.wasmbox.execute(req).await {
            Ok(r) => result_json(&r, "isolated"),
            Err(e) => exec_error("isolated", &e, Some(&provided)),
        }
    }

    fn health(&self) -> CallToolResult {
        let runtimes: serde_json::Map<String, Value> = self
            .wasmbox
            .runtime_status()
            .into_iter()
            .map(|s| (s.language.as_str().to_string(), Value::String(s.status)))
            .collect();
        ok_result(json!({
            "status": "ok",
            "server": "wasmbox",
            "version": VERSION,
            "location": "local",
            "uptime_seconds": self.wasmbox.uptime().as_secs_f64(),
            "executions": self.wasmbox.executions(),
            "runtimes": runtimes,
            "go_cache": self.wasmbox.go_cache_stats(),
        }))
    }

    fn metrics(&self) -> CallToolResult {
        ok_result(json!({
            "location": "local",
            "uptime_seconds": self.wasmbox.uptime().as_secs_f64(),
            "executions": self.wasmbox.executions(),
            "pools": self.wasmbox.pool_stats(),
            "memory": {"rss_bytes": rss_bytes()},
            "max_concurrency": self.wasmbox.config().max_concurrency,
        }))
    }

    fn list_templates(&self, a: ListTemplatesArgs) -> CallToolResult {
        let limits = &self.wasmbox.config().default_limits;
        let cfg = self.wasmbox.config();
        let mut data: Vec<Value> = templates()
            .into_iter()
            .map(|(id, name, description, languages)| {
                json!({
                    "id": id,
                    "name": name,
                    "display_name": name,
                    "description": description,
                    "category": "code-execution",
                    "language": languages[0],
                    "languages": languages,
                    "location": "local",
                    "default_resources": {
                        "timeout_seconds": limits.timeout.as_secs(),
                        "memory_mb": limits.memory_bytes / crate::config::MIB,
                        "output_bytes": limits.output_bytes,
                    },
                    "max_resources": {
                        "timeout_seconds": cfg.max_timeout.as_secs(),
                        "memory_mb": cfg.max_memory_bytes / crate::config::MIB,
                    },
                    "tags": ["wasm", "offline"],
                    "is_active": true,
                    "is_public": true,
                    "status": "active",
                })
            })
            .collect();
        if a.limit > 0 {
            data.truncate(a.limit as usize);
        }
        let fields = a.fields.clone().filter(|f| !f.is_empty());
        if let Some(f) = fields.as_deref().filter(|f| *f != "all") {
            let keep: Vec<&str> = f.split(',').map(str::trim).collect();
            for t in &mut data {
                if let Value::Object(m) = t {
                    m.retain(|k, _| keep.contains(&k.as_str()));
                }
            }
        }
        let note = fields.as_deref().filter(|f| *f != "all").map(|f| {
            format!("Partial response with fields: {f}. Use fields='all' for complete data.")
        });
        ok_result(json!({
            "count": data.len(),
            "data": data,
            "_fields": if a.fields.as_deref() == Some("all") { Value::Null } else { json!(a.fields) },
            "_note": note,
        }))
    }
}

/// The local templates: (id, name, description, languages).
fn templates() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
)> {
    const PY: &str = "Python 3.15 (WASI) with numpy, pandas, scipy, scikit-learn and matplotlib, run locally in WebAssembly";
    vec![
        (
            "code-interpreter",
            "code-interpreter",
            "Python 3.15 (numpy, pandas, scipy, scikit-learn, matplotlib), JavaScript (QuickJS-NG) and Go (standard library, built for wasip1), run locally in WebAssembly",
            &["python", "javascript", "go"],
        ),
        ("python", "python", PY, &["python"]),
        (
            "javascript",
            "javascript",
            "JavaScript (QuickJS-NG 0.16, ES2023) with console, timers, process and a small fs module, run locally in WebAssembly",
            &["javascript"],
        ),
        (
            "go",
            "go",
            "Go (standard library) built for GOOS=wasip1 by a real Go toolchain and run locally in WebAssembly",
            &["go"],
        ),
    ]
}

/// Resident set size of this process (Linux), or null elsewhere.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn parse<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<T, CallToolResult> {
    serde_json::from_value(Value::Object(args)).map_err(|e| {
        error_result(json!({
            "error": "Invalid arguments",
            "message": format!("Error executing tool {tool}: invalid arguments: {e}"),
        }))
    })
}

/// A result object as HOPX sends it (2-space-indented JSON text) plus `structuredContent`.
fn ok_result(value: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(pretty(&value))]);
    r.structured_content = Some(value);
    r
}

fn error_result(value: Value) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(pretty(&value))]);
    r.structured_content = Some(value);
    r
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn result_json(r: &ExecResult, mode: &str) -> CallToolResult {
    let id = format!("local-{}", uuid::Uuid::new_v4().simple());
    let mut v = json!({
        "stdout": r.stdout,
        "stderr": r.stderr,
        "exit_code": r.exit_code,
        "execution_time": r.execution_time,
        "success": r.success,
        "mode": mode,
        "sandbox_id": id,
        "language": r.language,
        "location": "local",
        "truncated": r.truncated,
        "limit": r.limit,
        "_note": "Ran in a fresh local WebAssembly sandbox that was discarded after the run.",
    });
    if let Some(stage) = r.stage {
        v["stage"] = json!(stage.as_str());
    }
    ok_result(v)
}

/// An execution that could not run, in HOPX's error shape, flagged `isError`.
fn exec_error(mode: &str, e: &Error, provided: Option<&str>) -> CallToolResult {
    let (error, kind) = match e {
        Error::UnknownLanguage(_) => ("Invalid language", "InvalidLanguage"),
        Error::LanguageNotAvailable(_) => ("Language not available", "LanguageNotAvailable"),
        Error::InvalidArgument(_) => ("Invalid arguments", "InvalidArgument"),
        Error::RuntimeMissing { .. } => ("Runtime missing", "RuntimeMissing"),
        Error::Busy(_) => ("Server busy", "Busy"),
        Error::Engine(_) | Error::Io { .. } => {
            ("Unexpected error during code execution", "EngineError")
        }
    };
    let mut v = json!({
        "error": error,
        "message": e.to_string(),
        "exception": e.to_string(),
        "exception_type": kind,
        "mode": mode,
        "stdout": "",
        "stderr": e.to_string(),
        "exit_code": 1,
        "success": false,
    });
    if let (Error::UnknownLanguage(_), Some(p)) = (e, provided) {
        v["provided"] = json!(p);
    }
    error_result(v)
}

impl ServerHandler for WasmboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("wasmbox", VERSION))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items((*self.tools).clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        tracing::debug!(tool = %request.name, "tool call");
        Ok(self.dispatch(&request.name, args).await.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }
}
