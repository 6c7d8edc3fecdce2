//! What a HOPX VM would report of a local sandbox: `ping_vm`, `get_vm_info`, and the preview and
//! agent URLs a local sandbox does not have.

use std::collections::BTreeMap;

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::{Parameters, SandboxArgs, lenient};
use super::error::ToolError;
use super::reply::Json;
use super::{VERSION, WasmboxServer};

#[derive(Deserialize, JsonSchema)]
pub struct PortArgs {
    pub sandbox_id: String,
    #[allow(dead_code)]
    #[serde(deserialize_with = "lenient")]
    pub port: i64,
}

/// `ping_vm` and `get_vm_info`: the agent HOPX would run, here this process.
#[derive(Serialize, JsonSchema)]
pub struct VmReply {
    pub agent: String,
    pub agent_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(flatten)]
    pub details: BTreeMap<String, Value>,
}

impl VmReply {
    /// This process as the agent, and `details` (an object) beside it.
    fn new(status: Option<&str>, details: Value) -> Self {
        let Value::Object(details) = details else {
            unreachable!("details are an object")
        };
        VmReply {
            agent: "wasmbox".into(),
            agent_version: VERSION.into(),
            status: status.map(Into::into),
            details: details.into_iter().collect(),
        }
    }
}

#[tool_router(router = vm_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "ping_vm",
        title = "Ping a sandbox",
        description = "Check that a sandbox is alive.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn ping_vm(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Json<VmReply>, ToolError> {
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "ping_vm")?;
        Ok(Json::new(VmReply::new(
            Some("ok"),
            json!({
                "features": sb.template.languages,
                "uptime": self.wasmbox.uptime().as_secs_f64(),
            }),
        )))
    }

    #[tool(
        name = "get_vm_info",
        title = "What a sandbox runs",
        description = "What a sandbox runs: template, languages, runtimes, limits.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_vm_info(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Json<VmReply>, ToolError> {
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "get_vm_info")?;
        let cfg = self.wasmbox.config();
        Ok(Json::new(VmReply::new(
            None,
            json!({
            "sandbox_id": sb.id,
            "template": sb.template.id,
            "languages": sb.template.languages,
            "runtimes": self.runtimes(),
            "network": false,
            "limits": {
                "default_timeout_seconds": cfg.default_limits.timeout.as_secs(),
                "max_timeout_seconds": cfg.max_timeout.as_secs(),
                "memory_mb": cfg.default_limits.memory_bytes / crate::config::MIB,
                "output_bytes": cfg.default_limits.output_bytes,
                "disk_bytes": sb.fs.quota().max_bytes,
                "files": sb.fs.quota().max_entries,
            },
            }),
        )))
    }

    #[tool(
        name = "get_preview_url",
        title = "Preview URL (none locally)",
        description = "HOPX preview URLs do not exist locally: local sandboxes have no network.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_preview_url(&self, Parameters(a): Parameters<PortArgs>) -> ToolError {
        self.no_url("get_preview_url", &a.sandbox_id)
    }

    #[tool(
        name = "get_agent_url",
        title = "Agent URL (none locally)",
        description = "HOPX agent URLs do not exist locally: the sandbox is served by this process.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_agent_url(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolError {
        self.no_url("get_agent_url", &a.sandbox_id)
    }
}

impl WasmboxServer {
    /// Preview and agent URLs: a sandbox here has neither (no network, no agent process).
    fn no_url(&self, tool: &str, sandbox_id: &str) -> ToolError {
        if let Err(e) = self.local_sandbox(sandbox_id, "sandbox_id", tool) {
            return e;
        }
        let error = if tool == "get_preview_url" {
            "Failed to get preview URL"
        } else {
            "Failed to get agent URL"
        };
        ToolError::exception(error, "local sandboxes have no network and no agent URL: code runs inside this wasmbox process. Use the file and execute tools instead.")
            .with("sandbox_id", sandbox_id)
    }
}
