//! Cloud settings, which both the router (is the cloud available?) and the client (where, with
//! which key, under which limits) read.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::error::CloudError;
use super::route::CloudReason;

pub const DEFAULT_BASE_URL: &str = "https://api.hopx.dev";

/// The default template of one-shots, as hopx-mcp uses it.
pub const ONESHOT_TEMPLATE: &str = "code-interpreter";

/// The most of a control-plane reply that is read: its JSON is small (a sandbox, a page of them).
pub const CONTROL_REPLY_CAP: usize = 1 << 20;

/// The most of an agent reply that is read: run output and file contents come this way.
pub const AGENT_REPLY_CAP: usize = 16 << 20;

/// A credential (the API key, a sandbox token). `Debug` and `Display` print `***`, so a secret
/// cannot leak through logs or error formatting by accident; [`Secret::expose`] is the one way out.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_string())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Cloud settings. [`CloudConfig::from_env`] reads `HOPX_API_KEY`, `HOPX_BASE_URL`,
/// `WASMBOX_OFFLINE` and the cloud sandbox limits; the timing fields exist so tests can run in
/// milliseconds.
#[derive(Clone, Debug)]
pub struct CloudConfig {
    pub api_key: Option<Secret>,
    /// Control-plane base URL, without a trailing `/`.
    pub base_url: String,
    /// No cloud at all: every request that needs it fails before any network I/O.
    pub offline: bool,
    /// Per-request timeout of everything but code runs.
    pub request_timeout: Duration,
    /// Added to a run's own timeout for the HTTP timeout of `/execute` and `/commands/run`.
    pub execute_grace: Duration,
    /// How long a new sandbox may take to be running with a healthy agent.
    pub ready_timeout: Duration,
    /// Pause between readiness probes.
    pub poll_interval: Duration,
    /// Attempts of an idempotent call (1 = no retries); others get exactly one.
    pub max_attempts: u32,
    /// First retry delay, doubled per retry.
    pub retry_delay: Duration,
    /// Cap on a delay, including a server's 429 `retry_after_seconds`.
    pub max_retry_delay: Duration,
    /// Cloud sandboxes alive at once, in all and per owner (`WASMBOX_MAX_CLOUD_SANDBOXES`,
    /// `WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN`): each one runs on the user's HOPX bill.
    pub max_sandboxes: usize,
    pub max_sandboxes_per_owner: usize,
    /// The longest lifetime a cloud sandbox may ask for, and the one it gets when it asks for
    /// none (`WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT`, seconds): HOPX deletes it then, even if our
    /// DELETE never arrives.
    pub max_sandbox_timeout_secs: u64,
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig {
            api_key: None,
            base_url: DEFAULT_BASE_URL.into(),
            offline: false,
            request_timeout: Duration::from_secs(30),
            execute_grace: Duration::from_secs(30),
            ready_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            max_attempts: 3,
            retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(10),
            max_sandboxes: 8,
            max_sandboxes_per_owner: 4,
            max_sandbox_timeout_secs: 3600,
        }
    }
}

impl CloudConfig {
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`CloudConfig::from_env`] over any variable source (tests need not touch the process
    /// environment). `HOPX_BASE_URL` is honoured, unlike in hopx-mcp 0.2.1.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let api_key = get("HOPX_API_KEY")
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .map(Secret);
        let base_url = get("HOPX_BASE_URL")
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.into());
        let offline = get("WASMBOX_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        });
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        let d = CloudConfig::default();
        CloudConfig {
            api_key,
            base_url,
            offline,
            max_sandboxes: num("WASMBOX_MAX_CLOUD_SANDBOXES")
                .map_or(d.max_sandboxes, |n| n as usize),
            max_sandboxes_per_owner: num("WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN")
                .map_or(d.max_sandboxes_per_owner, |n| n as usize),
            max_sandbox_timeout_secs: num("WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT")
                .filter(|&n| n > 0)
                .unwrap_or(d.max_sandbox_timeout_secs),
            ..d
        }
    }

    /// The lifetime a new cloud sandbox gets: what it asks for within the maximum, the maximum
    /// when it asks for nothing; never none, so HOPX always ends it by itself.
    pub fn sandbox_timeout(&self, asked: Option<u64>) -> Result<u64, CloudError> {
        let max = self.max_sandbox_timeout_secs;
        match asked {
            None => Ok(max),
            Some(t) if t == 0 || t > max => Err(CloudError::BadTimeout { asked: t, max }),
            Some(t) => Ok(t),
        }
    }

    /// A one-shot's sandbox lifetime: ten minutes, or the run and two more, within the maximum.
    /// We delete it when the run ends; this is only for a DELETE that gets lost.
    pub fn oneshot_timeout(&self, run: Duration) -> u64 {
        600u64
            .max(run.as_secs() + 120)
            .min(self.max_sandbox_timeout_secs)
    }

    /// The key, or the error that says why the cloud cannot run `reason`.
    pub fn check_available(&self, reason: &CloudReason) -> Result<&Secret, CloudError> {
        if self.offline {
            return Err(CloudError::Offline {
                reason: reason.clone(),
            });
        }
        self.api_key
            .as_ref()
            .ok_or_else(|| CloudError::MissingApiKey {
                reason: reason.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_the_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = CloudConfig::from_vars(vars(&[
            ("HOPX_API_KEY", " hopx_live_abc "),
            ("HOPX_BASE_URL", "http://127.0.0.1:9/api//"),
            ("WASMBOX_OFFLINE", "1"),
        ]));
        assert_eq!(
            c.api_key.as_ref().map(Secret::expose),
            Some("hopx_live_abc")
        );
        assert_eq!(c.base_url, "http://127.0.0.1:9/api");
        assert!(c.offline);
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("hopx_live_abc") && dbg.contains("***"),
            "{dbg}"
        );

        let c = CloudConfig::from_vars(vars(&[("HOPX_API_KEY", ""), ("WASMBOX_OFFLINE", "0")]));
        assert!(c.api_key.is_none());
        assert_eq!(c.base_url, DEFAULT_BASE_URL);
        assert!(!c.offline);
        assert_eq!(
            (c.max_sandboxes, c.max_sandboxes_per_owner),
            (8, 4),
            "defaults"
        );
        assert_eq!(c.sandbox_timeout(None).unwrap(), 3600);
        assert_eq!(c.sandbox_timeout(Some(3600)).unwrap(), 3600);
        assert!(c.sandbox_timeout(Some(3601)).is_err());
        assert!(c.sandbox_timeout(Some(0)).is_err());
        assert_eq!(c.oneshot_timeout(Duration::from_secs(30)), 600);
        assert_eq!(c.oneshot_timeout(Duration::from_secs(900)), 1020);

        let c = CloudConfig::from_vars(vars(&[
            ("WASMBOX_MAX_CLOUD_SANDBOXES", "2"),
            ("WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN", " 1 "),
            ("WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT", "300"),
        ]));
        assert_eq!((c.max_sandboxes, c.max_sandboxes_per_owner), (2, 1));
        assert_eq!(c.sandbox_timeout(None).unwrap(), 300);
        let e = c.sandbox_timeout(Some(301)).unwrap_err().to_string();
        assert!(
            e.contains("at most 300 s") && e.contains("WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT"),
            "{e}"
        );
        assert_eq!(c.oneshot_timeout(Duration::from_secs(30)), 300);
        // Nonsense keeps the default; a lifetime of 0 would be none at all.
        let c = CloudConfig::from_vars(vars(&[
            ("WASMBOX_MAX_CLOUD_SANDBOXES", "many"),
            ("WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT", "0"),
        ]));
        assert_eq!((c.max_sandboxes, c.max_sandbox_timeout_secs), (8, 3600));
    }
}
