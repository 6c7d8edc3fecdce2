//! Per-execution limits: the deadline (epochs), the linear-memory cap (a `ResourceLimiter`) and
//! capped output capture. Hitting one is recorded so the result can say which limit stopped the
//! guest.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use crate::fit::Gap;

/// The limits of one execution. Always on; callers override within the configured maxima.
#[derive(Clone, Debug)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub output_bytes: usize,
}

/// Which limit stopped or cut an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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
    /// The server is stopping: ended as by a kill, but its session keeps the turn before.
    Shutdown,
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
            StopReason::Shutdown => 5,
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
            5 => Some(StopReason::Shutdown),
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
            StopReason::Shutdown => write!(f, "the server is shutting down"),
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

/// A guest's stdout or stderr: keeps the first half of `cap` bytes and the last half, and counts
/// what falls between (the end of a stream, a traceback or a final result, matters as much as
/// its start). Past `KILL_FACTOR` times the cap dropped the guest is stopped, so an endless
/// print loop ends long before its deadline.
#[derive(Clone)]
pub struct CappedOutput(Arc<Mutex<Buffer>>);

const KILL_FACTOR: u64 = 8;

#[derive(Default)]
struct Buffer {
    head: Vec<u8>,
    /// What came after the head filled, its newest `cap - head` bytes.
    tail: VecDeque<u8>,
    cap: usize,
    dropped: u64,
    killed: bool,
}

impl Buffer {
    fn captured(&mut self, take: bool) -> Captured {
        let mut bytes = if take {
            std::mem::take(&mut self.head)
        } else {
            self.head.clone()
        };
        let gap_at = bytes.len();
        bytes.extend(self.tail.iter());
        if take {
            self.tail = VecDeque::new();
        }
        let c = Captured {
            bytes,
            gap_at,
            dropped: self.dropped,
            killed: self.killed,
        };
        if take {
            self.dropped = 0;
            self.killed = false;
        }
        c
    }
}

/// What a guest wrote to one stream: its start, then its end; `dropped` bytes between them
/// (at `gap_at`) were not kept.
#[derive(Debug, Default, Clone)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub gap_at: usize,
    pub dropped: u64,
    pub killed: bool,
}

impl Captured {
    /// The output as text (invalid UTF-8 replaced), with [`crate::fit::marker`] where bytes were
    /// dropped, and that marker's place so a later cut can take it in.
    pub fn text(&self) -> (String, Option<Gap>) {
        if self.dropped == 0 {
            return (String::from_utf8_lossy(&self.bytes).into_owned(), None);
        }
        let (head, tail) = self.bytes.split_at(self.gap_at.min(self.bytes.len()));
        // Characters the gap split in two go with the dropped bytes.
        let head = match std::str::from_utf8(head) {
            Err(e) if e.error_len().is_none() => &head[..e.valid_up_to()],
            _ => head,
        };
        let skip = tail
            .iter()
            .take(3)
            .take_while(|b| **b & 0xC0 == 0x80)
            .count();
        let bytes = self.dropped + (self.gap_at - head.len() + skip) as u64;
        let mut text = String::from_utf8_lossy(head).into_owned();
        let start = text.len();
        text.push_str(&crate::fit::marker(bytes));
        let at = start..text.len();
        text.push_str(&String::from_utf8_lossy(&tail[skip..]));
        (text, Some(Gap { at, bytes }))
    }
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
        self.0.lock().unwrap().captured(true)
    }

    /// A copy of what was captured so far, leaving it in place (output of a running job).
    pub fn peek(&self) -> Captured {
        self.0.lock().unwrap().captured(false)
    }

    /// Bytes written since the last take, and the newest line of them (a progress report):
    /// only the last KiB is looked at, so a report costs the same whatever the guest wrote.
    pub fn progress(&self) -> (u64, Option<String>) {
        const LOOK: usize = 1024;
        let c = self.0.lock().unwrap();
        let total = (c.head.len() + c.tail.len()) as u64 + c.dropped;
        let from_tail = c.tail.len().min(LOOK);
        let from_head = (LOOK - from_tail).min(c.head.len());
        let mut end = c.head[c.head.len() - from_head..].to_vec();
        end.extend(c.tail.range(c.tail.len() - from_tail..));
        drop(c);
        (total, super::progress::last_line(&end))
    }

    /// Appends what the guest wrote; past the kill factor, an error that stops the guest.
    pub(crate) fn push(&self, bytes: &[u8]) -> Result<(), StreamError> {
        if failpoint("stdout-panic") && bytes.windows(23).any(|w| w == b"wasmbox-failpoint-panic") {
            panic!("failpoint stdout-panic: a panic inside the fd_write host function");
        }
        let mut c = self.0.lock().unwrap();
        let tail_cap = c.cap / 2;
        let room = (c.cap - tail_cap).saturating_sub(c.head.len());
        let (head, rest) = bytes.split_at(room.min(bytes.len()));
        c.head.extend_from_slice(head);
        // Only the newest `tail_cap` bytes of `rest` can stay.
        let skip = rest.len().saturating_sub(tail_cap);
        c.tail.extend(&rest[skip..]);
        let over = c.tail.len().saturating_sub(tail_cap);
        c.tail.drain(..over);
        c.dropped += (skip + over) as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keeps_its_start_and_end() {
        let out = CappedOutput::new(10);
        for chunk in [&b"abc"[..], b"defgh", b"ijklmnop", b"qrst"] {
            out.push(chunk).unwrap();
        }
        let c = out.take();
        assert_eq!(c.bytes, b"abcdepqrst");
        assert_eq!((c.gap_at, c.dropped), (5, 10));
        let (text, gap) = c.text();
        let gap = gap.unwrap();
        assert_eq!(&text[..5], "abcde");
        assert_eq!(&text[gap.at.clone()], crate::fit::marker(10));
        assert_eq!(&text[gap.at.end..], "pqrst");
        // Taken: the next call starts empty.
        out.push(b"xy").unwrap();
        let c = out.take();
        assert_eq!((c.bytes.as_slice(), c.dropped), (&b"xy"[..], 0));
        assert_eq!(c.text(), ("xy".to_string(), None));
    }

    #[test]
    fn a_character_split_by_the_gap_counts_as_dropped() {
        let out = CappedOutput::new(8);
        out.push("aaaé".as_bytes()).unwrap(); // head: "aaa" and half of "é"
        out.push(&[b'z'; 6]).unwrap();
        out.push("ébbc".as_bytes()).unwrap(); // tail: the last 4 bytes, "\xa9bbc"
        let (text, gap) = out.take().text();
        let gap = gap.unwrap();
        assert!(text.starts_with("aaa\n…"), "{text:?}");
        assert!(text.ends_with("…\nbbc"), "{text:?}");
        assert_eq!(gap.bytes, 1 + 6 + 2 + 1);
    }

    #[test]
    fn progress_counts_every_byte_and_finds_the_newest_line() {
        let out = CappedOutput::new(10);
        assert_eq!(out.progress(), (0, None));
        out.push(b"one\ntwo\n").unwrap();
        assert_eq!(out.progress(), (8, Some("two".into())));
        out.push(b"three\nfour").unwrap(); // past the cap: the middle is dropped
        assert_eq!(out.progress(), (18, Some("four".into())));
    }

    #[test]
    fn an_endless_writer_is_stopped() {
        let out = CappedOutput::new(4);
        let mut stopped = false;
        for _ in 0..100 {
            if out.push(b"x").is_err() {
                stopped = true;
                break;
            }
        }
        assert!(stopped && out.peek().killed);
    }
}
