//! For the fuzz targets (`fuzz/`), not an API: a tool's arguments parsed exactly as
//! [`WasmboxServer::dispatch`] parses them, without running anything.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::*;

/// Every tool name `dispatch` routes (the listed tools and their aliases).
pub const TOOL_NAMES: &[&str] = &[
    "execute_code",
    "execute_code_isolated",
    "execute_code_persistent",
    "execute_code_rich",
    "execute_code_background",
    "execute_code_async",
    "create_sandbox",
    "list_sandboxes",
    "get_sandbox",
    "delete_sandbox",
    "update_sandbox_timeout",
    "pause_sandbox",
    "resume_sandbox",
    "list_templates",
    "get_template",
    "execute_list_processes",
    "list_processes",
    "execute_kill_process",
    "file_read",
    "file_exists",
    "file_remove",
    "file_mkdir",
    "file_download",
    "file_write",
    "file_upload",
    "file_list",
    "env_get",
    "env_clear",
    "env_set",
    "run_command",
    "run_command_background",
    "health",
    "get_system_metrics",
    "cache_stats",
    "cache_clear",
    "ping_vm",
    "get_vm_info",
    "get_preview_url",
    "get_agent_url",
];

/// Parses `args` (a tools/call's `arguments`, which MCP makes an object) into `tool`'s argument
/// type. The error is the tool result `dispatch` would answer with; an unknown tool is `Err` too.
pub fn parse_tool_args(tool: &str, args: Value) -> Result<(), CallToolResult> {
    fn p<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<(), CallToolResult> {
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
        "file_read" | "file_exists" | "file_remove" | "file_mkdir" | "file_download" => {
            p::<PathArgs>(tool, args)
        }
        "file_write" => p::<FileWriteArgs>(tool, args),
        "file_upload" => p::<FileUploadArgs>(tool, args),
        "file_list" => p::<FileListArgs>(tool, args),
        "env_get" | "env_clear" | "ping_vm" | "get_vm_info" | "get_agent_url" => {
            p::<SandboxArgs>(tool, args)
        }
        "env_set" => p::<EnvSetArgs>(tool, args),
        "run_command" | "run_command_background" => p::<RunCommandArgs>(tool, args),
        // `dispatch` reads no arguments for it.
        "health" => Ok(()),
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
    fn knows_every_listed_tool() {
        let mut config = crate::Config::from_env();
        config.sandbox.data_dir = None;
        let wb = Wasmbox::new(config).unwrap();
        let server = WasmboxServer::new(wb);
        for t in server.tools.iter() {
            assert!(TOOL_NAMES.contains(&t.name.as_ref()), "{} missing", t.name);
        }
        for name in TOOL_NAMES {
            let r = parse_tool_args(name, json!({"sandbox_id": 1}));
            if let Err(r) = r {
                assert_eq!(
                    r.structured_content.unwrap()["error"],
                    "Invalid arguments",
                    "{name}"
                );
            }
        }
        assert!(parse_tool_args("file_read", json!({"sandbox_id": "x", "path": "a"})).is_ok());
        assert!(parse_tool_args("nope", json!({})).is_err());
        assert!(parse_tool_args("health", json!([])).is_err());
    }
}
