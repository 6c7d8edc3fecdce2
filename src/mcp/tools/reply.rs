//! How a tool answers: [`Json`], a typed HOPX result, as 2-space-indented JSON text plus
//! `structuredContent`, and any image blocks (a failure is a [`super::error::ToolError`]).

use std::marker::PhantomData;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use super::error::ToolError;

/// A tool's answer of type `T`. The `#[tool]` macro takes a tool's output schema from the `T` of
/// its `Result<Json<T>, _>`, and every answer is made from a `T`, so the two cannot drift. It
/// holds `T` as JSON because an answer may be fitted to the result budget once built (long
/// output cut, lists shortened), which keeps its fields and their types.
pub struct Json<T> {
    value: Value,
    images: Vec<ContentBlock>,
    shape: PhantomData<fn() -> T>,
}

impl<T: Serialize + JsonSchema> Json<T> {
    pub fn new(t: T) -> Self {
        Self::fitted(t, |_| {})
    }

    /// `t`, then `fit` on its JSON: it may shorten strings and lists and fill fields `T`
    /// declares, never add another or retype one.
    pub fn fitted(t: T, fit: impl FnOnce(&mut Value)) -> Self {
        let mut value = serde_json::to_value(t).unwrap_or_else(|e| json!({"error": e.to_string()}));
        fit(&mut value);
        Json {
            value,
            images: Vec::new(),
            shape: PhantomData,
        }
    }
}

impl<T> Json<T> {
    /// An answer of HOPX's cloud, passed on as HOPX gave it (its fields are HOPX's).
    pub(super) fn forwarded(value: Value) -> Self {
        Json {
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

impl<T> IntoCallToolResult for Json<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let mut r = ok_result(self.value);
        r.content.extend(self.images);
        Ok(r.into())
    }
}

/// A result object as HOPX sends it (2-space-indented JSON text) plus `structuredContent`.
pub fn ok_result(value: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(pretty(&value))]);
    r.structured_content = Some(value);
    r
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
        Err(ToolError::message(
            "Internal error",
            "the file operation failed unexpectedly; the server log has the details",
        ))
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

/// A HOPX list answer (`count`, the entries under `key`, `truncated`, `total_<key>`) cut to
/// the entries whose text fits `budget` bytes. Cut short (by max_results or the budget), it
/// says so: `truncated: true` and no total, as HOPX does.
pub fn fit_list(answer: &mut Value, key: &str, budget: usize) {
    let Some(Value::Array(entries)) = answer.get_mut(key).map(std::mem::take) else {
        return;
    };
    let mut truncated = answer["truncated"] == json!(true);
    answer[key] = json!([]);
    let mut used = pretty(answer).len();
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
    if truncated {
        answer[format!("total_{key}").as_str()] = Value::Null;
    }
}

/// How much of a list of `total` a HOPX list answer shows first: `max_results` of it (<= 0:
/// all), and the answer's `count`, `truncated` and `total_<key>` for that.
pub fn shown(max: i64, total: usize) -> (usize, bool, Option<usize>) {
    let shown = max_results(max, total);
    (shown, shown < total, (shown == total).then_some(total))
}
