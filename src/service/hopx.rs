//! The HOPX cloud side of the service: one-shots routed there, and cloud sandboxes behind
//! wasmbox ids.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Wasmbox;
use crate::lang::{ExecRequest, ExecResult};
use crate::{Error, Result, cancelled, cloud, lang};

/// A sandbox in the HOPX cloud behind a wasmbox id: its calls are forwarded.
pub struct CloudSandbox {
    pub id: String,
    /// Who created it (see [`crate::sandbox::Sandbox::owner`]).
    pub owner: String,
    pub template: String,
    pub created_at: std::time::SystemTime,
    pub timeout_seconds: Option<u64>,
    pub sandbox: cloud::Agent,
    /// Its place within the cloud sandbox limits, given back when it is forgotten.
    _slot: cloud::CloudSlot,
}

impl CloudSandbox {
    /// HOPX has deleted it by now (its lifetime is always set).
    fn expired(&self) -> bool {
        self.timeout_seconds.is_some_and(|t| {
            self.created_at + Duration::from_secs(t) <= std::time::SystemTime::now()
        })
    }
}

impl Wasmbox {
    /// A one-shot that goes where routing says: `bash`, `internet_access` or a cloud-only
    /// template run in a fresh HOPX sandbox (deleted afterwards), the rest locally.
    pub async fn execute_routed(
        &self,
        req: ExecRequest,
        template: Option<&str>,
        internet_access: bool,
    ) -> Result<ExecResult> {
        let route = cloud::RouteRequest {
            language: Some(req.language.as_str()),
            template,
            internet_access,
            ..Default::default()
        };
        match cloud::decide(&route) {
            cloud::Location::Local => self.execute(req).await,
            cloud::Location::Cloud { .. } => self.execute_in_cloud(&req, &route).await,
        }
    }

    pub(super) async fn execute_in_cloud(
        &self,
        req: &ExecRequest,
        route: &cloud::RouteRequest<'_>,
    ) -> Result<ExecResult> {
        cloud::route(route, &self.inner.config.cloud)?;
        let client = self.cloud()?;
        self.inner.executions.fetch_add(1, Ordering::Relaxed);
        let language = req.language.as_str();
        if let Some(p) = &req.progress {
            p.stage("running in a fresh HOPX cloud sandbox; waiting for it");
        }
        let run = async {
            match route
                .template
                .filter(|t| !cloud::LOCAL_TEMPLATES.contains(t))
            {
                None => {
                    client
                        .oneshot(language, &req.code, req.timeout, &req.env)
                        .await
                }
                Some(template) => {
                    let mut create = cloud::CreateSandbox::new(template);
                    create.internet_access = Some(route.internet_access);
                    create.timeout_seconds = Some(client.config().oneshot_timeout(req.timeout));
                    let mut exec = cloud::ExecuteRequest::new(language, req.code.clone());
                    exec.timeout = req.timeout;
                    exec.env = req.env.clone();
                    exec.workdir = Some(lang::guest::WORKSPACE_GUEST.into());
                    client
                        .with_sandbox(&create, |sb| async move { sb.execute(&exec).await })
                        .await
                }
            }
        };
        // Dropping the run on cancellation deletes its cloud sandbox (the client's guard).
        let r = tokio::select! {
            r = run => r?,
            _ = cancelled(req.cancel.as_deref()) => {
                return Err(Error::Cancelled("; its HOPX sandbox is deleted"));
            }
        };
        let id = r.sandbox_id.clone();
        let mut r = r.into_exec_result(req.language);
        r.cloud_sandbox_id = Some(id);
        Ok(r)
    }

    /// Creates a sandbox in the HOPX cloud (routing has decided it must: a cloud-only template
    /// or internet access) and gives it a wasmbox id.
    pub async fn create_cloud_sandbox(
        &self,
        template: &str,
        timeout_seconds: Option<u64>,
        internet_access: bool,
        env: BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Arc<CloudSandbox>> {
        let location = cloud::route(
            &cloud::RouteRequest {
                template: Some(template),
                internet_access,
                ..Default::default()
            },
            &self.inner.config.cloud,
        )?;
        if location == cloud::Location::Local {
            return Err(Error::invalid(format!(
                "template {template} runs locally; create it as a local sandbox"
            )));
        }
        let client = self.cloud()?;
        let timeout = client.config().sandbox_timeout(timeout_seconds)?;
        drop(self.live_cloud_sandboxes());
        let slot = client.reserve(Some(owner))?;
        let mut req = cloud::CreateSandbox::new(template);
        req.timeout_seconds = Some(timeout);
        req.internet_access = Some(internet_access);
        req.env_vars = env;
        let sandbox = client.start(&req).await?;
        let sb = Arc::new(CloudSandbox {
            id: format!("wb{}", uuid::Uuid::new_v4().simple()),
            owner: owner.to_string(),
            template: template.to_string(),
            created_at: std::time::SystemTime::now(),
            timeout_seconds: Some(timeout),
            sandbox,
            _slot: slot,
        });
        self.inner
            .cloud_sandboxes
            .lock()
            .unwrap()
            .insert(sb.id.clone(), sb.clone());
        Ok(sb)
    }

    /// The cloud sandboxes map without those HOPX has ended (their places are given back).
    fn live_cloud_sandboxes(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<CloudSandbox>>> {
        let mut map = self.inner.cloud_sandboxes.lock().unwrap();
        map.retain(|_, c| !c.expired());
        map
    }

    pub fn cloud_sandbox(&self, id: &str) -> Option<Arc<CloudSandbox>> {
        self.live_cloud_sandboxes().get(id).cloned()
    }

    pub fn cloud_sandboxes(&self) -> Vec<Arc<CloudSandbox>> {
        let mut v: Vec<_> = self.live_cloud_sandboxes().values().cloned().collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    /// Forgets a cloud sandbox (deleted, or gone on the HOPX side).
    pub fn forget_cloud_sandbox(&self, id: &str) {
        self.inner.cloud_sandboxes.lock().unwrap().remove(id);
    }

    /// The HOPX client, once routing has said the cloud may be used.
    pub fn cloud(&self) -> Result<&cloud::Cloud> {
        self.inner
            .cloud
            .as_ref()
            .ok_or_else(|| Error::wasm("the HOPX client could not be built (see the server log)"))
    }
}
