//! The HOPX REST client: the control plane (`X-API-Key`) and each sandbox's agent (Bearer JWT),
//! as specified in `hopx-api.md`.
//!
//! Unlike the official SDK, only idempotent calls are retried: a retried `/execute`,
//! `/commands/run` or sandbox creation after a 5xx or a timeout can run code twice or leave a
//! second sandbox behind.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::config::{AGENT_REPLY_CAP, CONTROL_REPLY_CAP, CloudConfig, ONESHOT_TEMPLATE, Secret};
use super::error::CloudError;
use super::route::CloudReason;
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

    fn body(&self) -> Value {
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
    auth_token: Option<Secret>,
    #[serde(default, skip_serializing)]
    token_expires_at: Option<String>,
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

#[derive(Deserialize)]
struct RunReply {
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    execution_time: f64,
    #[serde(default)]
    success: Option<bool>,
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

/// The HOPX client. Cheap to clone (one shared connection pool).
#[derive(Clone)]
pub struct Cloud {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: CloudConfig,
    http: reqwest::Client,
    live: Mutex<Live>,
}

/// Places taken by live cloud sandboxes: in all, and by owner.
#[derive(Default)]
struct Live {
    total: usize,
    by_owner: HashMap<String, usize>,
}

/// One live cloud sandbox's place within the limits, given back when dropped: hold it for as
/// long as the sandbox exists.
pub struct CloudSlot {
    cloud: Cloud,
    owner: Option<String>,
}

impl fmt::Debug for CloudSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudSlot")
            .field("owner", &self.owner)
            .finish()
    }
}

impl Drop for CloudSlot {
    fn drop(&mut self) {
        let mut live = self.cloud.inner.live.lock().unwrap();
        live.total -= 1;
        if let Some(o) = &self.owner
            && let Some(n) = live.by_owner.get_mut(o)
        {
            *n -= 1;
            if *n == 0 {
                live.by_owner.remove(o);
            }
        }
    }
}

impl fmt::Debug for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cloud")
            .field("config", &self.inner.cfg)
            .finish()
    }
}

/// Whether a call may be sent again after a 429, 5xx or timeout.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    Idempotent,
    /// Runs user code: a second attempt could run it twice.
    RunsCode,
    /// Creates a sandbox: a second attempt could leave one behind.
    Creates,
    /// Not idempotent for another reason (a write, a background start).
    Once,
}

enum Auth<'a> {
    Key,
    Token(&'a Sandbox),
}

struct Call<'a> {
    op: &'static str,
    /// What a 404 is about ("sandbox X", "file /p").
    target: String,
    method: Method,
    url: String,
    query: Vec<(&'static str, String)>,
    body: Option<Value>,
    timeout: Duration,
    auth: Auth<'a>,
    retry: Retry,
}

struct Reply {
    status: StatusCode,
    body: bytes::Bytes,
}

impl Reply {
    /// The body as `T`; an empty body (204) is `T::default()`.
    fn json<T: DeserializeOwned + Default>(&self, op: &'static str) -> Result<T, CloudError> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(T::default());
        }
        serde_json::from_slice(&self.body).map_err(|e| CloudError::BadResponse {
            op,
            message: format!("{e} (status {})", self.status.as_u16()),
        })
    }

    fn is_empty(&self) -> bool {
        self.body.iter().all(u8::is_ascii_whitespace)
    }
}

impl Cloud {
    pub fn new(cfg: CloudConfig) -> Result<Self, CloudError> {
        // No redirects: reqwest keeps custom headers (X-API-Key) across hosts, and a 307 would
        // resend a code run wherever it points. A 3xx is an error naming HOPX_BASE_URL.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10).min(cfg.request_timeout))
            .user_agent(concat!("wasmbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CloudError::Setup(e.to_string()))?;
        tracing::debug!(config = ?cfg, "HOPX client ready");
        Ok(Cloud {
            inner: Arc::new(Inner {
                cfg,
                http,
                live: Mutex::default(),
            }),
        })
    }

    /// Takes a place for one more live cloud sandbox, within the limits in all and, for an
    /// `owner`, per owner (one-shots, whose owner this client does not know, count in all).
    pub fn reserve(&self, owner: Option<&str>) -> Result<CloudSlot, CloudError> {
        let cfg = &self.inner.cfg;
        let mut live = self.inner.live.lock().unwrap();
        if live.total >= cfg.max_sandboxes {
            return Err(CloudError::TooManySandboxes {
                max: cfg.max_sandboxes,
            });
        }
        if let Some(o) = owner {
            if live.by_owner.get(o).copied().unwrap_or(0) >= cfg.max_sandboxes_per_owner {
                return Err(CloudError::TooManyForOwner {
                    max: cfg.max_sandboxes_per_owner,
                });
            }
            *live.by_owner.entry(o.to_string()).or_default() += 1;
        }
        live.total += 1;
        Ok(CloudSlot {
            cloud: self.clone(),
            owner: owner.map(String::from),
        })
    }

    pub fn from_env() -> Result<Self, CloudError> {
        Self::new(CloudConfig::from_env())
    }

    pub fn config(&self) -> &CloudConfig {
        &self.inner.cfg
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.cfg.base_url)
    }

    /// `POST /v1/sandboxes`. Never retried (a retry can create a second sandbox). The lifetime
    /// is always sent, and at most the configured maximum.
    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<SandboxInfo, CloudError> {
        let mut req = req.clone();
        req.timeout_seconds = Some(self.inner.cfg.sandbox_timeout(req.timeout_seconds)?);
        let req = &req;
        let reply = self
            .call(Call {
                op: "sandbox creation",
                target: format!("template '{}'", req.template.trim()),
                method: Method::POST,
                url: self.url("/v1/sandboxes"),
                query: vec![],
                body: Some(req.body()),
                timeout: self.inner.cfg.request_timeout,
                auth: Auth::Key,
                retry: Retry::Creates,
            })
            .await?;
        let info: Option<SandboxInfo> = reply.json("sandbox creation")?;
        let info = info.ok_or_else(|| CloudError::BadResponse {
            op: "sandbox creation",
            message: "empty reply, no sandbox id".into(),
        })?;
        tracing::info!(sandbox = %info.id, template = %req.template, "HOPX sandbox created");
        Ok(info)
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxInfo, CloudError> {
        let reply = self
            .control_get("sandbox lookup", id, &format!("/v1/sandboxes/{id}"), vec![])
            .await?;
        let info: Option<SandboxInfo> = reply.json("sandbox lookup")?;
        info.ok_or_else(|| CloudError::BadResponse {
            op: "sandbox lookup",
            message: "empty reply".into(),
        })
    }

    /// `GET /v1/sandboxes`: the first page, up to `limit`.
    pub async fn list_sandboxes(
        &self,
        limit: u32,
        status: Option<&str>,
    ) -> Result<Vec<SandboxInfo>, CloudError> {
        #[derive(Default, Deserialize)]
        struct Page {
            #[serde(default)]
            data: Vec<SandboxInfo>,
        }
        let mut query = vec![("limit", limit.to_string())];
        if let Some(s) = status {
            query.push(("status", s.to_string()));
        }
        let reply = self
            .control_get("sandbox list", "", "/v1/sandboxes", query)
            .await?;
        Ok(reply.json::<Page>("sandbox list")?.data)
    }

    /// `DELETE /v1/sandboxes/{id}`. A sandbox that is already gone (404) counts as deleted.
    pub async fn delete_sandbox(&self, id: &str) -> Result<(), CloudError> {
        let r = self
            .call(Call {
                op: "sandbox deletion",
                target: format!("sandbox {id}"),
                method: Method::DELETE,
                url: self.url(&format!("/v1/sandboxes/{id}")),
                query: vec![],
                body: None,
                timeout: self.inner.cfg.request_timeout,
                auth: Auth::Key,
                retry: Retry::Idempotent,
            })
            .await;
        match r {
            Ok(_) | Err(CloudError::NotFound { .. }) => {
                tracing::info!(sandbox = %id, "HOPX sandbox deleted");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Creates a sandbox and waits until its agent is healthy. The caller owns it (and deletes
    /// it); [`Cloud::with_sandbox`] is the form that always cleans up.
    pub async fn start(&self, req: &CreateSandbox) -> Result<Sandbox, CloudError> {
        let info = self.create_sandbox(req).await?;
        let mut guard = DeleteGuard {
            cloud: self.clone(),
            id: Some(info.id.clone()),
        };
        match self.ready(info, req).await {
            Ok(sb) => {
                guard.id = None;
                Ok(sb)
            }
            Err(e) => {
                guard.delete().await;
                Err(e)
            }
        }
    }

    /// Attaches to an existing sandbox: looks it up (resuming it if paused), gets a fresh token
    /// and waits for its agent.
    pub async fn connect(&self, id: &str) -> Result<Sandbox, CloudError> {
        let info = self.get_sandbox(id).await?;
        match info.status.as_str() {
            "running" => {}
            "paused" => {
                self.control_post("sandbox resume", id, &format!("/v1/sandboxes/{id}/resume"))
                    .await?;
            }
            other => {
                return Err(CloudError::SandboxUnavailable {
                    sandbox_id: id.to_string(),
                    status: other.to_string(),
                });
            }
        }
        let url = info.agent_url().ok_or_else(|| CloudError::BadResponse {
            op: "sandbox lookup",
            message: format!("sandbox {id} has no public_host or direct_url"),
        })?;
        let sb = Sandbox::new(self.clone(), id.to_string(), url, None);
        sb.refresh_token().await?;
        sb.wait_healthy(Instant::now() + self.inner.cfg.ready_timeout)
            .await?;
        Ok(sb)
    }

    /// Runs `body` in a new sandbox and deletes the sandbox afterwards, on success, on error, on
    /// timeout and when this future is dropped (the deletion is then spawned on the runtime).
    /// The sandbox holds a place within [`Cloud::reserve`]'s limit in all while it lives.
    pub async fn with_sandbox<T, F, Fut>(
        &self,
        req: &CreateSandbox,
        body: F,
    ) -> Result<T, CloudError>
    where
        F: FnOnce(Sandbox) -> Fut,
        Fut: Future<Output = Result<T, CloudError>>,
    {
        let _slot = self.reserve(None)?;
        let info = self.create_sandbox(req).await?;
        let mut guard = DeleteGuard {
            cloud: self.clone(),
            id: Some(info.id.clone()),
        };
        let result = async {
            let sb = self.ready(info, req).await?;
            body(sb).await
        }
        .await;
        guard.delete().await;
        result
    }

    /// A one-shot in a fresh `code-interpreter` sandbox: create → wait healthy → execute →
    /// delete (always). `language` is any name the agent accepts (python, javascript, bash, go).
    pub async fn oneshot(
        &self,
        language: &str,
        code: &str,
        timeout: Duration,
        env: &BTreeMap<String, String>,
    ) -> Result<CloudExec, CloudError> {
        let create = CreateSandbox {
            template: ONESHOT_TEMPLATE.into(),
            // The server deletes it by itself if our DELETE is lost.
            timeout_seconds: Some(self.inner.cfg.oneshot_timeout(timeout)),
            internet_access: Some(true),
            ..Default::default()
        };
        let req = ExecuteRequest {
            language: language.into(),
            code: code.into(),
            timeout,
            env: env.clone(),
            workdir: Some("/workspace".into()),
        };
        self.with_sandbox(&create, |sb| async move { sb.execute(&req).await })
            .await
    }

    /// From a create reply to a usable sandbox: agent URL (polling the lookup while it is
    /// still being created), token, healthy agent, create-time env applied.
    async fn ready(
        &self,
        mut info: SandboxInfo,
        req: &CreateSandbox,
    ) -> Result<Sandbox, CloudError> {
        let cfg = &self.inner.cfg;
        let deadline = Instant::now() + cfg.ready_timeout;
        let token = info.auth_token.take().map(|t| Token {
            expires_at: info.token_expires_at.as_deref().and_then(parse_rfc3339),
            value: t,
        });
        let mut first = true;
        let url = loop {
            let running = matches!(info.status.as_str(), "" | "running");
            match info.agent_url() {
                Some(url) if running => break url,
                _ => {}
            }
            if !first {
                if Instant::now() + cfg.poll_interval > deadline {
                    return Err(CloudError::NotReady {
                        sandbox_id: info.id,
                        waited: cfg.ready_timeout,
                        last: format!("status '{}'", info.status),
                    });
                }
                tokio::time::sleep(cfg.poll_interval).await;
            }
            first = false;
            info = self.get_sandbox(&info.id).await?;
        };
        let sb = Sandbox::new(self.clone(), info.id, url, token);
        if sb.token.lock().unwrap().is_none() {
            sb.refresh_token().await?;
        }
        sb.wait_healthy(deadline).await?;
        if !req.env_vars.is_empty() {
            sb.env_set(&req.env_vars, true).await?;
        }
        Ok(sb)
    }

    async fn control_get(
        &self,
        op: &'static str,
        id: &str,
        path: &str,
        query: Vec<(&'static str, String)>,
    ) -> Result<Reply, CloudError> {
        self.call(Call {
            op,
            target: format!("sandbox {id}"),
            method: Method::GET,
            url: self.url(path),
            query,
            body: None,
            timeout: self.inner.cfg.request_timeout,
            auth: Auth::Key,
            retry: Retry::Idempotent,
        })
        .await
    }

    async fn control_post(
        &self,
        op: &'static str,
        id: &str,
        path: &str,
    ) -> Result<Reply, CloudError> {
        self.call(Call {
            op,
            target: format!("sandbox {id}"),
            method: Method::POST,
            url: self.url(path),
            query: vec![],
            body: None,
            timeout: self.inner.cfg.request_timeout,
            auth: Auth::Key,
            retry: Retry::Once,
        })
        .await
    }

    /// Sends one call with its retry policy: idempotent calls are retried on 429/5xx/timeouts;
    /// an agent 401 refreshes the token and resends once (a 401 means nothing ran).
    async fn call(&self, c: Call<'_>) -> Result<Reply, CloudError> {
        let cfg = &self.inner.cfg;
        let key = cfg.check_available(&CloudReason::Request { what: c.op })?;
        let path = c.url.split_once("://").map_or(c.url.as_str(), |(_, rest)| {
            rest.find('/').map_or("/", |i| &rest[i..])
        });
        let mut attempt = 1;
        let mut refreshed = false;
        if let Auth::Token(sb) = c.auth
            && sb.token_expiring()
        {
            // Refreshing is idempotent; a failure here leaves the 401 path to handle it.
            if let Err(e) = Box::pin(sb.refresh_token()).await {
                tracing::debug!(sandbox = %sb.id, error = %e, "early token refresh failed");
            }
        }
        loop {
            let mut rb = self
                .inner
                .http
                .request(c.method.clone(), &c.url)
                .timeout(c.timeout)
                .header(CONTENT_TYPE, "application/json");
            if !c.query.is_empty() {
                rb = rb.query(&c.query);
            }
            if let Some(b) = &c.body {
                rb = rb.json(b);
            }
            match c.auth {
                Auth::Key => rb = rb.header("X-API-Key", sensitive(key.expose())?),
                Auth::Token(sb) => {
                    if let Some(t) = sb.token_value() {
                        rb =
                            rb.header(AUTHORIZATION, sensitive(&format!("Bearer {}", t.expose()))?);
                    }
                }
            }
            let can_retry = c.retry == Retry::Idempotent && attempt < cfg.max_attempts;
            let backoff = cfg
                .retry_delay
                .saturating_mul(1 << (attempt - 1))
                .min(cfg.max_retry_delay);
            let started = Instant::now();
            let sent = match rb.send().await {
                Ok(mut resp) => {
                    let status = resp.status();
                    let retry_after = resp
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    if status.is_redirection() {
                        let ms = started.elapsed().as_millis() as u64;
                        tracing::debug!(op = c.op, method = %c.method, path, status = status.as_u16(), ms, attempt, "HOPX redirect refused");
                        let to: String =
                            resp.headers().get(LOCATION).map_or("nowhere".into(), |v| {
                                String::from_utf8_lossy(v.as_bytes())
                                    .chars()
                                    .take(200)
                                    .collect()
                            });
                        return Err(CloudError::Redirect {
                            op: c.op,
                            status: status.as_u16(),
                            location: self.scrub(&to, &c.auth),
                        });
                    }
                    let cap = match c.auth {
                        Auth::Key => CONTROL_REPLY_CAP,
                        Auth::Token(_) => AGENT_REPLY_CAP,
                    };
                    match read_capped(&mut resp, cap).await {
                        Ok((body, true)) => Ok((status, retry_after, body)),
                        Ok((_, false)) => {
                            let ms = started.elapsed().as_millis() as u64;
                            tracing::debug!(op = c.op, method = %c.method, path, status = status.as_u16(), ms, attempt, "HOPX reply over its cap");
                            return Err(CloudError::TooLarge {
                                op: c.op,
                                limit: cap,
                            });
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            let ms = started.elapsed().as_millis() as u64;
            let (status, header_retry_after, body) = match sent {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(op = c.op, method = %c.method, path, ms, attempt, error = %e, "HOPX request failed");
                    // A refused connection never reached the server, so even a code run may
                    // be sent again.
                    if can_retry || (e.is_connect() && attempt < cfg.max_attempts) {
                        tokio::time::sleep(backoff).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(if e.is_timeout() {
                        CloudError::Timeout {
                            op: c.op,
                            after: c.timeout,
                            note: note(c.retry, attempt),
                        }
                    } else {
                        CloudError::Network {
                            op: c.op,
                            message: self.scrub(&error_chain(&e), &c.auth),
                        }
                    });
                }
            };
            tracing::debug!(op = c.op, method = %c.method, path, status = status.as_u16(), ms, attempt, "HOPX request");
            if status.is_success() {
                return Ok(Reply { status, body });
            }
            if status == StatusCode::UNAUTHORIZED {
                match c.auth {
                    Auth::Key => return Err(CloudError::BadApiKey),
                    Auth::Token(_) if refreshed => return Err(CloudError::BadToken { op: c.op }),
                    Auth::Token(sb) => {
                        refreshed = true;
                        Box::pin(sb.refresh_token()).await?;
                        continue;
                    }
                }
            }
            let info = ErrorInfo::parse(&body, status, |s| self.scrub(s, &c.auth));
            let transient = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
            if transient && can_retry {
                let delay = if status == StatusCode::TOO_MANY_REQUESTS {
                    info.retry_after
                        .or(header_retry_after)
                        .map_or(backoff, Duration::from_secs)
                        .min(cfg.max_retry_delay)
                } else {
                    backoff
                };
                tokio::time::sleep(delay).await;
                attempt += 1;
                continue;
            }
            return Err(map_status(&c, status, info, header_retry_after, attempt));
        }
    }

    /// Server text can echo request data; the key and the sandbox token never leave as text.
    fn scrub(&self, s: &str, auth: &Auth<'_>) -> String {
        let mut out = s.to_string();
        if let Some(k) = &self.inner.cfg.api_key
            && !k.expose().is_empty()
        {
            out = out.replace(k.expose(), "***");
        }
        if let Auth::Token(sb) = auth
            && let Some(t) = sb.token_value()
            && !t.expose().is_empty()
        {
            out = out.replace(t.expose(), "***");
        }
        out
    }
}

/// Reads a reply's body, at most `cap` bytes: with `true` the whole body, with `false` the body
/// is longer (its `Content-Length` says so, or reading found out) and the rest was never read.
/// Replies come from servers we do not control; `bytes()` would buffer whatever they send.
pub(crate) async fn read_capped(
    resp: &mut reqwest::Response,
    cap: usize,
) -> reqwest::Result<(bytes::Bytes, bool)> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Ok((bytes::Bytes::new(), false));
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.freeze(), false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), true))
}

fn sensitive(v: &str) -> Result<HeaderValue, CloudError> {
    let mut h = HeaderValue::from_str(v).map_err(|_| {
        CloudError::Setup("the API key or token contains characters not allowed in a header".into())
    })?;
    h.set_sensitive(true);
    Ok(h)
}

fn note(retry: Retry, attempts: u32) -> &'static str {
    match retry {
        Retry::RunsCode => "; not retried, because running it again could run the code twice",
        Retry::Creates => "; not retried, because it could create a second sandbox",
        Retry::Idempotent if attempts > 1 => " (after retries)",
        _ => "",
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The useful parts of an error body, in either plane's shape.
struct ErrorInfo {
    message: String,
    code: Option<String>,
    retry_after: Option<u64>,
}

impl ErrorInfo {
    fn parse(body: &[u8], status: StatusCode, scrub: impl Fn(&str) -> String) -> Self {
        let raw = String::from_utf8_lossy(body).trim().to_string();
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let (err, top) = (&v["error"], &v);
        let (message, code, details) = if err.is_object() {
            (
                err["message"].as_str(),
                err["code"].as_str(),
                &err["details"],
            )
        } else {
            (
                err.as_str().or(top["message"].as_str()),
                top["code"].as_str(),
                &top["details"],
            )
        };
        let message = match message {
            Some(m) if !m.trim().is_empty() => m.trim().to_string(),
            _ if !raw.is_empty() => raw,
            _ => status
                .canonical_reason()
                .unwrap_or("no details")
                .to_string(),
        };
        let mut message = scrub(&message);
        if let Some((i, _)) = message.char_indices().nth(300) {
            message.truncate(i);
            message.push_str("...");
        }
        ErrorInfo {
            message,
            code: code.map(String::from),
            retry_after: details["retry_after_seconds"].as_u64(),
        }
    }
}

fn map_status(
    c: &Call<'_>,
    status: StatusCode,
    info: ErrorInfo,
    header_retry_after: Option<u64>,
    attempts: u32,
) -> CloudError {
    let op = c.op;
    let s = status.as_u16();
    match (s, &info.code, &c.auth) {
        (429, ..) => CloudError::RateLimited {
            op,
            retry_after: info.retry_after.or(header_retry_after),
        },
        (500.., ..) => CloudError::Server {
            op,
            status: s,
            message: info.message,
            note: note(c.retry, attempts),
        },
        (_, Some(code), Auth::Token(_)) => CloudError::Agent {
            op,
            status: s,
            code: code.clone(),
            message: info.message,
        },
        (403, ..) if info.message.to_ascii_lowercase().contains("limit") => {
            CloudError::LimitReached {
                op,
                message: info.message,
            }
        }
        (403, ..) => CloudError::Forbidden {
            op,
            message: info.message,
        },
        (404, ..) => CloudError::NotFound {
            what: c.target.clone(),
            message: info.message,
        },
        _ => CloudError::Api {
            op,
            status: s,
            message: info.message,
        },
    }
}

/// Deletes its sandbox when told to, or, if dropped first (the caller gave up on the future),
/// from a task spawned on the current runtime.
struct DeleteGuard {
    cloud: Cloud,
    id: Option<String>,
}

impl DeleteGuard {
    async fn delete(&mut self) {
        if let Some(id) = self.id.take()
            && let Err(e) = self.cloud.delete_sandbox(&id).await
        {
            tracing::warn!(sandbox = %id, error = %e, "could not delete a HOPX sandbox; it is deleted by HOPX when its timeout passes");
        }
    }
}

impl Drop for DeleteGuard {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let mut guard = DeleteGuard {
                    cloud: self.cloud.clone(),
                    id: Some(id),
                };
                rt.spawn(async move { guard.delete().await });
            }
            Err(_) => {
                tracing::warn!(sandbox = %id, "no runtime to delete a HOPX sandbox; it is deleted by HOPX when its timeout passes");
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Token {
    value: Secret,
    /// Unix seconds, when the server said.
    expires_at: Option<i64>,
}

/// A running sandbox and its agent. Cheap to clone; clones share the token.
#[derive(Clone, Debug)]
pub struct Sandbox {
    cloud: Cloud,
    id: String,
    agent_url: String,
    token: Arc<Mutex<Option<Token>>>,
}

/// Refresh a token this close to its expiry before using it.
const TOKEN_MARGIN_SECS: i64 = 60;

impl Sandbox {
    fn new(cloud: Cloud, id: String, agent_url: String, token: Option<Token>) -> Self {
        Sandbox {
            cloud,
            id,
            agent_url,
            token: Arc::new(Mutex::new(token)),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn agent_url(&self) -> &str {
        &self.agent_url
    }

    fn token_value(&self) -> Option<Secret> {
        self.token.lock().unwrap().as_ref().map(|t| t.value.clone())
    }

    fn token_expiring(&self) -> bool {
        match &*self.token.lock().unwrap() {
            None => true,
            Some(Token {
                expires_at: Some(at),
                ..
            }) => *at - unix_now() < TOKEN_MARGIN_SECS,
            Some(_) => false,
        }
    }

    /// `POST /v1/sandboxes/{id}/token/refresh` (idempotent, so retried like a GET).
    pub async fn refresh_token(&self) -> Result<(), CloudError> {
        #[derive(Default, Deserialize)]
        struct Fresh {
            auth_token: Option<Secret>,
            token_expires_at: Option<String>,
        }
        let cloud = &self.cloud;
        let reply = cloud
            .call(Call {
                op: "token refresh",
                target: format!("sandbox {}", self.id),
                method: Method::POST,
                url: cloud.url(&format!("/v1/sandboxes/{}/token/refresh", self.id)),
                query: vec![],
                body: None,
                timeout: cloud.inner.cfg.request_timeout,
                auth: Auth::Key,
                retry: Retry::Idempotent,
            })
            .await?;
        let fresh: Fresh = reply.json("token refresh")?;
        let value = fresh.auth_token.ok_or_else(|| CloudError::BadResponse {
            op: "token refresh",
            message: "no auth_token in the reply".into(),
        })?;
        *self.token.lock().unwrap() = Some(Token {
            value,
            expires_at: fresh.token_expires_at.as_deref().and_then(parse_rfc3339),
        });
        tracing::debug!(sandbox = %self.id, "HOPX sandbox token refreshed");
        Ok(())
    }

    /// Polls `GET /health` until the agent says "healthy" or `deadline` passes. A 4xx other than
    /// 429 is final (a bad key stays bad); anything else is retried after a pause.
    pub async fn wait_healthy(&self, deadline: Instant) -> Result<(), CloudError> {
        #[derive(Default, Deserialize)]
        struct Health {
            #[serde(default)]
            status: String,
        }
        let cfg = &self.cloud.inner.cfg;
        let started = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = self
                .agent(
                    "agent health check",
                    Method::GET,
                    "/health",
                    vec![],
                    None,
                    left.min(Duration::from_secs(5))
                        .max(Duration::from_millis(100)),
                    Retry::Once,
                )
                .await;
            let last = match r {
                Ok(reply) => match reply.json::<Health>("agent health check") {
                    Ok(h) if h.status == "healthy" => return Ok(()),
                    Ok(h) => format!("status '{}'", h.status),
                    Err(e) => e.to_string(),
                },
                Err(e) if matches!(e.status(), Some(400..=428 | 430..=499)) => return Err(e),
                Err(e) => e.to_string(),
            };
            if Instant::now() + cfg.poll_interval > deadline {
                return Err(CloudError::NotReady {
                    sandbox_id: self.id.clone(),
                    waited: started.elapsed(),
                    last,
                });
            }
            tokio::time::sleep(cfg.poll_interval).await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn agent(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        query: Vec<(&'static str, String)>,
        body: Option<Value>,
        timeout: Duration,
        retry: Retry,
    ) -> Result<Reply, CloudError> {
        let file = query
            .iter()
            .find(|(k, _)| *k == "path")
            .map(|(_, v)| v.clone())
            .or_else(|| {
                body.as_ref()
                    .and_then(|b| b["path"].as_str().map(String::from))
            });
        let target = match file {
            Some(p) => format!("{p} in sandbox {}", self.id),
            None => format!("{op} target in sandbox {}", self.id),
        };
        self.cloud
            .call(Call {
                op,
                target,
                method,
                url: format!("{}{path}", self.agent_url),
                query,
                body,
                timeout,
                auth: Auth::Token(self),
                retry,
            })
            .await
    }

    fn run_timeout(&self, t: Duration) -> Duration {
        t + self.cloud.inner.cfg.execute_grace
    }

    /// `POST /execute`. Sent once: a 5xx or timeout is an error, never a second run.
    pub async fn execute(&self, req: &ExecuteRequest) -> Result<CloudExec, CloudError> {
        let mut body = json!({
            "language": req.language,
            "code": req.code,
            "workdir": req.workdir,
            "timeout": whole_secs(req.timeout),
        });
        if !req.env.is_empty() {
            body["env"] = json!(req.env);
        }
        let reply = self
            .agent(
                "code execution",
                Method::POST,
                "/execute",
                vec![],
                Some(body),
                self.run_timeout(req.timeout),
                Retry::RunsCode,
            )
            .await?;
        self.run_result(reply, "code execution")
    }

    /// `POST /commands/run` as `bash -c <command>`. Sent once, like [`Sandbox::execute`].
    pub async fn run_command(&self, req: &CommandRequest) -> Result<CloudExec, CloudError> {
        let reply = self
            .agent(
                "command run",
                Method::POST,
                "/commands/run",
                vec![],
                Some(command_body(req)),
                self.run_timeout(req.timeout),
                Retry::RunsCode,
            )
            .await?;
        self.run_result(reply, "command run")
    }

    fn run_result(&self, reply: Reply, op: &'static str) -> Result<CloudExec, CloudError> {
        if reply.is_empty() {
            // The SDK's reading of an empty reply: the run failed.
            return Ok(CloudExec {
                stdout: String::new(),
                stderr: format!("the HOPX agent sent an empty reply to the {op}"),
                exit_code: 1,
                execution_time: 0.0,
                success: false,
                sandbox_id: self.id.clone(),
            });
        }
        let r: RunReply =
            serde_json::from_slice(&reply.body).map_err(|e| CloudError::BadResponse {
                op,
                message: e.to_string(),
            })?;
        Ok(CloudExec {
            success: r.success.unwrap_or(r.exit_code == 0),
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
            execution_time: r.execution_time,
            sandbox_id: self.id.clone(),
        })
    }

    /// `POST /commands/background`: the agent's reply (with `process_id`), as is.
    pub async fn run_command_background(&self, req: &CommandRequest) -> Result<Value, CloudError> {
        let reply = self
            .agent(
                "background command",
                Method::POST,
                "/commands/background",
                vec![],
                Some(command_body(req)),
                Duration::from_secs(10),
                Retry::RunsCode,
            )
            .await?;
        reply.json("background command")
    }

    /// `POST /execute/background` (no workdir in this API): the agent's reply, as is.
    pub async fn execute_background(
        &self,
        req: &ExecuteRequest,
        name: Option<&str>,
    ) -> Result<Value, CloudError> {
        let mut body = json!({
            "language": req.language,
            "code": req.code,
            "timeout": whole_secs(req.timeout),
        });
        if !req.env.is_empty() {
            body["env"] = json!(req.env);
        }
        if let Some(n) = name {
            body["name"] = n.into();
        }
        let reply = self
            .agent(
                "background execution",
                Method::POST,
                "/execute/background",
                vec![],
                Some(body),
                Duration::from_secs(10),
                Retry::RunsCode,
            )
            .await?;
        reply.json("background execution")
    }

    /// `GET /execute/processes`: the background runs, as the agent describes them.
    pub async fn list_processes(&self) -> Result<Vec<Value>, CloudError> {
        #[derive(Default, Deserialize)]
        struct Procs {
            #[serde(default)]
            processes: Vec<Value>,
        }
        let t = self.cloud.inner.cfg.request_timeout;
        let reply = self
            .agent(
                "process list",
                Method::GET,
                "/execute/processes",
                vec![],
                None,
                t,
                Retry::Idempotent,
            )
            .await?;
        Ok(reply.json::<Procs>("process list")?.processes)
    }

    /// `POST /execute/kill/{process_id}` (POST, whatever hopx-mcp's docstring says).
    pub async fn kill_process(&self, process_id: &str) -> Result<Value, CloudError> {
        let t = self.cloud.inner.cfg.request_timeout;
        let path = format!("/execute/kill/{process_id}");
        let reply = self
            .agent(
                "process kill",
                Method::POST,
                &path,
                vec![],
                None,
                t,
                Retry::Once,
            )
            .await?;
        reply.json("process kill")
    }

    /// `GET /files/read`: a text file's content.
    pub async fn read_file(&self, path: &str) -> Result<String, CloudError> {
        #[derive(Default, Deserialize)]
        struct Content {
            #[serde(default)]
            content: String,
        }
        let t = self.cloud.inner.cfg.request_timeout;
        let q = vec![("path", path.to_string())];
        let reply = self
            .agent(
                "file read",
                Method::GET,
                "/files/read",
                q,
                None,
                t,
                Retry::Idempotent,
            )
            .await?;
        Ok(reply.json::<Content>("file read")?.content)
    }

    /// `POST /files/write` (creates or overwrites, mode 0644).
    pub async fn write_file(&self, path: &str, content: &str) -> Result<(), CloudError> {
        let t = self.cloud.inner.cfg.request_timeout;
        let body = json!({"path": path, "content": content, "mode": "0644"});
        self.agent(
            "file write",
            Method::POST,
            "/files/write",
            vec![],
            Some(body),
            t,
            Retry::Once,
        )
        .await?;
        Ok(())
    }

    /// `GET /files/list`.
    pub async fn list_files(&self, path: &str) -> Result<Vec<FileEntry>, CloudError> {
        #[derive(Default, Deserialize)]
        struct Listing {
            #[serde(default)]
            files: Vec<FileEntry>,
        }
        let t = self.cloud.inner.cfg.request_timeout;
        let q = vec![("path", path.to_string())];
        let reply = self
            .agent(
                "file list",
                Method::GET,
                "/files/list",
                q,
                None,
                t,
                Retry::Idempotent,
            )
            .await?;
        Ok(reply.json::<Listing>("file list")?.files)
    }

    /// `GET /files/exists`. Errors are errors here (the SDK turns them into `false`).
    pub async fn file_exists(&self, path: &str) -> Result<bool, CloudError> {
        #[derive(Default, Deserialize)]
        struct Exists {
            #[serde(default)]
            exists: bool,
        }
        let q = vec![("path", path.to_string())];
        let reply = self
            .agent(
                "file check",
                Method::GET,
                "/files/exists",
                q,
                None,
                Duration::from_secs(10),
                Retry::Idempotent,
            )
            .await?;
        Ok(reply.json::<Exists>("file check")?.exists)
    }

    /// `DELETE /files/remove` (recursive for directories).
    pub async fn remove_file(&self, path: &str) -> Result<(), CloudError> {
        let t = self.cloud.inner.cfg.request_timeout;
        let q = vec![("path", path.to_string())];
        self.agent(
            "file removal",
            Method::DELETE,
            "/files/remove",
            q,
            None,
            t,
            Retry::Idempotent,
        )
        .await?;
        Ok(())
    }

    /// `POST /files/mkdir` (with parents).
    pub async fn mkdir(&self, path: &str) -> Result<(), CloudError> {
        let t = self.cloud.inner.cfg.request_timeout;
        let body = json!({"path": path});
        self.agent(
            "directory creation",
            Method::POST,
            "/files/mkdir",
            vec![],
            Some(body),
            t,
            Retry::Once,
        )
        .await?;
        Ok(())
    }

    /// `GET /env`: the sandbox-global variables (secret-looking values come back masked).
    pub async fn env_get(&self) -> Result<BTreeMap<String, String>, CloudError> {
        let t = self.cloud.inner.cfg.request_timeout;
        let reply = self
            .agent(
                "env read",
                Method::GET,
                "/env",
                vec![],
                None,
                t,
                Retry::Idempotent,
            )
            .await?;
        Ok(reply.json::<EnvVars>("env read")?.env_vars)
    }

    /// `PATCH /env` (merge) or `PUT /env` (replace all). Returns the variables as the agent
    /// reports them afterwards.
    pub async fn env_set(
        &self,
        vars: &BTreeMap<String, String>,
        merge: bool,
    ) -> Result<BTreeMap<String, String>, CloudError> {
        let t = self.cloud.inner.cfg.request_timeout;
        let (method, body, retry) = if merge {
            (
                Method::PATCH,
                json!({"env_vars": vars, "merge": true}),
                Retry::Once,
            )
        } else {
            (Method::PUT, json!({"env_vars": vars}), Retry::Idempotent)
        };
        let reply = self
            .agent("env update", method, "/env", vec![], Some(body), t, retry)
            .await?;
        match (reply.is_empty(), merge) {
            (false, _) => Ok(reply.json::<EnvVars>("env update")?.env_vars),
            (true, true) => self.env_get().await,
            (true, false) => Ok(vars.clone()),
        }
    }

    /// `PUT /env` with nothing: clears the sandbox-global variables.
    pub async fn env_clear(&self) -> Result<(), CloudError> {
        self.env_set(&BTreeMap::new(), false).await.map(|_| ())
    }

    /// Deletes this sandbox.
    pub async fn delete(&self) -> Result<(), CloudError> {
        self.cloud.delete_sandbox(&self.id).await
    }
}

#[derive(Default, Deserialize)]
struct EnvVars {
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
}

fn command_body(req: &CommandRequest) -> Value {
    let mut body = json!({
        "command": "bash",
        "args": ["-c", req.command],
        "timeout": whole_secs(req.timeout),
        "workdir": req.workdir,
    });
    if !req.env.is_empty() {
        body["env"] = json!(req.env);
    }
    body
}

/// The agent takes whole seconds; round up so a short timeout never becomes 0.
fn whole_secs(d: Duration) -> u64 {
    (d.as_secs_f64().ceil() as u64).max(1)
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// RFC 3339 / ISO-8601 (`2025-01-16T10:30:00Z`, fractions and offsets allowed) to Unix seconds.
fn parse_rfc3339(s: &str) -> Option<i64> {
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
    use crate::cloud::DEFAULT_BASE_URL;

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

    #[test]
    fn places_are_limited_in_all_and_per_owner_and_given_back() {
        let cloud = Cloud::new(CloudConfig {
            max_sandboxes: 3,
            max_sandboxes_per_owner: 2,
            ..CloudConfig::default()
        })
        .unwrap();
        let a1 = cloud.reserve(Some("a")).unwrap();
        let _a2 = cloud.reserve(Some("a")).unwrap();
        assert!(matches!(
            cloud.reserve(Some("a")),
            Err(CloudError::TooManyForOwner { max: 2 })
        ));
        let _b = cloud.reserve(Some("b")).unwrap();
        assert!(matches!(
            cloud.reserve(None),
            Err(CloudError::TooManySandboxes { max: 3 })
        ));
        // A refusal in all takes no per-owner place either.
        assert!(matches!(
            cloud.reserve(Some("c")),
            Err(CloudError::TooManySandboxes { .. })
        ));
        drop(a1);
        let _one_shot = cloud.reserve(None).unwrap();
        drop(_one_shot);
        let _a3 = cloud.reserve(Some("a")).unwrap();
        let live = cloud.inner.live.lock().unwrap();
        assert_eq!((live.total, live.by_owner.get("c")), (3, None));
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

    #[test]
    fn error_bodies_of_both_planes_are_read() {
        let id = |s: &str| s.to_string();
        let e = ErrorInfo::parse(
            br#"{"error":{"message":"Slow down","code":"rate_limited","details":{"retry_after_seconds":7}}}"#,
            StatusCode::TOO_MANY_REQUESTS,
            id,
        );
        assert_eq!((e.message.as_str(), e.retry_after), ("Slow down", Some(7)));
        let e = ErrorInfo::parse(
            br#"{"error":"File not found","code":"FILE_NOT_FOUND"}"#,
            StatusCode::NOT_FOUND,
            id,
        );
        assert_eq!(
            (e.message.as_str(), e.code.as_deref()),
            ("File not found", Some("FILE_NOT_FOUND"))
        );
        let e = ErrorInfo::parse(b"<html>bad gateway</html>", StatusCode::BAD_GATEWAY, id);
        assert_eq!(e.message, "<html>bad gateway</html>");
        let e = ErrorInfo::parse(b"", StatusCode::BAD_GATEWAY, id);
        assert_eq!(e.message, "Bad Gateway");
    }
}
