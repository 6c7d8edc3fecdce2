//! Background executions: each runs on a thread of its own (they may last minutes and must not
//! hold the guest threads one-shots need), can be listed with its output so far, and is killed
//! through its stop flag, which its guest's epoch callback checks.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Instant, SystemTime};

use super::fs::{json_prefix, rfc3339};
use crate::engine::limits::{CappedOutput, Stop, StopReason};
use crate::fit::{json_char_len, json_len};
use crate::lang::{ExecResult, Language};

/// A background execution as `execute_list_processes` shows it.
#[derive(Clone, Debug, serde::Serialize, schemars::JsonSchema)]
pub struct JobInfo {
    pub process_id: String,
    pub execution_id: String,
    pub name: Option<String>,
    pub language: Language,
    pub started_at: String,
    /// running, completed, failed, killed or timeout.
    pub status: String,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Output was dropped at the output cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_time: Option<f64>,
    pub ended_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<Option<crate::LimitHit>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    /// stdout or stderr was cut to fit the listing.
    pub output_truncated: bool,
}

/// Why a background job did not run to an end, as the job keeps it: cut to its share of
/// output, or replaced by a note once its sandbox drops that output.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct JobFailed(String);

impl From<String> for JobFailed {
    fn from(why: String) -> Self {
        JobFailed(why)
    }
}

impl From<&str> for JobFailed {
    fn from(why: &str) -> Self {
        JobFailed(why.to_string())
    }
}

impl From<JobFailed> for String {
    fn from(e: JobFailed) -> Self {
        e.0
    }
}

/// One background execution.
pub struct Job {
    pub id: String,
    pub name: Option<String>,
    pub language: Language,
    pub started_at: SystemTime,
    started: Instant,
    pub stop: Arc<Stop>,
    output: (CappedOutput, CappedOutput),
    end: Mutex<Option<(Result<ExecResult, JobFailed>, SystemTime)>>,
    done: tokio::sync::watch::Sender<bool>,
    /// The sandbox's account of its ended jobs' output, once the job is added to a sandbox.
    kept_in: OnceLock<Arc<KeptOutput>>,
    /// Whether this job's output is in that account (it goes in once).
    counted: AtomicBool,
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
            kept_in: OnceLock::new(),
            counted: AtomicBool::new(false),
        })
    }

    /// The buffers the job's guest writes to, shared so its output can be read while it runs.
    pub fn output(&self) -> (CappedOutput, CappedOutput) {
        self.output.clone()
    }

    /// Ends the job with `result`, of which it keeps [`JOB_KEPT_OUTPUT`] of output.
    pub fn finish(self: &Arc<Self>, result: Result<ExecResult, JobFailed>) {
        let result = match result {
            Ok(mut r) => {
                if fit_json(&mut r.stdout, &mut r.stderr, JOB_KEPT_OUTPUT) {
                    r.truncated = true;
                    // The cut may have taken the markers' places.
                    r.gaps = Default::default();
                }
                Ok(r)
            }
            Err(mut e) => {
                fit_json(&mut String::new(), &mut e.0, JOB_KEPT_OUTPUT);
                Err(e)
            }
        };
        *self.end.lock().unwrap() = Some((result, SystemTime::now()));
        self.count_output();
        self.done.send_replace(true);
    }

    /// Counts the job's output in `kept` (its sandbox's) once it ends.
    pub fn keep_output_in(self: &Arc<Self>, kept: Arc<KeptOutput>) {
        let _ = self.kept_in.set(kept);
        if self.end.lock().unwrap().is_some() {
            self.count_output();
        }
    }

    fn count_output(self: &Arc<Self>) {
        let Some(kept) = self.kept_in.get() else {
            return;
        };
        if self.counted.swap(true, Ordering::AcqRel) {
            return;
        }
        let size = match &*self.end.lock().unwrap() {
            Some((Ok(r), _)) => json_len(&r.stdout) + json_len(&r.stderr),
            Some((Err(e), _)) => json_len(&e.0),
            None => return,
        };
        kept.ended(self, size);
    }

    /// Replaces the output of this ended job with a note (its sandbox keeps newer jobs').
    fn drop_output(&self, budget: usize) {
        let note = format!(
            "wasmbox: this job's output was dropped: a sandbox keeps at most {} KiB of its \
             ended jobs' output (as JSON), the oldest jobs' going first\n",
            budget >> 10
        );
        match &mut *self.end.lock().unwrap() {
            Some((Ok(r), _)) => {
                r.stdout = String::new();
                r.stderr = note;
                r.truncated = true;
            }
            Some((Err(e), _)) => e.0 = note,
            None => {}
        }
    }

    /// Until its result is published and its output counted (so a listing that shows it ended
    /// also shows what its sandbox keeps of it).
    pub fn running(&self) -> bool {
        !*self.done.borrow()
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
    pub fn result(&self) -> Option<Result<ExecResult, JobFailed>> {
        self.end.lock().unwrap().as_ref().map(|(r, _)| r.clone())
    }

    /// The job as `execute_list_processes` shows it, stdout and stderr each cut to take at most
    /// `max_output` bytes of JSON (`output_truncated` says so): a list of jobs must fit a tool
    /// answer's budget.
    pub fn info(&self, max_output: usize) -> JobInfo {
        let cut = std::cell::Cell::new(false);
        let out = |s: &str| {
            let kept = json_prefix(s, max_output);
            if kept.len() < s.len() {
                cut.set(true);
            }
            kept.to_string()
        };
        let end = self.end.lock().unwrap();
        let mut info = JobInfo {
            process_id: self.id.clone(),
            execution_id: self.id.clone(),
            name: self.name.clone(),
            language: self.language,
            started_at: rfc3339(self.started_at),
            status: "running".into(),
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            truncated: None,
            execution_time: None,
            ended_at: None,
            limit: None,
            success: None,
            output_truncated: false,
        };
        let end = if self.running() { &None } else { &*end };
        match end {
            None => {
                let (so, se) = (self.output.0.peek(), self.output.1.peek());
                let (mut stdout, mut stderr) = (so.text().0, se.text().0);
                let kept_cut = fit_json(&mut stdout, &mut stderr, JOB_KEPT_OUTPUT);
                info.stdout = out(&stdout);
                info.stderr = out(&stderr);
                info.truncated = Some(kept_cut || so.dropped > 0 || se.dropped > 0);
                info.execution_time = Some(self.started.elapsed().as_secs_f64());
            }
            Some((r, ended)) => {
                info.ended_at = Some(rfc3339(*ended));
                match r {
                    Ok(r) => {
                        let status = match (self.stop.reason(), r.limit) {
                            (Some(StopReason::Killed), _) => "killed",
                            (Some(StopReason::SandboxGone | StopReason::Shutdown), _) => "killed",
                            (_, Some(crate::LimitHit::Timeout)) => "timeout",
                            _ if r.success => "completed",
                            _ => "failed",
                        };
                        info.status = status.into();
                        info.exit_code = Some(r.exit_code);
                        info.stdout = out(&r.stdout);
                        info.stderr = out(&r.stderr);
                        info.truncated = Some(r.truncated);
                        info.execution_time = Some(r.execution_time);
                        info.limit = Some(r.limit);
                        info.success = Some(r.success);
                    }
                    Err(e) => {
                        info.status = "failed".into();
                        info.exit_code = Some(1);
                        info.stderr = out(&e.0);
                        info.success = Some(false);
                    }
                }
            }
        }
        info.output_truncated = cut.get();
        info
    }
}

/// Background work running now (jobs and async executions), in all and per owner, and the
/// sandbox-less async executions queued for a place in it.
///
/// Places are not taken back from running work, so when several owners share the server (HTTP
/// with several tokens) one owner holds at most `max(1, max - 1)` of them whatever its own
/// limit says: another owner's job always finds a place (unless `max` is 1).
pub struct JobBudget {
    max: usize,
    per_owner: usize,
    /// Whether more than one owner may ask for places.
    shared: AtomicBool,
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
            shared: AtomicBool::new(false),
            queue,
            queue_bytes,
            state: Mutex::new(BudgetState::default()),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// Declares that `owners` distinct owners may ask for places.
    pub fn set_owners(&self, owners: usize) {
        self.shared.store(owners > 1, Ordering::Relaxed);
    }

    /// The most places one owner may hold, and the setting that says so.
    pub fn per_owner(&self) -> (usize, &'static str) {
        let share = (self.max - 1).max(1);
        if self.shared.load(Ordering::Relaxed) && share < self.per_owner {
            (
                share,
                "WASMBOX_MAX_JOBS less one, as several tokens share the server",
            )
        } else {
            (self.per_owner, "WASMBOX_MAX_JOBS_PER_TOKEN")
        }
    }

    /// Running jobs, in all and `owner`'s.
    pub fn running(&self, owner: &str) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.running, st.by_owner.get(owner).copied().unwrap_or(0))
    }

    /// Places taken now, and async executions queued for one.
    pub fn load(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.running, st.queued)
    }

    /// A place for one more job of `owner`, or why there is none.
    pub fn try_take(self: &Arc<Self>, owner: &str) -> crate::Result<JobTicket> {
        let mut st = self.state.lock().unwrap();
        let mine = st.by_owner.get(owner).copied().unwrap_or(0);
        let (limit, why) = self.per_owner();
        if mine >= limit {
            return Err(crate::Error::busy(format!(
                "this client already runs {mine} background jobs and async executions, its limit \
                 ({why}); wait for one to end or stop one with execute_kill_process"
            )));
        }
        if st.running >= self.max {
            return Err(crate::Error::busy(format!(
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
            return Err(crate::Error::busy(format!(
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

/// What one job keeps of stdout and stderr together, measured as JSON text: that is what a
/// listing sends and holds, and control characters take 6 bytes there (`\u0001`), so a byte
/// cap alone would let 1 MiB of them become 6 MiB in every listing.
pub const JOB_KEPT_OUTPUT: usize = 256 << 10;

/// What a sandbox keeps of its ended jobs' output in all (as [`JOB_KEPT_OUTPUT`] measures it);
/// past it the oldest ended jobs' output is dropped. Running jobs are bounded by their count.
pub const SANDBOX_KEPT_OUTPUT: usize = 4 << 20;

/// Room kept for the note that says output was cut.
const NOTE_ROOM: usize = 512;

/// A sandbox's account of its ended jobs' output, oldest first.
pub struct KeptOutput {
    budget: usize,
    state: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    /// Ended jobs and the bytes each keeps, oldest first.
    jobs: VecDeque<(Weak<Job>, usize)>,
    total: usize,
}

impl KeptOutput {
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(Self {
            budget,
            state: Mutex::new(Kept::default()),
        })
    }

    /// Counts `job`'s `size` bytes; drops the oldest jobs' output while over the budget.
    fn ended(&self, job: &Arc<Job>, size: usize) {
        let mut st = self.state.lock().unwrap();
        let Kept { jobs, total } = &mut *st;
        // Jobs the sandbox no longer lists (and nobody holds) are gone with their output.
        jobs.retain(|(j, n)| {
            let alive = j.strong_count() > 0;
            if !alive {
                *total -= n;
            }
            alive
        });
        jobs.push_back((Arc::downgrade(job), size));
        *total += size;
        while *total > self.budget {
            let Some((oldest, n)) = jobs.pop_front() else {
                break;
            };
            *total -= n;
            if let Some(j) = oldest.upgrade() {
                j.drop_output(self.budget);
            }
        }
    }

    /// Runs `f` while no job's output is dropped: a listing then shows one state of the
    /// sandbox's jobs (a job that ends meanwhile waits, and is listed as running).
    pub fn steady<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.state.lock().unwrap();
        f()
    }

    /// Output bytes counted now.
    pub fn total(&self) -> usize {
        self.state.lock().unwrap().total
    }
}

/// Cuts `s` to its longest prefix of at most `budget` JSON bytes.
fn cut_json(s: &mut String, budget: usize) {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += json_char_len(c);
        if used > budget {
            s.truncate(i);
            return;
        }
    }
}

/// Cuts `stdout` and `stderr` so that together they take at most `budget` bytes as JSON,
/// with a note at the end of stderr; stderr keeps at least a quarter when both are long.
/// Returns whether anything was cut.
fn fit_json(stdout: &mut String, stderr: &mut String, budget: usize) -> bool {
    let (out, err) = (json_len(stdout), json_len(stderr));
    if out + err <= budget {
        return false;
    }
    let room = budget.saturating_sub(NOTE_ROOM);
    let err_share = err.min((room / 4).max(room.saturating_sub(out)));
    cut_json(stdout, room - err_share);
    cut_json(stderr, err_share);
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    stderr.push_str(&format!(
        "wasmbox: output cut to {} KiB (stdout and stderr as JSON): a background job keeps no \
         more\n",
        budget >> 10
    ));
    true
}

#[cfg(test)]
mod output_tests {
    use super::*;

    /// With several owners, one owner's limit stops below the server's: the last place is
    /// another owner's. Alone, an owner may have them all.
    #[test]
    fn shared_owners_leave_each_other_a_place() {
        let budget = JobBudget::new(3, 8, 0, 0);
        let alone: Vec<_> = (0..3).map(|_| budget.try_take("a").unwrap()).collect();
        drop(alone);
        budget.set_owners(2);
        let a: Vec<_> = (0..2).map(|_| budget.try_take("a").unwrap()).collect();
        let Err(e) = budget.try_take("a") else {
            panic!("A took the last place")
        };
        assert!(e.to_string().contains("WASMBOX_MAX_JOBS less one"), "{e}");
        let b = budget.try_take("b").unwrap();
        assert!(budget.try_take("b").is_err(), "the server's limit holds");
        drop((a, b));
        assert_eq!(budget.running("a"), (0, 0));
    }

    #[test]
    fn output_is_cut_by_its_json_size() {
        let mut out = "\u{1}".repeat(100_000);
        let mut err = "e".repeat(10);
        assert!(fit_json(&mut out, &mut err, 64 << 10));
        let json = serde_json::to_string(&(&out, &err)).unwrap();
        assert!(json.len() <= (64 << 10) + 8, "{}", json.len());
        assert!(out.len() > 10_000, "stdout keeps the rest: {}", out.len());
        assert!(err.starts_with("eeeeeeeeee\nwasmbox: output cut"), "{err}");
        for s in ["\"\\\n\t\u{7f}é\u{0}x", "plain"] {
            assert_eq!(
                json_len(s) + 2,
                serde_json::to_string(s).unwrap().len(),
                "{s:?}"
            );
        }
        let (mut a, mut b) = ("short".to_string(), String::new());
        assert!(!fit_json(&mut a, &mut b, 64));
        assert_eq!(a, "short");
    }

    #[test]
    fn a_sandbox_drops_its_oldest_jobs_output_first() {
        let kept = KeptOutput::new(250);
        let jobs: Vec<_> = (0..4)
            .map(|_| Job::new(None, Language::Python, 1 << 10))
            .collect();
        for j in &jobs {
            j.keep_output_in(kept.clone());
            j.finish(Ok(ExecResult {
                stdout: "x".repeat(100),
                stderr: String::new(),
                exit_code: 0,
                execution_time: 0.0,
                success: true,
                truncated: false,
                limit: None,
                language: Language::Python,
                stage: None,
                rich: Vec::new(),
                notes: Vec::new(),
                cloud_sandbox_id: None,
                gaps: Default::default(),
            }));
        }
        assert_eq!(kept.total(), 200);
        let out = |j: &Arc<Job>| j.result().unwrap().unwrap().stdout;
        assert_eq!(out(&jobs[0]), "");
        assert_eq!(out(&jobs[1]), "");
        assert_eq!(out(&jobs[3]).len(), 100);
        assert!(
            jobs[0]
                .result()
                .unwrap()
                .unwrap()
                .stderr
                .contains("dropped")
        );
    }
}
