//! The audit log: one JSON line per tool call in `<data dir>/audit.jsonl`, rotated by size,
//! and one more when a background run ends (the call that started it answered long before).
//!
//! A call hands its facts over as a plain [`Call`] and goes on: the queue takes it under a short
//! lock, with no wake (a wake on a sleeping CPU costs the waker tens of microseconds, and a
//! pooled one-shot answers in a fraction of a millisecond). The writer thread, at low priority,
//! wakes every [`BATCH_EVERY`] (or when the queue is three quarters full, or at close), hashes
//! and redacts the code, and writes the batch with one flush. A queue that is full drops the
//! line and counts it ([`dropped`]); the `seq` gaps show where.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Lines the queue holds before it drops new ones.
const QUEUE: usize = 4096;
/// Bytes of code the queued lines may hold together (a call's code may be 4 MiB).
const QUEUE_BYTES: usize = 32 << 20;
/// How often the writer looks at the queue when nobody wakes it.
const BATCH_EVERY: Duration = Duration::from_millis(100);
/// Characters of a call's code the line quotes (after redaction).
pub const CODE_HEAD: usize = 200;
/// Files kept: `audit.jsonl`, `audit.1.jsonl`, `audit.2.jsonl`.
pub const KEEP: usize = 3;
/// Host calls a line lists; the rest are counted in `host_calls_more`.
const HOST_NOTES: usize = 64;

static DROPPED: AtomicU64 = AtomicU64::new(0);
static LOG: OnceLock<Log> = OnceLock::new();

/// Lines dropped because the writer fell behind (the `seq` gaps show where).
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Where the log goes and how large a file grows before it is rotated.
#[derive(Clone, Debug)]
pub struct Settings {
    pub path: PathBuf,
    pub max_bytes: u64,
}

/// Makes the text a line quotes safe to keep: secrets' values, keys and tokens become
/// placeholders. It sees the whole code, so a value cut at [`CODE_HEAD`] is still found.
pub type Redact = Box<dyn Fn(String) -> String + Send>;

/// The tool call a line belongs to: a call's own line, and the end of a run it started.
#[derive(Debug, Default)]
pub struct Origin {
    pub request_id: String,
    pub owner: Arc<str>,
    pub transport: &'static str,
    pub tool: String,
    pub trace_id: Option<String>,
    /// The host calls its code made (a background run's go on after the call's line).
    pub host_calls: Arc<HostLog>,
}

/// What a line records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A tool call answered.
    #[default]
    Call,
    /// A background job or async execution ended: its status, limit and host calls.
    RunEnd,
}

/// One tool call as the front saw it, or a run's end. `code` is hashed and quoted on the
/// writer, never kept.
#[derive(Debug, Default)]
pub struct Call {
    pub at: Option<SystemTime>,
    pub event: Event,
    pub origin: Arc<Origin>,
    /// The background job or async execution the call started, or whose end this is.
    pub run_id: Option<String>,
    pub sandbox_id: Option<String>,
    pub language: Option<String>,
    pub mode: Option<String>,
    pub code: Option<String>,
    pub duration: Duration,
    /// ok | failed | limit | error | refused | cancelled | input_required; a run's end also
    /// killed | sandbox_gone | shutdown.
    pub status: &'static str,
    pub error_type: Option<String>,
    pub exit_code: Option<i64>,
    pub limit: Option<serde_json::Value>,
    pub bytes_out: Option<u64>,
}

/// The host calls one tool call's code made: the host and status of each HTTP request, the
/// server and tool of each code-mode call. Never a path, a query, a header or a body.
#[derive(Debug, Default)]
pub struct HostLog {
    notes: Mutex<(Vec<HostCall>, u64)>,
}

/// One host call, as a line lists it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct HostCall {
    /// `http` or `tool`.
    pub kind: &'static str,
    /// An HTTP request's `host:port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A code-mode call's server and tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The HTTP status answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// ok | error | refused
    pub outcome: &'static str,
    /// The failure's kind (`refused`, `timeout`, `denied`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HostLog {
    pub fn note(&self, call: HostCall) {
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        if n.0.len() < HOST_NOTES {
            n.0.push(call);
        } else {
            n.1 += 1;
        }
    }

    /// The calls noted, and how many more were left out.
    pub fn taken(&self) -> (Vec<HostCall>, u64) {
        let n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        (n.0.clone(), n.1)
    }
}

/// Whether calls are being logged: the front builds a [`Call`] only then.
pub fn enabled() -> bool {
    LOG.get()
        .is_some_and(|l| !l.closing.load(Ordering::Relaxed))
}

/// Starts the writer for this process (once; a second start is refused).
pub fn start(settings: Settings, redact: Redact) -> io::Result<()> {
    let writer = Writer::open(settings.path.clone(), settings.max_bytes)?;
    let log = Log {
        queue: Mutex::new(Queue::default()),
        closing: AtomicBool::new(false),
        thread: Mutex::new(None),
        waker: OnceLock::new(),
    };
    if LOG.set(log).is_err() {
        return Err(io::Error::other("the audit log is already started"));
    }
    let log = LOG.get().expect("set above");
    let handle = std::thread::Builder::new()
        .name("wasmbox-audit".into())
        .spawn(move || run(log, writer, redact))?;
    let _ = log.waker.set(handle.thread().clone());
    *log.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    Ok(())
}

/// Queues a call's line (dropped and counted when the queue is full).
pub fn record(call: Call) {
    let Some(log) = LOG.get() else { return };
    let bytes = call.code.as_ref().map_or(0, String::len);
    let len = {
        let mut q = log.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.calls.len() >= QUEUE || q.bytes + bytes > QUEUE_BYTES {
            drop(q);
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.bytes += bytes;
        q.calls.push_back(call);
        q.calls.len()
    };
    if len == QUEUE * 3 / 4 {
        log.wake();
    }
}

/// Writes what is queued and stops the writer: the last lines reach the file before the
/// process ends.
pub fn close() {
    let Some(log) = LOG.get() else { return };
    log.closing.store(true, Ordering::Relaxed);
    log.wake();
    let handle = log.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(h) = handle {
        let _ = h.join();
    }
}

#[derive(Default)]
struct Queue {
    calls: VecDeque<Call>,
    /// The code the calls hold, together.
    bytes: usize,
}

struct Log {
    queue: Mutex<Queue>,
    closing: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    waker: OnceLock<Thread>,
}

impl Log {
    fn wake(&self) {
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
    }
}

fn run(log: &Log, mut writer: Writer, redact: Redact) {
    crate::platform::process::lower_priority();
    let id = process_id();
    let mut seq = 0u64;
    loop {
        let closing = log.closing.load(Ordering::Relaxed);
        let batch: Vec<Call> = {
            let mut q = log.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.bytes = 0;
            q.calls.drain(..).collect()
        };
        for call in batch {
            seq += 1;
            let line = line(call, seq, &id, &redact);
            if let Err(e) = writer.write_line(&line) {
                tracing::warn!("audit log: {e}");
            }
        }
        if let Err(e) = writer.flush() {
            tracing::warn!("audit log: {e}");
        }
        if closing {
            return;
        }
        std::thread::park_timeout(BATCH_EVERY);
    }
}

/// A prefix of call ids unique to this process, so ids from successive servers never repeat.
fn process_id() -> String {
    let mut b = [0u8; 6];
    let _ = getrandom::fill(&mut b);
    hex::encode(b)
}

#[derive(Serialize)]
struct Line<'a> {
    v: u32,
    seq: u64,
    time: String,
    call_id: String,
    event: Event,
    request_id: &'a str,
    owner: &'a str,
    transport: &'a str,
    tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code_head: Option<String>,
    duration_ms: f64,
    status: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_out: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    host_calls: Vec<HostCall>,
    #[serde(skip_serializing_if = "is_zero")]
    host_calls_more: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A call's line, newline included.
fn line(call: Call, seq: u64, process: &str, redact: &Redact) -> Vec<u8> {
    let time = chrono::DateTime::<chrono::Utc>::from(call.at.unwrap_or_else(SystemTime::now))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let (code_sha256, code_head) = match call.code {
        Some(code) => {
            let sha = hex::encode(Sha256::digest(code.as_bytes()));
            let head: String = redact(code).chars().take(CODE_HEAD).collect();
            (Some(sha), Some(head))
        }
        None => (None, None),
    };
    let origin = &*call.origin;
    let (host_calls, host_calls_more) = origin.host_calls.taken();
    let line = Line {
        v: 1,
        seq,
        time,
        call_id: format!("{process}-{seq}"),
        event: call.event,
        request_id: &origin.request_id,
        owner: &origin.owner,
        transport: origin.transport,
        tool: &origin.tool,
        run_id: call.run_id.as_deref(),
        sandbox_id: call.sandbox_id.as_deref(),
        language: call.language.as_deref(),
        mode: call.mode.as_deref(),
        code_sha256,
        code_head,
        duration_ms: (call.duration.as_secs_f64() * 1e6).round() / 1e3,
        status: call.status,
        error_type: call.error_type.as_deref(),
        exit_code: call.exit_code,
        limit: call.limit.as_ref(),
        bytes_out: call.bytes_out,
        host_calls,
        host_calls_more,
        trace_id: origin.trace_id.as_deref(),
    };
    let mut out = serde_json::to_vec(&line).expect("a line serializes");
    out.push(b'\n');
    out
}

/// `audit.jsonl` and its rotation. `size` is the file's length as this writer knows it (the
/// length at open plus what it wrote): rotation never stats the file per line.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    file: BufWriter<File>,
    size: u64,
}

impl Writer {
    fn open(path: PathBuf, max_bytes: u64) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            crate::platform::fs::private_dir(&mut b);
            b.create(dir)?;
        }
        let (file, size) = open_append(&path)?;
        Ok(Self {
            path,
            max_bytes: max_bytes.max(1),
            file: BufWriter::with_capacity(64 << 10, file),
            size,
        })
    }

    /// Appends `line`, first rotating when it would take the file past its cap (a file holds at
    /// least one line, however long).
    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }

    /// `audit.jsonl` becomes `audit.1.jsonl`, that one `audit.2.jsonl`; the oldest goes.
    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        for n in (1..KEEP).rev() {
            let from = if n == 1 {
                self.path.clone()
            } else {
                numbered(&self.path, n - 1)
            };
            match std::fs::rename(&from, numbered(&self.path, n)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        let (file, size) = open_append(&self.path)?;
        self.file = BufWriter::with_capacity(64 << 10, file);
        self.size = size;
        Ok(())
    }
}

/// `audit.jsonl` → `audit.<n>.jsonl`.
pub fn numbered(path: &Path, n: usize) -> PathBuf {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("jsonl");
    path.with_file_name(format!("{stem}.{n}.{ext}"))
}

fn open_append(path: &Path) -> io::Result<(File, u64)> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).append(true);
    crate::platform::fs::private_file(&mut o);
    let file = o.open(path)?;
    let size = file.metadata()?.len();
    Ok((file, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(path: &Path) -> Vec<PathBuf> {
        let mut v = vec![path.to_path_buf()];
        v.extend((1..KEEP).map(|n| numbered(path, n)));
        v
    }

    /// xorshift: random sequences without a dependency.
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// The writer's size is the file's after any sequence of lines and rotations (including
    /// reopening a file another writer left), every kept file stays within its cap unless it
    /// holds a single longer line, and no more than KEEP files exist.
    #[test]
    fn the_size_kept_is_the_files_after_random_writes() {
        for seed in 1..=40u64 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("audit.jsonl");
            let mut s = seed * 0x9E37_79B9_7F4A_7C15;
            let cap = 200 + next(&mut s) % 2000;
            let mut w = Writer::open(path.clone(), cap).unwrap();
            for i in 0..(50 + next(&mut s) % 300) {
                let len = 1 + (next(&mut s) % (cap + cap / 2)) as usize;
                let mut line = vec![b'x'; len];
                *line.last_mut().unwrap() = b'\n';
                w.write_line(&line).unwrap();
                if next(&mut s).is_multiple_of(7) {
                    w.flush().unwrap();
                }
                if next(&mut s).is_multiple_of(50) {
                    // A restart: a new writer on the same file.
                    w.flush().unwrap();
                    w = Writer::open(path.clone(), cap).unwrap();
                }
                if i % 5 == 0 {
                    w.flush().unwrap();
                    assert_eq!(
                        w.size,
                        std::fs::metadata(&path).unwrap().len(),
                        "seed {seed}"
                    );
                }
            }
            w.flush().unwrap();
            assert_eq!(w.size, std::fs::metadata(&path).unwrap().len());
            let present: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(
                present.len() <= KEEP,
                "seed {seed}: {} files",
                present.len()
            );
            for f in files(&path).iter().filter(|f| f.exists()) {
                let bytes = std::fs::read(f).unwrap();
                let lines = bytes.split_inclusive(|b| *b == b'\n').count();
                assert!(
                    bytes.len() as u64 <= cap || lines == 1,
                    "seed {seed}: {} is {} bytes over {cap} with {lines} lines",
                    f.display(),
                    bytes.len()
                );
            }
        }
    }

    #[test]
    fn a_line_is_json_with_the_code_redacted_and_cut() {
        let secret = "s3cr3t-value";
        // The value straddles the cut: redacted first, the head ends in the placeholder's start.
        let code = format!("{}{secret}\nprint(1)", "x = 1\n".repeat(33));
        let redact: Redact = Box::new(move |c: String| c.replace(secret, "$SECRET"));
        let log = Arc::new(HostLog::default());
        for i in 0..70 {
            log.note(HostCall {
                kind: "http",
                host: Some(format!("127.0.0.1:{i}")),
                server: None,
                tool: None,
                status: Some(200),
                outcome: "ok",
                error: None,
            });
        }
        let call = Call {
            origin: Arc::new(Origin {
                owner: "local".into(),
                transport: "stdio",
                tool: "execute_code".into(),
                host_calls: log,
                ..Default::default()
            }),
            code: Some(code.clone()),
            status: "ok",
            ..Default::default()
        };
        let bytes = line(call, 7, "abc", &redact);
        assert_eq!(bytes.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["seq"], 7);
        assert_eq!(v["call_id"], "abc-7");
        assert_eq!(v["event"], "call");
        assert_eq!(
            v["code_sha256"],
            hex::encode(Sha256::digest(code.as_bytes()))
        );
        let head = v["code_head"].as_str().unwrap();
        assert_eq!(head.chars().count(), CODE_HEAD);
        assert!(head.ends_with("$S"), "{head}");
        assert_eq!(v["host_calls"].as_array().unwrap().len(), HOST_NOTES);
        assert_eq!(v["host_calls_more"], 70 - HOST_NOTES as u64);
        assert!(!String::from_utf8_lossy(&bytes).contains(secret));
    }
}
