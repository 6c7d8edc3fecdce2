//! What goes over the wire to HOPX and comes back: request and reply types and their JSON
//! shapes, kept apart from how they are sent so that both planes, the MCP tools and the tests
//! share one reading of `hopx-api.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::config::Secret;
use crate::lang::{ExecResult, Language};

/// What `POST /v1/sandboxes` creates.
#[derive(Clone, Debug, Default)]
pub struct CreateSandbox {
    /// A template name (`code-interpreter`), or a numeric template id (`"291"`).
    pub template: String,
    pub region: Option<String>,
    /// Server-side auto-delete: the safety net if our DELETE never arrives.
    pub timeout_seconds: Option<u64>,
    pub internet_access: Option<bool>,
    /// Sent with the create and then applied with `PATCH /env`, as the SDK does (the API does not
    /// apply create-time variables at runtime).
    pub env_vars: BTreeMap<String, String>,
}

impl CreateSandbox {
    pub fn new(template: impl Into<String>) -> Self {
        CreateSandbox {
            template: template.into(),
            ..Default::default()
        }
    }

    pub(super) fn body(&self) -> Value {
        let t = self.template.trim();
        let mut b = serde_json::Map::new();
        if !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit()) {
            b.insert("template_id".into(), t.into());
        } else {
            b.insert("template_name".into(), t.into());
        }
        if let Some(r) = &self.region {
            b.insert("region".into(), r.as_str().into());
        }
        if let Some(s) = self.timeout_seconds {
            b.insert("timeout_seconds".into(), s.into());
        }
        if let Some(i) = self.internet_access {
            b.insert("internet_access".into(), i.into());
        }
        if !self.env_vars.is_empty() {
            b.insert("env_vars".into(), json!(self.env_vars));
        }
        Value::Object(b)
    }
}

/// The control plane's sandbox object (the fields we use).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct SandboxInfo {
    pub id: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub public_host: Option<String>,
    #[serde(default)]
    pub direct_url: Option<String>,
    #[serde(default)]
    pub template_id: Option<String>,
    #[serde(default)]
    pub template_name: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub internet_access: Option<bool>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing)]
    pub(super) auth_token: Option<Secret>,
    #[serde(default, skip_serializing)]
    pub(super) token_expires_at: Option<String>,
}

impl SandboxInfo {
    /// The agent's base URL: `public_host`, else `direct_url`, without a trailing `/`.
    pub fn agent_url(&self) -> Option<String> {
        [&self.public_host, &self.direct_url]
            .into_iter()
            .flatten()
            .map(|u| u.trim().trim_end_matches('/'))
            .find(|u| !u.is_empty())
            .map(String::from)
    }
}

/// One code run (`POST /execute`).
#[derive(Clone, Debug)]
pub struct ExecuteRequest {
    pub language: String,
    pub code: String,
    pub timeout: Duration,
    pub env: BTreeMap<String, String>,
    /// `None` sends JSON null (the agent's default directory), as hopx-mcp's persistent mode.
    pub workdir: Option<String>,
}

impl ExecuteRequest {
    pub fn new(language: impl Into<String>, code: impl Into<String>) -> Self {
        ExecuteRequest {
            language: language.into(),
            code: code.into(),
            timeout: Duration::from_secs(30),
            env: BTreeMap::new(),
            workdir: Some("/workspace".into()),
        }
    }

    /// The body of `/execute` and `/execute/background`, less the workdir (which only the
    /// first takes).
    pub(super) fn body(&self) -> Value {
        let mut body = json!({
            "language": self.language,
            "code": self.code,
            "timeout": whole_secs(self.timeout),
        });
        if !self.env.is_empty() {
            body["env"] = json!(self.env);
        }
        body
    }
}

/// One shell command (`POST /commands/run`, as `bash -c <command>`).
#[derive(Clone, Debug)]
pub struct CommandRequest {
    pub command: String,
    pub timeout: Duration,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
}

impl CommandRequest {
    pub fn new(command: impl Into<String>) -> Self {
        CommandRequest {
            command: command.into(),
            timeout: Duration::from_secs(30),
            env: BTreeMap::new(),
            workdir: Some("/workspace".into()),
        }
    }

    /// The body of `/commands/run` and `/commands/background`.
    pub(super) fn body(&self) -> Value {
        let mut body = json!({
            "command": "bash",
            "args": ["-c", self.command],
            "timeout": whole_secs(self.timeout),
            "workdir": self.workdir,
        });
        if !self.env.is_empty() {
            body["env"] = json!(self.env);
        }
        body
    }
}

/// The outcome of a cloud run. A non-zero exit is a result, not an error, as locally.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CloudExec {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    pub execution_time: f64,
    pub success: bool,
    pub sandbox_id: String,
}

impl CloudExec {
    /// The local result shape, so callers can treat cloud and local runs alike. The cloud
    /// reports no limit or truncation; a timeout inside the sandbox is just its exit code.
    pub fn into_exec_result(self, language: Language) -> ExecResult {
        ExecResult {
            stdout: self.stdout,
            stderr: self.stderr,
            exit_code: self.exit_code,
            execution_time: self.execution_time,
            success: self.success,
            truncated: false,
            limit: None,
            language,
            stage: None,
            rich: Vec::new(),
            notes: Vec::new(),
            cloud_sandbox_id: None,
            gaps: Default::default(),
        }
    }
}

/// The agent's reply to `/execute` and `/commands/run`.
#[derive(Deserialize)]
pub(super) struct RunReply {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub execution_time: f64,
    #[serde(default)]
    pub success: Option<bool>,
}

/// A file in a sandbox directory listing (the SDK's alternative key names accepted).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct FileEntry {
    pub name: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default, alias = "is_dir")]
    pub is_directory: bool,
    #[serde(default, alias = "modified")]
    pub modified_time: Option<String>,
    #[serde(default, alias = "mode")]
    pub permissions: Option<String>,
}

/// The agent's reply to `/env` (read and update).
#[derive(Default, Deserialize)]
pub(super) struct EnvVars {
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
}

/// The agent takes whole seconds; round up so a short timeout never becomes 0.
fn whole_secs(d: Duration) -> u64 {
    (d.as_secs_f64().ceil() as u64).max(1)
}

/// RFC 3339 / ISO-8601 (`2025-01-16T10:30:00Z`, fractions and offsets allowed) to Unix seconds.
pub(super) fn parse_rfc3339(s: &str) -> Option<i64> {
    let (date, rest) = s.trim().split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let (time, offset) = if let Some(t) = rest.strip_suffix(['Z', 'z']) {
        (t, 0)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (t, o) = rest.split_at(i);
        let sign = if o.starts_with('-') { -1 } else { 1 };
        let (oh, om) = o[1..].split_once(':').unwrap_or((&o[1..], "0"));
        (
            t,
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60),
        )
    } else {
        (rest, 0)
    };
    let mut t = time.split('.').next()?.splitn(3, ':');
    let (h, mi, sec): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next().unwrap_or("0").parse().ok()?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from civil (H. Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_timestamps_parse_to_unix_seconds() {
        assert_eq!(parse_rfc3339("2025-01-16T10:30:00Z"), Some(1_737_023_400));
        assert_eq!(
            parse_rfc3339("2025-01-16T10:30:00.123456Z"),
            Some(1_737_023_400)
        );
        assert_eq!(
            parse_rfc3339("2025-01-16T12:30:00+02:00"),
            Some(1_737_023_400)
        );
        assert_eq!(parse_rfc3339("2000-02-29T23:59:59Z"), Some(951_868_799));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("soon"), None);
        assert_eq!(parse_rfc3339("2025-13-01T00:00:00Z"), None);
    }

    #[test]
    fn create_body_sends_digits_as_template_id() {
        assert_eq!(
            CreateSandbox::new("291").body(),
            json!({"template_id": "291"})
        );
        let mut c = CreateSandbox::new("code-interpreter");
        c.timeout_seconds = Some(600);
        c.internet_access = Some(true);
        assert_eq!(
            c.body(),
            json!({"template_name": "code-interpreter", "timeout_seconds": 600, "internet_access": true})
        );
    }
}
