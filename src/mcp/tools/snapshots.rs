//! Interpreter state as something to copy: forks of a live sandbox, and snapshots new sandboxes
//! start from (`create_sandbox(from_snapshot=...)`). Ours: HOPX has none.

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::args::SandboxArgs;
use super::args::{NoArgs, Parameters};
use super::error::{ToolError, kind};
use super::reply::{Json, fit_list, on_disk};
use super::sandboxes::{SandboxReply, created};
use super::{WasmboxServer, not_found};
use crate::Error;
use crate::lang::Language;
use crate::sandbox::SandboxError;
use crate::sandbox::fs::rfc3339;
use crate::sandbox::snapshots::{SnapshotError, SnapshotMeta};

#[derive(Deserialize, JsonSchema)]
pub struct SnapshotArgs {
    /// The snapshot id (from snapshot_sandbox).
    pub snapshot_id: String,
}

/// A snapshot: a sandbox's files, env and session state, kept.
#[derive(Serialize, JsonSchema)]
pub struct SnapshotReply {
    pub snapshot_id: String,
    /// The sandbox it was taken from (which may be gone since).
    pub sandbox_id: String,
    pub template_id: String,
    pub size_bytes: u64,
    /// What it is charged against WASMBOX_SNAPSHOT_DISK_MB: its blocks on disk, and a block
    /// per file and directory.
    pub charged_bytes: u64,
    pub created_at: String,
    /// The languages whose sessions (variables) it holds.
    pub languages: Vec<Language>,
    /// What it does not hold (the lent folders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<String>>,
}

impl From<&SnapshotMeta> for SnapshotReply {
    fn from(m: &SnapshotMeta) -> Self {
        Self {
            snapshot_id: m.snapshot_id.clone(),
            sandbox_id: m.sandbox_id.clone(),
            template_id: m.template.clone(),
            size_bytes: m.size_bytes,
            charged_bytes: m.charged_bytes,
            created_at: rfc3339(m.created_at()),
            languages: m.languages.clone(),
            notes: None,
        }
    }
}

/// `list_snapshots`: as many as fit the answer's budget, oldest first.
#[derive(Serialize, JsonSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotReply>,
    pub count: usize,
    pub truncated: bool,
    /// null when truncated.
    pub total_snapshots: Option<usize>,
    /// What this owner's snapshots and saved sessions take on disk, and may take
    /// (WASMBOX_SNAPSHOT_DISK_MB).
    pub disk_used_bytes: u64,
    pub disk_limit_bytes: u64,
}

/// `delete_snapshot`.
#[derive(Serialize, JsonSchema)]
pub struct SnapshotDeleted {
    pub snapshot_id: String,
    pub deleted: bool,
}

/// A failed snapshot operation, in HOPX's error shape.
fn failed(what: &str, key: &str, id: &str, e: Error) -> ToolError {
    match e {
        Error::Sandbox(e @ SandboxError::NotFound(_)) => not_found(&e, key, id),
        e @ Error::Snapshot(SnapshotError::NotFound(_)) => {
            ToolError::message(kind(&e).0, e).with(key, id)
        }
        e => ToolError::message(what, e).with(key, id),
    }
}

#[tool_router(router = state_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "fork_sandbox",
        title = "Fork a sandbox",
        description = "Create a new local sandbox that starts as a copy of this one: its files, env and the variables of its Python and JavaScript sessions (a loaded DataFrame, a fitted model) equal the source's now, and the two are independent afterwards. Random generators are reseeded in the copy. Returns the new sandbox as create_sandbox does.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork_sandbox(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Json<SandboxReply>, ToolError> {
        self.local_sandbox(&a.sandbox_id, "sandbox_id", "fork_sandbox")?;
        let (sb, mut notes) = self
            .wasmbox
            .fork_sandbox(&a.sandbox_id, &self.owner)
            .await
            .map_err(|e| failed("Failed to fork sandbox", "sandbox_id", &a.sandbox_id, e))?;
        notes.extend(super::sandboxes::mounts_note(sb.fs.mounts()));
        Ok(Json::new(created(&sb, notes)))
    }

    #[tool(
        name = "snapshot_sandbox",
        title = "Snapshot a sandbox",
        description = "Keep a sandbox's files, env and the variables of its Python and JavaScript sessions as a snapshot; create_sandbox(from_snapshot=snapshot_id) starts new sandboxes from it. The sandbox runs on unchanged. Snapshots last until delete_snapshot.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn snapshot_sandbox(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
    ) -> Result<Json<SnapshotReply>, ToolError> {
        self.local_sandbox(&a.sandbox_id, "sandbox_id", "snapshot_sandbox")?;
        let meta = self
            .wasmbox
            .snapshot_sandbox(&a.sandbox_id, &self.owner)
            .await
            .map_err(|e| failed("Failed to snapshot sandbox", "sandbox_id", &a.sandbox_id, e))?;
        let mut reply = SnapshotReply::from(&meta);
        reply.notes = super::sandboxes::mounts_note(crate::lang::mounts::for_owner(&self.owner))
            .map(|n| vec![n]);
        Ok(Json::new(reply))
    }

    #[tool(
        name = "list_snapshots",
        title = "List snapshots",
        description = "List your snapshots, oldest first.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_snapshots(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<Json<SnapshotList>, ToolError> {
        let (sandboxes, owner) = (self.wasmbox.sandboxes().clone(), self.owner.clone());
        let budget = self.wasmbox.config().result_bytes;
        // Reads every snapshot's meta.json: off the runtime's workers.
        on_disk(move || {
            let all = sandboxes.snapshots.list(&owner);
            let list = SnapshotList {
                count: all.len(),
                snapshots: all.iter().map(SnapshotReply::from).collect(),
                truncated: false,
                total_snapshots: Some(all.len()),
                disk_used_bytes: sandboxes.owner_used(&owner, None),
                disk_limit_bytes: sandboxes.snapshots.ledger().max(),
            };
            Ok(Json::fitted(list, |v| fit_list(v, "snapshots", budget)))
        })
        .await
    }

    #[tool(
        name = "delete_snapshot",
        title = "Delete a snapshot",
        description = "Delete a snapshot and its files. Sandboxes made from it are unaffected.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn delete_snapshot(
        &self,
        Parameters(a): Parameters<SnapshotArgs>,
    ) -> Result<Json<SnapshotDeleted>, ToolError> {
        self.wasmbox
            .sandboxes()
            .snapshots
            .delete(&a.snapshot_id, &self.owner)
            .map_err(|e| {
                failed(
                    "Failed to delete snapshot",
                    "snapshot_id",
                    &a.snapshot_id,
                    e.into(),
                )
            })?;
        Ok(Json::new(SnapshotDeleted {
            snapshot_id: a.snapshot_id,
            deleted: true,
        }))
    }
}
