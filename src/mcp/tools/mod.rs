//! The HOPX-compatible tool surface (see `../shared/hopx-mcp-tools.md`), mapped onto the library.
//!
//! Each group of tools is an rmcp `#[tool_router]` in its own file; [`WasmboxServer::router`]
//! adds them up, and `tools/list` is that router's list. `call_tool` wraps the router for what
//! the macros do not do: the HTTP owner and its call permit, cancellation, running disk-bound
//! tools off the runtime's workers, and answering bad arguments and unknown tools with a HOPX
//! error result (`isError`) rather than a protocol error. A tool on a sandbox takes its
//! [`Target`] itself and handles a cloud sandbox in place (`cloud.rs` has what those paths share).

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, ListPromptsResult, ListToolsResult,
    PaginatedRequestParams, Prompt, PromptMessage, Role, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

use crate::Wasmbox;
use crate::engine::cpu::LOCAL_OWNER;
use crate::engine::limits::{Stop, StopReason};
use crate::sandbox::Sandbox;
use error::{ToolError, not_found};

mod args;
mod cloud;
mod commands;
mod env;
mod error;
mod exec;
mod exec_reply;
mod files;
#[doc(hidden)]
pub mod fuzz_args;
mod observe;
mod packages;
mod prompt;
mod reply;
mod sandboxes;
mod schema;
mod server;
mod snapshots;
mod vm;

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
    router: Arc<ToolRouter<Self>>,
    guest_tools: Arc<ToolRouter<Self>>,
    tools: Arc<Vec<Tool>>,
    /// Whose sandboxes this call may see: [`LOCAL_OWNER`] over stdio, the caller's token over
    /// HTTP (set per call from the request, see [`Owner`]).
    owner: Arc<str>,
    /// Runs waiting for the person's consent while their call answered `input_required`.
    parked: Arc<crate::mcp::consent::ParkedRuns>,
    /// The tools whose answers may take more than `WASMBOX_RESULT_BYTES`, as their groups
    /// declare them.
    budgets: Arc<HashMap<String, Budget>>,
}

/// What a tool's answer may take beyond `WASMBOX_RESULT_BYTES`.
#[derive(Clone, Copy, Debug)]
enum Budget {
    /// Also the base64 of the bytes it may return (`WASMBOX_DOWNLOAD_BYTES`).
    Download,
}

/// The owner of an HTTP request (a token), put in its extensions by the transport's auth layer,
/// with the token's limit on calls running at once and its queue of calls waiting to run: an
/// assistant that sends several calls at once gets them all answered in turn, and only a token
/// past its queue too is refused. Fairness between tokens is the CPU scheduler's, not this.
#[derive(Clone, Debug)]
pub struct Owner {
    pub id: Arc<str>,
    pub calls: Arc<tokio::sync::Semaphore>,
    pub max_calls: usize,
    pub waiting: Arc<tokio::sync::Semaphore>,
    pub max_waiting: usize,
}

impl Owner {
    /// `id` with room for `calls` running at once and `waiting` more in line.
    pub fn new(id: &str, calls: usize, waiting: usize) -> Self {
        Self {
            id: id.into(),
            calls: Arc::new(tokio::sync::Semaphore::new(calls)),
            max_calls: calls,
            waiting: Arc::new(tokio::sync::Semaphore::new(waiting)),
            max_waiting: waiting,
        }
    }

    /// A running place for one call: at once when one is free, else after waiting in the
    /// token's queue (`None`: the queue is full).
    async fn place(
        &self,
        cancelled: &tokio_util::sync::CancellationToken,
    ) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
        if let Ok(p) = self.calls.clone().try_acquire_owned() {
            return Some(Some(p));
        }
        let _in_line = self.waiting.clone().try_acquire_owned().ok()?;
        let _counted = crate::telemetry::metrics::InTokenQueue::enter();
        tokio::select! {
            p = self.calls.clone().acquire_owned() => Some(p.ok()),
            () = cancelled.cancelled() => Some(None),
        }
    }
}

impl WasmboxServer {
    pub fn new(wasmbox: Wasmbox) -> Self {
        let router = Self::router();
        let tools = router
            .list_all()
            .into_iter()
            .map(|mut t| {
                t.output_schema = t
                    .output_schema
                    .map(|s| Arc::new(schema::quick_to_check(&s)));
                t
            })
            .collect();
        Self {
            wasmbox,
            router: Arc::new(router),
            guest_tools: Arc::new(Self::guest_router()),
            tools: Arc::new(tools),
            owner: LOCAL_OWNER.into(),
            parked: Default::default(),
            budgets: Arc::new(Self::file_budgets().into_iter().collect()),
        }
    }

    /// Every tool, by group.
    pub fn router() -> ToolRouter<Self> {
        Self::guest_router()
            + Self::sandbox_router()
            + Self::vm_router()
            + Self::state_router()
            + Self::file_router()
            + Self::env_router()
            + Self::package_router()
            + Self::server_router()
    }

    /// The groups whose tools run guests: called on the runtime's workers (see `route`).
    fn guest_router() -> ToolRouter<Self> {
        Self::exec_router() + Self::command_router()
    }

    /// The names `tools/list` shows.
    pub fn tool_names() -> Vec<String> {
        Self::router()
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// One tool call as `call_tool` makes it, once the caller is known: every failure is a tool
    /// result with `isError: true`, and every answer, whichever path made it, fits its budget.
    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let budget = self.budget(&request.name);
        let mut r = self.route(request, context).await;
        reply::fit_result(&mut r, budget);
        r
    }

    /// The most bytes a tool's text block may take: `WASMBOX_RESULT_BYTES`, and more for the
    /// tools whose group declares a [`Budget`].
    fn budget(&self, tool: &str) -> usize {
        let c = self.wasmbox.config();
        match self.budgets.get(tool) {
            Some(Budget::Download) => c.result_bytes + c.download_bytes.div_ceil(3) * 4,
            None => c.result_bytes,
        }
    }

    /// Runs a call on its tool and shapes rmcp's own failures. The guest tools (their group
    /// says so: [`WasmboxServer::guest_router`]) run guests on guest threads and only validate
    /// and wait here; every other tool works on the disk (workspaces, meta files, the module
    /// cache, walks of any size), off the runtime's workers, so a slow disk delays only its own
    /// call.
    async fn route(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let name = request.name.to_string();
        let answer = if self.guest_tools.has_route(&name) {
            self.router
                .call(ToolCallContext::new(self, request, context))
                .await
        } else {
            let this = self.clone();
            let handle = tokio::runtime::Handle::current();
            // The call's cancel flag goes along: a tool's cloud path is cancelled with the call.
            let cancel = call_cancel().unwrap_or_default();
            let span = tracing::Span::current();
            tokio::task::spawn_blocking(move || {
                let _span = span.enter();
                handle.block_on(
                    CALL_CANCEL.scope(
                        cancel,
                        this.router
                            .call(ToolCallContext::new(&this, request, context)),
                    ),
                )
            })
            .await
            .unwrap_or_else(|_| {
                Ok(ToolError::exception(
                    "Internal error",
                    "the tool failed inside wasmbox (a host panic); other calls are unaffected",
                )
                .into_result()
                .into())
            })
        };
        self.hopx_shaped(&name, answer)
    }

    /// rmcp's own failures (an unknown tool, arguments that do not parse) as HOPX's results.
    fn hopx_shaped(
        &self,
        name: &str,
        answer: Result<CallToolResponse, McpError>,
    ) -> CallToolResult {
        const BAD_ARGS: &str = "failed to deserialize parameters: ";
        match answer {
            // Ours always carry a JSON object; rmcp's argument errors carry prose.
            Ok(CallToolResponse::Complete(r))
                if r.is_error == Some(true) && reply::text_json(&r).is_none() =>
            {
                let text = r
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| t.text.clone())
                    .unwrap_or_default();
                let why = text.strip_prefix(BAD_ARGS).unwrap_or(&text);
                ToolError::message(
                    "Invalid arguments",
                    format!("Error executing tool {name}: invalid arguments: {why}"),
                )
                .into_result()
            }
            Ok(CallToolResponse::Complete(r)) => r,
            Ok(_) => ToolError::message(
                "Internal error",
                format!("{name} gave an answer of a kind wasmbox does not send"),
            )
            .into_result(),
            Err(e) if !self.router.has_route(name) => {
                tracing::debug!("unknown tool {name}: {}", e.message);
                ToolError::message(
                    "Unknown tool",
                    format!(
                        "Unknown tool: {name}. Available tools: {}",
                        self.tools
                            .iter()
                            .map(|t| t.name.as_ref())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
                .into_result()
            }
            Err(e) => ToolError::message(
                "Invalid request",
                format!("Error executing tool {name}: {}", e.message),
            )
            .into_result(),
        }
    }

    /// The caller's sandbox `id`, local or in the cloud, or HOPX's not-found error (under
    /// `key`: `id` or `sandbox_id`). A tool with a cloud path takes its target here and handles
    /// both cases in place.
    fn target(&self, id: &str, key: &str) -> Result<Target, ToolError> {
        match self.wasmbox.cloud_sandbox(id) {
            Some(c) if *c.owner == *self.owner => Ok(Target::Cloud(c)),
            _ => self.local(id, key).map(Target::Local),
        }
    }

    /// The caller's local sandbox `id`, for a tool that has no cloud path: a cloud sandbox's id
    /// gets an error that says so.
    fn local_sandbox(&self, id: &str, key: &str, tool: &str) -> Result<Arc<Sandbox>, ToolError> {
        match self.target(id, key)? {
            Target::Local(sb) => Ok(sb),
            Target::Cloud(c) => Err(ToolError::message(
                "Not supported for cloud sandboxes",
                format!(
                    "{tool} is not available for cloud sandbox {}; it works on local sandboxes",
                    c.id
                ),
            )
            .with("sandbox_id", &c.id)),
        }
    }

    /// For a tool whose work is the server's, whatever sandbox it names (HOPX's are per
    /// sandbox): a cloud sandbox's id gets the error that it works locally only.
    fn server_wide(&self, id: Option<&str>, tool: &str) -> Result<(), ToolError> {
        match id.and_then(|id| self.wasmbox.cloud_sandbox(id)) {
            Some(c) if *c.owner == *self.owner => {
                self.local_sandbox(&c.id, "sandbox_id", tool).map(drop)
            }
            _ => Ok(()),
        }
    }

    fn local(&self, id: &str, key: &str) -> Result<Arc<Sandbox>, ToolError> {
        self.wasmbox
            .sandboxes()
            .get(id, &self.owner)
            .map_err(|e| not_found(&e, key, id))
    }
}

/// Where a tool's sandbox is.
enum Target {
    Local(Arc<Sandbox>),
    Cloud(Arc<crate::CloudSandbox>),
}

impl ServerHandler for WasmboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .build(),
        )
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
        tracing::debug!(tool = %request.name, "tool call");
        // Over HTTP the auth layer has named the caller; its sandboxes are the only ones it sees.
        // Only a call with no HTTP request at all is stdio's (the local owner): an HTTP call that
        // reached here unnamed is refused, never served with the local owner's sandboxes.
        let (owner, transport) = match context.extensions.get::<http::request::Parts>() {
            None => (Some(None), "stdio"),
            Some(parts) => (parts.extensions.get::<Owner>().cloned().map(Some), "http"),
        };
        let who = match &owner {
            Some(Some(o)) => o.id.clone(),
            Some(None) => self.owner.clone(),
            None => "unauthenticated".into(),
        };
        let observed = observe::Observed::begin(&request, &context, who, transport);
        let tool = if self.router.has_route(&request.name) {
            request.name.to_string()
        } else {
            "unknown".to_string()
        };
        let answer = observed.scope(self.admit(owner, request, context)).await;
        observed.end(&tool, &answer);
        Ok(answer)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            prompt::NAME,
            Some(prompt::DESCRIPTION),
            None,
        )]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != prompt::NAME {
            return Err(McpError::invalid_params(
                format!(
                    "unknown prompt '{}': the one prompt is {}",
                    request.name,
                    prompt::NAME
                ),
                None,
            ));
        }
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, prompt::TEXT)])
                .with_description(prompt::DESCRIPTION)
                .into(),
        )
    }
}

impl WasmboxServer {
    /// Serves a call whose caller is `owner` (`Some(None)`: stdio's local user; `None`: an HTTP
    /// call the auth layer did not name), once the token has a running place for it.
    async fn admit(
        &self,
        owner: Option<Option<Owner>>,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResponse {
        use tracing::Instrument;
        let owner = match owner {
            Some(None) => return self.serve(request, context).await,
            Some(Some(owner)) => owner,
            None => {
                tracing::error!(tool = %request.name, "HTTP tool call without an owner refused");
                return ToolError::exception(
                    "Unauthenticated request",
                    "this HTTP request reached the tools with no authenticated owner (a bearer token); refused rather than served as the local owner",
                )
                .with("error_type", "AuthenticationError")
                .into_result()
                .into();
            }
        };
        let queued = owner.place(&context.ct);
        let Some(place) = queued.instrument(tracing::debug_span!("queue.token")).await else {
            return ToolError::exception(
                "Too many concurrent calls",
                format!(
                    "this token already has {} tool calls running and {} waiting (its limits; WASMBOX_TOKEN_CONCURRENCY and WASMBOX_TOKEN_QUEUE raise them): wait for one to finish",
                    owner.max_calls, owner.max_waiting
                ),
            )
            .with("error_type", "RateLimitError")
            .into_result()
            .into();
        };
        let Some(_place) = place else {
            return ToolError::exception(
                "Cancelled",
                "the call was cancelled while it waited for a running place",
            )
            .with("error_type", "CancelledError")
            .into_result()
            .into();
        };
        let mut this = self.clone();
        this.owner = owner.id.clone();
        this.serve(request, context).await
    }
}

tokio::task_local! {
    /// The running tool call's cancel flag, raised when its client cancels it.
    static CALL_CANCEL: Arc<Stop>;
}

/// The cancel flag of the tool call this runs in, if any.
fn call_cancel() -> Option<Arc<Stop>> {
    CALL_CANCEL.try_with(Arc::clone).ok()
}

impl WasmboxServer {
    /// Serves one call once its caller is known, with its progress, its cancel flag and who to
    /// ask for consent. A cancelled call's guest (or Go build) stops at its next check and the
    /// call returns what it has, as at a deadline; cloud one-shots are dropped, deleting their
    /// sandbox. The client's cancel is watched in the call's own task, so a call costs no second
    /// task (whose spawn could wake another worker) unless its run asks the person something on
    /// protocol 2026-07-28, where the call answers `input_required` and the run waits in a task
    /// of its own for the retry that brings the answer.
    async fn serve(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResponse {
        use super::consent::{AskThroughCall, PeerConsent};
        if let Some(token) = request.request_state.as_deref() {
            return self.resume(token, &request, context).await;
        }
        let tool = request.name.to_string();
        let cancel = Arc::new(Stop::default());
        let mrtr = context
            .protocol_version()
            .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
        let (consent, questions): (Arc<dyn crate::reach::tools::Consent>, _) = if mrtr {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (Arc::new(AskThroughCall(tx)), Some(rx))
        } else {
            (Arc::new(PeerConsent(context.peer.clone())), None)
        };
        let this = self.clone();
        let ctx = context.clone();
        let call = CALL_CANCEL.scope(
            cancel.clone(),
            async move { this.dispatch(request, ctx).await },
        );
        let call = super::consent::scope(consent, call);
        let progress_ctx = context.clone();
        let call = async move { super::progress::scope(&progress_ctx, call).await };
        self.drive(Box::pin(call), questions, cancel, tool, context)
            .await
    }

    /// Waits for a call's run, watching the client's cancel and, on protocol 2026-07-28, the
    /// run's questions: one parks the run and answers `input_required`.
    async fn drive(
        &self,
        mut run: std::pin::Pin<Box<dyn std::future::Future<Output = CallToolResult> + Send>>,
        mut questions: Option<tokio::sync::mpsc::UnboundedReceiver<crate::mcp::consent::Question>>,
        cancel: Arc<Stop>,
        tool: String,
        context: RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let mut cancelled = false;
        loop {
            let asked = async {
                match questions.as_mut() {
                    Some(q) => q.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                r = &mut run => return r.into(),
                () = context.ct.cancelled(), if !cancelled => {
                    cancel.stop(StopReason::Cancelled);
                    cancelled = true;
                }
                Some(q) = asked => {
                    if context.client_capabilities().and_then(|c| c.elicitation).is_none() {
                        let _ = q.answer.send(Err(crate::reach::tools::CannotAsk::NoElicitation));
                        continue;
                    }
                    let message = q.message.clone();
                    let token = self.parked.park(crate::mcp::consent::Parked {
                        run: tokio::spawn(tracing::Instrument::in_current_span(run)),
                        answer: q.answer,
                        questions: questions.take().expect("questions come from a receiver"),
                        cancel,
                        owner: self.owner.clone(),
                        tool,
                        since: std::time::Instant::now(),
                    });
                    return super::consent::input_required(message, token).into();
                }
            }
        }
    }

    /// A client's retry of a call that answered `input_required`: the answer goes to the
    /// parked run, and the call waits for the run as the first one would have.
    async fn resume(
        &self,
        token: &str,
        request: &CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let Some(p) = self.parked.take(token, &self.owner, &request.name) else {
            return ToolError::message(
                "Invalid request",
                format!(
                    "requestState {token:?} names no run of {} waiting for an answer (it finished, expired or belongs to another call)",
                    request.name
                ),
            )
            .into_result()
            .into();
        };
        let answer = super::consent::answer_of(request.input_responses.as_ref());
        let _ = p.answer.send(answer);
        let run = p.run;
        let run = Box::pin(async move {
            run.await.unwrap_or_else(|_| {
                ToolError::exception(
                    "Internal error",
                    "the tool failed inside wasmbox (a host panic); other calls are unaffected",
                )
                .into_result()
            })
        });
        self.drive(run, Some(p.questions), p.cancel, p.tool, context)
            .await
    }
}
