//! How a tool fails: one [`ToolError`] in HOPX's error shape, and one mapping ([`kind`]) from
//! the crate's errors to HOPX's titles and error types.

use std::fmt::Display;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::reply::pretty;
use crate::Error;
use crate::sandbox::SandboxError;

/// A failed call as HOPX sends it: what failed (`error`, a short title), why (under the key HOPX
/// uses for that tool: `message`, `exception` or both), and what it was about (named fields:
/// `path`, `sandbox_id`, `details`, an execution's empty output). Sent with `isError: true`, so
/// that clients and models see the call failed.
#[derive(Debug)]
pub struct ToolError {
    error: String,
    reason: String,
    says: Says,
    fields: Map<String, Value>,
}

/// The keys that carry the reason: HOPX names it per tool, and clients read the one it names.
#[derive(Debug, Clone, Copy)]
enum Says {
    Message,
    Exception,
    Both,
}

impl ToolError {
    /// `error`, with the reason as `message`.
    pub fn message(error: impl Into<String>, why: impl Display) -> Self {
        Self::new(error, why, Says::Message)
    }

    /// `error`, with the reason as `exception`.
    pub fn exception(error: impl Into<String>, why: impl Display) -> Self {
        Self::new(error, why, Says::Exception)
    }

    /// `error`, with the reason as both `message` and `exception`.
    pub fn both(error: impl Into<String>, why: impl Display) -> Self {
        Self::new(error, why, Says::Both)
    }

    /// The crate's error `e` as HOPX titles it, the reason under both keys and the error type
    /// as `exception_type`.
    pub fn of(e: &Error) -> Self {
        let (title, kind) = kind(e);
        Self::both(title, e).with("exception_type", kind)
    }

    fn new(error: impl Into<String>, why: impl Display, says: Says) -> Self {
        ToolError {
            error: error.into(),
            reason: why.to_string(),
            says,
            fields: Map::new(),
        }
    }

    /// A named field beside the reason (one named again replaces it).
    pub fn with(mut self, key: &str, value: impl Serialize) -> Self {
        self.fields.insert(key.into(), json!(value));
        self
    }

    /// The shape of a run that did not start: no output, the reason as stderr, exit code 1.
    pub fn for_run(self) -> Self {
        let why = self.reason.clone();
        self.with("stdout", "")
            .with("stderr", why)
            .with("exit_code", 1)
    }

    /// The error object as it is sent.
    pub fn to_value(&self) -> Value {
        let mut v = self.fields.clone();
        v.insert("error".into(), json!(self.error));
        if matches!(self.says, Says::Message | Says::Both) {
            v.insert("message".into(), json!(self.reason));
        }
        if matches!(self.says, Says::Exception | Says::Both) {
            v.insert("exception".into(), json!(self.reason));
        }
        Value::Object(v)
    }

    /// The error as a tool result: its text block only, because the TypeScript SDK (the MCP
    /// Inspector, and the clients built on it) validates any `structuredContent` against the
    /// tool's output schema, errors included, and then reports a protocol error instead of ours.
    pub fn into_result(self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(pretty(&self.to_value()))])
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(self.into_result().into())
    }
}

/// HOPX's title for the crate's error `e`, and its error type: the one place that maps them.
pub fn kind(e: &Error) -> (&'static str, &'static str) {
    use crate::engine::EngineError as E;
    use crate::lang::LangError as L;
    match e {
        Error::Lang(L::UnknownLanguage(_)) => ("Invalid language", "InvalidLanguage"),
        Error::Lang(L::LanguageNotAvailable(_)) => {
            ("Language not available", "LanguageNotAvailable")
        }
        Error::Lang(L::InvalidArgument(_)) => ("Invalid arguments", "InvalidArgument"),
        Error::Lang(L::RuntimeMissing { .. }) => ("Runtime missing", "RuntimeMissing"),
        Error::Lang(L::Engine(E::Busy(_))) => ("Server busy", "Busy"),
        Error::Cancelled(_) => ("Cancelled", "Cancelled"),
        Error::Package(p) => {
            use crate::packages::PackageError as P;
            match p {
                P::Compiled { .. } => ("Package needs compiled code", "CompiledPackage"),
                P::Hash { .. } => ("Package refused", "HashMismatch"),
                P::NotFound { .. } | P::NoMatch { .. } => ("Package not found", "PackageNotFound"),
                P::BadRequirement(..) => ("Invalid arguments", "InvalidArgument"),
                _ => ("Package install failed", "PackageError"),
            }
        }
        Error::Sandbox(e) => sandbox_kind(e),
        Error::File(_) => ("Path not allowed", "FileError"),
        Error::Snapshot(crate::sandbox::snapshots::SnapshotError::NotFound(_)) => {
            ("Snapshot not found", "SnapshotNotFoundError")
        }
        Error::Snapshot(_) => ("Invalid request", "SnapshotError"),
        Error::Webhook(_) => ("Invalid callback_url", "InvalidArgument"),
        Error::Cloud(c) if c.is_unavailable() => ("Language not available", "CloudUnavailable"),
        Error::Cloud(_) => ("Code execution failed", "CloudError"),
        Error::Lang(L::Engine(E::Wasm(_) | E::Io { .. })) => {
            ("Unexpected error during code execution", "EngineError")
        }
    }
}

/// A sandbox that is not the caller's to use, in HOPX's not-found shape, with the id under
/// `key`; other sandbox errors keep their message.
pub fn not_found(e: &SandboxError, key: &str, id: &str) -> ToolError {
    ToolError::message(sandbox_kind(e).0, e).with(key, id)
}

fn sandbox_kind(e: &SandboxError) -> (&'static str, &'static str) {
    match e {
        SandboxError::NotFound(_) => ("Sandbox not found", "SandboxNotFoundError"),
        _ => ("Invalid request", "SandboxError"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_goes_under_the_keys_the_tool_names() {
        let m = ToolError::message("E", "why").to_value();
        assert_eq!(m, json!({"error": "E", "message": "why"}));
        let x = ToolError::exception("E", "why")
            .with("path", "a")
            .to_value();
        assert_eq!(x, json!({"error": "E", "exception": "why", "path": "a"}));
        let b = ToolError::both("E", "why").for_run().to_value();
        assert_eq!(
            b,
            json!({"error": "E", "message": "why", "exception": "why",
                   "stdout": "", "stderr": "why", "exit_code": 1})
        );
    }

    #[test]
    fn fields_cannot_overwrite_the_title_or_the_reason() {
        let v = ToolError::message("E", "why")
            .with("error", "other")
            .with("message", "other")
            .to_value();
        assert_eq!(v, json!({"error": "E", "message": "why"}));
    }

    #[test]
    fn crate_errors_map_to_hopx_titles_and_types() {
        let e = Error::Sandbox(SandboxError::NotFound("s".into()));
        let v = ToolError::of(&e).to_value();
        assert_eq!(v["error"], "Sandbox not found");
        assert_eq!(v["exception_type"], "SandboxNotFoundError");
        assert_eq!(v["message"], e.to_string());
        let n = not_found(&SandboxError::Paused("s".into()), "id", "s").to_value();
        assert_eq!(n["error"], "Invalid request");
        assert_eq!(n["id"], "s");
    }
}
