//! Calls on a HOPX cloud sandbox, forwarded as a whole; results keep the local shapes, with
//! `location: "cloud"`.

use std::sync::Arc;

use rmcp::model::{CallToolResult, JsonObject};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::WasmboxServer;
use super::commands::{KillArgs, ProcessesArgs, RunCommandArgs};
use super::env::{EnvReply, EnvSetArgs};
use super::exec::{BACKGROUND_MAX_TIMEOUT, BACKGROUND_TIMEOUT, ExecuteCodeArgs, Mode};
use super::exec_reply::{ExecReply, exec_error, fit_output};
use super::files::{FileListArgs, FileWriteArgs, PathArgs, ReadArgs, cloud_text_window, listing};
use super::reply::{error_result, fit_list, max_results, ok_result, output_share};
use crate::lang::guest::WORKSPACE_GUEST;
use crate::sandbox::fs::rfc3339;

/// A tool's arguments, or the HOPX error result for ones that do not parse.
pub fn parse<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<T, CallToolResult> {
    serde_json::from_value(Value::Object(args)).map_err(|e| {
        error_result(json!({
            "error": "Invalid arguments",
            "message": format!("Error executing tool {tool}: invalid arguments: {e}"),
        }))
    })
}

impl WasmboxServer {
    /// Forwards a call on a cloud sandbox to HOPX; results keep the local shapes, with
    /// `location: "cloud"`.
    pub(super) async fn cloud_dispatch(
        &self,
        name: &str,
        args: JsonObject,
        csb: Arc<crate::CloudSandbox>,
    ) -> CallToolResult {
        use crate::cloud::{CommandRequest, ExecuteRequest};
        let sb = &csb.sandbox;
        let n = name;
        let default = self.wasmbox.config().default_limits.timeout.as_secs_f64();
        let secs = |t: Option<f64>, d: f64| {
            std::time::Duration::from_secs_f64(t.unwrap_or(d).clamp(1.0, BACKGROUND_MAX_TIMEOUT))
        };
        macro_rules! args {
            ($ty:ty) => {
                match parse::<$ty>(n, args) {
                    Ok(a) => a,
                    Err(r) => return r,
                }
            };
        }
        let out: Result<Value, crate::cloud::CloudError> = match name {
            "execute_code"
            | "execute_code_persistent"
            | "execute_code_rich"
            | "execute_code_background"
            | "execute_code_isolated" => {
                let a = args!(ExecuteCodeArgs);
                let mode = match name {
                    "execute_code_persistent" => Mode::Persistent,
                    "execute_code_rich" => Mode::Rich,
                    "execute_code_background" => Mode::Background,
                    "execute_code_isolated" => Mode::Isolated,
                    _ => a.mode.unwrap_or(Mode::Isolated),
                };
                let background = mode == Mode::Background;
                let mut req = ExecuteRequest::new(a.language.clone(), a.code);
                req.timeout = secs(
                    a.timeout,
                    if background {
                        BACKGROUND_TIMEOUT
                    } else {
                        default
                    },
                );
                req.env = a.env.unwrap_or_default();
                req.workdir = a.working_dir.or_else(|| Some(WORKSPACE_GUEST.into()));
                if background {
                    sb.execute_background(&req, a.name.as_deref())
                        .await
                        .map(|mut v| {
                            v["mode"] = json!("background");
                            v["sandbox_id"] = json!(csb.id);
                            v
                        })
                } else {
                    sb.execute(&req).await.map(|r| {
                        let language =
                            crate::Language::parse(&a.language).unwrap_or(crate::Language::Bash);
                        let mut r = r.into_exec_result(language);
                        r.cloud_sandbox_id = Some(sb.id().to_string());
                        let reply = ExecReply::run(&r, mode.as_str(), &csb.id);
                        self.answer(reply, &r, mode == Mode::Rich).into_value()
                    })
                }
            }
            "run_command" | "run_command_background" => {
                let a = args!(RunCommandArgs);
                let bg = name == "run_command_background";
                let mut req = CommandRequest::new(a.command.clone());
                req.timeout = secs(a.timeout, if bg { BACKGROUND_TIMEOUT } else { default });
                req.env = a.env.unwrap_or_default();
                req.workdir = a.working_dir.or_else(|| Some(WORKSPACE_GUEST.into()));
                if bg {
                    sb.run_command_background(&req).await
                } else {
                    sb.run_command(&req).await.map(|r| {
                        let mut v = json!({"stdout": r.stdout, "stderr": r.stderr,
                               "exit_code": r.exit_code, "execution_time": r.execution_time});
                        let budget = self.wasmbox.config().result_bytes;
                        fit_output(&mut v, &Default::default(), budget);
                        v
                    })
                }
            }
            "file_read" => {
                let a = args!(ReadArgs);
                let budget = self.wasmbox.config().result_bytes;
                sb.read_file(&a.path)
                    .await
                    .map(|c| cloud_text_window(a, &c, budget))
            }
            "file_write" => {
                let a = args!(FileWriteArgs);
                sb.write_file(&a.path, &a.content)
                    .await
                    .map(|()| json!({"path": a.path, "size": a.content.chars().count()}))
            }
            "file_list" => {
                let a = args!(FileListArgs);
                let budget = self.wasmbox.config().result_bytes;
                sb.list_files(&a.path)
                    .await
                    .map(|files| listing(&a.path, &files, a.max_results, budget))
            }
            "file_exists" => {
                let a = args!(PathArgs);
                sb.file_exists(&a.path)
                    .await
                    .map(|e| json!({"path": a.path, "exists": e}))
            }
            "file_remove" => {
                let a = args!(PathArgs);
                sb.remove_file(&a.path)
                    .await
                    .map(|()| json!({"status": "removed", "path": a.path}))
            }
            "file_mkdir" => {
                let a = args!(PathArgs);
                sb.mkdir(&a.path)
                    .await
                    .map(|()| json!({"status": "created", "path": a.path}))
            }
            "env_get" => sb.env_get().await.map(|e| json!({"env_vars": e})),
            "env_clear" => sb.env_clear().await.map(|()| json!({"status": "cleared"})),
            "env_set" => {
                let a = args!(EnvSetArgs);
                sb.env_set(&a.env_vars, a.merge)
                    .await
                    .map(|_| json!(EnvReply::set(&a.env_vars, a.merge)))
            }
            "execute_list_processes" | "list_processes" => {
                let max = args
                    .get("max_results")
                    .and_then(Value::as_i64)
                    .unwrap_or_else(ProcessesArgs::default_max);
                let budget = self.wasmbox.config().result_bytes;
                sb.list_processes().await.map(|p| {
                    let total = p.len();
                    let shown = max_results(max, total);
                    let share = output_share(budget, shown);
                    let p = p.into_iter().take(shown).map(|mut p| {
                        for k in ["stdout", "stderr"] {
                            if let Some(s) = p[k].as_str() {
                                let kept = crate::sandbox::fs::json_prefix(s, share);
                                if kept.len() < s.len() {
                                    p[k] = json!(kept);
                                    p["output_truncated"] = json!(true);
                                }
                            }
                        }
                        p
                    });
                    fit_list(json!({}), "processes", p, total, shown < total, budget)
                })
            }
            "execute_kill_process" => {
                let a = args!(KillArgs);
                sb.kill_process(&a.process_id)
                    .await
                    .map(|_| json!({"status": "killed", "process_id": a.process_id}))
            }
            "delete_sandbox" => {
                let r = sb
                    .delete()
                    .await
                    .map(|()| json!({"status": "deleted", "id": csb.id}));
                if r.is_ok() {
                    self.wasmbox.forget_cloud_sandbox(&csb.id);
                }
                r
            }
            "get_sandbox" => match self.wasmbox.cloud() {
                Ok(client) => client.get_sandbox(sb.id()).await.map(|info| {
                    json!({
                        "id": csb.id,
                        "status": info.status,
                        "template_id": info.template_id,
                        "template_name": info.template_name.unwrap_or_else(|| csb.template.clone()),
                        "timeout_seconds": csb.timeout_seconds,
                        "created_at": rfc3339(csb.created_at),
                    })
                }),
                Err(e) => return error_result(exec_error("cloud", &e, None).0),
            },
            other => {
                return error_result(json!({
                    "error": "Not supported for cloud sandboxes",
                    "message": format!("{other} is not available for cloud sandbox {}; it works on local sandboxes", csb.id),
                    "sandbox_id": csb.id,
                }));
            }
        };
        match out {
            Ok(mut v) => {
                if v.is_object() {
                    v["location"] = json!("cloud");
                }
                ok_result(v)
            }
            Err(e) => {
                let gone = matches!(e, crate::cloud::CloudError::NotFound { .. });
                error_result(json!({
                    "error": if gone { "Not found".to_string() } else { format!("{name} failed in the cloud") },
                    "exception": e.to_string(),
                    "sandbox_id": csb.id,
                    "stdout": "",
                    "stderr": e.to_string(),
                    "exit_code": 1,
                    "location": "cloud",
                }))
            }
        }
    }
}
