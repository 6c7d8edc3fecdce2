//! A sandbox's environment variables, which every later execution in it sees.

use std::collections::BTreeMap;

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::args::{Parameters, SandboxArgs, lenient};
use super::error::ToolError;
use super::reply::Json;
use super::{Target, WasmboxServer};

fn default_true() -> bool {
    true
}

#[derive(Deserialize, JsonSchema)]
pub struct EnvSetArgs {
    pub sandbox_id: String,
    #[serde(deserialize_with = "lenient")]
    pub env_vars: BTreeMap<String, String>,
    /// true (default): add to the existing variables; false: replace them all.
    #[serde(default = "default_true", deserialize_with = "lenient")]
    pub merge: bool,
}

/// env_get, env_set, env_clear.
#[derive(Serialize, JsonSchema)]
pub struct EnvReply {
    /// env_get: the variables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// env_set: success; env_clear: cleared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variables_set: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_mode: Option<bool>,
}

impl EnvReply {
    /// env_set's answer, the same locally and in the cloud.
    pub fn set(vars: &BTreeMap<String, String>, merge: bool) -> Self {
        EnvReply {
            env_vars: None,
            status: Some("success".into()),
            message: Some(format!(
                "Successfully set {} environment variable(s)",
                vars.len()
            )),
            variables_set: Some(vars.keys().cloned().collect()),
            merge_mode: Some(merge),
        }
    }

    pub fn status(status: &str) -> Self {
        EnvReply {
            env_vars: None,
            status: Some(status.into()),
            message: None,
            variables_set: None,
            merge_mode: None,
        }
    }
}

#[tool_router(router = env_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "env_get",
        title = "Get environment variables",
        description = "A sandbox's environment variables.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn env_get(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Json<EnvReply>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let work = async { Ok(json!({"env_vars": c.sandbox.env_get().await?})) };
                return self.in_cloud("env_get", &c, work).await;
            }
        };
        Ok(Json::new(EnvReply {
            env_vars: Some(sb.env()),
            status: None,
            ..EnvReply::status("")
        }))
    }

    #[tool(
        name = "env_set",
        title = "Set environment variables",
        description = "Set a sandbox's environment variables (merge, or replace with merge=false); every later execution in every language sees them.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn env_set(
        &self,
        Parameters(a): Parameters<EnvSetArgs>,
    ) -> Result<Json<EnvReply>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let work = async {
                    c.sandbox.env_set(&a.env_vars, a.merge).await?;
                    Ok(json!(EnvReply::set(&a.env_vars, a.merge)))
                };
                return self.in_cloud("env_set", &c, work).await;
            }
        };
        let failed = |e: String| ToolError::exception("Failed to set environment variables", e);
        crate::check_env(&a.env_vars).map_err(|e| failed(e.to_string()))?;
        sb.set_env(&a.env_vars, a.merge)
            .map_err(|e| failed(e.to_string()))?;
        Ok(Json::new(EnvReply::set(&a.env_vars, a.merge)))
    }

    #[tool(
        name = "env_clear",
        title = "Clear environment variables",
        description = "Remove all of a sandbox's environment variables.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn env_clear(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Json<EnvReply>, ToolError> {
        match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb.clear_env(),
            Target::Cloud(c) => {
                let work = async {
                    c.sandbox.env_clear().await?;
                    Ok(json!({"status": "cleared"}))
                };
                return self.in_cloud("env_clear", &c, work).await;
            }
        }
        Ok(Json::new(EnvReply::status("cleared")))
    }
}
