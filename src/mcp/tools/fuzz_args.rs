//! For the fuzz targets (`fuzz/`), not an API: whether a tool's arguments parse, answered by
//! the router itself, so that no table of tools and argument types can fall behind it.

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use rmcp::RoleServer;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::service::RequestContext;
use serde_json::Value;

use super::args::{parse_only, parsed};
use super::error::ToolError;
use super::{CallToolResult, WasmboxServer};

/// Every tool name the server routes.
pub fn tool_names() -> Vec<String> {
    WasmboxServer::tool_names()
}

impl WasmboxServer {
    /// Parses `args` (a tools/call's `arguments`, which MCP makes an object) as the call to
    /// `tool` would, through the router, and stops there: no tool runs. The error is the tool
    /// result the call would answer with; an unknown tool is `Err` too. `context` only has to
    /// be one of this server's (the router wants one).
    pub fn parse_tool_args(
        &self,
        tool: &str,
        args: Value,
        context: RequestContext<RoleServer>,
    ) -> Result<(), CallToolResult> {
        let Value::Object(args) = args else {
            return Err(ToolError::message(
                "Invalid arguments",
                format!("Error executing tool {tool}: arguments must be an object"),
            )
            .into_result());
        };
        let request = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        let call = self
            .router
            .call(ToolCallContext::new(self, request, parse_only(context)));
        // Parsing is synchronous: a call that parses, or does not, is ready at its first poll.
        let Poll::Ready(answer) = pin!(call).poll(&mut Context::from_waker(Waker::noop())) else {
            panic!(
                "{tool} ran instead of parsing: its arguments are not a tools::args::Parameters"
            );
        };
        let failed = match &answer {
            Err(e) if parsed(e) => return Ok(()),
            Err(_) => true,
            Ok(CallToolResponse::Complete(r)) => r.is_error == Some(true),
            Ok(_) => false,
        };
        assert!(
            failed,
            "{tool} ran instead of parsing: its arguments are not a tools::args::Parameters"
        );
        Err(self.hopx_shaped(tool, answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A server (offline, no runtimes, sandboxes in a temp dir) and a request context of its.
    fn with_server(f: impl FnOnce(&WasmboxServer, &dyn Fn() -> RequestContext<RoleServer>)) {
        let t = tempfile::tempdir().unwrap();
        let mut config = crate::Config::from_env();
        config.runtimes_dir = t.path().join("no-runtimes");
        config.cache_dir = t.path().join("cache");
        config.pooled_instances = 0;
        config.cloud.api_key = None;
        config.cloud.offline = true;
        config.sandbox.data_dir = Some(t.path().join("data"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let server = WasmboxServer::new(crate::Wasmbox::new(config).unwrap());
            let (io, _other_end) = tokio::io::duplex(1024);
            let running = rmcp::service::serve_directly(server.clone(), io, None);
            let context = || {
                RequestContext::new(
                    rmcp::model::NumberOrString::Number(1),
                    running.peer().clone(),
                )
            };
            f(&server, &context);
        });
    }

    /// Every tool's arguments parse through the router without running it (a tool that ran
    /// would panic here, or leave a sandbox behind), and fail as the call would.
    #[test]
    fn parses_for_every_routed_tool() {
        with_server(|server, context| {
            let parse = |tool: &str, args: Value| server.parse_tool_args(tool, args, context());
            for name in tool_names() {
                for args in [
                    json!({"sandbox_id": 1}),
                    json!({}),
                    json!({"sandbox_id": "x", "id": "x", "path": "a", "code": "print(1)",
                           "command": "ls", "env_vars": {}, "port": 1, "timeout": 60,
                           "callback_url": "http://127.0.0.1:9/", "process_id": "p",
                           "snapshot_id": "s", "template_name": "code-interpreter",
                           "content": "", "language": "python"}),
                ] {
                    if let Err(r) = parse(&name, args) {
                        assert_eq!(
                            crate::mcp::tools::reply::text_json(&r).unwrap()["error"],
                            "Invalid arguments",
                            "{name}"
                        );
                    }
                }
            }
            assert!(parse("file_read", json!({"sandbox_id": "x", "path": "a"})).is_ok());
            assert!(parse("health", json!({})).is_ok());
            let r = parse("file_read", json!({"sandbox_id": "x"})).unwrap_err();
            let v = crate::mcp::tools::reply::text_json(&r).unwrap();
            assert!(v["message"].as_str().unwrap().contains("path"), "{v}");
            let r = parse("nope", json!({})).unwrap_err();
            assert_eq!(
                crate::mcp::tools::reply::text_json(&r).unwrap()["error"],
                "Unknown tool"
            );
            assert!(parse("health", json!([])).is_err());
            assert!(
                server
                    .wasmbox
                    .sandboxes()
                    .list(crate::engine::cpu::LOCAL_OWNER)
                    .is_empty(),
                "a tool ran"
            );
        });
    }

    /// A property schema that is a bare `true` (what schemars gives `serde_json::Value`) is
    /// valid JSON Schema, but the TypeScript SDK (the MCP Inspector, Claude Desktop) rejects the
    /// whole tool list over it.
    fn no_bare_schemas(v: &Value, at: &str) {
        if let Some(props) = v.get("properties").and_then(Value::as_object) {
            for (k, p) in props {
                assert!(
                    p.is_object(),
                    "{at}.{k} is {p}, which TypeScript clients refuse"
                );
                no_bare_schemas(p, &format!("{at}.{k}"));
            }
        }
        if let Some(defs) = v.get("$defs").and_then(Value::as_object) {
            for (k, d) in defs {
                no_bare_schemas(d, &format!("{at}.$defs.{k}"));
            }
        }
    }

    #[test]
    fn every_tool_is_titled_annotated_and_typed() {
        for t in WasmboxServer::router().list_all() {
            if let Some(s) = &t.output_schema {
                no_bare_schemas(&Value::Object((**s).clone()), &t.name);
            }
            no_bare_schemas(&Value::Object((*t.input_schema).clone()), &t.name);
            assert!(t.title.is_some(), "{} has no title", t.name);
            assert!(t.annotations.is_some(), "{} has no annotations", t.name);
            let url = t.name.starts_with("get_preview") || t.name.starts_with("get_agent");
            assert!(
                url || t.output_schema.is_some(),
                "{} has no output schema",
                t.name
            );
        }
    }
}
