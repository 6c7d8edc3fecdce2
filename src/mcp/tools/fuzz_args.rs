//! For the fuzz targets (`fuzz/`), not an API: a tool's arguments parsed exactly as the tool
//! parses them, without running anything. The names come from the router, and a test checks
//! that every routed tool has its parser here.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::args::{IdArgs, OptionalSandboxArgs, SandboxArgs};
use super::cloud::parse;
use super::commands::{KillArgs, ProcessesArgs, RunCommandArgs};
use super::env::EnvSetArgs;
use super::exec::{
    ExecuteAsyncArgs, ExecuteCodeArgs, ExecuteCodeIsolatedArgs, ExecuteInSandboxArgs,
};
use super::files::{FileListArgs, FileUploadArgs, FileWriteArgs, PathArgs, ReadArgs};
use super::reply::error_result;
use super::sandboxes::{CreateSandboxArgs, ListSandboxesArgs, PortArgs, UpdateTimeoutArgs};
use super::server::{GetTemplateArgs, ListTemplatesArgs, MetricsArgs};
use super::snapshots::SnapshotArgs;
use super::{CallToolResult, WasmboxServer};

/// Every tool name the server routes.
pub fn tool_names() -> Vec<String> {
    WasmboxServer::tool_names()
}

/// Parses `args` (a tools/call's `arguments`, which MCP makes an object) into `tool`'s argument
/// type. The error is the tool result the call would answer with; an unknown tool is `Err` too.
pub fn parse_tool_args(tool: &str, args: Value) -> Result<(), CallToolResult> {
    fn p<T: DeserializeOwned>(
        tool: &str,
        args: serde_json::Map<String, Value>,
    ) -> Result<(), CallToolResult> {
        parse::<T>(tool, args).map(drop)
    }
    let Value::Object(args) = args else {
        return Err(error_result(json!({
            "error": "Invalid arguments",
            "message": format!("Error executing tool {tool}: arguments must be an object"),
        })));
    };
    match tool {
        "execute_code" => p::<ExecuteCodeArgs>(tool, args),
        "execute_code_isolated" => p::<ExecuteCodeIsolatedArgs>(tool, args),
        "execute_code_persistent" | "execute_code_rich" | "execute_code_background" => {
            p::<ExecuteInSandboxArgs>(tool, args)
        }
        "execute_code_async" => p::<ExecuteAsyncArgs>(tool, args),
        "create_sandbox" => p::<CreateSandboxArgs>(tool, args),
        "list_sandboxes" => p::<ListSandboxesArgs>(tool, args),
        "get_sandbox" | "delete_sandbox" | "pause_sandbox" | "resume_sandbox" => {
            p::<IdArgs>(tool, args)
        }
        "update_sandbox_timeout" => p::<UpdateTimeoutArgs>(tool, args),
        "list_templates" => p::<ListTemplatesArgs>(tool, args),
        "get_template" => p::<GetTemplateArgs>(tool, args),
        "execute_list_processes" | "list_processes" => p::<ProcessesArgs>(tool, args),
        "execute_kill_process" => p::<KillArgs>(tool, args),
        "file_read" | "file_download" => p::<ReadArgs>(tool, args),
        "file_exists" | "file_remove" | "file_mkdir" => p::<PathArgs>(tool, args),
        "file_write" => p::<FileWriteArgs>(tool, args),
        "file_upload" => p::<FileUploadArgs>(tool, args),
        "file_list" => p::<FileListArgs>(tool, args),
        "env_get" | "env_clear" | "ping_vm" | "get_vm_info" | "get_agent_url" | "fork_sandbox"
        | "snapshot_sandbox" => p::<SandboxArgs>(tool, args),
        "delete_snapshot" => p::<SnapshotArgs>(tool, args),
        "env_set" => p::<EnvSetArgs>(tool, args),
        "run_command" | "run_command_background" => p::<RunCommandArgs>(tool, args),
        // It reads no arguments.
        "health" | "list_snapshots" => Ok(()),
        "get_system_metrics" => p::<MetricsArgs>(tool, args),
        "cache_stats" | "cache_clear" => p::<OptionalSandboxArgs>(tool, args),
        "get_preview_url" => p::<PortArgs>(tool, args),
        other => Err(error_result(json!({
            "error": "Unknown tool",
            "message": format!("Unknown tool: {other}"),
        }))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_for_every_routed_tool() {
        let names = tool_names();
        assert_eq!(names.len(), 43, "{names:?}");
        for name in &names {
            match parse_tool_args(name, json!({"sandbox_id": 1})) {
                Ok(()) => {}
                Err(r) => assert_eq!(
                    crate::mcp::tools::reply::text_json(&r).unwrap()["error"],
                    "Invalid arguments",
                    "{name} has no parser here"
                ),
            }
        }
        assert!(parse_tool_args("file_read", json!({"sandbox_id": "x", "path": "a"})).is_ok());
        assert!(parse_tool_args("nope", json!({})).is_err());
        assert!(parse_tool_args("health", json!([])).is_err());
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
