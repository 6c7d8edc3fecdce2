//! How a tool answers: [`Reply`] (a typed HOPX result, as 2-space-indented JSON text plus
//! `structuredContent`, and any image blocks) or [`ToolError`] (HOPX's error JSON, `isError`).

use std::marker::PhantomData;
use std::sync::Arc;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

/// A tool's answer of type `T`. It holds `T` as JSON because the answer is fitted to the
/// result budget after it is built (long output cut, lists shortened); `T` gives the schema.
pub struct Reply<T> {
    value: Value,
    images: Vec<ContentBlock>,
    shape: PhantomData<fn() -> T>,
}

impl<T: Serialize> Reply<T> {
    pub fn new(t: T) -> Self {
        Self::json(serde_json::to_value(t).unwrap_or_else(|e| json!({"error": e.to_string()})))
    }
}

impl<T> Reply<T> {
    /// An answer already in `T`'s shape as JSON.
    pub fn json(value: Value) -> Self {
        Reply {
            value,
            images: Vec::new(),
            shape: PhantomData,
        }
    }

    /// The answer's JSON, without its images.
    pub fn into_value(self) -> Value {
        self.value
    }

    /// Image blocks after the text block, in order (`(base64, mime)`).
    pub fn with_images(mut self, images: impl IntoIterator<Item = (String, String)>) -> Self {
        self.images.extend(
            images
                .into_iter()
                .map(|(b64, mime)| ContentBlock::image(b64, mime)),
        );
        self
    }
}

impl<T> IntoCallToolResult for Reply<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let mut r = ok_result(self.value);
        r.content.extend(self.images);
        Ok(r.into())
    }
}

/// A failed call in HOPX's error shape (`error`, `message`/`exception`, ...), sent with
/// `isError: true` so that clients and models see it failed.
#[derive(Debug)]
pub struct ToolError(pub Value);

impl ToolError {
    pub fn new(value: Value) -> Self {
        ToolError(value)
    }

    /// A field added to the error object.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Self {
        if let Value::Object(m) = &mut self.0 {
            m.insert(key.into(), json!(value));
        }
        self
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(error_result(self.0).into())
    }
}

/// What every tool function returns.
pub type ToolResult<T> = Result<Reply<T>, ToolError>;

/// `T`'s output schema, as `tools/list` shows it.
pub fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::tool::schema_for_output::<T>()
}

/// A result object as HOPX sends it (2-space-indented JSON text) plus `structuredContent`.
pub fn ok_result(value: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(pretty(&value))]);
    r.structured_content = Some(value);
    r
}

/// An error goes as its text block only: the TypeScript SDK (the MCP Inspector, and the clients
/// built on it) validates any `structuredContent` against the tool's output schema, errors
/// included, and then reports a protocol error instead of ours.
pub fn error_result(value: Value) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(pretty(&value))])
}

/// The last step of every tool call: the text block, and `structuredContent` (the same
/// object), fitted to `budget` bytes whatever a field holds (guest output, a note, a message
/// quoting a name), by [`crate::fit::fit_value`], so that no field the tool forgot to fit can
/// fill a client's context. Fields are cut, never dropped, so the answer keeps its schema;
/// one that has `truncated` says so.
pub fn fit_result(r: &mut CallToolResult, budget: usize) {
    let Some(text) = r.content.first().and_then(|c| c.as_text()) else {
        return;
    };
    if text.text.len() <= budget {
        return;
    }
    let structured = r.structured_content.is_some();
    let value = match r.structured_content.take() {
        Some(v) => Ok(v),
        None => serde_json::from_str::<Value>(&text.text).map_err(|_| text.text.clone()),
    };
    match value {
        Ok(mut v) => {
            if crate::fit::fit_value(&mut v, budget)
                && matches!(v.get("truncated"), Some(Value::Bool(_)))
            {
                v["truncated"] = json!(true);
            }
            r.content[0] = ContentBlock::text(pretty(&v));
            if structured {
                r.structured_content = Some(v);
            }
        }
        // Prose (not ours): cut as it is; JSON measures at least its length.
        Err(text) => {
            if let Some((cut, _)) = crate::fit::elide_middle(&text, None, budget) {
                r.content[0] = ContentBlock::text(cut);
            }
        }
    }
}

/// The JSON object a result's text block carries (every answer of ours has one).
pub fn text_json(r: &CallToolResult) -> Option<Value> {
    let text = r.content.first()?.as_text()?;
    serde_json::from_str(&text.text).ok()
}

pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// Runs a tool's disk work on tokio's blocking pool: a slow disk, a quota walk over thousands of
/// files or a large read must not hold one of the few runtime workers every other call needs.
pub async fn on_disk<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        tracing::error!("a file operation did not finish: {e}");
        Err(ToolError::new(json!({
            "error": "Internal error",
            "message": "the file operation failed unexpectedly; the server log has the details",
        })))
    })
}

/// How many of `total` entries HOPX's `max_results` asks for (<= 0: all).
pub fn max_results(max: i64, total: usize) -> usize {
    if max > 0 {
        total.min(max as usize)
    } else {
        total
    }
}

/// Bytes of JSON each of stdout and stderr may take when `n` processes share a `budget`: what
/// their other fields (about 1 KB each) leave, split evenly, but enough to say something; the
/// list then holds as many entries as fit.
pub fn output_share(budget: usize, n: usize) -> usize {
    ((budget / n.max(1)).saturating_sub(1024) / 2).max(128)
}

/// A HOPX list answer: `answer`'s fields plus `count`, the entries under `key`, `truncated` and
/// `total_<key>`, holding entries while its text fits `budget` bytes. Cut short (by
/// max_results or the budget), it says so: `truncated: true` and no total, as HOPX does.
pub fn fit_list(
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
