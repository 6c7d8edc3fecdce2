//! Command lines (`run_command*`) and a sandbox's background executions (`*_processes`,
//! `execute_kill_process`).

use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::{Env, Parameters, lenient, lenient_opt};
use super::error::ToolError;
use super::exec::{BACKGROUND_MAX_TIMEOUT, BACKGROUND_TIMEOUT};
use super::exec_reply::ExecReply;
use super::reply::{Json, fit_list, output_share, shown};
use super::{Target, WasmboxServer};
use crate::lang::guest::WORKSPACE_GUEST;
use crate::lang::python::literal;
use crate::sandbox::Sandbox;
use crate::sandbox::fs::FsError;

fn default_max_processes() -> i64 {
    100
}

#[derive(Deserialize, JsonSchema)]
pub struct RunCommandArgs {
    pub sandbox_id: String,
    /// A command line. Locally: `python file.py [args]`, `python -c CODE`, `node file.js`,
    /// `go run main.go`; anything needing a shell needs a cloud sandbox (HOPX_API_KEY).
    pub command: String,
    /// Seconds (default 30; background: 300).
    #[serde(default, deserialize_with = "lenient_opt")]
    #[schemars(range(min = 0.001, max = 3600))]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default, deserialize_with = "lenient_opt")]
    pub env: Env,
    /// Job name (run_command_background).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ProcessesArgs {
    pub sandbox_id: String,
    /// At most this many (<= 0: all).
    #[serde(default = "default_max_processes", deserialize_with = "lenient")]
    pub max_results: i64,
}

#[derive(Deserialize, JsonSchema)]
pub struct KillArgs {
    pub sandbox_id: String,
    pub process_id: String,
}

/// A sandbox's background executions.
#[derive(Serialize, JsonSchema)]
pub struct ProcessList {
    pub count: usize,
    /// process_id, name, language, status (running, completed, failed, killed, timeout),
    /// exit_code, stdout, stderr (each cut to fit; output_truncated says so), times.
    pub processes: Vec<Value>,
    pub truncated: bool,
    /// null when truncated.
    pub total_processes: Option<usize>,
}

/// `execute_kill_process`.
#[derive(Serialize, JsonSchema)]
pub struct Killed {
    /// killed, or already_ended.
    pub status: String,
    pub process_id: String,
}

#[tool_router(router = command_router, vis = "pub(super)")]
impl WasmboxServer {
    #[tool(
        name = "run_command",
        title = "Run a command",
        description = "Run a command in a sandbox. Local sandboxes run language commands (python file.py, python -c, node file.js, go run main.go) in a fresh process on the sandbox's files; shell commands need a cloud sandbox (HOPX_API_KEY). Returns stdout, stderr, exit_code.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn run_command(
        &self,
        Parameters(a): Parameters<RunCommandArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        self.command(a, false).await
    }

    #[tool(
        name = "run_command_background",
        title = "Start a command in the background",
        description = "Start a command in a sandbox in the background; returns a process_id (see execute_list_processes).",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn run_command_background(
        &self,
        Parameters(a): Parameters<RunCommandArgs>,
    ) -> Result<Json<ExecReply>, ToolError> {
        self.command(a, true).await
    }

    #[tool(
        name = "execute_list_processes",
        title = "List background executions",
        description = "List a sandbox's background executions with status, exit code and output so far.",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn execute_list_processes(
        &self,
        Parameters(a): Parameters<ProcessesArgs>,
    ) -> Result<Json<ProcessList>, ToolError> {
        self.list_jobs("execute_list_processes", a).await
    }

    #[tool(
        name = "list_processes",
        title = "List what runs in a sandbox",
        description = "List what runs in a sandbox (its background executions; sandboxes have no OS processes).",
        annotations(read_only_hint = true, open_world_hint = true)
    )]
    async fn list_processes(
        &self,
        Parameters(a): Parameters<ProcessesArgs>,
    ) -> Result<Json<ProcessList>, ToolError> {
        self.list_jobs("list_processes", a).await
    }

    #[tool(
        name = "execute_kill_process",
        title = "Stop a background execution",
        description = "Stop a background execution.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn execute_kill_process(
        &self,
        Parameters(a): Parameters<KillArgs>,
    ) -> Result<Json<Killed>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => {
                let work = async {
                    c.sandbox.kill_process(&a.process_id).await?;
                    Ok(json!({"status": "killed", "process_id": a.process_id}))
                };
                return self.in_cloud("execute_kill_process", &c, work).await;
            }
        };
        let job = sb.job(&a.process_id).map_err(|e| {
            ToolError::exception("Failed to kill process", e).with("process_id", &a.process_id)
        })?;
        let wfor_running = job.running();
        job.kill();
        Ok(Json::new(Killed {
            status: if wfor_running {
                "killed"
            } else {
                "already_ended"
            }
            .into(),
            process_id: a.process_id,
        }))
    }
}

impl WasmboxServer {
    async fn list_jobs(
        &self,
        tool: &str,
        a: ProcessesArgs,
    ) -> Result<Json<ProcessList>, ToolError> {
        let sb = match self.target(&a.sandbox_id, "sandbox_id")? {
            Target::Local(sb) => sb,
            Target::Cloud(c) => return self.processes_in_cloud(tool, &c, a.max_results).await,
        };
        let budget = self.wasmbox.config().result_bytes;
        Ok(sb.with_jobs(|jobs| {
            let (count, truncated, total_processes) = shown(a.max_results, jobs.len());
            let share = output_share(budget, count);
            let list = ProcessList {
                count,
                processes: jobs
                    .iter()
                    .take(count)
                    .map(|j| json!(j.info(share)))
                    .collect(),
                truncated,
                total_processes,
            };
            Json::fitted(list, |v| fit_list(v, "processes", budget))
        }))
    }

    /// A command line on a local sandbox: language commands run locally, in a fresh process-like
    /// instance on the sandbox's files; shell commands are refused with the way to get a shell.
    async fn command(
        &self,
        a: RunCommandArgs,
        background: bool,
    ) -> Result<Json<ExecReply>, ToolError> {
        let run_error = |error: &str, msg: String| {
            ToolError::exception(error, msg)
                .for_run()
                .with("command", &a.command)
        };
        let target = self
            .target(&a.sandbox_id, "sandbox_id")
            .map_err(ToolError::for_run)?;
        let sb = match target {
            Target::Local(sb) => sb,
            Target::Cloud(c) => return self.command_in_cloud(&c, a, background).await,
        };
        if let Some(pip) = pip_install(&a.command) {
            return self.pip_install(&sb, &a.command, pip).await;
        }
        let local = match crate::cloud::classify_command(&a.command) {
            crate::cloud::CommandClass::Local(l) => l,
            crate::cloud::CommandClass::NeedsShell(why) => {
                let reason = crate::cloud::CloudReason::Command {
                    command: a.command.clone(),
                    why,
                };
                let msg = match self.wasmbox.config().cloud.check_available(&reason) {
                    Err(e) => e.to_string(),
                    Ok(_) => format!(
                        "{reason} needs a shell, and sandbox {} is local (WebAssembly, no shell). Create a cloud sandbox for shell commands (create_sandbox with internet_access=true or a cloud template), or run the language command directly (python file.py, node file.js, go run main.go).",
                        sb.id
                    ),
                };
                return Err(run_error("Command execution failed", msg));
            }
        };
        let cwd = a
            .working_dir
            .clone()
            .unwrap_or_else(|| WORKSPACE_GUEST.into());
        let read = {
            let (sb, local, cwd) = (sb.clone(), local.clone(), cwd.clone());
            let limit = self.wasmbox.config().max_code_bytes;
            tokio::task::spawn_blocking(move || command_code(&sb, &local, &cwd, limit)).await
        };
        let code = match read {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(run_error("Command execution failed", e.to_string())),
            Err(e) => {
                tracing::error!("reading a command's script did not finish: {e}");
                let msg = "reading the script failed unexpectedly; the server log has the details";
                return Err(run_error("Command execution failed", msg.to_string()));
            }
        };
        let (timeout, max) = if background {
            (BACKGROUND_TIMEOUT, BACKGROUND_MAX_TIMEOUT)
        } else {
            let cfg = self.wasmbox.config();
            let default = cfg.default_limits.timeout.as_secs_f64();
            (default, cfg.max_timeout.as_secs_f64())
        };
        let timeout = Some(a.timeout.unwrap_or(timeout));
        let language = local.language.as_str();
        let req = self
            .request(
                super::exec::code_options(language, code, timeout, a.env.clone(), false, None),
                max,
            )
            .map_err(|e| run_error("Command execution failed", e.to_string()))?;
        if background {
            let job = self
                .wasmbox
                .start_job(&sb, req, Some(&cwd), a.name.clone())
                .await
                .map_err(|e| run_error("Failed to run command in background", e.to_string()))?;
            return Ok(Json::new(ExecReply {
                process_id: Some(job.id.clone()),
                status: Some("running".into()),
                message: Some(format!("Background process started: {}", job.id)),
                command: Some(a.command.clone()),
                ..Default::default()
            }));
        }
        let r = self
            .wasmbox
            .execute_fresh_in(&sb, req, Some(&cwd))
            .await
            .map_err(|e| run_error("Unexpected error during command execution", e.to_string()))?;
        let reply = ExecReply {
            command: Some(a.command.clone()),
            ..ExecReply::output(&r)
        };
        Ok(self.answer(reply, &r, false).await)
    }
}

/// A `pip install` option the local install does not take.
#[derive(Debug, thiserror::Error)]
#[error(
    "pip option {0} is not supported by wasmbox's local install (it installs pure-Python packages by name, e.g. pip install NAME==VERSION)"
)]
struct PipOption(String);

/// The requirements of `pip install ...` (also `pip3`, `python -m pip`), or the option it
/// does not take; `None`: not a pip install.
fn pip_install(command: &str) -> Option<Result<Vec<String>, PipOption>> {
    let argv = shlex::split(command)?;
    let rest = match argv
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["pip" | "pip3", "install", ..] => &argv[2..],
        ["python" | "python3", "-m", "pip", "install", ..] => &argv[4..],
        _ => return None,
    };
    // Flags that change nothing here: output, upgrades (the newest match is taken), caches.
    const IGNORED: [&str; 8] = [
        "-q",
        "--quiet",
        "-U",
        "--upgrade",
        "--user",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--no-input",
    ];
    let mut out = Vec::new();
    for a in rest {
        if IGNORED.contains(&a.as_str()) {
            continue;
        }
        if a.starts_with('-') {
            return Some(Err(PipOption(a.clone())));
        }
        out.push(a.clone());
    }
    Some(Ok(out))
}

impl WasmboxServer {
    /// `pip install` in a local sandbox: install_packages, answered as pip would.
    async fn pip_install(
        &self,
        sb: &std::sync::Arc<Sandbox>,
        command: &str,
        pip: Result<Vec<String>, PipOption>,
    ) -> Result<Json<ExecReply>, ToolError> {
        let started = std::time::Instant::now();
        let installed = match pip {
            Ok(reqs) => self
                .wasmbox
                .install_packages(sb, &reqs)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let (stdout, stderr, code) = match installed {
            Ok(out) => (super::packages::pip_line(&out), String::new(), 0),
            Err(e) => (String::new(), format!("ERROR: {e}\n"), 1),
        };
        Ok(Json::new(ExecReply {
            stdout: Some(stdout),
            stderr: Some(stderr),
            exit_code: Some(code),
            execution_time: Some(started.elapsed().as_secs_f64()),
            success: Some(code == 0),
            language: Some(crate::Language::Python),
            location: Some("local".into()),
            command: Some(command.to_string()),
            ..Default::default()
        }))
    }
}

/// The code a local command runs: its file read from the sandbox (through the workspace's
/// `Dir`, at most `limit` bytes, the code-size limit), or its inline code; Python gets the
/// `sys.argv` the command line gave. Blocking: disk I/O.
fn command_code(
    sb: &Sandbox,
    cmd: &crate::cloud::LocalCommand,
    cwd: &str,
    limit: usize,
) -> Result<String, FsError> {
    use crate::cloud::Program;
    match (&cmd.program, cmd.language) {
        (Program::File(path), crate::Language::Python) => {
            let full = join_guest(cwd, path);
            // runpy reads it in the guest (which decodes it, PEP 263); here only its kind and size.
            sb.fs.check_script(&full, limit)?;
            let mut argv = vec![path.clone()];
            argv.extend(cmd.args.iter().cloned());
            Ok(format!(
                "import sys, runpy\nsys.argv = {}\nrunpy.run_path({}, run_name='__main__')",
                literal(&argv),
                literal(&full)
            ))
        }
        (Program::Code(code), crate::Language::Python) if !cmd.args.is_empty() => {
            let mut argv = vec!["-c".to_string()];
            argv.extend(cmd.args.iter().cloned());
            Ok(format!("import sys; sys.argv = {}\n{code}", literal(&argv)))
        }
        (Program::Code(code), _) => Ok(code.clone()),
        (Program::File(path), _) => sb
            .fs
            .read_script(&join_guest(cwd, path), limit)
            .map(|(_, text)| text),
    }
}

/// A command's file path as a guest path: absolute as given, else under the working directory.
fn join_guest(cwd: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", cwd.trim_end_matches('/'))
    }
}
