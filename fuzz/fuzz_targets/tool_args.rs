//! Tool arguments and the JSON-RPC messages that carry them. Never a panic; errors are errors.
//!
//! Every input is used three ways:
//! 1. As the byte stream a client sends to `wasmbox serve`: rmcp's line codec decodes it into
//!    client messages, fed whole and again in two chunks (the messages must not depend on how
//!    the bytes arrived); each message serialises and parses again.
//! 2. As JSON text: if it parses, its value goes through the argument parser of every tool
//!    (a parse error must be a tool error).
//! 3. As raw material for `arbitrary`: a tool and a structured JSON object of arguments, whose
//!    keys are mostly the tools' real parameter names.
//!
//! Tool calls (from 1 and 3) of the tools that run no code go to a real `WasmboxServer`
//! (offline, no runtimes, sandboxes in a temp dir, stdio's owner): its answer must be a tool result with a JSON
//! object, and one with `isError` must carry an `error` key. Where the arguments do not parse,
//! the answer is the parser's error. A string "SANDBOX" as `sandbox_id` or `id` is replaced with
//! the id of a live sandbox, so the fuzzer reaches past the lookup. The tools that run code
//! (`execute_code*`, `run_command*`) only have their arguments parsed.

#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    JsonRpcMessage, NumberOrString,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::async_rw::JsonRpcMessageCodec;
use serde_json::{Map, Value};
use tokio_util::codec::Decoder;
use wasmbox::engine::cpu::LOCAL_OWNER;
use wasmbox::mcp::WasmboxServer;
use wasmbox::mcp::tools::fuzz_args::tool_names;

const PLACEHOLDER: &str = "SANDBOX";

struct Fixture {
    _t: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    wasmbox: wasmbox::Wasmbox,
    server: WasmboxServer,
    /// A peer for the calls' request contexts; nothing goes through it.
    running: RunningService<rmcp::RoleServer, WasmboxServer>,
    _other_end: tokio::io::DuplexStream,
    tools: Vec<String>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let mut config = wasmbox::Config::from_env();
        config.runtimes_dir = t.path().join("no-runtimes");
        config.cache_dir = t.path().join("cache");
        config.pooled_instances = 0;
        config.cloud.api_key = None;
        config.cloud.offline = true;
        config.sandbox.max_live = 4;
        config.sandbox.max_per_owner = 4;
        // Sandboxes in a temporary directory (under TMPDIR), not the user's data directory.
        config.sandbox.data_dir = None;
        config.sandbox.quota.max_bytes = 1 << 20;
        config.sandbox.quota.max_entries = 100;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let wasmbox = rt
            .block_on(async { wasmbox::Wasmbox::new(config) })
            .unwrap();
        let server = WasmboxServer::new(wasmbox.clone());
        let (io, other_end) = tokio::io::duplex(1024);
        let running =
            rt.block_on(async { rmcp::service::serve_directly(server.clone(), io, None) });
        Fixture {
            _t: t,
            rt,
            wasmbox,
            server,
            running,
            _other_end: other_end,
            tools: tool_names(),
        }
    })
}

/// No sandbox but one fresh one, whose id is returned.
fn reset(f: &Fixture) -> String {
    let sandboxes = f.wasmbox.sandboxes();
    for sb in sandboxes.list(LOCAL_OWNER) {
        let _ = sandboxes.delete(&sb.id, LOCAL_OWNER);
    }
    sandboxes
        .create("code-interpreter", Some(600), BTreeMap::new(), LOCAL_OWNER)
        .expect("creating the fixture sandbox")
        .id
        .clone()
}

/// A request context of the fixture's server.
fn context(f: &Fixture) -> RequestContext<rmcp::RoleServer> {
    RequestContext::new(NumberOrString::Number(1), f.running.peer().clone())
}

fn runs_code(tool: &str) -> bool {
    tool.starts_with("execute_code") || tool.starts_with("run_command")
}

/// Parses the arguments, and for a tool that runs no code, dispatches the call and checks the
/// answer.
fn call(f: &Fixture, sandbox_id: &str, tool: &str, mut args: Map<String, Value>) {
    for key in ["sandbox_id", "id"] {
        if let Some(v) = args.get_mut(key)
            && v == PLACEHOLDER
        {
            *v = Value::String(sandbox_id.to_string());
        }
    }
    let parsed = f
        .server
        .parse_tool_args(tool, Value::Object(args.clone()), context(f));
    if let Err(e) = &parsed {
        check_result(tool, e);
        assert_eq!(
            e.is_error,
            Some(true),
            "{tool}: a parse error that is no error"
        );
    }
    if runs_code(tool) {
        return;
    }
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    let r = match f.rt.block_on(f.server.call_tool(params, context(f))) {
        Ok(CallToolResponse::Complete(r)) => r,
        other => panic!("{tool}: not a tool result: {other:?}"),
    };
    check_result(tool, &r);
    match parsed {
        // The same error as dispatch's: the parser is the one dispatch uses.
        Err(e) if f.tools.iter().any(|t| t == tool) => assert_eq!(
            payload(tool, &r),
            payload(tool, &e),
            "{tool}: dispatch and parse_tool_args disagree"
        ),
        Err(e) => assert_eq!(
            payload(tool, &r)["error"],
            payload(tool, &e)["error"],
            "{tool}: an unknown tool"
        ),
        Ok(()) => {}
    }
}

/// A result's JSON object: `structuredContent` for an answer, the text block for an error (errors
/// carry no `structuredContent`, which clients would check against the tool's output schema).
fn payload(tool: &str, r: &CallToolResult) -> Value {
    if r.is_error == Some(true) {
        assert!(
            r.structured_content.is_none(),
            "{tool}: an error with structuredContent: {r:?}"
        );
        let text = r.content.first().and_then(|c| c.as_text());
        let text = text.unwrap_or_else(|| panic!("{tool}: an error without a text block: {r:?}"));
        serde_json::from_str(&text.text)
            .unwrap_or_else(|e| panic!("{tool}: an error whose text is not JSON ({e}): {r:?}"))
    } else {
        r.structured_content
            .clone()
            .unwrap_or_else(|| panic!("{tool}: no structuredContent in {r:?}"))
    }
}

fn check_result(tool: &str, r: &CallToolResult) {
    let Value::Object(v) = payload(tool, r) else {
        panic!("{tool}: no JSON object in {r:?}");
    };
    assert!(!r.content.is_empty(), "{tool}: no content");
    if r.is_error == Some(true) {
        assert!(
            v.get("error").is_some_and(Value::is_string),
            "{tool}: an error without an `error` key: {v:?}"
        );
    }
    serde_json::to_string(r).expect("a tool result serialises");
}

/// Decodes a client byte stream the way the stdio transport does, in the given chunks.
fn decode(chunks: &[&[u8]]) -> Vec<Result<Value, String>> {
    let mut codec = JsonRpcMessageCodec::<ClientJsonRpcMessage>::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut push = |r: Result<Option<ClientJsonRpcMessage>, _>| match r {
        Ok(Some(m)) => {
            let v = serde_json::to_value(&m).expect("a decoded message serialises");
            let back: ClientJsonRpcMessage =
                serde_json::from_value(v.clone()).expect("a serialised message parses again");
            drop(back);
            out.push(Ok(v));
            true
        }
        Ok(None) => false,
        Err(e) => {
            out.push(Err(format!("{e:?}")
                .split('(')
                .next()
                .unwrap_or("")
                .to_string()));
            true
        }
    };
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        for _ in 0..10_000 {
            let before = buf.len();
            if !push(codec.decode(&mut buf)) && buf.len() == before {
                break;
            }
        }
    }
    for _ in 0..10_000 {
        let before = buf.len();
        if !push(codec.decode_eof(&mut buf)) && buf.len() == before {
            break;
        }
    }
    out
}

/// A tools/call among client messages: its tool name and arguments.
fn tool_call(m: &Value) -> Option<(String, Map<String, Value>)> {
    let msg: ClientJsonRpcMessage = serde_json::from_value(m.clone()).ok()?;
    let JsonRpcMessage::Request(req) = msg else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = req.request else {
        return None;
    };
    Some((
        call.params.name.into_owned(),
        call.params.arguments.unwrap_or_default(),
    ))
}

/// A JSON value for arguments: keys mostly real parameter names, values of every type.
#[derive(Debug)]
struct Json(Value);

const KEYS: &[&str] = &[
    "sandbox_id",
    "id",
    "code",
    "language",
    "mode",
    "timeout",
    "env",
    "echo",
    "working_dir",
    "name",
    "template_name",
    "template_id",
    "internet_access",
    "region",
    "callback_url",
    "timeout_seconds",
    "env_vars",
    "limit",
    "status",
    "fields",
    "max_results",
    "process_id",
    "path",
    "content",
    "content_base64",
    "merge",
    "command",
    "port",
    "capture_rich",
];

impl Json {
    fn value(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Value> {
        let pick = u.int_in_range(0..=if depth == 0 { 6 } else { 8 })?;
        Ok(match pick {
            0 => Value::Null,
            1 => Value::Bool(u.arbitrary()?),
            2 => Value::from(u.arbitrary::<i64>()?),
            3 => Value::from(u.arbitrary::<u64>()?),
            4 => serde_json::Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
            5 => Value::String(u.arbitrary()?),
            6 => Value::String(
                u.choose(&[
                    PLACEHOLDER,
                    "python",
                    "javascript",
                    "go",
                    "bash",
                    "/workspace/a.txt",
                    "../etc/passwd",
                    "/tmp/x",
                    "code-interpreter",
                    "persistent",
                    "aGVsbG8=",
                    "http://127.0.0.1:9/cb",
                ])?
                .to_string(),
            ),
            7 => Value::Array(
                (0..u.int_in_range(0..=4)?)
                    .map(|_| Self::value(u, depth - 1))
                    .collect::<arbitrary::Result<_>>()?,
            ),
            _ => Value::Object(Self::object(u, depth - 1)?),
        })
    }

    fn object(u: &mut Unstructured, depth: u32) -> arbitrary::Result<Map<String, Value>> {
        let mut m = Map::new();
        for _ in 0..u.int_in_range(0..=6)? {
            let key = if u.ratio(1, 8)? {
                u.arbitrary::<String>()?
            } else {
                u.choose(KEYS)?.to_string()
            };
            m.insert(key, Self::value(u, depth)?);
        }
        Ok(m)
    }
}

impl<'a> Arbitrary<'a> for Json {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Json(Value::Object(Self::object(u, 3)?)))
    }
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let sandbox_id = reset(f);

    // 1. The stdio byte stream.
    let whole = decode(&[data]);
    let cut = data.len() / 3;
    let chunked = decode(&[&data[..cut], &data[cut..]]);
    assert_eq!(
        whole, chunked,
        "the messages depend on how the bytes arrived"
    );
    for (tool, args) in whole.iter().flatten().filter_map(tool_call).take(16) {
        call(f, &sandbox_id, &tool, args);
    }

    // 2. JSON text as every tool's arguments.
    if let Ok(v) = serde_json::from_slice::<Value>(data) {
        for tool in &f.tools {
            let parsed = f.server.parse_tool_args(tool, v.clone(), context(f));
            if let Err(e) = &parsed {
                check_result(tool, e);
            }
        }
    }

    // 3. Structured arguments for a tool.
    let mut u = Unstructured::new(data);
    if let (Ok(tool), Ok(Json(Value::Object(args)))) = (u.choose(&f.tools), Json::arbitrary(&mut u))
    {
        call(f, &sandbox_id, tool, args);
    }
});
