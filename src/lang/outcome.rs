//! How a guest's end becomes an [`ExecResult`]: its exit status, or the trap or stop that ended
//! it, with the limit it hit, the notes that say so and its captured output.

use std::time::{Duration, Instant};

use wasmtime::Trap;
use wasmtime_wasi::I32Exit;

use super::guest::{EXIT_CANCELLED, EXIT_KILLED};
use super::{EXIT_TIMEOUT, ExecResult, Language};
use crate::engine::disk::Over;
use crate::engine::limits::{Captured, LimitHit, StopReason, Stopped};

/// The result's note for a run stopped at a lent folder's room (the caller's, beside the
/// guest's stderr): which folder, and the room guests had there.
fn folder_note(o: &Over) -> Option<String> {
    let (folder, room) = o.folder.as_ref()?;
    Some(format!(
        "stopped at the room of the lent folder {folder}: guests may add {} bytes and {} files \
         and directories to what it held when the server started (WASMBOX_MOUNT_DISK_MB, \
         WASMBOX_MOUNT_FILES); remove files there to free room",
        room.max_bytes, room.max_entries
    ))
}

/// The note of a guest the disk limit stopped.
pub fn disk_note(over: Option<Over>) -> String {
    let Some(o) = over else {
        return "wasmbox: execution stopped: the disk limit of /workspace and /tmp was reached"
            .into();
    };
    let what = if o.unmeasured {
        "the files could not be measured (nested too deep, or unreadable)".to_string()
    } else if o.entries > o.quota.max_entries {
        format!(
            "{} files and directories, of {} allowed",
            o.entries, o.quota.max_entries
        )
    } else {
        format!(
            "a write would make it {} bytes, of {} allowed",
            o.bytes, o.quota.max_bytes
        )
    };
    match &o.folder {
        Some((folder, _)) => format!(
            "wasmbox: execution stopped: the lent folder {folder} is full ({what}); code may add WASMBOX_MOUNT_DISK_MB and WASMBOX_MOUNT_FILES to what it held when the server started; remove files there to free space"
        ),
        None => format!(
            "wasmbox: execution stopped: the disk limit of /workspace and /tmp was reached ({what}); sizes are apparent sizes (a sparse file counts in full); remove files to free space"
        ),
    }
}

/// What the limits saw of a call, for its result.
pub(super) struct Limits {
    pub(super) timeout: Duration,
    pub(super) memory_hit: bool,
    pub(super) disk_over: Option<Over>,
}

pub(super) fn finish(
    outcome: wasmtime::Result<i32>,
    limits: Limits,
    stdout: Captured,
    stderr: Captured,
    start: Instant,
    language: Language,
) -> ExecResult {
    let Limits {
        timeout,
        memory_hit,
        disk_over,
    } = limits;
    let mut limit = memory_hit.then_some(LimitHit::Memory);
    let mut notes = Vec::new();
    let mut result_notes = Vec::new();
    let exit_code = match outcome {
        Ok(status) => status,
        Err(e) => {
            if let Some(exit) = e.downcast_ref::<I32Exit>() {
                exit.0
            } else if let Some(Stopped(why)) = e.downcast_ref::<Stopped>() {
                match why {
                    StopReason::DiskQuota => {
                        limit = Some(LimitHit::Disk);
                        result_notes.extend(disk_over.as_ref().and_then(folder_note));
                        notes.push(disk_note(disk_over));
                        1
                    }
                    StopReason::Killed => {
                        notes.push("wasmbox: execution stopped: killed".into());
                        EXIT_KILLED
                    }
                    StopReason::SandboxGone => {
                        notes.push(
                            "wasmbox: execution stopped: the sandbox was deleted or expired".into(),
                        );
                        EXIT_KILLED
                    }
                    StopReason::Shutdown => {
                        notes
                            .push("wasmbox: execution stopped: the server is shutting down".into());
                        EXIT_KILLED
                    }
                    StopReason::Cancelled => {
                        notes.push(
                            "wasmbox: execution stopped: the client cancelled the call".into(),
                        );
                        EXIT_CANCELLED
                    }
                }
            } else if matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
                limit = Some(LimitHit::Timeout);
                notes.push(format!(
                    "wasmbox: execution stopped: the deadline ({}) was reached",
                    deadline_text(timeout)
                ));
                EXIT_TIMEOUT
            } else if stdout.killed || stderr.killed {
                limit = Some(LimitHit::Output);
                notes.push("wasmbox: execution stopped: the output limit was exceeded".into());
                1
            } else {
                let what = if memory_hit {
                    "the guest ran out of its memory limit"
                } else {
                    "the guest trapped"
                };
                notes.push(format!("wasmbox: {what}: {e:#}"));
                1
            }
        }
    };
    if memory_hit && !notes.iter().any(|n| n.contains("memory")) {
        notes.push(
            "wasmbox: the memory limit was reached (a request to grow memory was denied)".into(),
        );
    }
    let truncated = stdout.dropped > 0 || stderr.dropped > 0;
    for (name, s) in [("stdout", &stdout), ("stderr", &stderr)] {
        if s.dropped > 0 {
            notes.push(format!(
                "wasmbox: {name} over the output cap: its start and end kept ({} bytes in all), \
                 {} bytes between them dropped",
                s.bytes.len(),
                s.dropped
            ));
        }
    }
    let (stdout_text, stdout_gap) = stdout.text();
    let (mut stderr_text, stderr_gap) = stderr.text();
    for n in notes {
        if !stderr_text.is_empty() && !stderr_text.ends_with('\n') {
            stderr_text.push('\n');
        }
        stderr_text.push_str(&n);
        stderr_text.push('\n');
    }
    ExecResult {
        stdout: stdout_text,
        stderr: stderr_text,
        exit_code,
        execution_time: start.elapsed().as_secs_f64(),
        success: exit_code == 0 && limit.is_none(),
        truncated,
        limit,
        language,
        stage: None,
        rich: Vec::new(),
        notes: result_notes,
        cloud_sandbox_id: None,
        gaps: crate::lang::Gaps {
            stdout: stdout_gap,
            stderr: stderr_gap,
        },
    }
}

/// A deadline as a note says it: `timeout 2 s`, `timeout 0.5 s`.
pub fn deadline_text(timeout: Duration) -> String {
    let s = timeout.as_secs_f64();
    if s.fract() == 0.0 {
        format!("timeout {s:.0} s")
    } else {
        format!("timeout {s} s")
    }
}
