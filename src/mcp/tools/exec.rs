//! Running code: `execute_code` and its per-mode aliases, and `execute_code_async`.

use std::time::Duration;

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::args::{Env, Parameters, default_language, language_schema, lenient_opt};
use super::error::ToolError;
use super::exec_reply::{ExecMode, ExecReply, exec_error};
use super::reply::Json;
use super::{Target, WasmboxServer, call_cancel};
use crate::{Error, ExecOptions, OneShot};

/// A background job's deadline when none is given, and the longest one allowed (seconds).
pub const BACKGROUND_TIMEOUT: f64 = 300.0;
pub const BACKGROUND_MAX_TIMEOUT: f64 = 3600.0;

/// What every exec tool runs, the same in each tool's schema: the code and its language.
#[derive(Deserialize, JsonSchema)]
pub struct Snippet {
    /// The code to run.
    pub code: String,
    /// python (default), javascript (js, node), go (golang) or bash. python, javascript and go
    /// run locally.
    #[serde(default = "default_language")]
    #[schemars(schema_with = "language_schema")]
    pub language: String,
}

impl Snippet {
    fn options(
        self,
        timeout: Option<f64>,
        env: Env,
        echo: bool,
        allow_hosts: Option<Vec<String>>,
    ) -> ExecOptions {
        code_options(&self.language, self.code, timeout, env, echo, allow_hosts)
    }
}

#[derive(Deserialize, JsonSchema)]
pub struct ExecuteCodeIsolatedArgs {
    #[serde(flatten)]
    snippet: Snippet,
    /// Deadline in seconds (default 30, max 300).
    #[serde(default, deserialize_with = "lenient_opt")]
    #[schemars(range(min = 0.001, max = 300))]
    timeout: Option<f64>,
    /// Environment variables for this run only.
    #[serde(default, deserialize_with = "lenient_opt")]
    env: Env,
    /// Print the value of a final expression, notebook style (default false, like `python -c`).
    #[serde(default, deserialize_with = "lenient_opt")]
    echo: Option<bool>,
    /// code-interpreter (default) runs locally; a cloud-only template runs in the HOPX cloud.
    #[serde(default)]
    template_name: Option<String>,
    /// true runs the one-shot in the HOPX cloud (local sandboxes have no network).
    #[serde(default, deserialize_with = "lenient_opt")]
    internet_access: Option<bool>,
    /// Hosts this run's code may reach over HTTP, e.g. ["api.example.com", "*.example.org"]:
    /// within what the server allows (WASMBOX_ALLOW_HOSTS; guest network is off without it).
    /// Default: all of those.
    #[serde(default, deserialize_with = "lenient_opt")]
    allow_hosts: Option<Vec<String>>,
    /// Python: pure-Python packages to install first, e.g. ["python-slugify"] (as
    /// install_packages; cached after the first time).
    #[serde(default, deserialize_with = "lenient_opt")]
    packages: Option<Vec<String>>,
    /// Accepted for HOPX compatibility; ignored locally.
    #[serde(default)]
    #[allow(dead_code)]
    region: Option<String>,
}

// The mode a caller picks for `execute_code`; an execution may also run in [`ExecMode`]'s
// others. (No doc comment: it would be a description in the tool's input schema.)
#[derive(Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Isolated,
    Persistent,
    Rich,
    Background,
}

impl From<Mode> for ExecMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Isolated => ExecMode::Isolated,
            Mode::Persistent => ExecMode::Persistent,
            Mode::Rich => ExecMode::Rich,
            Mode::Background => ExecMode::Background,
        }
    }
}

#[derive(Deserialize, JsonSchema)]
pub struct ExecuteCodeArgs {
    #[serde(flatten)]
    pub snippet: Snippet,
    /// isolated (default): a one-shot in a fresh sandbox, discarded afterwards. persistent: in
    /// the sandbox's live session (variables persist). rich: persistent, plus plots as PNG
    /// images and a final DataFrame as HTML. background: returns a process_id at once.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Required by the persistent, rich and background modes (from create_sandbox).
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Deadline in seconds (default 30; max 300, 3600 in background mode).
    #[serde(default, deserialize_with = "lenient_opt")]
    #[schemars(range(min = 0.001, max = 3600))]
    pub timeout: Option<f64>,
    /// Environment variables for this run only (on top of the sandbox's).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub env: Env,
    /// Print the value of a final expression (default: true in a sandbox, false for one-shots).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub echo: Option<bool>,
    /// Working directory in a sandbox (default /workspace; created if missing).
    #[serde(default)]
    pub working_dir: Option<String>,
    /// Background job name (background mode).
    #[serde(default)]
    pub name: Option<String>,
    /// isolated mode: code-interpreter (default) runs locally; a cloud-only template runs in
    /// the HOPX cloud.
    #[serde(default)]
    pub template_name: Option<String>,
    /// isolated mode: true runs the one-shot in the HOPX cloud (local sandboxes have no network).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub internet_access: Option<bool>,
    /// Hosts this run's code may reach over HTTP, e.g. ["api.example.com", "*.example.org"]:
    /// within what the server allows (WASMBOX_ALLOW_HOSTS; guest network is off without it).
    /// Default: all of those.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub allow_hosts: Option<Vec<String>>,
    /// Python: pure-Python packages to install first, e.g. ["python-slugify", "tinydb==4.8"]
    /// (as install_packages: into the sandbox when sandbox_id is given; cached after the first
    /// time).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub packages: Option<Vec<String>>,
    /// Accepted for HOPX compatibility; ignored locally.
    #[serde(default)]
    #[allow(dead_code)]
    pub region: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ExecuteInSandboxArgs {
    /// The sandbox id (from create_sandbox).
    pub(super) sandbox_id: String,
    #[serde(flatten)]
    pub(super) snippet: Snippet,
    /// Deadline in seconds (default 30, max 300; background: default 300, max 3600).
    #[serde(default, deserialize_with = "lenient_opt")]
    #[schemars(range(min = 0.001, max = 3600))]
    pub(super) timeout: Option<f64>,
    #[serde(default, deserialize_with = "lenient_opt")]
    pub(super) env: Env,
    /// Working directory (default /workspace).
    #[serde(default)]
    pub(super) working_dir: Option<String>,
    /// Print the value of a final expression (default true).
    #[serde(default, deserialize_with = "lenient_opt")]
    pub(super) echo: Option<bool>,
    /// Background job name (execute_code_background).
    #[serde(default)]
    pub(super) name: Option<String>,
    /// Hosts this run's code may reach over HTTP, e.g. ["api.example.com", "*.example.org"]:
    /// within what the server allows (WASMBOX_ALLOW_HOSTS; guest network is off without it).
    /// Default: all the sandbox may reach.
    #[serde(default, deserialize_with = "lenient_opt")]
    pub(super) allow_hosts: Option<Vec<String>>,
    /// Accepted for HOPX compatibility (execute_code_rich always captures).
    #[serde(default, deserialize_with = "lenient_opt")]
    #[allow(dead_code)]
    pub(super) capture_rich: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ExecuteAsyncArgs {
    #[serde(flatten)]
    snippet: Snippet,
    /// Where to POST the result (http/https; loopback hosts unless the server allows others).
    /// Signed: X-Wasmbox-Signature = sha256=HMAC(secret, X-Wasmbox-Timestamp + "." + body).
    callback_url: String,
    /// Run in this sandbox (as a background job); omit for a one-shot.
    #[serde(default)]
    sandbox_id: Option<String>,
    /// Deadline in seconds (default 30; max 300 for a one-shot, 3600 in a sandbox).
    #[serde(default, deserialize_with = "lenient_opt")]
    #[schemars(range(min = 0.001, max = 3600))]
    timeout: Option<f64>,
    #[serde(default, deserialize_with = "lenient_opt")]
    env: Env,
    #[serde(default)]
    working_dir: Option<String>,
}

#[tool_router(router = exec_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "execute_code",
        title = "Run code",
        description = "Run code. mode 'isolated' (default): a one-shot in a fresh WebAssembly sandbox with an \
             empty /workspace, no network and no host environment, discarded afterwards. 'persistent' \
             (needs sandbox_id): in the sandbox's live session, so variables, imports and files persist; \
             a final expression is echoed like a notebook cell. 'rich': persistent, and matplotlib \
             figures come back as PNG images and a final DataFrame as HTML (rich_outputs). \
             'background': returns a process_id at once (see execute_list_processes). Returns stdout, \
             stderr, exit_code, execution_time, success, mode, sandbox_id (plus limit, truncated, notes).",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn execute_code(
        &self,
        Parameters(a): Parameters<ExecuteCodeArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        let mode = a.mode.unwrap_or(Mode::Isolated);
        let Some(id) = a.sandbox_id.filter(|s| !s.is_empty()) else {
            if mode != Mode::Isolated {
                return Err(ToolError::message(
                    "Missing sandbox_id",
                    format!("Mode '{}' requires sandbox_id. Create sandbox first with create_sandbox() or use mode='isolated'.", ExecMode::from(mode)),
                )
                .with("mode", ExecMode::from(mode).as_str()));
            }
            return self
                .one_shot(
                    a.snippet
                        .options(a.timeout, a.env, a.echo.unwrap_or(false), a.allow_hosts),
                    OneShot {
                        template: a.template_name,
                        internet_access: a.internet_access.unwrap_or(false),
                        packages: a.packages.unwrap_or_default(),
                    },
                )
                .await;
        };
        if let Some(p) = a.packages.as_ref().filter(|p| !p.is_empty()) {
            let m: ExecMode = mode.into();
            let sb = match self.target(&id, "sandbox_id")? {
                Target::Local(sb) => sb,
                Target::Cloud(_) => {
                    let why = "packages installs into local sandboxes; in a HOPX cloud sandbox, run_command 'pip install NAME' installs with pip";
                    return Err(exec_error(
                        m,
                        &Error::invalid(why),
                        Some(&a.snippet.language),
                    ));
                }
            };
            self.wasmbox
                .install_packages(&sb, p)
                .await
                .map_err(|e| exec_error(m, &e, Some(&a.snippet.language)))?;
        }
        let a = ExecuteInSandboxArgs {
            sandbox_id: id,
            snippet: a.snippet,
            timeout: a.timeout,
            env: a.env,
            working_dir: a.working_dir,
            echo: a.echo,
            name: a.name,
            allow_hosts: a.allow_hosts,
            capture_rich: None,
        };
        if mode != Mode::Isolated {
            return self.in_sandbox("execute_code", mode, a).await;
        }
        // HOPX runs it in the existing sandbox; here: its workspace and env, a fresh
        // interpreter (the session is left alone).
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => return self.execute_in_cloud(&c, "execute_code", mode, a).await,
        };
        let lang = a.snippet.language.clone();
        let fail = |e: Error| exec_error(ExecMode::Isolated, &e, Some(&lang));
        let max = self.wasmbox.config().max_timeout.as_secs_f64();
        let echo = a.echo.unwrap_or(false);
        let req = self
            .request(
                a.snippet.options(a.timeout, a.env, echo, a.allow_hosts),
                max,
            )
            .map_err(fail)?;
        let r = self
            .wasmbox
            .execute_fresh_in(&sb, req, a.working_dir.as_deref())
            .await
            .map_err(fail)?;
        let reply = ExecReply {
            note: Some(format!(
                "Executed in existing sandbox {} (isolated mode with sandbox_id): its files and env, a fresh interpreter",
                sb.id
            )),
            ..ExecReply::run(&r, ExecMode::Isolated, &sb.id)
        };
        Ok(self.answer(reply, &r, false).await)
    }

    #[tool(
        name = "execute_code_isolated",
        title = "Run code in a fresh sandbox",
        description = "Run code as a one-shot in a fresh sandbox (same as execute_code with mode 'isolated').",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn execute_code_isolated(
        &self,
        Parameters(a): Parameters<ExecuteCodeIsolatedArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        self.one_shot(
            a.snippet
                .options(a.timeout, a.env, a.echo.unwrap_or(false), a.allow_hosts),
            OneShot {
                template: a.template_name,
                internet_access: a.internet_access.unwrap_or(false),
                packages: a.packages.unwrap_or_default(),
            },
        )
        .await
    }

    #[tool(
        name = "execute_code_persistent",
        title = "Run code in a sandbox's session",
        description = "Run code in a sandbox's live session (same as execute_code with mode 'persistent').",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn execute_code_persistent(
        &self,
        Parameters(a): Parameters<ExecuteInSandboxArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        self.in_sandbox("execute_code_persistent", Mode::Persistent, a)
            .await
    }

    #[tool(
        name = "execute_code_rich",
        title = "Run code, with plots and tables",
        description = "Run code in a sandbox's session and return plots as PNG images and a final DataFrame as HTML (execute_code mode 'rich').",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn execute_code_rich(
        &self,
        Parameters(a): Parameters<ExecuteInSandboxArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        self.in_sandbox("execute_code_rich", Mode::Rich, a).await
    }

    #[tool(
        name = "execute_code_background",
        title = "Start code in the background",
        description = "Start code in a sandbox in the background; returns a process_id at once (execute_code mode 'background').",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn execute_code_background(
        &self,
        Parameters(a): Parameters<ExecuteInSandboxArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        self.in_sandbox("execute_code_background", Mode::Background, a)
            .await
    }

    #[tool(
        name = "execute_code_async",
        title = "Run code, result to a webhook",
        description = "Run code (in a sandbox, or as a one-shot) and POST the result as JSON to callback_url when done; returns an execution_id at once. The POST is signed: X-Wasmbox-Signature = sha256=HMAC-SHA256(secret, X-Wasmbox-Timestamp + '.' + body).",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn execute_code_async(
        &self,
        Parameters(a): Parameters<ExecuteAsyncArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        let sb = match a.sandbox_id.as_deref().filter(|s| !s.is_empty()) {
            Some(id) => Some(self.local_sandbox(id, "sandbox_id", "execute_code_async")?),
            None => None,
        };
        // A sandbox's async execution is a background job; without one it is a one-shot, under
        // the one-shot cap.
        let max = match sb {
            Some(_) => BACKGROUND_MAX_TIMEOUT,
            None => self.wasmbox.config().max_timeout.as_secs_f64(),
        };
        let lang = a.snippet.language.clone();
        let fail = |e: Error| exec_error(ExecMode::Async, &e, Some(&lang));
        let req = self
            .request(a.snippet.options(a.timeout, a.env, false, None), max)
            .map_err(fail)?;
        let id = self
            .wasmbox
            .execute_async(
                &self.owner,
                sb.as_ref(),
                req,
                a.working_dir.as_deref(),
                &a.callback_url,
            )
            .await
            .map_err(fail)?;
        Ok(Json::new(ExecReply {
            execution_id: Some(id),
            status: Some("queued".into()),
            callback_url: Some(a.callback_url),
            sandbox_id: Some(sb.map(|s| s.id.clone())),
            message: Some("The result will be POSTed to callback_url when the execution ends (signed: X-Wasmbox-Signature).".into()),
            ..Default::default()
        }))
    }
}

/// An execution's arguments as the library takes them.
pub(super) fn code_options(
    language: &str,
    code: String,
    timeout: Option<f64>,
    env: Env,
    echo: bool,
    allow_hosts: Option<Vec<String>>,
) -> ExecOptions {
    ExecOptions {
        language: language.into(),
        code,
        timeout_secs: timeout,
        env: env.unwrap_or_default(),
        echo,
        allow_hosts,
        ..Default::default()
    }
}

impl WasmboxServer {
    /// Validates an execution's arguments as this call's (its cancellation, progress, owner
    /// and who to ask for consent); `max_timeout` in seconds.
    pub(super) fn request(
        &self,
        opts: ExecOptions,
        max_timeout: f64,
    ) -> Result<crate::ExecRequest, Error> {
        // The library checks against its own maximum; background jobs may run longer.
        let lib_max = self.wasmbox.config().max_timeout.as_secs_f64();
        let long = opts
            .timeout_secs
            .filter(|t| *t > lib_max && *t <= max_timeout);
        let mut req = self.wasmbox.request(self.call_options(ExecOptions {
            timeout_secs: if long.is_some() {
                None
            } else {
                opts.timeout_secs
            },
            ..opts
        }))?;
        if let Some(t) = long {
            req.timeout = Duration::from_secs_f64(t);
        }
        Ok(req)
    }

    /// `opts` as this call's: its cancellation, progress, owner and who to ask for consent.
    fn call_options(&self, opts: ExecOptions) -> ExecOptions {
        ExecOptions {
            cancel: call_cancel(),
            progress: crate::mcp::progress::call_progress(),
            owner: Some(self.owner.clone()),
            consent: crate::mcp::consent::call_consent(),
            audit: super::observe::call_origin(),
            ..opts
        }
    }

    /// An execution's answer as it goes out, fitted to the result budget.
    pub(super) async fn answer(
        &self,
        reply: ExecReply,
        r: &crate::ExecResult,
        rich: bool,
    ) -> Json<ExecReply> {
        // The top-level package of a module a run could not import: can it be installed?
        let hint = match super::exec_reply::missing_module(r) {
            Some(m) => {
                let top = m.split('.').next().unwrap_or(m);
                self.wasmbox.packages().installable(top).await
            }
            None => crate::packages::Installable::Unknown,
        };
        reply.answer(r, self.wasmbox.config().result_bytes, rich, &hint)
    }

    /// Code run in a sandbox's session (`tool` is the tool called, for errors).
    async fn in_sandbox(
        &self,
        tool: &str,
        mode: Mode,
        a: ExecuteInSandboxArgs,
    ) -> Result<Json<ExecReply>, ToolError> {
        let m = ExecMode::from(mode);
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => return self.execute_in_cloud(&c, tool, mode, a).await,
        };
        let lang = a.snippet.language.clone();
        let fail = |e: Error| exec_error(m, &e, Some(&lang));
        if mode == Mode::Background {
            let timeout = Some(a.timeout.unwrap_or(BACKGROUND_TIMEOUT));
            let req = self
                .request(
                    a.snippet.options(timeout, a.env, false, a.allow_hosts),
                    BACKGROUND_MAX_TIMEOUT,
                )
                .map_err(fail)?;
            let language = req.language;
            let job = self
                .wasmbox
                .start_job(&sb, req, a.working_dir.as_deref(), a.name.clone())
                .await
                .map_err(fail)?;
            return Ok(Json::new(ExecReply {
                process_id: Some(job.id.clone()),
                execution_id: Some(job.id.clone()),
                status: Some("running".into()),
                name: Some(a.name),
                language: Some(language),
                mode: Some(ExecMode::Background.as_str().into()),
                sandbox_id: Some(Some(sb.id.clone())),
                location: Some("local".into()),
                message: Some(format!(
                    "Background execution started: {}. Follow it with execute_list_processes, stop it with execute_kill_process.",
                    job.id
                )),
                ..Default::default()
            }));
        }
        let max = self.wasmbox.config().max_timeout.as_secs_f64();
        let echo = a.echo.unwrap_or(true);
        let req = self
            .request(
                a.snippet.options(a.timeout, a.env, echo, a.allow_hosts),
                max,
            )
            .map_err(fail)?;
        let rich = mode == Mode::Rich;
        let r = self
            .wasmbox
            .execute_in(&sb, req, a.working_dir.as_deref(), rich)
            .await
            .map_err(fail)?;
        Ok(self.answer(ExecReply::run(&r, m, &sb.id), &r, rich).await)
    }

    /// A one-shot: one call to the service, which validates and runs it.
    async fn one_shot(
        &self,
        opts: ExecOptions,
        shot: OneShot,
    ) -> Result<Json<ExecReply>, ToolError> {
        let provided = opts.language.clone();
        let fail = |e: Error| exec_error(ExecMode::Isolated, &e, Some(&provided));
        let (mut r, installed) = self
            .wasmbox
            .oneshot(self.call_options(opts), shot)
            .await
            .map_err(fail)?;
        r.notes
            .extend(installed.map(|out| super::packages::installed_note(&out)));
        let reply = match &r.cloud_sandbox_id {
            Some(id) => ExecReply {
                note: Some(format!(
                    "Ran in HOPX cloud sandbox {id}, which was deleted after the run."
                )),
                ..ExecReply::run(&r, ExecMode::Isolated, id)
            },
            None => ExecReply {
                note: Some(
                    "Ran in a fresh local WebAssembly sandbox that was discarded after the run."
                        .into(),
                ),
                ..ExecReply::run(
                    &r,
                    ExecMode::Isolated,
                    &format!("local-{}", uuid::Uuid::new_v4().simple()),
                )
            },
        };
        Ok(self.answer(reply, &r, false).await)
    }
}
