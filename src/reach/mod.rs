//! Reach: what a guest may ask the host to do for it beyond WASI, under the policy the person
//! running the server set. A guest sends one request through its door (a wasm import) and
//! waits, as in a sleep, without a CPU slot; the host does the bounded thing and answers.
//!
//! That is HTTP to allowed hosts ([`http`]) and the tools of the person's other MCP servers
//! ([`tools`], code mode), through one channel ([`calls`]).

pub mod addr;
pub mod calls;
pub mod http;
pub mod policy;
pub mod secrets;
pub mod tools;

use std::path::PathBuf;
use std::sync::Arc;

use crate::telemetry::audit::HostLog;

pub use policy::{ALLOW_HOSTS, BadPattern, HostList, HostPattern};

/// `WASMBOX_ALLOW_PRIVATE_HOSTS`: names the flag in refusals.
pub const ALLOW_PRIVATE: &str = "WASMBOX_ALLOW_PRIVATE_HOSTS";

/// What guests may reach, as the server's settings say: `WASMBOX_ALLOW_HOSTS` (off when
/// empty), `WASMBOX_ALLOW_PRIVATE_HOSTS`, `WASMBOX_HTTP_BYTES` (one response body, and one
/// request's: 16 MiB), `WASMBOX_HOST_CALLS` (host calls per run: 1,000) and
/// `WASMBOX_HOST_CALL_MB` (their bytes in and out per run: 64 MiB) and `WASMBOX_SECRETS`.
#[derive(Clone, Debug)]
pub struct ReachConfig {
    pub hosts: HostList,
    pub allow_private: bool,
    pub http_bytes: usize,
    pub calls: usize,
    pub call_bytes: usize,
    /// `WASMBOX_SECRETS`: values lent to requests to their hosts, placeholders to guests.
    pub secrets: Vec<secrets::Secret>,
    /// `--mcp-config` / `WASMBOX_MCP_CONFIG`: the MCP servers whose tools code may call.
    pub mcp_config: Option<PathBuf>,
    /// `WASMBOX_TOOL_BYTES`: the most one tool answer (or one message from an MCP server) may
    /// take: 16 MiB.
    pub tool_bytes: usize,
    /// A setting that did not parse: the server refuses to start with it.
    pub error: Option<BadSetting>,
}

/// A reach setting that did not parse.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BadSetting {
    #[error("{ALLOW_HOSTS}: {0}")]
    Hosts(BadPattern),
    #[error(transparent)]
    Secrets(secrets::BadSecret),
}

/// Why the server's reach could not be made, or a run's could not be narrowed.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    #[error(transparent)]
    Setting(BadSetting),
    #[error("building the guests' HTTP client: {0}")]
    Client(reqwest::Error),
    #[error(transparent)]
    McpConfig(tools::config::ConfigError),
    #[error("allow_hosts: {0}")]
    AllowHosts(BadPattern),
    #[error(
        "allow_hosts may only narrow what the server allows, and {wider} is not within {ALLOW_HOSTS}={}",
        server_list(.server)
    )]
    Wider {
        wider: HostPattern,
        server: HostList,
    },
    #[error("{why} (within this sandbox's allow_hosts: {list})")]
    WithinSandbox { why: Box<ReachError>, list: String },
}

/// The server's list as a refusal shows it.
fn server_list(hosts: &HostList) -> String {
    if hosts.is_empty() {
        "(empty: guest network is off)".to_string()
    } else {
        hosts.to_string()
    }
}

impl From<ReachError> for String {
    fn from(e: ReachError) -> Self {
        e.to_string()
    }
}

impl ReachConfig {
    pub fn from_env() -> Self {
        let num = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        let (hosts, error) = match std::env::var(ALLOW_HOSTS) {
            Ok(v) => match HostList::parse(&v) {
                Ok(h) => (h, None),
                Err(e) => (HostList::default(), Some(BadSetting::Hosts(e))),
            },
            Err(_) => (HostList::default(), None),
        };
        let (secrets, error) = match (error, secrets::from_env()) {
            (Some(e), _) => (Vec::new(), Some(e)),
            (None, Err(e)) => (Vec::new(), Some(BadSetting::Secrets(e))),
            (None, Ok(s)) => (s, None),
        };
        Self {
            secrets,
            hosts,
            allow_private: std::env::var(ALLOW_PRIVATE).is_ok_and(|v| v.trim() == "1"),
            http_bytes: num("WASMBOX_HTTP_BYTES").unwrap_or(16 << 20).max(1),
            calls: num("WASMBOX_HOST_CALLS").unwrap_or(1000),
            call_bytes: num("WASMBOX_HOST_CALL_MB").unwrap_or(64).max(1) << 20,
            mcp_config: std::env::var_os(tools::MCP_CONFIG)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            tool_bytes: num("WASMBOX_TOOL_BYTES").unwrap_or(16 << 20).max(1),
            error,
        }
    }
}

/// What one run may reach: the server's settings with its hosts narrowed by the sandbox's or
/// the call's `allow_hosts`, the client that makes the requests, the MCP tools code may call
/// and who to ask before a destructive one.
#[derive(Clone)]
pub struct Reach {
    pub hosts: HostList,
    /// Whether the hosts were narrowed below the server's list (refusals say which list).
    pub narrowed: bool,
    pub config: Arc<ReachConfig>,
    pub client: reqwest::Client,
    /// Code mode's servers (`None`: none configured, or not for this caller).
    pub tools: Option<Arc<tools::CodeTools>>,
    /// Asks the person behind the call that started the run.
    pub consent: Option<Arc<dyn tools::Consent>>,
    /// Where the run's host calls are noted for the call's audit line (`None`: audit off).
    pub log: Option<Arc<HostLog>>,
}

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach")
            .field("hosts", &self.hosts)
            .field("narrowed", &self.narrowed)
            .field("tools", &self.tools)
            .field("consent", &self.consent.is_some())
            .finish()
    }
}

impl Reach {
    /// The server's reach, with the client its requests go through.
    pub fn new(config: ReachConfig) -> Result<Self, ReachError> {
        if let Some(e) = &config.error {
            return Err(ReachError::Setting(e.clone()));
        }
        let client = http::client(config.allow_private).map_err(ReachError::Client)?;
        let tools = match &config.mcp_config {
            None => None,
            Some(path) => Some(Arc::new(tools::CodeTools::new(
                tools::config::load(path).map_err(ReachError::McpConfig)?,
                config.tool_bytes,
            ))),
        };
        Ok(Self {
            hosts: config.hosts.clone(),
            narrowed: false,
            config: Arc::new(config),
            client,
            tools,
            consent: None,
            log: None,
        })
    }

    /// This reach for one caller: code mode only for the local user (over stdio; an HTTP
    /// token's code never reaches the person's own MCP servers), with who to ask for consent
    /// and where its host calls are noted.
    pub fn for_caller(
        self: Arc<Self>,
        local: bool,
        consent: Option<Arc<dyn tools::Consent>>,
        log: Option<Arc<HostLog>>,
    ) -> Arc<Self> {
        if consent.is_none()
            && log.is_none()
            && (local || self.tools.is_none())
            && self.consent.is_none()
            && self.log.is_none()
        {
            return self;
        }
        Arc::new(Self {
            tools: self.tools.clone().filter(|_| local),
            consent,
            log,
            ..(*self).clone()
        })
    }

    /// This reach inside a sandbox created with `allow_hosts` (each within the server's list):
    /// the hosts both allow; the caller's code tools and consent stay.
    pub fn within_sandbox<S: AsRef<str>>(&self, allow_hosts: &[S]) -> Result<Self, ReachError> {
        let server = Self {
            hosts: self.config.hosts.clone(),
            narrowed: false,
            ..self.clone()
        };
        let theirs = server.narrowed(allow_hosts)?;
        if !self.narrowed {
            return Ok(theirs);
        }
        theirs.narrowed(&self.hosts.items()).map_err(|e| {
            let list: Vec<&str> = allow_hosts.iter().map(AsRef::as_ref).collect();
            ReachError::WithinSandbox {
                why: Box::new(e),
                list: list.join(","),
            }
        })
    }

    /// This reach with its hosts narrowed to `allow_hosts`, each of which must be within the
    /// server's list.
    pub fn narrowed<S: AsRef<str>>(&self, allow_hosts: &[S]) -> Result<Self, ReachError> {
        let list = HostList::from_items(allow_hosts).map_err(ReachError::AllowHosts)?;
        let hosts = self.hosts.narrow(list).map_err(|wider| ReachError::Wider {
            wider,
            server: self.hosts.clone(),
        })?;
        Ok(Self {
            hosts,
            narrowed: true,
            ..self.clone()
        })
    }
}
