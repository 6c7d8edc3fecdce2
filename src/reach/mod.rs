//! Reach: what a guest may ask the host to do for it beyond WASI, under the policy the person
//! running the server set. A guest sends one request through its door (a wasm import) and
//! waits, as in a sleep, without a CPU slot; the host does the bounded thing and answers.
//!
//! Today that is HTTP to allowed hosts ([`http`]); the channel ([`calls`]) is the same for
//! whatever comes next.

pub mod addr;
pub mod calls;
pub mod http;
pub mod policy;
pub mod secrets;

use std::sync::Arc;

pub use policy::{ALLOW_HOSTS, HostList, HostPattern};

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
    /// A setting that did not parse: the server refuses to start with it.
    pub error: Option<String>,
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
                Err(e) => (HostList::default(), Some(format!("{ALLOW_HOSTS}: {e}"))),
            },
            Err(_) => (HostList::default(), None),
        };
        let (secrets, error) = match (error, secrets::from_env()) {
            (Some(e), _) | (None, Err(e)) => (Vec::new(), Some(e)),
            (None, Ok(s)) => (s, None),
        };
        Self {
            secrets,
            hosts,
            allow_private: std::env::var(ALLOW_PRIVATE).is_ok_and(|v| v.trim() == "1"),
            http_bytes: num("WASMBOX_HTTP_BYTES").unwrap_or(16 << 20).max(1),
            calls: num("WASMBOX_HOST_CALLS").unwrap_or(1000),
            call_bytes: num("WASMBOX_HOST_CALL_MB").unwrap_or(64).max(1) << 20,
            error,
        }
    }
}

/// What one run may reach: the server's settings with its hosts narrowed by the sandbox's or
/// the call's `allow_hosts`, and the client that makes the requests.
#[derive(Clone, Debug)]
pub struct Reach {
    pub hosts: HostList,
    /// Whether the hosts were narrowed below the server's list (refusals say which list).
    pub narrowed: bool,
    pub config: Arc<ReachConfig>,
    pub client: reqwest::Client,
}

impl Reach {
    /// The server's reach, with the client its requests go through.
    pub fn new(config: ReachConfig) -> Result<Self, String> {
        if let Some(e) = &config.error {
            return Err(e.clone());
        }
        let client = http::client(config.allow_private)
            .map_err(|e| format!("building the guests' HTTP client: {e}"))?;
        Ok(Self {
            hosts: config.hosts.clone(),
            narrowed: false,
            config: Arc::new(config),
            client,
        })
    }

    /// This reach with its hosts narrowed to `allow_hosts`, each of which must be within the
    /// server's list.
    pub fn narrowed<S: AsRef<str>>(&self, allow_hosts: &[S]) -> Result<Self, String> {
        let list = HostList::from_items(allow_hosts).map_err(|e| format!("allow_hosts: {e}"))?;
        let hosts = self.hosts.narrow(list).map_err(|wider| {
            format!(
                "allow_hosts may only narrow what the server allows, and {wider} is not within {ALLOW_HOSTS}={}",
                if self.hosts.is_empty() { "(empty: guest network is off)".to_string() } else { self.hosts.to_string() }
            )
        })?;
        Ok(Self {
            hosts,
            narrowed: true,
            config: self.config.clone(),
            client: self.client.clone(),
        })
    }
}
