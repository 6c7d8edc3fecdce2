//! Sandboxes' lives: create, list, get, delete, lifetime, pause and resume, and what a HOPX
//! VM would report (`ping_vm`, `get_vm_info`, the URLs a local sandbox does not have).

use std::collections::BTreeMap;

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::{IdArgs, Parameters, SandboxArgs, lenient, lenient_opt};
use super::reply::{Reply, ToolError, ToolResult, schema};
use super::server::template_names;
use super::{Target, VERSION, WasmboxServer, not_found};
use crate::Error;
use crate::sandbox::SandboxError;
use crate::sandbox::fs::rfc3339;

fn default_template() -> String {
    "code-interpreter".into()
}
fn default_sandbox_limit() -> i64 {
    100
}

#[derive(Deserialize, JsonSchema)]
pub struct CreateSandboxArgs {
    /// Template name: code-interpreter (default; python, javascript, go), python, javascript
    /// or go.
    #[serde(default)]
    pub template_id: Option<String>,
    /// Accepted for HOPX compatibility; local sandboxes have no region.
    #[serde(default)]
    #[allow(dead_code)]
    pub region: Option<String>,
    /// Lifetime in seconds (default 600); the sandbox and its files are removed after it.
    #[serde(default, deserialize_with = "lenient_opt")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<i64>,
    /// Local sandboxes have no network; true needs the HOPX cloud.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub internet_access: Option<bool>,
    /// Environment variables every execution in the sandbox sees.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Start from this snapshot (snapshot_sandbox): its files, env and session variables. The
    /// sandbox gets the snapshot's template; leave template_id out or give the same one.
    #[serde(default)]
    pub from_snapshot: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ListSandboxesArgs {
    /// At most this many (<= 0: all).
    #[serde(default = "default_sandbox_limit", deserialize_with = "lenient")]
    pub limit: i64,
    /// running, paused or quarantined (unreadable sandboxes kept at start; stdio only).
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    pub region: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct UpdateTimeoutArgs {
    pub id: String,
    /// New lifetime in seconds, counted from now.
    #[serde(deserialize_with = "lenient")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: i64,
}

#[derive(Deserialize, JsonSchema)]
pub struct PortArgs {
    pub sandbox_id: String,
    #[allow(dead_code)]
    #[serde(deserialize_with = "lenient")]
    pub port: i64,
}

/// A sandbox as HOPX describes it (SandboxInfo), plus local details. `get_sandbox` and
/// `create_sandbox` name it `id`; lists and pause/resume `sandbox_id`.
#[derive(Serialize, JsonSchema)]
pub struct SandboxReply {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// running, paused, deleted, updated, quarantined.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// local or cloud.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// What happened to the sandbox's sessions (pause saves them to disk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<String>>,
}

/// `list_sandboxes`.
#[derive(Serialize, JsonSchema)]
pub struct SandboxList {
    pub count: usize,
    /// Each as get_sandbox shows it (key sandbox_id), cloud and quarantined ones included.
    pub data: Vec<Value>,
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

#[tool_router(router = sandbox_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "create_sandbox",
        title = "Create a sandbox",
        description = "Create a persistent local sandbox (template code-interpreter: python, javascript, go). Returns its id at once; it lives timeout_seconds (default 600) and is then removed with its files.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true),
        output_schema = schema::<SandboxReply>()
    )]
    async fn create_sandbox(
        &self,
        Parameters(a): Parameters<CreateSandboxArgs>,
    ) -> ToolResult<SandboxReply> {
        if let Some(snapshot) = &a.from_snapshot {
            let sb = self
                .wasmbox
                .create_from_snapshot(
                    snapshot,
                    a.template_id.as_deref(),
                    a.timeout_seconds,
                    a.env_vars.clone().unwrap_or_default(),
                    &self.owner,
                )
                .await
                .map_err(|e| {
                    ToolError::new(json!({
                        "error": "Failed to create sandbox",
                        "exception": e.to_string(),
                        "details": {"from_snapshot": snapshot, "error_type": match e {
                            Error::Snapshot(_) => "SnapshotError",
                            Error::Sandbox(SandboxError::TooMany(_) | SandboxError::TooManyForOwner(_)) => "SandboxLimitError",
                            _ => "InvalidArgument",
                        }},
                    }))
                })?;
            return Ok(Reply::json(created(&sb)));
        }
        let template_id = a.template_id.clone().unwrap_or_else(default_template);
        let route = crate::cloud::RouteRequest {
            template: Some(&template_id),
            internet_access: a.internet_access == Some(true),
            ..Default::default()
        };
        let failed = |exception: String, kind: &str| {
            ToolError::new(json!({
                "error": "Failed to create sandbox",
                "exception": exception,
                "details": {"template_id": template_id, "error_type": kind},
            }))
        };
        if crate::cloud::decide(&route) != crate::cloud::Location::Local {
            let timeout = a.timeout_seconds.map(|t| t.max(1) as u64);
            let env = a.env_vars.clone().unwrap_or_default();
            let sb = self
                .wasmbox
                .create_cloud_sandbox(
                    &template_id,
                    timeout,
                    route.internet_access,
                    env,
                    &self.owner,
                )
                .await
                .map_err(|e| {
                    let (exception, kind) =
                        cloud_create_error(&template_id, &e, route.internet_access);
                    failed(exception, kind)
                })?;
            return Ok(Reply::json(json!({
                "id": sb.id,
                "status": "running",
                "template_id": sb.template,
                "template_name": sb.template,
                "region": null,
                "created_at": rfc3339(sb.created_at),
                "timeout_seconds": sb.timeout_seconds,
                "location": "cloud",
            })));
        }
        let env = a.env_vars.clone().unwrap_or_default();
        crate::check_env(&env).map_err(|e| failed(e.to_string(), "InvalidArgument"))?;
        let sb = self
            .wasmbox
            .sandboxes()
            .create(&template_id, a.timeout_seconds, env, &self.owner)
            .map_err(|e| {
                let kind = match e {
                    SandboxError::TemplateNotFound(_) => "TemplateNotFoundError",
                    SandboxError::TooMany(_) => "SandboxLimitError",
                    SandboxError::BadTimeout(..) | SandboxError::EnvTooLarge(_) => {
                        "InvalidArgument"
                    }
                    _ => "SandboxError",
                };
                failed(e.to_string(), kind)
            })?;
        Ok(Reply::json(created(&sb)))
    }

    #[tool(
        name = "list_sandboxes",
        title = "List sandboxes",
        description = "List live sandboxes.",
        annotations(read_only_hint = true, open_world_hint = true),
        output_schema = schema::<SandboxList>()
    )]
    async fn list_sandboxes(
        &self,
        Parameters(a): Parameters<ListSandboxesArgs>,
    ) -> ToolResult<SandboxList> {
        let wanted = |status: &str| a.status.as_deref().is_none_or(|st| st == status);
        let mut data: Vec<Value> = self
            .wasmbox
            .sandboxes()
            .list(&self.owner)
            .iter()
            .filter(|s| wanted(s.status()))
            .map(|s| json!(s.info()))
            .collect();
        for c in self.wasmbox.cloud_sandboxes() {
            if *c.owner == *self.owner && wanted("running") {
                data.push(json!({
                    "sandbox_id": c.id,
                    "template_id": c.template,
                    "template_name": c.template,
                    "status": "running",
                    "timeout_seconds": c.timeout_seconds,
                    "created_at": rfc3339(c.created_at),
                    "location": "cloud",
                }));
            }
        }
        // Unreadable sandboxes moved aside at start (the local user only): kept until deleted.
        if wanted("quarantined") {
            for q in self.wasmbox.sandboxes().quarantined(&self.owner) {
                data.push(json!({
                    "sandbox_id": q.id,
                    "status": "quarantined",
                    "reason": q.reason,
                    "quarantined_at": rfc3339(q.quarantined_at),
                    "path": q.path,
                    "location": "local",
                    "message": "its files were kept; delete_sandbox removes them",
                }));
            }
        }
        if a.limit > 0 {
            data.truncate(a.limit as usize);
        }
        Ok(Reply::new(SandboxList {
            count: data.len(),
            data,
        }))
    }

    #[tool(
        name = "get_sandbox",
        title = "Get a sandbox",
        description = "Details of a sandbox (status, lifetime, workspace usage).",
        annotations(read_only_hint = true, open_world_hint = true),
        output_schema = schema::<SandboxReply>()
    )]
    async fn get_sandbox(&self, Parameters(a): Parameters<IdArgs>) -> ToolResult<SandboxReply> {
        let sb = match self.target(&a.id, "id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => return self.info_in_cloud(&c).await,
        };
        let mut v = json!(sb.info());
        let id = v.as_object_mut().and_then(|m| m.remove("sandbox_id"));
        v["id"] = json!(id);
        Ok(Reply::json(v))
    }

    #[tool(
        name = "delete_sandbox",
        title = "Delete a sandbox",
        description = "Delete a sandbox: its running code is stopped and its files removed.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = true),
        output_schema = schema::<SandboxReply>()
    )]
    async fn delete_sandbox(&self, Parameters(a): Parameters<IdArgs>) -> ToolResult<SandboxReply> {
        if let Ok(Target::Cloud(c)) = self.target(&a.id, "id") {
            let work = async {
                c.sandbox.delete().await?;
                self.wasmbox.forget_cloud_sandbox(&c.id);
                Ok(json!({"status": "deleted", "id": c.id}))
            };
            return self.in_cloud("delete_sandbox", &c, work).await;
        }
        self.wasmbox
            .sandboxes()
            .delete(&a.id, &self.owner)
            .map_err(|e| not_found(&e, "id", &a.id))?;
        Ok(Reply::json(json!({"status": "deleted", "id": a.id})))
    }

    #[tool(
        name = "update_sandbox_timeout",
        title = "Set a sandbox's lifetime",
        description = "Set a sandbox's remaining lifetime (seconds from now).",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false),
        output_schema = schema::<SandboxReply>()
    )]
    async fn update_sandbox_timeout(
        &self,
        Parameters(a): Parameters<UpdateTimeoutArgs>,
    ) -> ToolResult<SandboxReply> {
        self.local_sandbox(&a.id, "id", "update_sandbox_timeout")?;
        let sb = self
            .wasmbox
            .sandboxes()
            .set_timeout(&a.id, &self.owner, a.timeout_seconds)
            .map_err(|e| not_found(&e, "id", &a.id))?;
        Ok(Reply::json(json!({
            "id": a.id,
            "timeout_seconds": a.timeout_seconds,
            "status": "updated",
            "expires_at": rfc3339(sb.expires_at()),
        })))
    }

    #[tool(
        name = "pause_sandbox",
        title = "Pause a sandbox",
        description = "Pause a sandbox: executions are refused until resume_sandbox. Its Python and JavaScript sessions are saved to disk and their memory freed; the first call after resume_sandbox restores them, variables included (also after a server restart).",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false),
        output_schema = schema::<SandboxReply>()
    )]
    async fn pause_sandbox(&self, Parameters(a): Parameters<IdArgs>) -> ToolResult<SandboxReply> {
        self.local_sandbox(&a.id, "id", "pause_sandbox")?;
        let (sb, notes) = self
            .wasmbox
            .pause_sandbox(&a.id, &self.owner)
            .await
            .map_err(|e| match e {
                Error::Sandbox(e) => not_found(&e, "id", &a.id),
                e => ToolError::new(json!({
                    "error": "Failed to pause sandbox",
                    "message": e.to_string(),
                    "id": a.id,
                })),
            })?;
        let mut v = json!(sb.info());
        let notes: Vec<String> = notes.into_iter().filter(|n| !n.is_empty()).collect();
        if !notes.is_empty() {
            v["notes"] = json!(notes);
        }
        Ok(Reply::json(v))
    }

    #[tool(
        name = "resume_sandbox",
        title = "Resume a sandbox",
        description = "Resume a paused sandbox.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false),
        output_schema = schema::<SandboxReply>()
    )]
    async fn resume_sandbox(&self, Parameters(a): Parameters<IdArgs>) -> ToolResult<SandboxReply> {
        self.local_sandbox(&a.id, "id", "resume_sandbox")?;
        self.set_paused(&a.id, false)
    }

    #[tool(
        name = "ping_vm",
        title = "Ping a sandbox",
        description = "Check that a sandbox is alive.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<VmReply>()
    )]
    async fn ping_vm(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolResult<VmReply> {
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "ping_vm")?;
        Ok(Reply::json(json!({
            "status": "ok",
            "agent_version": VERSION,
            "agent": "wasmbox",
            "features": sb.template.languages,
            "uptime": self.wasmbox.uptime().as_secs_f64(),
        })))
    }

    #[tool(
        name = "get_vm_info",
        title = "What a sandbox runs",
        description = "What a sandbox runs: template, languages, runtimes, limits.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<VmReply>()
    )]
    async fn get_vm_info(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolResult<VmReply> {
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "get_vm_info")?;
        let cfg = self.wasmbox.config();
        Ok(Reply::json(json!({
            "agent": "wasmbox",
            "agent_version": VERSION,
            "sandbox_id": sb.id,
            "template": sb.template.id,
            "languages": sb.template.languages,
            "runtimes": self.runtimes_json(),
            "network": false,
            "limits": {
                "default_timeout_seconds": cfg.default_limits.timeout.as_secs(),
                "max_timeout_seconds": cfg.max_timeout.as_secs(),
                "memory_mb": cfg.default_limits.memory_bytes / crate::config::MIB,
                "output_bytes": cfg.default_limits.output_bytes,
                "disk_bytes": sb.fs.quota().max_bytes,
                "files": sb.fs.quota().max_entries,
            },
        })))
    }

    #[tool(
        name = "get_preview_url",
        title = "Preview URL (none locally)",
        description = "HOPX preview URLs do not exist locally: local sandboxes have no network.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_preview_url(
        &self,
        Parameters(a): Parameters<PortArgs>,
    ) -> Result<Reply<Value>, ToolError> {
        Err(self.no_url("get_preview_url", &a.sandbox_id))
    }

    #[tool(
        name = "get_agent_url",
        title = "Agent URL (none locally)",
        description = "HOPX agent URLs do not exist locally: the sandbox is served by this process.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_agent_url(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Reply<Value>, ToolError> {
        Err(self.no_url("get_agent_url", &a.sandbox_id))
    }
}

/// `create_sandbox`'s reply for a local sandbox (also `fork_sandbox`'s).
pub(super) fn created(sb: &crate::sandbox::Sandbox) -> Value {
    json!({
        "id": sb.id,
        "status": sb.status(),
        "template_id": sb.template.id,
        "template_name": sb.template.id,
        "region": "local",
        "created_at": rfc3339(sb.created_at),
        "timeout_seconds": sb.timeout().as_secs(),
        "expires_at": rfc3339(sb.expires_at()),
        "languages": sb.template.languages,
        "location": "local",
    })
}

impl WasmboxServer {
    fn set_paused(&self, id: &str, paused: bool) -> ToolResult<SandboxReply> {
        let sb = self
            .wasmbox
            .sandboxes()
            .set_paused(id, &self.owner, paused)
            .map_err(|e| not_found(&e, "id", id))?;
        Ok(Reply::json(json!(sb.info())))
    }

    /// Preview and agent URLs: a sandbox here has neither (no network, no agent process).
    fn no_url(&self, tool: &str, sandbox_id: &str) -> ToolError {
        if let Err(e) = self.local_sandbox(sandbox_id, "sandbox_id", tool) {
            return e;
        }
        ToolError::new(json!({
            "error": if tool == "get_preview_url" { "Failed to get preview URL" } else { "Failed to get agent URL" },
            "exception": "local sandboxes have no network and no agent URL: code runs inside this wasmbox process. Use the file and execute tools instead.",
            "sandbox_id": sandbox_id,
        }))
    }
}

/// Why a cloud sandbox could not be created, as (exception, error_type).
fn cloud_create_error(template: &str, e: &Error, internet: bool) -> (String, &'static str) {
    let unavailable = matches!(e, Error::Cloud(c) if c.is_unavailable());
    // Without the cloud, an unknown name is most likely a typo of a local one.
    if unavailable && !internet {
        return (
            format!(
                "Template '{template}' not found locally. Local templates: {}. Other templates exist only in the HOPX cloud: {e}",
                template_names()
            ),
            "TemplateNotFoundError",
        );
    }
    if unavailable {
        return (e.to_string(), "CloudUnavailable");
    }
    use crate::cloud::CloudError as C;
    let kind = match e {
        Error::Cloud(C::TooManySandboxes { .. } | C::TooManyForOwner { .. }) => "SandboxLimitError",
        Error::Cloud(C::BadTimeout { .. }) => "InvalidArgument",
        _ => "CloudError",
    };
    (e.to_string(), kind)
}
