//! `install_packages`: pure-Python packages into a local sandbox, resolved by the host.

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::WasmboxServer;
use super::args::{Parameters, lenient};
use super::error::ToolError;
use super::reply::Json;
use crate::packages::{Bundled, Installed, Outcome};

#[derive(Deserialize, JsonSchema)]
pub struct InstallArgs {
    pub sandbox_id: String,
    /// Requirements as pip takes them: "name", "name==1.2", "name>=1,<2", "name[extra]".
    #[serde(deserialize_with = "lenient")]
    pub packages: Vec<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct InstallReply {
    pub success: bool,
    pub sandbox_id: String,
    /// What was added to the sandbox: name, version, source (wheelhouse or index), wheel,
    /// sha256, and cached (unpacked before: nothing fetched or unpacked now).
    pub installed: Vec<Installed>,
    /// Requirements the bundled packages satisfied (never replaced).
    pub bundled: Vec<Bundled>,
    /// Requirements the sandbox had already.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub already_installed: Vec<Bundled>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One line for a run's notes: what a one-shot's `packages` brought.
pub(super) fn installed_note(out: &Outcome) -> String {
    let list: Vec<String> = out
        .installed
        .iter()
        .map(|i| format!("{} {} ({})", i.name, i.version, i.source))
        .collect();
    format!("packages: {}", list.join(", "))
}

/// pip's last line for what an install added.
pub(super) fn pip_line(out: &Outcome) -> String {
    let mut s = String::new();
    for b in out.bundled.iter().chain(&out.present) {
        s += &format!("Requirement already satisfied: {} {}\n", b.name, b.version);
    }
    if !out.installed.is_empty() {
        let names: Vec<String> = out
            .installed
            .iter()
            .map(|i| format!("{}-{}", i.name, i.version))
            .collect();
        s += &format!("Successfully installed {}\n", names.join(" "));
    }
    s
}

#[tool_router(router = package_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "install_packages",
        title = "Install Python packages",
        description = "Install pure-Python packages (py3-none-any wheels) into a local sandbox; its next Python run imports them, no restart. The host resolves them and their dependencies from the server's wheelhouse, then the package index (unless offline); bundled packages (numpy, pandas, ...) are never replaced; packages needing compiled code are refused. They stay through restart, pause, fork and snapshot.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn install_packages(
        &self,
        Parameters(a): Parameters<InstallArgs>,
    ) -> Result<Json<InstallReply>, ToolError> {
        // A cloud sandbox has pip: run_command 'pip install NAME' there.
        let sb = self.local_sandbox(&a.sandbox_id, "sandbox_id", "install_packages")?;
        let out = self
            .wasmbox
            .install_packages(&sb, &a.packages)
            .await
            .map_err(|e| ToolError::of(&e).with("sandbox_id", &sb.id))?;
        Ok(Json::new(InstallReply {
            success: true,
            sandbox_id: sb.id.clone(),
            installed: out.installed,
            bundled: out.bundled,
            already_installed: out.present,
            notes: out.notes,
        }))
    }
}
