//! The server itself: health, metrics, caches and templates.

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::args::{NoArgs, OptionalSandboxArgs, Parameters, lenient};
use super::reply::{Reply, ToolError, ToolResult, schema};
use super::{VERSION, WasmboxServer};
use crate::config::MIB;
use crate::sandbox::TEMPLATES;

fn default_template_limit() -> i64 {
    10
}
fn default_fields() -> Option<String> {
    Some("id,name,description,category,language".into())
}

#[derive(Deserialize, JsonSchema)]
pub struct MetricsArgs {
    /// A sandbox to report on as well (workspace usage, sessions, jobs).
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ListTemplatesArgs {
    /// How many templates to return (<= 0: all).
    #[serde(default = "default_template_limit", deserialize_with = "lenient")]
    pub limit: i64,
    /// Comma-separated keys to keep, or "all".
    #[serde(default = "default_fields")]
    pub fields: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct GetTemplateArgs {
    pub name: String,
}

/// An answer whose fields are reports of their own (metrics, caches, health): named, each
/// an object or a number.
#[derive(Serialize, JsonSchema)]
pub struct Report {
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// `list_templates`.
#[derive(Serialize, JsonSchema)]
pub struct TemplateList {
    pub count: usize,
    pub data: Vec<Value>,
}

#[tool_router(router = server_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "health",
        title = "Server health",
        description = "Server health: version, uptime and the state of each runtime.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<Report>()
    )]
    async fn health(&self, Parameters(_): Parameters<NoArgs>) -> ToolResult<Report> {
        Ok(Reply::json(json!({
            "status": "ok",
            "server": "wasmbox",
            "version": VERSION,
            "location": "local",
            "uptime_seconds": self.wasmbox.uptime().as_secs_f64(),
            "executions": self.wasmbox.executions(),
            // The caller's own: over HTTP, one token must not learn about another's.
            "sandboxes": self.wasmbox.sandboxes().count(&self.owner),
            "runtimes": self.runtimes_json(),
            "go_cache": self.wasmbox.go_cache_stats(),
        })))
    }

    #[tool(
        name = "get_system_metrics",
        title = "Server metrics",
        description = "Server metrics: executions, instance pools, sandboxes, memory (RSS); with sandbox_id, that sandbox's too.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<Report>()
    )]
    async fn get_system_metrics(
        &self,
        Parameters(a): Parameters<MetricsArgs>,
    ) -> ToolResult<Report> {
        let sandboxes = self.wasmbox.sandboxes();
        let mut v = json!({
            "location": "local",
            "uptime_seconds": self.wasmbox.uptime().as_secs_f64(),
            "executions": self.wasmbox.executions(),
            // A runtime's pool appears once it has loaded: say which are still loading.
            "runtimes": self.runtimes_json(),
            "pools": self.wasmbox.pool_stats(),
            "slots": self.wasmbox.slot_stats(),
            "memory": {"rss_bytes": rss_bytes()},
            "max_concurrency": self.wasmbox.config().max_concurrency,
            "cpu_slots": self.wasmbox.cpu_stats(),
            // The caller's own jobs: one token must not learn about another's.
            "jobs": self.wasmbox.job_stats(&self.owner),
            "sandboxes": {
                "live": sandboxes.count(&self.owner),
                "max": sandboxes.config.max_live.min(sandboxes.config.max_per_owner),
            },
        });
        if let Some(id) = a.sandbox_id.filter(|s| !s.is_empty()) {
            v["sandbox"] = json!(
                self.local_sandbox(&id, "sandbox_id", "get_system_metrics")?
                    .info()
            );
        }
        Ok(Reply::json(v))
    }

    #[tool(
        name = "cache_stats",
        title = "Cache statistics",
        description = "The compiled-module cache, the Go build caches and the instance pools.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<Report>()
    )]
    async fn cache_stats(
        &self,
        Parameters(a): Parameters<OptionalSandboxArgs>,
    ) -> ToolResult<Report> {
        self.server_wide(a.sandbox_id.as_deref(), "cache_stats")?;
        Ok(Reply::json(json!({
            "modules": self.wasmbox.module_cache().stats(),
            "go": self.wasmbox.go_cache_stats(),
            "pools": self.wasmbox.pool_stats(),
        })))
    }

    #[tool(
        name = "cache_clear",
        title = "Clear unused compiled modules",
        description = "Remove compiled modules this server does not use (left by older runtimes or settings).",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false),
        output_schema = schema::<Report>()
    )]
    async fn cache_clear(
        &self,
        Parameters(a): Parameters<OptionalSandboxArgs>,
    ) -> ToolResult<Report> {
        self.server_wide(a.sandbox_id.as_deref(), "cache_clear")?;
        let (files, bytes) = self.wasmbox.module_cache().evict_unused();
        Ok(Reply::json(
            json!({"status": "success", "removed_files": files, "removed_bytes": bytes}),
        ))
    }

    #[tool(
        name = "list_templates",
        title = "List templates",
        description = "List the sandbox templates available locally, with their languages and limits.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<TemplateList>()
    )]
    async fn list_templates(
        &self,
        Parameters(a): Parameters<ListTemplatesArgs>,
    ) -> ToolResult<TemplateList> {
        let mut data = self.template_json();
        if a.limit > 0 {
            data.truncate(a.limit as usize);
        }
        let fields = a.fields.clone().filter(|f| !f.is_empty());
        if let Some(f) = fields.as_deref().filter(|f| *f != "all") {
            let keep: Vec<&str> = f.split(',').map(str::trim).collect();
            for t in &mut data {
                if let Value::Object(m) = t {
                    m.retain(|k, _| keep.contains(&k.as_str()));
                }
            }
        }
        let note = fields.as_deref().filter(|f| *f != "all").map(|f| {
            format!("Partial response with fields: {f}. Use fields='all' for complete data.")
        });
        Ok(Reply::json(json!({
            "count": data.len(),
            "data": data,
            "_fields": if a.fields.as_deref() == Some("all") { Value::Null } else { json!(a.fields) },
            "_note": note,
        })))
    }

    #[tool(
        name = "get_template",
        title = "Get a template",
        description = "One template by name.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schema::<Report>()
    )]
    async fn get_template(&self, Parameters(a): Parameters<GetTemplateArgs>) -> ToolResult<Report> {
        match self
            .template_json()
            .into_iter()
            .find(|t| t["name"] == a.name)
        {
            Some(t) => Ok(Reply::json(t)),
            None => Err(ToolError::new(json!({
                "error": "Failed to get template",
                "template_name": a.name,
                "exception": format!("Template '{}' not found. Available templates: {}", a.name, template_names()),
            }))),
        }
    }
}

impl WasmboxServer {
    pub(super) fn runtimes_json(&self) -> Map<String, Value> {
        self.wasmbox
            .runtime_status()
            .into_iter()
            .map(|s| (s.language.as_str().to_string(), Value::String(s.status)))
            .collect()
    }

    fn template_json(&self) -> Vec<Value> {
        let cfg = self.wasmbox.config();
        let limits = &cfg.default_limits;
        TEMPLATES
            .iter()
            .map(|t| {
                json!({
                    "id": t.id,
                    "name": t.id,
                    "display_name": t.id,
                    "description": t.description,
                    "category": "code-execution",
                    "language": t.languages[0],
                    "languages": t.languages,
                    "location": "local",
                    "default_resources": {
                        "timeout_seconds": limits.timeout.as_secs(),
                        "memory_mb": limits.memory_bytes / MIB,
                        "output_bytes": limits.output_bytes,
                        "sandbox_lifetime_seconds": cfg.sandbox.default_timeout.as_secs(),
                        "disk_mb": cfg.sandbox.quota.max_bytes / MIB as u64,
                        "files": cfg.sandbox.quota.max_entries,
                    },
                    "min_resources": null,
                    "max_resources": {
                        "timeout_seconds": cfg.max_timeout.as_secs(),
                        "memory_mb": cfg.max_memory_bytes / MIB,
                        "sandbox_lifetime_seconds": cfg.sandbox.max_timeout.as_secs(),
                    },
                    "features": ["persistent-sessions", "files", "env", "background", "async"],
                    "tags": ["wasm", "offline"],
                    "is_active": true,
                    "is_public": true,
                    "status": "active",
                })
            })
            .collect()
    }
}

pub fn template_names() -> String {
    TEMPLATES
        .iter()
        .map(|t| t.id)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resident set size of this process (Linux), or null elsewhere.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
