//! The server itself: health, metrics, caches and templates.

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::args::{NoArgs, OptionalSandboxArgs, Parameters, lenient};
use super::error::ToolError;
use super::reply::Json;
use super::{VERSION, WasmboxServer};
use crate::config::MIB;
use crate::engine::cache::CacheStats;
use crate::engine::pool::PoolStats;
use crate::lang::go::GoCacheStats;
use crate::sandbox::{SandboxInfo, TEMPLATES};

/// `name(required: type, optional?: type)` from a tool's input schema.
fn signature(name: &str, schema: &Map<String, Value>) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut params: Vec<(bool, String)> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .map(|(k, v)| {
                    let ty = match v.get("type") {
                        Some(Value::String(t)) => t.clone(),
                        Some(Value::Array(ts)) => ts
                            .iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join("|"),
                        _ => "any".into(),
                    };
                    let req = required.contains(&k.as_str());
                    (!req, format!("{k}{}: {ty}", if req { "" } else { "?" }))
                })
                .collect()
        })
        .unwrap_or_default();
    params.sort_by_key(|(optional, _)| *optional);
    let params: Vec<String> = params.into_iter().map(|(_, p)| p).collect();
    format!("{name}({})", params.join(", "))
}

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

/// `health`.
#[derive(Serialize, JsonSchema)]
pub struct Health {
    /// Always "ok": a server that answers is up.
    pub status: String,
    /// "wasmbox".
    pub server: String,
    pub version: String,
    /// "local" (HOPX's cloud says where its VM runs).
    pub location: String,
    pub uptime_seconds: f64,
    pub executions: u64,
    /// The caller's sandboxes: over HTTP, one token does not learn about another's.
    pub sandboxes: usize,
    /// Each language's runtime: ready, not loaded yet, or missing and why.
    pub runtimes: BTreeMap<String, String>,
    /// Go's build cache, once Go has run.
    pub go_cache: Option<GoCacheStats>,
    /// Host folders the server lends to every sandbox and one-shot (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<super::sandboxes::MountReply>>,
}

/// `get_system_metrics`.
#[derive(Serialize, JsonSchema)]
pub struct Metrics {
    /// "local" (HOPX's cloud says where its VM runs).
    pub location: String,
    pub uptime_seconds: f64,
    pub executions: u64,
    /// A runtime's pool appears once it has loaded: this says which are still loading.
    pub runtimes: BTreeMap<String, String>,
    pub pools: Vec<PoolStats>,
    /// The pooling allocator's slots in use and its limit.
    #[schemars(with = "Option<Map<String, Value>>")]
    pub slots: Option<Value>,
    pub memory: Memory,
    pub max_concurrency: usize,
    /// Guests computing at once: in all, kept for calls, in use.
    #[schemars(with = "Map<String, Value>")]
    pub cpu_slots: Value,
    /// The caller's own background jobs and async executions, and the caps.
    #[schemars(with = "Map<String, Value>")]
    pub jobs: Value,
    pub sandboxes: SandboxCount,
    /// With sandbox_id: that sandbox, as get_sandbox describes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxInfo>,
    /// What `GET /metrics` carries (server-wide, every token's), by the name its samples have
    /// there (a counter's ends in `_total`): each an array of samples.
    #[schemars(with = "BTreeMap<String, Vec<FigureSample>>")]
    pub figures: Map<String, Value>,
}

/// One sample of a `figures` metric (schema only: built by `mcp::metrics`).
#[derive(JsonSchema)]
#[allow(dead_code)]
pub struct FigureSample {
    /// The sample's labels, e.g. `{"tool": "execute_code", "outcome": "ok"}`.
    pub labels: BTreeMap<String, String>,
    /// A counter's or gauge's value (absent from a histogram's sample).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
    /// A histogram's observations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// A histogram's sum, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sum: Option<f64>,
    /// A histogram's cumulative counts by upper bound in seconds (`+Inf` is `count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<FigureBucket>>,
}

/// One histogram bucket of a [`FigureSample`].
#[derive(JsonSchema)]
#[allow(dead_code)]
pub struct FigureBucket {
    pub le: f64,
    pub count: u64,
}

#[derive(Serialize, JsonSchema)]
pub struct Memory {
    /// Resident set size of the server (Linux; null elsewhere).
    pub rss_bytes: Option<u64>,
}

/// The caller's live sandboxes and how many it may have.
#[derive(Serialize, JsonSchema)]
pub struct SandboxCount {
    pub live: usize,
    pub max: usize,
}

/// `cache_stats`.
#[derive(Serialize, JsonSchema)]
pub struct CacheReport {
    /// The compiled-module cache.
    pub modules: CacheStats,
    /// Go's build cache, once Go has run.
    pub go: Option<GoCacheStats>,
    pub pools: Vec<PoolStats>,
}

/// `cache_clear`.
#[derive(Serialize, JsonSchema)]
pub struct CacheCleared {
    /// "success".
    pub status: String,
    pub removed_files: u64,
    pub removed_bytes: u64,
}

/// `list_templates`.
#[derive(Serialize, JsonSchema)]
pub struct TemplateList {
    pub count: usize,
    /// Each with the keys `fields` asked for.
    pub data: Vec<Value>,
    /// The keys asked for; null with fields "all".
    #[serde(rename = "_fields")]
    pub fields: Option<String>,
    #[serde(rename = "_note")]
    pub note: Option<String>,
}

/// `get_template`: a template as list_templates shows it with fields "all".
#[derive(Serialize, JsonSchema)]
pub struct Template {
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// `list_code_tools`.
#[derive(Serialize, JsonSchema)]
pub struct CodeToolList {
    /// How code calls them.
    pub usage: String,
    /// What code may call: `server.tool(arg: type, optional?: type)`.
    pub tools: Vec<CodeToolInfo>,
    /// Each configured server: connected, or failed and why.
    #[schemars(with = "Vec<Map<String, Value>>")]
    pub servers: Vec<Value>,
}

#[derive(Serialize, JsonSchema)]
pub struct CodeToolInfo {
    pub signature: String,
    /// The first line of its description.
    pub description: String,
    /// Whether the person is asked before it runs.
    pub asks_consent: bool,
}

const CODE_USAGE: &str = "Python: from wasmbox import tools; tools.SERVER.TOOL(arg=value) returns the tool's structured result (x itself where that is the Python MCP SDK's {\"result\": x} wrapper) or its text, and raises wasmbox.ToolError on failure; tools.search('text') and tools.describe('SERVER.TOOL') help. JavaScript: await tools.SERVER.TOOL({arg: value}) (ToolError with .kind). Filter and join results in code and print only what matters.";

#[tool_router(router = server_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "list_code_tools",
        title = "Tools code can call",
        description = "The tools of the person's other MCP servers that code run here may call (code mode, set by wasmbox's --mcp-config): compact signatures, and how to call them from Python and JavaScript. Calling tools from code and printing only what matters keeps large results out of the conversation.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn list_code_tools(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<Json<CodeToolList>, ToolError> {
        let reach = self
            .wasmbox
            .reach_for(None)
            .map_err(|e| ToolError::message("Internal error", e.to_string()))?;
        let local = *self.owner == *crate::engine::cpu::LOCAL_OWNER;
        let mut out = CodeToolList {
            usage: CODE_USAGE.into(),
            tools: Vec::new(),
            servers: Vec::new(),
        };
        let Some(tools) = reach.tools.clone().filter(|_| local) else {
            out.usage = if local {
                format!(
                    "No MCP servers are configured for code: start wasmbox with --mcp-config FILE (or {}), an mcpServers file as Claude Desktop uses. {CODE_USAGE}",
                    crate::reach::tools::MCP_CONFIG
                )
            } else {
                "Code mode is for the local user (wasmbox over stdio); code run over HTTP cannot call the person's MCP tools.".into()
            };
            return Ok(Json::new(out));
        };
        let listed = crate::reach::calls::spawn(async move {
            tokio::time::timeout(std::time::Duration::from_secs(30), tools.list()).await
        })
        .await;
        let Ok(Ok((list, status))) = listed else {
            return Err(ToolError::message(
                "Timeout",
                "the MCP servers for code did not all connect and list their tools within 30 s",
            ));
        };
        out.tools = list
            .iter()
            .map(|t| CodeToolInfo {
                signature: signature(&format!("{}.{}", t.server, t.attr), &t.input_schema),
                description: t
                    .description
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect(),
                asks_consent: t.confirm,
            })
            .collect();
        out.servers = status
            .iter()
            .map(|s| serde_json::to_value(s).unwrap_or_default())
            .collect();
        Ok(Json::new(out))
    }

    #[tool(
        name = "health",
        title = "Server health",
        description = "Server health: version, uptime and the state of each runtime.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn health(&self, Parameters(_): Parameters<NoArgs>) -> Result<Json<Health>, ToolError> {
        Ok(Json::new(Health {
            status: "ok".into(),
            server: "wasmbox".into(),
            version: VERSION.into(),
            location: "local".into(),
            uptime_seconds: self.wasmbox.uptime().as_secs_f64(),
            executions: self.wasmbox.executions(),
            sandboxes: self.wasmbox.sandboxes().count(&self.owner),
            runtimes: self.runtimes(),
            go_cache: self.wasmbox.go_cache_stats(),
            mounts: super::sandboxes::mounts(crate::lang::mounts::for_owner(&self.owner)),
        }))
    }

    #[tool(
        name = "get_system_metrics",
        title = "Server metrics",
        description = "Server metrics: executions, instance pools, sandboxes, memory (RSS); with sandbox_id, that sandbox's too.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_system_metrics(
        &self,
        Parameters(a): Parameters<MetricsArgs>,
    ) -> Result<Json<Metrics>, ToolError> {
        let sandbox = match a.sandbox_id.filter(|s| !s.is_empty()) {
            Some(id) => Some(
                self.local_sandbox(&id, "sandbox_id", "get_system_metrics")?
                    .info(),
            ),
            None => None,
        };
        let sandboxes = self.wasmbox.sandboxes();
        Ok(Json::new(Metrics {
            location: "local".into(),
            uptime_seconds: self.wasmbox.uptime().as_secs_f64(),
            executions: self.wasmbox.executions(),
            runtimes: self.runtimes(),
            pools: self.wasmbox.pool_stats(),
            slots: self.wasmbox.slot_stats(),
            memory: Memory {
                rss_bytes: crate::platform::process::rss_bytes(),
            },
            max_concurrency: self.wasmbox.config().max_concurrency,
            cpu_slots: self.wasmbox.cpu_stats(),
            jobs: self.wasmbox.job_stats(&self.owner),
            sandboxes: SandboxCount {
                live: sandboxes.count(&self.owner),
                max: sandboxes
                    .config
                    .max_live
                    .min(sandboxes.config.max_per_owner),
            },
            sandbox,
            figures: crate::mcp::metrics::json(&self.wasmbox).await,
        }))
    }

    #[tool(
        name = "cache_stats",
        title = "Cache statistics",
        description = "The compiled-module cache, the Go build caches and the instance pools.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn cache_stats(
        &self,
        Parameters(a): Parameters<OptionalSandboxArgs>,
    ) -> Result<Json<CacheReport>, ToolError> {
        self.server_wide(a.sandbox_id.as_deref(), "cache_stats")?;
        Ok(Json::new(CacheReport {
            modules: self.wasmbox.module_cache().stats(),
            go: self.wasmbox.go_cache_stats(),
            pools: self.wasmbox.pool_stats(),
        }))
    }

    #[tool(
        name = "cache_clear",
        title = "Clear unused compiled modules",
        description = "Remove compiled modules this server does not use (left by older runtimes or settings).",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn cache_clear(
        &self,
        Parameters(a): Parameters<OptionalSandboxArgs>,
    ) -> Result<Json<CacheCleared>, ToolError> {
        self.server_wide(a.sandbox_id.as_deref(), "cache_clear")?;
        let (removed_files, removed_bytes) = self.wasmbox.module_cache().evict_unused();
        Ok(Json::new(CacheCleared {
            status: "success".into(),
            removed_files,
            removed_bytes,
        }))
    }

    #[tool(
        name = "list_templates",
        title = "List templates",
        description = "List the sandbox templates available locally, with their languages and limits.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_templates(
        &self,
        Parameters(a): Parameters<ListTemplatesArgs>,
    ) -> Result<Json<TemplateList>, ToolError> {
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
        Ok(Json::new(TemplateList {
            count: data.len(),
            data,
            fields: a.fields.filter(|f| f != "all"),
            note,
        }))
    }

    #[tool(
        name = "get_template",
        title = "Get a template",
        description = "One template by name.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_template(
        &self,
        Parameters(a): Parameters<GetTemplateArgs>,
    ) -> Result<Json<Template>, ToolError> {
        match self
            .template_json()
            .into_iter()
            .find(|t| t["name"] == a.name)
        {
            Some(Value::Object(fields)) => Ok(Json::new(Template { fields })),
            _ => Err(ToolError::exception(
                "Failed to get template",
                format!(
                    "Template '{}' not found. Available templates: {}",
                    a.name,
                    template_names()
                ),
            )
            .with("template_name", &a.name)),
        }
    }
}

impl WasmboxServer {
    pub(super) fn runtimes(&self) -> BTreeMap<String, String> {
        self.wasmbox
            .runtime_status()
            .into_iter()
            .map(|s| (s.language.as_str().to_string(), s.status.to_string()))
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
