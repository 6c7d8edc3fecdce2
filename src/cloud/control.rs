//! The client handle and HOPX's control plane: creating, finding, resuming and deleting
//! sandboxes, and the limits on how many live at once. Every path that creates a sandbox here
//! also deletes it when the caller cannot (a failed start, a dropped future), so a sandbox is
//! never left to run until its server-side timeout.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::Deserialize;

use super::agent::{Agent, Token};
use super::config::{CloudConfig, ONESHOT_TEMPLATE};
use super::error::CloudError;
use super::transport::{Auth, Call, Retry};
use super::wire::{CloudExec, CreateSandbox, ExecuteRequest, SandboxInfo};

/// The HOPX client. Cheap to clone (one shared connection pool).
#[derive(Clone)]
pub struct Cloud {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) cfg: CloudConfig,
    pub(super) http: reqwest::Client,
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

    /// A control-plane call about sandbox `id` with the usual settings: the request timeout,
    /// retried (idempotent), no query or body.
    pub(super) fn control_call(
        &self,
        op: &'static str,
        id: &str,
        method: Method,
        path: &str,
    ) -> Call<'static> {
        Call {
            op,
            target: format!("sandbox {id}"),
            method,
            url: self.url(path),
            query: vec![],
            body: None,
            timeout: self.inner.cfg.request_timeout,
            auth: Auth::Key,
            retry: Retry::Idempotent,
        }
    }

    /// `POST /v1/sandboxes`. Never retried (a retry can create a second sandbox). The lifetime
    /// is always sent, and at most the configured maximum.
    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<SandboxInfo, CloudError> {
        let mut req = req.clone();
        req.timeout_seconds = Some(self.inner.cfg.sandbox_timeout(req.timeout_seconds)?);
        let req = &req;
        let reply = self
            .call(Call {
                target: format!("template '{}'", req.template.trim()),
                body: Some(req.body()),
                retry: Retry::Creates,
                ..self.control_call("sandbox creation", "", Method::POST, "/v1/sandboxes")
            })
            .await?;
        let info: Option<SandboxInfo> = reply.json()?;
        let info = info.ok_or_else(|| CloudError::BadResponse {
            op: "sandbox creation",
            message: "empty reply, no sandbox id".into(),
        })?;
        tracing::info!(sandbox = %info.id, template = %req.template, "HOPX sandbox created");
        Ok(info)
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxInfo, CloudError> {
        let path = format!("/v1/sandboxes/{id}");
        let reply = self
            .call(self.control_call("sandbox lookup", id, Method::GET, &path))
            .await?;
        let info: Option<SandboxInfo> = reply.json()?;
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
            .call(Call {
                query,
                ..self.control_call("sandbox list", "", Method::GET, "/v1/sandboxes")
            })
            .await?;
        Ok(reply.json::<Page>()?.data)
    }

    /// `DELETE /v1/sandboxes/{id}`. A sandbox that is already gone (404) counts as deleted.
    pub async fn delete_sandbox(&self, id: &str) -> Result<(), CloudError> {
        let path = format!("/v1/sandboxes/{id}");
        let r = self
            .call(self.control_call("sandbox deletion", id, Method::DELETE, &path))
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
    pub async fn start(&self, req: &CreateSandbox) -> Result<Agent, CloudError> {
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
    pub async fn connect(&self, id: &str) -> Result<Agent, CloudError> {
        let info = self.get_sandbox(id).await?;
        match info.status.as_str() {
            "running" => {}
            "paused" => {
                let path = format!("/v1/sandboxes/{id}/resume");
                self.call(Call {
                    retry: Retry::Once,
                    ..self.control_call("sandbox resume", id, Method::POST, &path)
                })
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
        let sb = Agent::new(self.clone(), id.to_string(), url, None);
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
        F: FnOnce(Agent) -> Fut,
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
    async fn ready(&self, mut info: SandboxInfo, req: &CreateSandbox) -> Result<Agent, CloudError> {
        let cfg = &self.inner.cfg;
        let deadline = Instant::now() + cfg.ready_timeout;
        let token = info
            .auth_token
            .take()
            .map(|t| Token::new(t, info.token_expires_at.as_deref()));
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
        let needs_token = token.is_none();
        let sb = Agent::new(self.clone(), info.id, url, token);
        if needs_token {
            sb.refresh_token().await?;
        }
        sb.wait_healthy(deadline).await?;
        if !req.env_vars.is_empty() {
            sb.env_set(&req.env_vars, true).await?;
        }
        Ok(sb)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
