//! Per-execution limits: the deadline (epochs), the linear-memory cap (a `ResourceLimiter`) and
//! capped output capture. Hitting one is recorded so the result can say which limit stopped the
//! guest.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// The limits of one execution. Always on; callers override within the configured maxima.
#[derive(Clone, Debug)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub output_bytes: usize,
}

/// Which limit stopped or cut an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitHit {
    /// The deadline passed; the guest was interrupted.
    Timeout,
    /// The guest asked for more linear memory than allowed.
    Memory,
    /// The guest kept writing far past the output cap and was stopped.
    Output,
    /// The sandbox's workspace went over its disk quota (bytes or file count).
    Disk,
}

impl LimitHit {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitHit::Timeout => "timeout",
            LimitHit::Memory => "memory",
            LimitHit::Output => "output",
            LimitHit::Disk => "disk",
        }
    }
}

/// Why a running guest was stopped from outside its own deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A caller killed it (`execute_kill_process`).
    Killed,
    /// Its sandbox was deleted or expired.
    SandboxGone,
    /// The workspace went over its disk quota.
    DiskQuota,
    /// The client gave up on the call (MCP `notifications/cancelled`).
    Cancelled,
}

/// A flag a guest's epoch callback checks: how background jobs are killed and how a sandbox's
/// deletion ends what still runs in it, without touching other guests (the engine's epoch is
/// shared, so it cannot be bumped for one store).
#[derive(Debug, Default)]
pub struct Stop(std::sync::atomic::AtomicU8);

impl Stop {
    pub fn stop(&self, why: StopReason) {
        let v = match why {
            StopReason::Killed => 1,
            StopReason::SandboxGone => 2,
            StopReason::DiskQuota => 3,
            StopReason::Cancelled => 4,
        };
        // The first reason wins: a kill stays a kill even if the sandbox goes next.
        let _ = self.0.compare_exchange(
            0,
            v,
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    pub fn reason(&self) -> Option<StopReason> {
        match self.0.load(std::sync::atomic::Ordering::SeqCst) {
            1 => Some(StopReason::Killed),
            2 => Some(StopReason::SandboxGone),
            3 => Some(StopReason::DiskQuota),
            4 => Some(StopReason::Cancelled),
            _ => None,
        }
    }
}

/// The error an epoch callback raises to stop a guest; `finish` turns it into the result.
#[derive(Debug)]
pub struct Stopped(pub StopReason);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            StopReason::Killed => write!(f, "the execution was killed"),
            StopReason::SandboxGone => write!(f, "the sandbox was deleted or expired"),
            StopReason::DiskQuota => write!(f, "the workspace went over its disk quota"),
            StopReason::Cancelled => write!(f, "the client cancelled the call"),
        }
    }
}

impl std::error::Error for Stopped {}

/// Denies linear-memory growth past the cap, remembering that it did.
pub struct MemoryLimiter {
    limit: usize,
    pub hit: bool,
}

impl MemoryLimiter {
    pub fn new(limit: usize) -> Self {
        Self { limit, hit: false }
    }

    /// A pooled instance is made before its caller's limit is known.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
        self.hit = false;
    }
}

/// Table growth is bounded too, so a guest cannot eat host memory through tables.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// A guest's stdout or stderr: keeps the first `cap` bytes and counts the rest. Past
/// `KILL_FACTOR` times the cap the guest is stopped, so an endless print loop ends long before
/// its deadline.
#[derive(Clone)]
pub struct CappedOutput(Arc<Mutex<Buffer>>);

const KILL_FACTOR: u64 = 8;

#[derive(Default)]
struct Buffer {
    buf: Vec<u8>,
    cap: usize,
    dropped: u64,
    killed: bool,
}

/// What a guest wrote to one stream.
#[derive(Debug, Default, Clone)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub dropped: u64,
    pub killed: bool,
}

impl CappedOutput {
    pub fn new(cap: usize) -> Self {
        Self(Arc::new(Mutex::new(Buffer {
            cap,
            ..Default::default()
        })))
    }

    /// Sets the cap for what is written from now on (pooled instances learn it at checkout).
    pub fn set_cap(&self, cap: usize) {
        self.0.lock().unwrap().cap = cap;
    }

    /// Takes what was captured so far.
    pub fn take(&self) -> Captured {
        let mut c = self.0.lock().unwrap();
        Captured {
            bytes: std::mem::take(&mut c.buf),
            dropped: std::mem::take(&mut c.dropped),
            killed: std::mem::take(&mut c.killed),
        }
    }

    /// A copy of what was captured so far, leaving it in place (output of a running job).
    pub fn peek(&self) -> Captured {
        let c = self.0.lock().unwrap();
        Captured {
            bytes: c.buf.clone(),
            dropped: c.dropped,
            killed: c.killed,
        }
    }

    /// Appends what the guest wrote; past the kill factor, an error that stops the guest.
    pub(crate) fn push(&self, bytes: &[u8]) -> Result<(), StreamError> {
        if failpoint("stdout-panic") && bytes.windows(23).any(|w| w == b"wasmbox-failpoint-panic") {
            panic!("failpoint stdout-panic: a panic inside the fd_write host function");
        }
        let mut c = self.0.lock().unwrap();
        let room = c.cap.saturating_sub(c.buf.len());
        let keep = room.min(bytes.len());
        c.buf.extend_from_slice(&bytes[..keep]);
        c.dropped += (bytes.len() - keep) as u64;
        if c.dropped > KILL_FACTOR * c.cap as u64 {
            c.killed = true;
            return Err(StreamError::Trap(wasmtime::format_err!(
                "output limit: the guest wrote more than {} bytes",
                (KILL_FACTOR + 1) * c.cap as u64
            )));
        }
        Ok(())
    }
}

impl IsTerminal for CappedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CappedOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes)
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(1 << 20)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CappedOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(
            self.push(buf)
                .map(|()| buf.len())
                .map_err(|_| std::io::Error::other("output limit")),
        )
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Fault injection for the fault suite: `WASMBOX_FAILPOINTS=name,...` turns named faults on.
/// `stdout-panic`: the guest-output host function panics when a guest writes
/// `wasmbox-failpoint-panic`, to prove a panic inside a host function fails only that call.
pub fn failpoint(name: &str) -> bool {
    static POINTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    POINTS
        .get_or_init(|| {
            std::env::var("WASMBOX_FAILPOINTS")
                .map(|v| v.split(',').map(|p| p.trim().to_string()).collect())
                .unwrap_or_default()
        })
        .iter()
        .any(|p| p == name)
}
