//! Background executions: each runs on a thread of its own (they may last minutes and must not
//! hold the guest threads one-shots need), can be listed with its output so far, and is killed
//! through its stop flag, which its guest's epoch callback checks.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use serde_json::{Value, json};

use super::fs::{json_prefix, rfc3339};
use crate::engine::limits::{CappedOutput, Stop, StopReason};
use crate::lang::{ExecResult, Language};

/// One background execution.
pub struct Job {
    pub id: String,
    pub name: Option<String>,
    pub language: Language,
    pub started_at: SystemTime,
    started: Instant,
    pub stop: Arc<Stop>,
    output: (CappedOutput, CappedOutput),
    end: Mutex<Option<(Result<ExecResult, String>, SystemTime)>>,
    done: tokio::sync::watch::Sender<bool>,
}

impl Job {
    pub fn new(name: Option<String>, language: Language, output_cap: usize) -> Arc<Self> {
        Arc::new(Self {
            id: format!("proc_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
            name,
            language,
            started_at: SystemTime::now(),
            started: Instant::now(),
            stop: Arc::new(Stop::default()),
            output: (CappedOutput::new(output_cap), CappedOutput::new(output_cap)),
            end: Mutex::new(None),
            done: tokio::sync::watch::channel(false).0,
        })
    }

    /// The buffers the job's guest writes to, shared so its output can be read while it runs.
    pub fn output(&self) -> (CappedOutput, CappedOutput) {
        self.output.clone()
    }

    pub fn finish(&self, result: Result<ExecResult, String>) {
        *self.end.lock().unwrap() = Some((result, SystemTime::now()));
        self.done.send_replace(true);
    }

    pub fn running(&self) -> bool {
        self.end.lock().unwrap().is_none()
    }

    pub fn kill(&self) {
        self.stop.stop(StopReason::Killed);
    }

    /// Waits until the job has ended.
    pub async fn wait(&self) {
        let mut rx = self.done.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// The result, once ended.
    pub fn result(&self) -> Option<Result<ExecResult, String>> {
        self.end.lock().unwrap().as_ref().map(|(r, _)| r.clone())
    }

    /// The job as `execute_list_processes` shows it, stdout and stderr each cut to take at most
    /// `max_output` bytes of JSON (`output_truncated` says so): a list of jobs must fit a tool
    /// answer's budget.
    pub fn info(&self, max_output: usize) -> Value {
        let cut = std::cell::Cell::new(false);
        let out = |s: &str| {
            let kept = json_prefix(s, max_output);
            if kept.len() < s.len() {
                cut.set(true);
            }
            json!(kept)
        };
        let end = self.end.lock().unwrap();
        let mut v = json!({
            "process_id": self.id,
            "execution_id": self.id,
            "name": self.name,
            "language": self.language,
            "started_at": rfc3339(self.started_at),
        });
        match &*end {
            None => {
                let (stdout, stderr) = (self.output.0.peek(), self.output.1.peek());
                v["status"] = json!("running");
                v["exit_code"] = Value::Null;
                v["stdout"] = out(&String::from_utf8_lossy(&stdout.bytes));
                v["stderr"] = out(&String::from_utf8_lossy(&stderr.bytes));
                v["execution_time"] = json!(self.started.elapsed().as_secs_f64());
                v["ended_at"] = Value::Null;
            }
            Some((r, ended)) => {
                v["ended_at"] = json!(rfc3339(*ended));
                match r {
                    Ok(r) => {
                        let status = match (self.stop.reason(), r.limit) {
                            (Some(StopReason::Killed), _) => "killed",
                            (Some(StopReason::SandboxGone), _) => "killed",
                            (_, Some(crate::LimitHit::Timeout)) => "timeout",
                            _ if r.success => "completed",
                            _ => "failed",
                        };
                        v["status"] = json!(status);
                        v["exit_code"] = json!(r.exit_code);
                        v["stdout"] = out(&r.stdout);
                        v["stderr"] = out(&r.stderr);
                        v["execution_time"] = json!(r.execution_time);
                        v["limit"] = json!(r.limit);
                        v["success"] = json!(r.success);
                    }
                    Err(e) => {
                        v["status"] = json!("failed");
                        v["exit_code"] = json!(1);
                        v["stdout"] = json!("");
                        v["stderr"] = out(e);
                        v["success"] = json!(false);
                    }
                }
            }
        }
        v["output_truncated"] = json!(cut.get());
        v
    }
}

/// Background work running now (jobs and async executions), in all and per owner, and the
/// sandbox-less async executions queued for a place in it.
pub struct JobBudget {
    max: usize,
    per_owner: usize,
    queue: usize,
    queue_bytes: usize,
    state: Mutex<BudgetState>,
    freed: tokio::sync::Notify,
}

#[derive(Default)]
struct BudgetState {
    running: usize,
    by_owner: std::collections::HashMap<String, usize>,
    queued: usize,
    queued_bytes: usize,
}

/// One running job's place in the budget, given back when dropped.
pub struct JobTicket {
    budget: Arc<JobBudget>,
    owner: String,
}

impl JobBudget {
    pub fn new(max: usize, per_owner: usize, queue: usize, queue_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            per_owner: per_owner.max(1),
            queue,
            queue_bytes,
            state: Mutex::new(BudgetState::default()),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// Running jobs, in all and `owner`'s.
    pub fn running(&self, owner: &str) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.running, st.by_owner.get(owner).copied().unwrap_or(0))
    }

    /// A place for one more job of `owner`, or why there is none.
    pub fn try_take(self: &Arc<Self>, owner: &str) -> crate::Result<JobTicket> {
        let mut st = self.state.lock().unwrap();
        let mine = st.by_owner.get(owner).copied().unwrap_or(0);
        if mine >= self.per_owner {
            return Err(crate::Error::Busy(format!(
                "this client already runs {mine} background jobs and async executions, its limit \
                 (WASMBOX_MAX_JOBS_PER_TOKEN); wait for one to end or stop one with \
                 execute_kill_process"
            )));
        }
        if st.running >= self.max {
            return Err(crate::Error::Busy(format!(
                "{} background jobs and async executions are running, the server's limit \
                 (WASMBOX_MAX_JOBS); wait for one to end or stop one with execute_kill_process",
                st.running
            )));
        }
        st.running += 1;
        *st.by_owner.entry(owner.to_string()).or_default() += 1;
        Ok(JobTicket {
            budget: self.clone(),
            owner: owner.to_string(),
        })
    }

    /// A place for a sandbox-less async execution: now, or after waiting in the queue; refused
    /// when the queue is full (by count, or by the queued code's bytes).
    pub async fn take_queued(self: &Arc<Self>, owner: &str, bytes: usize) -> crate::Result<Queued> {
        if let Ok(t) = self.try_take(owner) {
            return Ok(Queued::Now(t));
        }
        let mut st = self.state.lock().unwrap();
        if st.queued >= self.queue || st.queued_bytes.saturating_add(bytes) > self.queue_bytes {
            return Err(crate::Error::Busy(format!(
                "the async queue is full ({} executions, {} bytes of code waiting; limits \
                 WASMBOX_ASYNC_QUEUE={} and WASMBOX_ASYNC_QUEUE_MB={}); try again later",
                st.queued,
                st.queued_bytes,
                self.queue,
                self.queue_bytes >> 20
            )));
        }
        st.queued += 1;
        st.queued_bytes += bytes;
        Ok(Queued::Later(QueuePlace {
            budget: self.clone(),
            owner: owner.to_string(),
            bytes,
        }))
    }
}

/// Where a sandbox-less async execution stands.
pub enum Queued {
    Now(JobTicket),
    Later(QueuePlace),
}

/// A place in the async queue, given up when dropped.
pub struct QueuePlace {
    budget: Arc<JobBudget>,
    owner: String,
    bytes: usize,
}

impl QueuePlace {
    /// Waits until a job may start.
    pub async fn wait(self) -> JobTicket {
        loop {
            let freed = self.budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Ok(t) = self.budget.try_take(&self.owner) {
                return t;
            }
            freed.await;
        }
    }
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        let mut st = self.budget.state.lock().unwrap();
        st.queued -= 1;
        st.queued_bytes -= self.bytes;
    }
}

impl Drop for JobTicket {
    fn drop(&mut self) {
        let mut st = self.budget.state.lock().unwrap();
        st.running -= 1;
        if let Some(n) = st.by_owner.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                st.by_owner.remove(&self.owner);
            }
        }
        drop(st);
        self.budget.freed.notify_waiters();
    }
}
