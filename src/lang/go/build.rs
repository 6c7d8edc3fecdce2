//! One `go build` under the deadline and the caller's stop flag, and the results a build ends
//! with when no program runs (a compile error, the deadline, a stop).

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::GoRuntime;
use super::toolchain::*;
use crate::engine::cache::write_atomically;
use crate::engine::limits::{LimitHit, Stop, StopReason};
use crate::lang::{
    EXIT_TIMEOUT, ExecRequest, ExecResult, LangError as Error, Language, Result, Stage,
};

impl GoRuntime {
    /// Runs `go build` in a private scratch dir under the deadline and the caller's stop flag.
    /// `Ok(None)`: `wasm` now holds the program; `Ok(Some(result))`: a compile error, the
    /// deadline, a stop or an oversized program, as a normal result.
    pub(super) fn build(
        &self,
        source: &str,
        wasm: &Path,
        req: &ExecRequest,
        start: Instant,
        deadline: Instant,
    ) -> Result<Option<ExecResult>> {
        self.trim_gocache();
        // Under the process's scratch root: a build a crash left behind goes at the next start.
        let root = crate::lang::scratch::scratch_root()?;
        let dir = tempfile::Builder::new()
            .prefix("gobuild-")
            .tempdir_in(root)
            .map_err(|e| Error::io(root, e))?;
        let main = dir.path().join("main.go");
        fs::write(&main, source).map_err(|e| Error::io(&main, e))?;
        if super::uses_wasmbox_http(source) {
            // A module named `wasmbox` holding the package at `http/`: the snippet's import
            // resolves to it with no network and no module cache.
            let pkg = dir.path().join("http");
            let gomod = dir.path().join("go.mod");
            fs::write(&gomod, "module wasmbox\n\ngo 1.21\n").map_err(|e| Error::io(&gomod, e))?;
            fs::create_dir(&pkg).map_err(|e| Error::io(&pkg, e))?;
            let file = pkg.join("http.go");
            fs::write(&file, super::WASMBOX_HTTP).map_err(|e| Error::io(&file, e))?;
        }
        let gotmp = dir.path().join("tmp");
        fs::create_dir(&gotmp).map_err(|e| Error::io(&gotmp, e))?;
        let log_path = dir.path().join("build.log");
        let log = fs::File::create(&log_path).map_err(|e| Error::io(&log_path, e))?;
        let log2 = log.try_clone().map_err(|e| Error::io(&log_path, e))?;
        let mut cmd = build_command(&self.toolchain.go, &self.gocache, dir.path());
        cmd.stdout(Stdio::from(log)).stderr(Stdio::from(log2));
        let mut child = cmd.spawn().map_err(|e| {
            Error::LanguageNotAvailable(format!(
                "go: cannot run {}: {e}",
                self.toolchain.go.display()
            ))
        })?;
        let group =
            crate::platform::process::Group::join(&child, super::toolchain::BUILD_ADDRESS_SPACE);
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| Error::io(&self.toolchain.go, e))?
            {
                break status;
            }
            // A kill or the sandbox's deletion ends the build as it would end the program.
            if let Some(why) = stopped(req) {
                group.kill(&mut child);
                return Ok(Some(stopped_result(why, req, start)));
            }
            if Instant::now() >= deadline {
                group.kill(&mut child);
                return Ok(Some(timeout_result(Stage::Compile, req, start)));
            }
            std::thread::sleep(Duration::from_millis(3));
        };
        if !status.success() {
            // The compiler's messages, read no further than the caller's output cap.
            let mut log = Vec::new();
            let len = fs::File::open(&log_path)
                .and_then(|f| {
                    let len = f.metadata()?.len();
                    f.take(req.output_bytes as u64).read_to_end(&mut log)?;
                    Ok(len)
                })
                .unwrap_or(0);
            let mut text = String::from_utf8_lossy(&log).into_owned();
            if len > log.len() as u64 {
                text.push_str(&format!(
                    "\nwasmbox: the compiler wrote {len} bytes; the rest was cut\n"
                ));
            }
            let text = text.replace(&dir.path().display().to_string(), ".");
            return Ok(Some(compile_result(
                status.code().unwrap_or(1),
                text,
                req,
                start,
            )));
        }
        let built = dir.path().join("main.wasm");
        let bytes = match read_capped(&built, self.max_wasm_bytes) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(len)) => {
                return Ok(Some(compile_result(
                    1,
                    format!(
                        "wasmbox: the built program is {len} bytes, over the limit of {} MiB \
                         (WASMBOX_GO_MAX_WASM_MB)\n",
                        self.max_wasm_bytes >> 20
                    ),
                    req,
                    start,
                )));
            }
            Err(e) => return Err(Error::io(&built, e)),
        };
        write_atomically(wasm, &bytes).map_err(|e| Error::io(wasm, e))?;
        Ok(None)
    }
}

/// The reason the caller's stop flag (a sandboxed execution's) or the call's own cancel flag
/// was raised, if one was.
pub(super) fn stopped(req: &ExecRequest) -> Option<StopReason> {
    req.place
        .as_ref()
        .and_then(|p| Stop::reason(&p.stop))
        .or_else(|| req.cancel.as_deref().and_then(Stop::reason))
}

pub(super) fn compile_result(
    exit_code: i32,
    mut stderr: String,
    req: &ExecRequest,
    start: Instant,
) -> ExecResult {
    let mut truncated = false;
    if stderr.len() > req.output_bytes {
        let mut cut = req.output_bytes;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        truncated = true;
    }
    ExecResult {
        stdout: String::new(),
        stderr,
        exit_code: if exit_code == 0 { 1 } else { exit_code },
        execution_time: start.elapsed().as_secs_f64(),
        success: false,
        truncated,
        limit: None,
        language: Language::Go,
        stage: Some(Stage::Compile),
        rich: Vec::new(),
        notes: Vec::new(),
        cloud_sandbox_id: None,
        gaps: Default::default(),
    }
}

/// A build stopped from outside, as a program stopped from outside reads (`guest::finish`).
pub(super) fn stopped_result(why: StopReason, req: &ExecRequest, start: Instant) -> ExecResult {
    let (exit_code, limit, note) = match why {
        StopReason::Killed => (crate::lang::guest::EXIT_KILLED, None, "killed"),
        StopReason::SandboxGone => (
            crate::lang::guest::EXIT_KILLED,
            None,
            "the sandbox was deleted or expired",
        ),
        StopReason::Shutdown => (
            crate::lang::guest::EXIT_KILLED,
            None,
            "the server is shutting down",
        ),
        StopReason::DiskQuota => (
            1,
            Some(LimitHit::Disk),
            "the workspace went over its disk quota",
        ),
        StopReason::Cancelled => (
            crate::lang::guest::EXIT_CANCELLED,
            None,
            "the client cancelled the call",
        ),
    };
    let mut r = timeout_result(Stage::Compile, req, start);
    r.stderr = format!(
        "wasmbox: execution stopped while building the Go program (stage: compile): {note}\n"
    );
    r.exit_code = exit_code;
    r.limit = limit;
    r
}

pub(super) fn timeout_result(stage: Stage, req: &ExecRequest, start: Instant) -> ExecResult {
    ExecResult {
        stdout: String::new(),
        stderr: format!(
            "wasmbox: execution stopped: the deadline ({}) was reached while {}\n",
            crate::lang::outcome::deadline_text(req.timeout),
            match stage {
                Stage::Compile => "building the Go program (stage: compile)",
                Stage::Run => "running the Go program (stage: run)",
            }
        ),
        exit_code: EXIT_TIMEOUT,
        execution_time: start.elapsed().as_secs_f64(),
        success: false,
        truncated: false,
        limit: Some(LimitHit::Timeout),
        language: Language::Go,
        stage: Some(stage),
        rich: Vec::new(),
        notes: Vec::new(),
        cloud_sandbox_id: None,
        gaps: Default::default(),
    }
}
