//! What each tool call leaves behind for the people who run the server: its count by tool and
//! outcome in the metrics, and its line in the audit log (`crate::telemetry`). `call_tool` opens
//! an [`Observed`] before anything can refuse the call and closes it with the answer, so a
//! refused call, a cancelled one and a limit stop are recorded as surely as a success.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use rmcp::RoleServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult};
use rmcp::service::RequestContext;
use serde_json::Value;

use crate::telemetry::audit::{self, Origin};

tokio::task_local! {
    /// The running call, as its audit lines name it (only while the audit log is on).
    static ORIGIN: Arc<Origin>;
}

/// The tool call this runs in, if the audit log is on: its runs note their host calls there,
/// and a background run names it in the line written when the run ends.
pub(super) fn call_origin() -> Option<Arc<Origin>> {
    ORIGIN.try_with(Arc::clone).ok()
}

/// A tool call being watched, from its arrival to its answer.
pub(super) struct Observed {
    started: Instant,
    /// The call's span: the client's trace's child when its `_meta` carries a `traceparent`.
    span: tracing::Span,
    /// The audit line's facts, gathered only while the log is on.
    line: Option<audit::Call>,
}

impl Observed {
    /// Starts watching `request` from `owner` over `transport`. With the audit log off this
    /// reads the clock and nothing else.
    pub fn begin(
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        owner: Arc<str>,
        transport: &'static str,
    ) -> Self {
        let started = Instant::now();
        let span = crate::telemetry::trace::call_span(
            &request.name,
            context.meta.get_traceparent(),
            context.meta.get_tracestate(),
        );
        if !audit::enabled() {
            return Self {
                started,
                span,
                line: None,
            };
        }
        let arg = |k: &str| {
            request
                .arguments
                .as_ref()
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
        };
        let short = |k: &str| arg(k).map(cut);
        let origin = Origin {
            request_id: request_id(context),
            owner,
            transport,
            tool: cut(&request.name),
            trace_id: crate::telemetry::trace::trace_id(&span),
            host_calls: Default::default(),
        };
        let line = audit::Call {
            at: Some(SystemTime::now()),
            origin: Arc::new(origin),
            sandbox_id: short("sandbox_id").or_else(|| short("id")),
            language: short("language"),
            mode: short("mode"),
            code: arg("code").or_else(|| arg("command")).map(str::to_string),
            ..Default::default()
        };
        Self {
            started,
            span,
            line: Some(line),
        }
    }

    /// Runs `call` in this call's span, with its audit origin in scope.
    pub async fn scope<F: std::future::Future>(&self, call: F) -> F::Output {
        use tracing::Instrument;
        let call = call.instrument(self.span.clone());
        match &self.line {
            Some(line) => ORIGIN.scope(line.origin.clone(), call).await,
            None => call.await,
        }
    }

    /// Records the call's answer: `tool` is the name to count it under (a known tool's, or
    /// `unknown`: a client cannot grow the metrics with names of its own).
    pub fn end(self, tool: &str, answer: &CallToolResponse) {
        let facts = Facts::of(answer);
        crate::telemetry::metrics::call(tool, facts.status);
        if !self.span.is_disabled() {
            self.span.record("outcome", facts.status);
            if !matches!(facts.status, "ok" | "failed" | "limit") {
                self.span.record("otel.status_code", "ERROR");
            }
        }
        let Some(mut line) = self.line else { return };
        line.duration = self.started.elapsed();
        line.run_id = facts.run_id;
        line.status = facts.status;
        line.error_type = facts.error_type;
        line.exit_code = facts.exit_code;
        line.limit = facts.limit;
        line.bytes_out = facts.bytes_out;
        if facts.sandbox_id.is_some() {
            line.sandbox_id = facts.sandbox_id;
        }
        if facts.language.is_some() {
            line.language = facts.language;
        }
        if facts.mode.is_some() {
            line.mode = facts.mode;
        }
        audit::record(line);
    }
}

/// A name the client chose, as the line keeps it: a client cannot make lines of any size
/// with it (code is hashed and cut on the writer).
fn cut(s: &str) -> String {
    s.chars().take(NAME_CHARS).collect()
}

/// The most characters of a tool name, sandbox id, language or mode a line keeps.
const NAME_CHARS: usize = 128;

/// The JSON-RPC id of the request, as text.
fn request_id(context: &RequestContext<RoleServer>) -> String {
    match serde_json::to_value(&context.id) {
        Ok(Value::String(s)) => cut(&s),
        Ok(v) => cut(&v.to_string()),
        Err(_) => String::new(),
    }
}

/// What an answer says about how its call went.
#[derive(Default)]
struct Facts {
    status: &'static str,
    error_type: Option<String>,
    exit_code: Option<i64>,
    limit: Option<Value>,
    bytes_out: Option<u64>,
    sandbox_id: Option<String>,
    language: Option<String>,
    mode: Option<String>,
    /// A background or async start's job or execution id.
    run_id: Option<String>,
}

impl Facts {
    fn of(answer: &CallToolResponse) -> Self {
        match answer {
            CallToolResponse::Complete(r) if r.is_error == Some(true) => Self::failure(r),
            CallToolResponse::Complete(r) => Self::result(r),
            _ => Self {
                status: "input_required",
                ..Self::default()
            },
        }
    }

    /// A tool error: refused (the caller's token or its queue), cancelled, or an error.
    fn failure(r: &CallToolResult) -> Self {
        let body = r
            .structured_content
            .clone()
            .or_else(|| super::reply::text_json(r))
            .unwrap_or_default();
        let error_type = ["error_type", "exception_type", "error"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_str))
            .map(str::to_string);
        let status = match error_type.as_deref() {
            Some("AuthenticationError" | "RateLimitError") => "refused",
            Some("CancelledError") => "cancelled",
            _ => "error",
        };
        Self {
            status,
            error_type,
            ..Self::read(&body)
        }
    }

    /// A result: ok, failed (a non-zero exit) or stopped by a limit.
    fn result(r: &CallToolResult) -> Self {
        let Some(body) = &r.structured_content else {
            return Self {
                status: "ok",
                ..Self::default()
            };
        };
        let facts = Self::read(body);
        let status = if facts.limit.is_some() {
            "limit"
        } else if facts.exit_code.is_some_and(|c| c != 0) {
            "failed"
        } else {
            "ok"
        };
        Self { status, ..facts }
    }

    /// The fields an execution's answer carries.
    fn read(body: &Value) -> Self {
        let text = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_string);
        let out = |k: &str| body.get(k).and_then(Value::as_str).map(|s| s.len() as u64);
        let bytes_out = match (out("stdout"), out("stderr")) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        Self {
            status: "ok",
            error_type: None,
            exit_code: body.get("exit_code").and_then(Value::as_i64),
            limit: body.get("limit").filter(|l| !l.is_null()).cloned(),
            bytes_out,
            sandbox_id: text("sandbox_id"),
            language: text("language"),
            mode: text("mode"),
            run_id: text("process_id").or_else(|| text("execution_id")),
        }
    }
}
