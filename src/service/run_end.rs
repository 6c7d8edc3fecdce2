//! A background run's audit line, written when it ends: the call that started it answered at
//! once, so only this line can say how the run ended and what it reached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::lang::{ExecRequest, ExecResult, Language};
use crate::telemetry::audit;
use crate::{Wasmbox, engine};

impl Wasmbox {
    /// Writes the end line of every background run the exit cuts short (`shutdown`), so each
    /// run the audit log saw start is seen to end.
    pub fn end_runs_at_exit(&self) {
        let pending = std::mem::take(&mut *self.inner.run_ends.lock());
        for (_, end) in pending {
            end.record(Some(engine::limits::StopReason::Shutdown), None);
        }
    }
}

/// The end lines of the background runs still going, by run id: whichever comes first, the
/// run's end or the server's exit, takes a run's line and writes it.
#[derive(Default)]
pub(super) struct RunEnds(Mutex<HashMap<String, RunEnd>>);

impl RunEnds {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, RunEnd>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `end` until its run ends; returns its key.
    pub(super) fn hold(&self, end: RunEnd) -> String {
        let id = end.run_id.clone();
        self.lock().insert(id.clone(), end);
        id
    }

    pub(super) fn take(&self, id: &str) -> Option<RunEnd> {
        self.lock().remove(id)
    }
}

/// The audit line a background run writes when it ends, naming the call that started it:
/// that call's own line was written when it answered, before the run's limit or its later
/// host calls were known.
pub(super) struct RunEnd {
    origin: Arc<audit::Origin>,
    run_id: String,
    sandbox_id: Option<String>,
    language: Language,
    mode: &'static str,
    started: Instant,
}

impl RunEnd {
    /// `None` when the audit log is off.
    pub(super) fn of(
        req: &ExecRequest,
        run_id: &str,
        sandbox_id: Option<&str>,
        mode: &'static str,
    ) -> Option<Self> {
        Some(Self {
            origin: req.audit.clone()?,
            run_id: run_id.to_string(),
            sandbox_id: sandbox_id.map(str::to_string),
            language: req.language,
            mode,
            started: Instant::now(),
        })
    }

    /// `ran` is the run's result (`None`: it failed in wasmbox, or the exit cut it short).
    pub(super) fn record(
        self,
        stopped: Option<engine::limits::StopReason>,
        ran: Option<&ExecResult>,
    ) {
        use engine::limits::StopReason;
        let took = self.started.elapsed();
        let status = match (stopped, ran) {
            (Some(StopReason::Killed), _) => "killed",
            (Some(StopReason::SandboxGone), _) => "sandbox_gone",
            (Some(StopReason::Shutdown), _) => "shutdown",
            (Some(StopReason::Cancelled), _) => "cancelled",
            (_, None) => "error",
            (_, Some(r)) if r.limit.is_some() => "limit",
            (_, Some(r)) if r.exit_code != 0 => "failed",
            _ => "ok",
        };
        audit::record(audit::Call {
            at: Some(std::time::SystemTime::now()),
            event: audit::Event::RunEnd,
            origin: self.origin,
            run_id: Some(self.run_id),
            sandbox_id: self.sandbox_id,
            language: Some(self.language.as_str().to_string()),
            mode: Some(self.mode.to_string()),
            duration: took,
            status,
            exit_code: ran.map(|r| i64::from(r.exit_code)),
            limit: ran
                .and_then(|r| r.limit)
                .map(|l| serde_json::Value::from(l.as_str())),
            bytes_out: ran.map(|r| (r.stdout.len() + r.stderr.len()) as u64),
            ..Default::default()
        });
    }
}
