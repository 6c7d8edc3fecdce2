//! Sandboxes' lives: create, list, get, delete, lifetime, pause and resume.

use crate::lang::mounts::Layout;
use std::collections::BTreeMap;

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::{IdArgs, Parameters, lenient, lenient_opt};
use super::error::ToolError;
use super::reply::Json;
use super::server::template_names;
use super::{Target, WasmboxServer, not_found};
use crate::Error;
use crate::sandbox::fs::rfc3339;
use crate::sandbox::{SandboxError, SandboxInfo};

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
    /// Hosts the sandbox's code may reach over HTTP, e.g. ["api.example.com"]: within what the
    /// server allows (WASMBOX_ALLOW_HOSTS; guest network is off without it). Default: all of those.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub allow_hosts: Option<Vec<String>>,
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

/// A sandbox as HOPX describes it (SandboxInfo), plus local details: `get_sandbox`,
/// `pause_sandbox` and `resume_sandbox` describe it whole (`info`); `create_sandbox` and
/// `fork_sandbox` say what was made, `delete_sandbox` and `update_sandbox_timeout` what changed.
#[derive(Serialize, JsonSchema, Default)]
pub struct SandboxReply {
    /// The sandbox's id (lists, pause and resume name it sandbox_id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub info: Option<SandboxInfo>,
    /// running, paused, deleted, updated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_name: Option<String>,
    /// local; none for a cloud sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub languages: Option<Vec<crate::Language>>,
    /// Hosts its code may reach over HTTP, when narrower than the server's list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<String>>,
    /// local or cloud.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Host folders the server lends to every sandbox (never copied by a fork or snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<MountReply>>,
    /// What happened to the sandbox's sessions (pause saves them to disk; a fork copies them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<String>>,
}

impl SandboxReply {
    /// The sandbox as HOPX describes it, with what happened to its sessions (if anything).
    fn described(info: SandboxInfo, notes: Vec<String>) -> Self {
        SandboxReply {
            info: Some(info),
            notes: (!notes.is_empty()).then_some(notes),
            ..Default::default()
        }
    }
}

/// One lent folder as the guest sees it.
#[derive(Serialize, JsonSchema, Debug, Clone)]
pub struct MountReply {
    pub path: String,
    /// ro or rw.
    pub mode: String,
    /// rw: bytes code and the file tools may still add there (WASMBOX_MOUNT_DISK_MB past what
    /// it held at start, less what was added since).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub room_bytes: Option<u64>,
}

/// What a fork or snapshot says of the lent folders: they stay the host's.
pub(super) fn mounts_note(layout: &Layout) -> Option<String> {
    (!layout.mounts.is_empty()).then(|| {
        let at: Vec<&str> = layout.mounts.iter().map(|m| m.guest.as_str()).collect();
        format!(
            "the lent folders ({}) are not copied: they are the host's, and every sandbox sees the same ones",
            at.join(", ")
        )
    })
}

/// The folders lent to a caller, when there are any.
pub(super) fn mounts(layout: &Layout) -> Option<Vec<MountReply>> {
    (!layout.mounts.is_empty()).then(|| {
        layout
            .mounts
            .iter()
            .zip(&layout.budgets)
            .map(|(m, budget)| MountReply {
                path: m.guest.clone(),
                mode: if m.writable { "rw" } else { "ro" }.into(),
                room_bytes: budget
                    .as_ref()
                    .map(|b| b.quota().max_bytes.saturating_sub(b.counted().0)),
            })
            .collect()
    })
}

/// `list_sandboxes`.
#[derive(Serialize, JsonSchema)]
pub struct SandboxList {
    pub count: usize,
    /// Each as get_sandbox shows it (key sandbox_id), cloud and quarantined ones included.
    pub data: Vec<Value>,
}

#[tool_router(router = sandbox_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "create_sandbox",
        title = "Create a sandbox",
        description = "Create a persistent local sandbox (template code-interpreter: python, javascript, go). Returns its id at once; it lives timeout_seconds (default 600) and is then removed with its files.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn create_sandbox(
        &self,
        Parameters(a): Parameters<CreateSandboxArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
        if let Some(hosts) = &a.allow_hosts {
            self.wasmbox.reach_for(Some(hosts)).map_err(|e| {
                ToolError::exception("Failed to create sandbox", e).with(
                    "details",
                    json!({"allow_hosts": hosts, "error_type": "InvalidArgument"}),
                )
            })?;
        }
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
                    let kind = match e {
                        Error::Snapshot(_) => "SnapshotError",
                        Error::Sandbox(
                            SandboxError::TooMany(_) | SandboxError::TooManyForOwner(_),
                        ) => "SandboxLimitError",
                        _ => "InvalidArgument",
                    };
                    ToolError::exception("Failed to create sandbox", e).with(
                        "details",
                        json!({"from_snapshot": snapshot, "error_type": kind}),
                    )
                })?;
            if a.allow_hosts.is_some() {
                sb.set_allow_hosts(a.allow_hosts.clone());
            }
            return Ok(Json::new(created(&sb, Vec::new())));
        }
        let template_id = a.template_id.clone().unwrap_or_else(default_template);
        let route = crate::cloud::RouteRequest {
            template: Some(&template_id),
            internet_access: a.internet_access == Some(true),
            ..Default::default()
        };
        let failed = |exception: String, kind: &str| {
            ToolError::exception("Failed to create sandbox", exception).with(
                "details",
                json!({"template_id": template_id, "error_type": kind}),
            )
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
            return Ok(Json::new(SandboxReply {
                id: Some(sb.id.clone()),
                status: Some("running".into()),
                template_id: Some(sb.template.clone()),
                template_name: Some(sb.template.clone()),
                created_at: Some(rfc3339(sb.created_at)),
                timeout_seconds: sb.timeout_seconds,
                location: Some("cloud".into()),
                ..Default::default()
            }));
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
        if a.allow_hosts.is_some() {
            sb.set_allow_hosts(a.allow_hosts.clone());
        }
        Ok(Json::new(created(&sb, Vec::new())))
    }

    #[tool(
        name = "list_sandboxes",
        title = "List sandboxes",
        description = "List live sandboxes.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn list_sandboxes(
        &self,
        Parameters(a): Parameters<ListSandboxesArgs>,
    ) -> Result<Json<SandboxList>, ToolError> {
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
        Ok(Json::new(SandboxList {
            count: data.len(),
            data,
        }))
    }

    #[tool(
        name = "get_sandbox",
        title = "Get a sandbox",
        description = "Details of a sandbox (status, lifetime, workspace usage).",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn get_sandbox(
        &self,
        Parameters(a): Parameters<IdArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
        let sb = match self.target(&a.id, "id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => return self.info_in_cloud(&c).await,
        };
        Ok(Json::new(SandboxReply {
            id: Some(sb.id.clone()),
            mounts: mounts(sb.fs.mounts()),
            ..SandboxReply::described(sb.info(), Vec::new())
        }))
    }

    #[tool(
        name = "delete_sandbox",
        title = "Delete a sandbox",
        description = "Delete a sandbox: its running code is stopped and its files removed.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn delete_sandbox(
        &self,
        Parameters(a): Parameters<IdArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
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
        Ok(Json::new(SandboxReply {
            id: Some(a.id),
            status: Some("deleted".into()),
            ..Default::default()
        }))
    }

    #[tool(
        name = "update_sandbox_timeout",
        title = "Set a sandbox's lifetime",
        description = "Set a sandbox's remaining lifetime (seconds from now).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn update_sandbox_timeout(
        &self,
        Parameters(a): Parameters<UpdateTimeoutArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
        self.local_sandbox(&a.id, "id", "update_sandbox_timeout")?;
        let sb = self
            .wasmbox
            .sandboxes()
            .set_timeout(&a.id, &self.owner, a.timeout_seconds)
            .map_err(|e| not_found(&e, "id", &a.id))?;
        Ok(Json::new(SandboxReply {
            id: Some(a.id),
            timeout_seconds: Some(a.timeout_seconds as u64),
            status: Some("updated".into()),
            expires_at: Some(rfc3339(sb.expires_at())),
            ..Default::default()
        }))
    }

    #[tool(
        name = "pause_sandbox",
        title = "Pause a sandbox",
        description = "Pause a sandbox: executions are refused until resume_sandbox. Its Python and JavaScript sessions are saved to disk and their memory freed; the first call after resume_sandbox restores them, variables included (also after a server restart).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn pause_sandbox(
        &self,
        Parameters(a): Parameters<IdArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
        self.local_sandbox(&a.id, "id", "pause_sandbox")?;
        let (sb, notes) = self
            .wasmbox
            .pause_sandbox(&a.id, &self.owner)
            .await
            .map_err(|e| match e {
                Error::Sandbox(e) => not_found(&e, "id", &a.id),
                e => ToolError::message("Failed to pause sandbox", e).with("id", &a.id),
            })?;
        let notes = notes.into_iter().filter(|n| !n.is_empty()).collect();
        Ok(Json::new(SandboxReply::described(sb.info(), notes)))
    }

    #[tool(
        name = "resume_sandbox",
        title = "Resume a sandbox",
        description = "Resume a paused sandbox.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn resume_sandbox(
        &self,
        Parameters(a): Parameters<IdArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
        self.local_sandbox(&a.id, "id", "resume_sandbox")?;
        self.set_paused(&a.id, false)
    }
}

/// `create_sandbox`'s reply for a local sandbox (also `fork_sandbox`'s, with its notes).
pub(super) fn created(sb: &crate::sandbox::Sandbox, notes: Vec<String>) -> SandboxReply {
    SandboxReply {
        id: Some(sb.id.clone()),
        status: Some(sb.status().into()),
        template_id: Some(sb.template.id.into()),
        template_name: Some(sb.template.id.into()),
        region: Some("local".into()),
        created_at: Some(rfc3339(sb.created_at)),
        timeout_seconds: Some(sb.timeout().as_secs()),
        expires_at: Some(rfc3339(sb.expires_at())),
        languages: Some(sb.template.languages.to_vec()),
        allow_hosts: sb.allow_hosts(),
        location: Some("local".into()),
        mounts: mounts(sb.fs.mounts()),
        notes: (!notes.is_empty()).then_some(notes),
        ..Default::default()
    }
}

impl WasmboxServer {
    fn set_paused(&self, id: &str, paused: bool) -> Result<Json<SandboxReply>, ToolError> {
        let sb = self
            .wasmbox
            .sandboxes()
            .set_paused(id, &self.owner, paused)
            .map_err(|e| not_found(&e, "id", id))?;
        Ok(Json::new(SandboxReply::described(sb.info(), Vec::new())))
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
