//! A running HOPX sandbox and the agent inside it (Bearer JWT): code runs, commands, background
//! processes, files and environment. The token lives here, shared by clones of an [`Agent`],
//! because every agent call may have to refresh it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::config::Secret;
use super::control::Cloud;
use super::error::CloudError;
use super::transport::{Auth, Call, Reply, Retry};
use super::wire::{
    CloudExec, CommandRequest, EnvVars, ExecuteRequest, FileEntry, RunReply, parse_rfc3339,
};

#[derive(Clone, Debug)]
pub(super) struct Token {
    value: Secret,
    /// Unix seconds, when the server said.
    expires_at: Option<i64>,
}

impl Token {
    /// A token as the control plane hands it out, with its RFC 3339 expiry if it gave one.
    pub(super) fn new(value: Secret, expires_at: Option<&str>) -> Self {
        Token {
            value,
            expires_at: expires_at.and_then(parse_rfc3339),
        }
    }
}

/// A running HOPX sandbox, reached through its agent. Cheap to clone; clones share the token.
#[derive(Clone, Debug)]
pub struct Agent {
    cloud: Cloud,
    id: String,
    agent_url: String,
    token: Arc<Mutex<Option<Token>>>,
}

/// A cloud sandbox's environment variables, by name.
pub type Vars = BTreeMap<String, String>;

/// Refresh a token this close to its expiry before using it.
const TOKEN_MARGIN_SECS: i64 = 60;

/// How long a background start or a file check may take.
const SHORT_CALL: Duration = Duration::from_secs(10);

impl Agent {
    pub(super) fn new(cloud: Cloud, id: String, agent_url: String, token: Option<Token>) -> Self {
        Agent {
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

    pub(super) fn token_value(&self) -> Option<Secret> {
        self.token.lock().unwrap().as_ref().map(|t| t.value.clone())
    }

    pub(super) fn token_expiring(&self) -> bool {
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
        let path = format!("/v1/sandboxes/{}/token/refresh", self.id);
        let reply = self
            .cloud
            .call(
                self.cloud
                    .control_call("token refresh", &self.id, Method::POST, &path),
            )
            .await?;
        let fresh: Fresh = reply.json()?;
        let value = fresh.auth_token.ok_or_else(|| CloudError::BadResponse {
            op: "token refresh",
            message: "no auth_token in the reply".into(),
        })?;
        *self.token.lock().unwrap() = Some(Token::new(value, fresh.token_expires_at.as_deref()));
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
        let cfg = self.cloud.config();
        let started = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = self
                .send(Call {
                    timeout: left
                        .min(Duration::from_secs(5))
                        .max(Duration::from_millis(100)),
                    retry: Retry::Once,
                    ..self.agent_call("agent health check", Method::GET, "/health")
                })
                .await;
            let last = match r {
                Ok(reply) => match reply.json::<Health>() {
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

    /// An agent call with the usual settings: the request timeout, retried (idempotent), no
    /// query or body.
    fn agent_call(&self, op: &'static str, method: Method, path: &str) -> Call<'_> {
        Call {
            op,
            target: String::new(),
            method,
            url: format!("{}{path}", self.agent_url),
            query: vec![],
            body: None,
            timeout: self.cloud.config().request_timeout,
            auth: Auth::Token(self),
            retry: Retry::Idempotent,
        }
    }

    /// An agent call about the file at `path` (sent as `?path=`).
    fn file_call(&self, op: &'static str, method: Method, endpoint: &str, path: &str) -> Call<'_> {
        Call {
            query: vec![("path", path.to_string())],
            ..self.agent_call(op, method, endpoint)
        }
    }

    /// Sends an agent call; its 404 names the file it was about, if any, else the operation.
    async fn send(&self, mut c: Call<'_>) -> Result<Reply, CloudError> {
        let file = c
            .query
            .iter()
            .find(|(k, _)| *k == "path")
            .map(|(_, v)| v.clone())
            .or_else(|| {
                c.body
                    .as_ref()
                    .and_then(|b| b["path"].as_str().map(String::from))
            });
        c.target = match file {
            Some(p) => format!("{p} in sandbox {}", self.id),
            None => format!("{} target in sandbox {}", c.op, self.id),
        };
        self.cloud.call(c).await
    }

    /// Sends an agent call and reads its reply as `T`.
    async fn send_json<T: DeserializeOwned + Default>(&self, c: Call<'_>) -> Result<T, CloudError> {
        self.send(c).await?.json()
    }

    /// `POST /execute`. Sent once: a 5xx or timeout is an error, never a second run.
    pub async fn execute(&self, req: &ExecuteRequest) -> Result<CloudExec, CloudError> {
        let mut body = req.body();
        body["workdir"] = json!(req.workdir);
        self.run(
            "code execution",
            "/execute",
            body,
            req.timeout + self.cloud.config().execute_grace,
        )
        .await
    }

    /// `POST /commands/run` as `bash -c <command>`. Sent once, like [`Agent::execute`].
    pub async fn run_command(&self, req: &CommandRequest) -> Result<CloudExec, CloudError> {
        self.run(
            "command run",
            "/commands/run",
            req.body(),
            req.timeout + self.cloud.config().execute_grace,
        )
        .await
    }

    /// Sends one run (never again: it runs user code) and reads its outcome.
    async fn run(
        &self,
        op: &'static str,
        path: &str,
        body: Value,
        timeout: Duration,
    ) -> Result<CloudExec, CloudError> {
        let reply = self
            .send(Call {
                body: Some(body),
                timeout,
                retry: Retry::RunsCode,
                ..self.agent_call(op, Method::POST, path)
            })
            .await?;
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

    /// Starts a background run (sent once, like a run): the agent's reply, as is.
    async fn start_background(
        &self,
        op: &'static str,
        path: &str,
        body: Value,
    ) -> Result<Value, CloudError> {
        self.send_json(Call {
            body: Some(body),
            timeout: SHORT_CALL,
            retry: Retry::RunsCode,
            ..self.agent_call(op, Method::POST, path)
        })
        .await
    }

    /// `POST /commands/background`: the agent's reply (with `process_id`), as is.
    pub async fn run_command_background(&self, req: &CommandRequest) -> Result<Value, CloudError> {
        self.start_background("background command", "/commands/background", req.body())
            .await
    }

    /// `POST /execute/background` (no workdir in this API): the agent's reply, as is.
    pub async fn execute_background(
        &self,
        req: &ExecuteRequest,
        name: Option<&str>,
    ) -> Result<Value, CloudError> {
        let mut body = req.body();
        if let Some(n) = name {
            body["name"] = n.into();
        }
        self.start_background("background execution", "/execute/background", body)
            .await
    }

    /// `GET /execute/processes`: the background runs, as the agent describes them.
    pub async fn list_processes(&self) -> Result<Vec<Value>, CloudError> {
        #[derive(Default, Deserialize)]
        struct Procs {
            #[serde(default)]
            processes: Vec<Value>,
        }
        let c = self.agent_call("process list", Method::GET, "/execute/processes");
        Ok(self.send_json::<Procs>(c).await?.processes)
    }

    /// `POST /execute/kill/{process_id}` (POST, whatever hopx-mcp's docstring says).
    pub async fn kill_process(&self, process_id: &str) -> Result<Value, CloudError> {
        let path = format!("/execute/kill/{process_id}");
        self.send_json(Call {
            retry: Retry::Once,
            ..self.agent_call("process kill", Method::POST, &path)
        })
        .await
    }

    /// `GET /files/read`: a text file's content.
    pub async fn read_file(&self, path: &str) -> Result<String, CloudError> {
        #[derive(Default, Deserialize)]
        struct Content {
            #[serde(default)]
            content: String,
        }
        let c = self.file_call("file read", Method::GET, "/files/read", path);
        Ok(self.send_json::<Content>(c).await?.content)
    }

    /// `POST /files/write` (creates or overwrites, mode 0644).
    pub async fn write_file(&self, path: &str, content: &str) -> Result<(), CloudError> {
        self.send(Call {
            body: Some(json!({"path": path, "content": content, "mode": "0644"})),
            retry: Retry::Once,
            ..self.agent_call("file write", Method::POST, "/files/write")
        })
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
        let c = self.file_call("file list", Method::GET, "/files/list", path);
        Ok(self.send_json::<Listing>(c).await?.files)
    }

    /// `GET /files/exists`. Errors are errors here (the SDK turns them into `false`).
    pub async fn file_exists(&self, path: &str) -> Result<bool, CloudError> {
        #[derive(Default, Deserialize)]
        struct Exists {
            #[serde(default)]
            exists: bool,
        }
        let c = Call {
            timeout: SHORT_CALL,
            ..self.file_call("file check", Method::GET, "/files/exists", path)
        };
        Ok(self.send_json::<Exists>(c).await?.exists)
    }

    /// `DELETE /files/remove` (recursive for directories).
    pub async fn remove_file(&self, path: &str) -> Result<(), CloudError> {
        self.send(self.file_call("file removal", Method::DELETE, "/files/remove", path))
            .await?;
        Ok(())
    }

    /// `POST /files/mkdir` (with parents).
    pub async fn mkdir(&self, path: &str) -> Result<(), CloudError> {
        self.send(Call {
            body: Some(json!({"path": path})),
            retry: Retry::Once,
            ..self.agent_call("directory creation", Method::POST, "/files/mkdir")
        })
        .await?;
        Ok(())
    }

    /// `GET /env`: the sandbox-global variables (secret-looking values come back masked).
    pub async fn env_get(&self) -> Result<Vars, CloudError> {
        let c = self.agent_call("env read", Method::GET, "/env");
        Ok(self.send_json::<EnvVars>(c).await?.env_vars)
    }

    /// `PATCH /env` (merge) or `PUT /env` (replace all). Returns the variables as the agent
    /// reports them afterwards.
    pub async fn env_set(&self, vars: &Vars, merge: bool) -> Result<Vars, CloudError> {
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
            .send(Call {
                body: Some(body),
                retry,
                ..self.agent_call("env update", method, "/env")
            })
            .await?;
        match (reply.is_empty(), merge) {
            (false, _) => Ok(reply.json::<EnvVars>()?.env_vars),
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

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
