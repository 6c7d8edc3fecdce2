//! Code mode: the tools of the person's other MCP servers, callable from guest code.
//!
//! The servers come from `--mcp-config` / `WASMBOX_MCP_CONFIG` ([`config`]); wasmbox connects
//! to each as an MCP client the first time code lists or calls tools, and keeps the connection.
//! Code sees only the tools its server's `allow` admits (by default those annotated
//! read-only); a tool the server does not mark harmless (`destructiveHint` is true unless it says
//! otherwise) needs the person's consent, asked through the client (elicitation), unless the
//! config sets `confirm: false`. The servers' credentials stay in their processes; a guest sees
//! results only, each bounded (`WASMBOX_TOOL_BYTES`).

pub mod config;
mod error;
mod link;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::ServiceError;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub use config::{Allow, MCP_CONFIG, ServerSpec, Transport};
pub use error::{CannotAsk, ServerError};
use link::{ConnectError, Link};

/// Asks the person whether a destructive call may go ahead.
pub trait Consent: Send + Sync {
    /// `Ok(true)` when they accepted; `Err` when they cannot be asked (the client has no
    /// elicitation, or it failed), with why.
    fn ask(&self, message: String)
    -> Pin<Box<dyn Future<Output = Result<bool, CannotAsk>> + Send>>;
}

impl std::fmt::Debug for dyn Consent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Consent")
    }
}

/// Why a call failed, in the guest protocol's kinds.
#[derive(Debug, Clone, PartialEq)]
pub struct Fail {
    pub kind: &'static str,
    pub message: String,
}

impl Fail {
    fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// One tool code may call.
#[derive(Clone, Debug, Serialize)]
pub struct CodeTool {
    /// `tools.<server>`.
    pub server: String,
    /// The tool's own name, as its server knows it.
    pub tool: String,
    /// Its attribute under the server: the name as an identifier.
    pub attr: String,
    /// The one name the guest protocol knows it by: `<server>__<attr>`, at most 64 characters.
    pub name: String,
    pub description: String,
    #[serde(rename = "inputSchema")]
    pub input_schema: Arc<JsonObject>,
    /// The schema of what code gets back: for the Python SDK's wrapper, the wrapped value's.
    #[serde(rename = "outputSchema", skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Arc<JsonObject>>,
    /// Whether a call needs the person's consent first.
    pub confirm: bool,
    /// Code gets `structuredContent.result` rather than the wrapper around it.
    #[serde(skip)]
    pub unwrap: bool,
}

/// A server's state as `list_code_tools` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct ServerStatus {
    pub name: String,
    pub transport: &'static str,
    /// "connected", "not started" or "failed".
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Tools it has that code may not call (not in `allow`).
    pub hidden: usize,
}

/// The configured servers and their connections.
pub struct CodeTools {
    servers: Vec<Server>,
    /// The most bytes one answer (or one message from a server) may take.
    max_answer: usize,
}

impl fmt::Debug for CodeTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.servers.iter().map(|s| &s.spec.name))
            .finish()
    }
}

struct Server {
    spec: ServerSpec,
    slot: tokio::sync::Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    link: Option<Arc<Link>>,
    /// Its tools as last listed.
    tools: Option<Arc<Vec<Listed>>>,
    /// The last failure to connect, and when: a server that failed is not started again for
    /// a few seconds, so a broken entry does not cost every call a process.
    failed: Option<(ConnectError, Instant)>,
    /// A connection being made, in a task of its own: a guest that stops waiting (its
    /// deadline) does not abort it, so a slow first start (`npx -y`) finishes for the next.
    connecting: Option<(Connecting, Instant)>,
}

/// A tool as its server listed it, with what code gets back from it decided once.
struct Listed {
    tool: Tool,
    /// Its output schema is the Python SDK's `{"result": x}` wrapper: code gets `x`.
    unwrap: bool,
    /// Its output schema as code is told it (the wrapped value's for a wrapper).
    output_schema: Option<Arc<JsonObject>>,
}

impl Listed {
    fn new(tool: Tool) -> Self {
        let wrapped = tool.output_schema.as_deref().and_then(wrapped_schema);
        Self {
            unwrap: wrapped.is_some(),
            output_schema: wrapped.map(Arc::new).or_else(|| tool.output_schema.clone()),
            tool,
        }
    }
}

type Connecting = futures::future::Shared<
    std::pin::Pin<Box<dyn Future<Output = Result<Arc<Link>, ConnectError>> + Send>>,
>;

/// How long a server has to start, shake hands, or list its tools.
const CONNECT_TIME: Duration = Duration::from_secs(60);

/// How long a list of every server's tools waits for one of them.
const LIST_WAIT: Duration = Duration::from_secs(10);

/// How long a server that could not be reached is left alone.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// What a guest's call to a server turned into.
enum Outcome {
    Done(CallToolResult),
    Failed(Fail),
}

impl CodeTools {
    pub fn new(servers: Vec<ServerSpec>, max_answer: usize) -> Self {
        Self {
            servers: servers
                .into_iter()
                .map(|spec| Server {
                    spec,
                    slot: Default::default(),
                })
                .collect(),
            max_answer,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Every tool code may call, each server connected and listed if it was not yet (all at
    /// once), with each server's state.
    pub async fn list(&self) -> (Vec<CodeTool>, Vec<ServerStatus>) {
        // A server still starting is waited for a while, then reported as such; its start goes
        // on in its own task and its tools appear in a later list.
        let lists = futures::future::join_all(self.servers.iter().map(|s| async {
            // One that has been starting for a while already is not waited for again.
            let since = s
                .slot
                .lock()
                .await
                .connecting
                .as_ref()
                .map(|(_, at)| at.elapsed());
            let wait = LIST_WAIT.saturating_sub(since.unwrap_or_default());
            tokio::time::timeout(wait, self.catalog(s))
                .await
                .unwrap_or_else(|_| {
                    Err(ServerError::Slow {
                        server: s.spec.name.clone(),
                        secs: LIST_WAIT.as_secs(),
                    })
                })
        }))
        .await;
        let mut out = Vec::new();
        let mut status = Vec::new();
        for (s, listed) in self.servers.iter().zip(lists) {
            let spec = &s.spec;
            let mut st = ServerStatus {
                name: spec.name.clone(),
                transport: match spec.transport {
                    Transport::Stdio { .. } => "stdio",
                    Transport::Http { .. } => "http",
                },
                state: "connected",
                error: None,
                hidden: 0,
            };
            match listed {
                Err(e) => {
                    st.state = "failed";
                    st.error = Some(e.to_string());
                }
                Ok((tools, hidden)) => {
                    st.hidden = hidden;
                    out.extend(tools);
                }
            }
            status.push(st);
        }
        (out, status)
    }

    /// The tools of one server that code may call, and how many it hides. Their protocol names
    /// are `<server>__<tool>`, made unique within the server.
    async fn catalog(&self, s: &Server) -> Result<(Vec<CodeTool>, usize), ServerError> {
        let tools = self.tools_of(s).await?;
        let spec = &s.spec;
        let mut taken = HashMap::new();
        let mut out = Vec::new();
        let mut hidden = 0;
        for listed in tools.iter() {
            let t = &listed.tool;
            let read_only = annotated(t, |a| a.read_only_hint);
            if !spec.allow.admits(&t.name, read_only) {
                hidden += 1;
                continue;
            }
            let attr = config::ident(&t.name);
            let name = unique(&format!("{}__{attr}", spec.name), &mut taken);
            let destructive = !read_only
                && t.annotations.as_ref().and_then(|a| a.destructive_hint) != Some(false);
            out.push(CodeTool {
                server: spec.name.clone(),
                tool: t.name.to_string(),
                attr,
                name,
                description: t.description.as_deref().unwrap_or_default().to_string(),
                input_schema: t.input_schema.clone(),
                output_schema: listed.output_schema.clone(),
                confirm: destructive && spec.confirm,
                unwrap: listed.unwrap,
            });
        }
        Ok((out, hidden))
    }

    /// Calls the tool code knows as `name` with `args`, asking `consent` first when it needs it.
    pub async fn call(
        &self,
        name: &str,
        args: JsonObject,
        consent: Option<&Arc<dyn Consent>>,
    ) -> Result<Value, Fail> {
        let unknown = || {
            Fail::new(
                "unknown_tool",
                format!("no tool code may call is named {name} (list_code_tools shows them)"),
            )
        };
        // Only this tool's server is reached: another's slow start costs this call nothing.
        let server = name
            .split_once("__")
            .and_then(|(s, _)| self.servers.iter().find(|x| x.spec.name == s))
            .ok_or_else(unknown)?;
        let (tools, _) = self
            .catalog(server)
            .await
            .map_err(|e| Fail::new("tool_error", e.to_string()))?;
        let tool = tools
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(unknown)?;
        let label = format!("{}.{}", tool.server, tool.tool);
        if tool.confirm {
            let Some(consent) = consent else {
                return Err(Fail::new(
                    "denied",
                    format!(
                        "{label} may change things, and there is no one to ask for consent in this run; set \"confirm\": false for server {:?} in the MCP config to allow it without asking",
                        server.spec.key
                    ),
                ));
            };
            let mut shown = Value::Object(args.clone()).to_string();
            if let Some((at, _)) = shown.char_indices().nth(500) {
                shown.truncate(at);
                shown.push_str("...");
            }
            let message = format!(
                "Code in a wasmbox sandbox wants to call {label}, which its server marks as one that may change things, with {shown}. Allow this call?"
            );
            match consent.ask(message).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Fail::new(
                        "denied",
                        format!("the person declined the call to {label}"),
                    ));
                }
                Err(why) => {
                    return Err(Fail::new(
                        "denied",
                        format!(
                            "{label} needs the person's consent and it could not be asked: {why}; set \"confirm\": false for server {:?} in the MCP config to allow it without asking",
                            server.spec.key
                        ),
                    ));
                }
            }
        }
        match self.send(server, &tool.tool, args).await {
            Outcome::Failed(f) => Err(f),
            Outcome::Done(r) => {
                let value = value_of(&r, tool.unwrap);
                if r.is_error == Some(true) {
                    let text = match &value {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    };
                    return Err(Fail::new(
                        "tool_error",
                        format!("{label}: {}", cut(&text, 2000)),
                    ));
                }
                let size = serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len());
                if size > self.max_answer {
                    return Err(Fail::new(
                        "too_large",
                        format!(
                            "{label} answered {size} bytes, over WASMBOX_TOOL_BYTES ({} bytes)",
                            self.max_answer
                        ),
                    ));
                }
                Ok(value)
            }
        }
    }

    async fn send(&self, server: &Server, tool: &str, args: JsonObject) -> Outcome {
        let link = match self.link(server).await {
            Ok(l) => l,
            Err(e) => return Outcome::Failed(Fail::new("tool_error", e.to_string())),
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        match link.client.call_tool(params).await {
            Ok(r) => Outcome::Done(r),
            Err(ServiceError::McpError(e)) => Outcome::Failed(match e.code.0 {
                -32602 => Fail::new(
                    "invalid_arguments",
                    format!("{}.{tool}: {}", server.spec.name, cut(&e.message, 1000)),
                ),
                -32601 => Fail::new(
                    "unknown_tool",
                    format!("{}.{tool}: {}", server.spec.name, cut(&e.message, 1000)),
                ),
                _ => Fail::new(
                    "tool_error",
                    format!("{}.{tool}: {}", server.spec.name, cut(&e.message, 1000)),
                ),
            }),
            Err(ServiceError::Timeout { .. }) => Outcome::Failed(Fail::new(
                "timeout",
                format!("{}.{tool} did not answer in time", server.spec.name),
            )),
            Err(e) => {
                // The connection is gone or broken: the next call starts it again.
                let mut slot = server.slot.lock().await;
                if slot.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, &link)) {
                    slot.link = None;
                    slot.tools = None;
                }
                // Over stdio our reader ends the connection; over HTTP rmcp refuses the body.
                Outcome::Failed(
                    if link.is_over() || e.to_string().contains("exceeded the maximum size") {
                        Fail::new(
                            "too_large",
                            format!(
                                "MCP server {} sent a message over {} bytes (WASMBOX_TOOL_BYTES); its connection was closed and the next call starts it again",
                                server.spec.name, self.max_answer
                            ),
                        )
                    } else {
                        Fail::new(
                            "tool_error",
                            format!(
                                "MCP server {} stopped answering ({e}: it exited, or sent a message over twice WASMBOX_TOOL_BYTES); the next call starts it again",
                                server.spec.name
                            ),
                        )
                    },
                )
            }
        }
    }

    /// The server's connection, made now if there is none (or the last one closed).
    async fn link(&self, server: &Server) -> Result<Arc<Link>, ServerError> {
        let unreachable = |why: ConnectError| ServerError::Unreachable {
            server: server.spec.name.clone(),
            why,
        };
        let pending = {
            let mut slot = server.slot.lock().await;
            if let Some(l) = &slot.link
                && !l.client.is_closed()
            {
                return Ok(l.clone());
            }
            match &slot.connecting {
                Some((c, _)) => c.clone(),
                None => {
                    if let Some((e, at)) = &slot.failed
                        && at.elapsed() < RETRY_AFTER
                    {
                        return Err(unreachable(e.clone()));
                    }
                    slot.tools = None;
                    let spec = server.spec.clone();
                    // Twice the largest answer: one somewhat over it arrives whole and is refused
                    // as too large with the connection kept; past this the connection ends.
                    let max = self.max_answer.saturating_mul(2).saturating_add(64 << 10);
                    let task = tokio::spawn(async move {
                        match tokio::time::timeout(CONNECT_TIME, link::connect(&spec, max)).await {
                            Ok(r) => r.map(Arc::new),
                            Err(_) => Err(ConnectError::Slow(CONNECT_TIME.as_secs())),
                        }
                    });
                    let c: Connecting = futures::FutureExt::shared(Box::pin(async move {
                        task.await
                            .unwrap_or_else(|e| Err(ConnectError::Task(Arc::new(e))))
                    })
                        as std::pin::Pin<Box<dyn Future<Output = _> + Send>>);
                    slot.connecting = Some((c.clone(), Instant::now()));
                    c
                }
            }
        };
        let made = pending.clone().await;
        let mut slot = server.slot.lock().await;
        if slot
            .connecting
            .as_ref()
            .is_some_and(|(c, _)| c.ptr_eq(&pending))
        {
            slot.connecting = None;
            match &made {
                Ok(l) => {
                    slot.link = Some(l.clone());
                    slot.failed = None;
                }
                Err(e) => {
                    slot.link = None;
                    slot.failed = Some((e.clone(), Instant::now()));
                }
            }
        }
        made.map_err(unreachable)
    }

    async fn tools_of(&self, server: &Server) -> Result<Arc<Vec<Listed>>, ServerError> {
        {
            let slot = server.slot.lock().await;
            if let (Some(t), Some(l)) = (&slot.tools, &slot.link)
                && !l.client.is_closed()
            {
                return Ok(t.clone());
            }
        }
        let link = self.link(server).await?;
        let tools = link
            .client
            .list_all_tools()
            .await
            .map_err(|why| ServerError::NotListed {
                server: server.spec.name.clone(),
                why,
            })?;
        let tools = Arc::new(tools.into_iter().map(Listed::new).collect::<Vec<_>>());
        server.slot.lock().await.tools = Some(tools.clone());
        Ok(tools)
    }
}

fn annotated(t: &Tool, f: impl Fn(&rmcp::model::ToolAnnotations) -> Option<bool>) -> bool {
    t.annotations.as_ref().and_then(f).unwrap_or(false)
}

/// `want`, or when it is taken or too long, a shortened form with a hash of it.
fn unique(want: &str, taken: &mut HashMap<String, ()>) -> String {
    let mut name = want.to_string();
    if name.len() > 64 || taken.contains_key(&name) {
        let hash = Sha256::digest(want.as_bytes());
        let tag: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
        name.truncate(64 - 13);
        let stem = name;
        name = format!("{stem}_{tag}");
        let mut n = 0u32;
        while taken.contains_key(&name) {
            n += 1;
            name = format!("{stem}_{tag}{n}");
        }
    }
    taken.insert(name.clone(), ());
    name
}

/// When `schema` is the official Python SDK's wrapper, the schema of the value it wraps.
///
/// That SDK answers a tool that returns a primitive or a list (`-> int`, `-> list[str]`) with
/// `{"result": x}` as its structured content, described by an object schema whose one property
/// `result` is required; code that calls `add(a=2, b=3)` means to get `5`. A real model with a
/// `result` field and any other field is not a wrapper, nor is one whose `result` is optional.
fn wrapped_schema(schema: &JsonObject) -> Option<JsonObject> {
    let properties = schema.get("properties")?.as_object()?;
    let inner = properties.get("result")?;
    if schema.get("type")? != "object"
        || properties.len() != 1
        || schema.get("required")? != &json!(["result"])
    {
        return None;
    }
    let mut inner = match inner {
        Value::Object(o) => o.clone(),
        // A boolean schema (`true`: anything) says nothing a guest can use.
        _ => JsonObject::new(),
    };
    // The wrapped schema's references point into the wrapper's definitions.
    for defs in ["$defs", "definitions"] {
        if let Some(d) = schema.get(defs) {
            inner.entry(defs).or_insert_with(|| d.clone());
        }
    }
    Some(inner)
}

/// A result as the guest's value: the structured content when the tool gave it (what the
/// Python SDK's wrapper wraps when `unwrap`), else its text (one block: a string, or the object
/// or array it holds when it is JSON, as many servers send their data; several: a list, other
/// kinds as their JSON).
fn value_of(r: &CallToolResult, unwrap: bool) -> Value {
    if let Some(v) = &r.structured_content {
        if unwrap && let Some(x) = v.get("result") {
            return x.clone();
        }
        return v.clone();
    }
    let blocks: Vec<Value> = r
        .content
        .iter()
        .map(|c| match c.as_text() {
            Some(t) => Value::String(t.text.clone()),
            None => serde_json::to_value(c).unwrap_or(json!(null)),
        })
        .collect();
    match <[Value; 1]>::try_from(blocks) {
        Ok([Value::String(text)]) => match serde_json::from_str::<Value>(&text) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
            _ => Value::String(text),
        },
        Ok([one]) => one,
        Err(v) if v.is_empty() => Value::Null,
        Err(v) => Value::Array(v),
    }
}

/// `s` cut to `chars` characters, marked when cut.
pub(crate) fn cut(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_short() {
        let mut taken = HashMap::new();
        let a = unique("srv__tool", &mut taken);
        let b = unique("srv__tool", &mut taken);
        let long = unique(&format!("srv__{}", "x".repeat(80)), &mut taken);
        assert_eq!(a, "srv__tool");
        assert_ne!(a, b);
        assert!(long.len() <= 64 && b.len() <= 64);
        let re = |s: &str| {
            s.len() <= 64
                && s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        assert!(re(&a) && re(&b) && re(&long), "{b} {long}");
    }

    /// A tool as a server lists it, with `output` as its output schema.
    fn listed(output: Option<Value>) -> Listed {
        let mut t = json!({"name": "add", "inputSchema": {"type": "object"}});
        if let Some(o) = output {
            t["outputSchema"] = o;
        }
        Listed::new(serde_json::from_value(t).unwrap())
    }

    #[test]
    fn only_the_python_sdks_wrapper_is_unwrapped() {
        // `-> int`, as the SDK lists it: code is told, and gets, the integer.
        let wrapper = listed(Some(json!({"type": "object", "title": "addOutput",
            "properties": {"result": {"type": "integer", "title": "Result"}},
            "required": ["result"]})));
        assert!(wrapper.unwrap);
        assert_eq!(
            Value::Object((*wrapper.output_schema.unwrap()).clone()),
            json!({"type": "integer", "title": "Result"})
        );
        // `-> list[Model]`: the wrapped schema keeps the definitions its reference needs.
        let defs = json!({"Pt": {"type": "object", "properties": {"x": {"type": "integer"}}}});
        let models = listed(Some(json!({"type": "object", "$defs": defs,
            "properties": {"result": {"type": "array", "items": {"$ref": "#/$defs/Pt"}}},
            "required": ["result"]})));
        assert!(models.unwrap);
        assert_eq!(models.output_schema.unwrap()["$defs"], defs);

        // A model with a `result` field and another: whole, as listed.
        let schema = json!({"type": "object",
            "properties": {"result": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["result", "note"]});
        let model = listed(Some(schema.clone()));
        assert!(!model.unwrap);
        assert_eq!(
            Value::Object((*model.output_schema.unwrap()).clone()),
            schema
        );
        // Extra names in `required` only, `result` optional, or another name: not the wrapper.
        for required in [json!(["result", "note"]), json!([]), json!(null)] {
            let mut s = json!({"type": "object", "properties": {"result": {"type": "integer"}}});
            if !required.is_null() {
                s["required"] = required;
            }
            assert!(!listed(Some(s.clone())).unwrap, "{s}");
        }
        let other = json!({"type": "object", "properties": {"value": {"type": "integer"}},
            "required": ["value"]});
        assert!(!listed(Some(other)).unwrap);
        // No output schema: nothing to unwrap, nothing to tell.
        let bare = listed(None);
        assert!(!bare.unwrap && bare.output_schema.is_none());
    }

    #[test]
    fn a_wrapped_value_is_the_result_and_anything_else_is_whole() {
        let answer = |structured: Value| {
            let mut r = CallToolResult::success(vec![rmcp::model::ContentBlock::text("5")]);
            r.structured_content = Some(structured);
            r
        };
        assert_eq!(value_of(&answer(json!({"result": 5})), true), json!(5));
        assert_eq!(
            value_of(&answer(json!({"result": [1, 2]})), true),
            json!([1, 2])
        );
        // A server that breaks its own schema gets its structured content passed on as it is.
        assert_eq!(
            value_of(&answer(json!({"other": 1})), true),
            json!({"other": 1})
        );
        assert_eq!(
            value_of(&answer(json!({"result": 5})), false),
            json!({"result": 5})
        );
        // No structured content: the text, as before.
        let text = CallToolResult::success(vec![rmcp::model::ContentBlock::text("5")]);
        assert_eq!(value_of(&text, true), json!("5"));
    }
}
