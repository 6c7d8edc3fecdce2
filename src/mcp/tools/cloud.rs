//! What the tools' cloud paths share: each tool on a sandbox handles a HOPX cloud sandbox in
//! place ([`super::Target::Cloud`]) through [`WasmboxServer::in_cloud`], and the answers keep
//! the local shapes, with `location: "cloud"`.

use serde_json::{Value, json};

use super::WasmboxServer;
use super::commands::{ProcessList, RunCommandArgs};
use super::error::ToolError;
use super::exec::{BACKGROUND_MAX_TIMEOUT, BACKGROUND_TIMEOUT, ExecuteInSandboxArgs, Mode};
use super::exec_reply::{ExecMode, ExecReply, exec_error, fit_output};
use super::reply::{Json, fit_list, output_share, shown};
use super::sandboxes::SandboxReply;
use crate::cloud::{CloudError, CommandRequest, ExecuteRequest};
use crate::lang::guest::WORKSPACE_GUEST;
use crate::sandbox::fs::rfc3339;

impl WasmboxServer {
    /// A tool's cloud path: `work` on cloud sandbox `csb`, dropped (and with it the request to
    /// HOPX) when the call is cancelled. The answer says `location: "cloud"`; a failure comes
    /// back in HOPX's error shape.
    pub(super) async fn in_cloud<T>(
        &self,
        tool: &str,
        csb: &crate::CloudSandbox,
        work: impl Future<Output = Result<Value, CloudError>>,
    ) -> Result<Json<T>, ToolError> {
        let cancel = super::call_cancel();
        let out = tokio::select! {
            r = work => r,
            _ = crate::cancelled(cancel.as_deref()) => {
                return Err(exec_error(ExecMode::Cloud, &crate::Error::Cancelled(""), None));
            }
        };
        match out {
            Ok(mut v) => {
                if v.is_object() {
                    v["location"] = json!("cloud");
                }
                Ok(Json::forwarded(v))
            }
            Err(e) => {
                let gone = matches!(e, CloudError::NotFound { .. });
                let error = if gone {
                    "Not found".to_string()
                } else {
                    format!("{tool} failed in the cloud")
                };
                Err(ToolError::exception(error, e)
                    .with("sandbox_id", &csb.id)
                    .for_run()
                    .with("location", "cloud"))
            }
        }
    }

    /// Code run on a cloud sandbox (`execute_code` and its mode tools).
    pub(super) async fn execute_in_cloud(
        &self,
        csb: &crate::CloudSandbox,
        tool: &str,
        mode: Mode,
        a: ExecuteInSandboxArgs,
    ) -> Result<Json<ExecReply>, ToolError> {
        let sb = &csb.sandbox;
        let background = mode == Mode::Background;
        let mut req = ExecuteRequest::new(a.snippet.language.clone(), a.snippet.code);
        req.timeout = self.cloud_timeout(a.timeout, background);
        req.env = a.env.unwrap_or_default();
        req.workdir = a.working_dir.or_else(|| Some(WORKSPACE_GUEST.into()));
        let work = async {
            if background {
                let mut v = sb.execute_background(&req, a.name.as_deref()).await?;
                v["mode"] = json!("background");
                v["sandbox_id"] = json!(csb.id);
                return Ok(v);
            }
            let r = sb.execute(&req).await?;
            let language =
                crate::Language::parse(&a.snippet.language).unwrap_or(crate::Language::Bash);
            let mut r = r.into_exec_result(language);
            r.cloud_sandbox_id = Some(sb.id().to_string());
            let reply = ExecReply::run(&r, mode.into(), &csb.id);
            Ok(self
                .answer(reply, &r, mode == Mode::Rich)
                .await
                .into_value())
        };
        self.in_cloud(tool, csb, work).await
    }

    /// A command run on a cloud sandbox (`run_command`, `run_command_background`).
    pub(super) async fn command_in_cloud(
        &self,
        csb: &crate::CloudSandbox,
        a: RunCommandArgs,
        background: bool,
    ) -> Result<Json<ExecReply>, ToolError> {
        let sb = &csb.sandbox;
        let mut req = CommandRequest::new(a.command.clone());
        req.timeout = self.cloud_timeout(a.timeout, background);
        req.env = a.env.unwrap_or_default();
        req.workdir = a.working_dir.or_else(|| Some(WORKSPACE_GUEST.into()));
        let budget = self.wasmbox.config().result_bytes;
        let tool = if background {
            "run_command_background"
        } else {
            "run_command"
        };
        let work = async {
            if background {
                return sb.run_command_background(&req).await;
            }
            let r = sb.run_command(&req).await?;
            let mut v = json!({"stdout": r.stdout, "stderr": r.stderr,
                   "exit_code": r.exit_code, "execution_time": r.execution_time});
            fit_output(&mut v, &Default::default(), budget);
            Ok(v)
        };
        self.in_cloud(tool, csb, work).await
    }

    /// A cloud sandbox's processes, each one's output within its share of the budget.
    pub(super) async fn processes_in_cloud(
        &self,
        tool: &str,
        csb: &crate::CloudSandbox,
        max: i64,
    ) -> Result<Json<ProcessList>, ToolError> {
        let budget = self.wasmbox.config().result_bytes;
        let work = async {
            let p = csb.sandbox.list_processes().await?;
            let (count, truncated, total) = shown(max, p.len());
            let share = output_share(budget, count);
            let p = p.into_iter().take(count).map(|mut p| {
                for k in ["stdout", "stderr"] {
                    if let Some(s) = p[k].as_str() {
                        let kept = crate::fit::json_prefix(s, share);
                        if kept.len() < s.len() {
                            p[k] = json!(kept);
                            p["output_truncated"] = json!(true);
                        }
                    }
                }
                p
            });
            let mut v = json!(ProcessList {
                count,
                processes: p.collect(),
                truncated,
                total_processes: total,
            });
            fit_list(&mut v, "processes", budget);
            Ok(v)
        };
        self.in_cloud(tool, csb, work).await
    }

    /// A cloud sandbox as `get_sandbox` describes it.
    pub(super) async fn info_in_cloud(
        &self,
        csb: &crate::CloudSandbox,
    ) -> Result<Json<SandboxReply>, ToolError> {
        let client = self
            .wasmbox
            .cloud()
            .map_err(|e| exec_error(ExecMode::Cloud, &e, None))?;
        let work = async {
            let info = client.get_sandbox(csb.sandbox.id()).await?;
            Ok(json!({
                "id": csb.id,
                "status": info.status,
                "template_id": info.template_id,
                "template_name": info.template_name.unwrap_or_else(|| csb.template.clone()),
                "timeout_seconds": csb.timeout_seconds,
                "created_at": rfc3339(csb.created_at),
            }))
        };
        self.in_cloud("get_sandbox", csb, work).await
    }

    /// A cloud call's timeout: the caller's, or the default for its kind (a background run's
    /// is longer), within 1 s and the background cap.
    fn cloud_timeout(&self, t: Option<f64>, background: bool) -> std::time::Duration {
        let default = if background {
            BACKGROUND_TIMEOUT
        } else {
            self.wasmbox.config().default_limits.timeout.as_secs_f64()
        };
        std::time::Duration::from_secs_f64(t.unwrap_or(default).clamp(1.0, BACKGROUND_MAX_TIMEOUT))
    }
}
