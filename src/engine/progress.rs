//! Progress of a call, for callers that show it (MCP `notifications/progress`): the stages
//! before the code runs (a runtime loading or its image being built, a Go build) and, while it
//! runs, a report about once a second. Reports are made on the host side and handed to a sink
//! that must not block: a guest never waits for whoever shows them.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::limits::CappedOutput;

/// How often a running guest is reported on.
pub const EVERY: Duration = Duration::from_secs(1);
/// Longest last line a report carries, in characters.
pub const LAST_LINE_CHARS: usize = 200;

/// One report on a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// A stage before the code runs, as a sentence: "loading the python runtime".
    Stage(String),
    /// The code has run for `elapsed` and written `output_bytes` (stdout and stderr);
    /// `last_line` is the newest line it wrote, cleaned of control characters and cut short.
    Running {
        elapsed: Duration,
        output_bytes: u64,
        last_line: Option<String>,
    },
}

impl Progress {
    /// The report as one line for a person.
    pub fn message(&self) -> String {
        match self {
            Progress::Stage(s) => s.clone(),
            Progress::Running {
                elapsed,
                output_bytes,
                last_line,
            } => {
                let mut m = format!(
                    "running: {} s elapsed, {output_bytes} bytes of output",
                    elapsed.as_secs()
                );
                if let Some(line) = last_line {
                    m.push_str("; last line: ");
                    m.push_str(line);
                }
                m
            }
        }
    }
}

/// Where a call's reports go. Called on guest and loader threads: it must return at once.
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(Progress) + Send + Sync>);

impl ProgressSink {
    pub fn new(f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    pub fn report(&self, p: Progress) {
        (self.0)(p)
    }

    pub fn stage(&self, s: impl Into<String>) {
        self.report(Progress::Stage(s.into()))
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// The running reports of one guest call, made from the checks its epoch callback and waits
/// already make (every 50 ms while it computes, every 10 ms while it sleeps).
pub struct Ticker {
    sink: ProgressSink,
    start: Instant,
    next: Instant,
    stdout: CappedOutput,
    stderr: CappedOutput,
}

impl Ticker {
    pub fn new(sink: ProgressSink, stdout: CappedOutput, stderr: CappedOutput) -> Self {
        let start = Instant::now();
        Self {
            sink,
            start,
            next: start + EVERY,
            stdout,
            stderr,
        }
    }

    /// Reports if a report is due.
    pub fn tick(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        // Catching up after a long wait would send a burst: the next one is a period away.
        self.next = now + EVERY;
        let (out_bytes, out_line) = self.stdout.progress();
        let (err_bytes, err_line) = self.stderr.progress();
        self.sink.report(Progress::Running {
            elapsed: now - self.start,
            output_bytes: out_bytes + err_bytes,
            last_line: out_line.or(err_line).map(|l| clean_line(&l)),
        });
    }
}

/// A line as a report may show it: control characters (escape sequences, tabs) become
/// spaces, surrounding space goes, and past [`LAST_LINE_CHARS`] it is cut with an ellipsis.
pub fn clean_line(line: &str) -> String {
    let cleaned: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let cleaned = cleaned.trim();
    match cleaned.char_indices().nth(LAST_LINE_CHARS) {
        None => cleaned.to_string(),
        Some((at, _)) => format!("{}…", &cleaned[..at]),
    }
}

/// The newest non-blank line at the end of `bytes` (a line a `\r` rewrote counts from it).
pub(crate) fn last_line(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    text.split(['\n', '\r'])
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::to_string)
}

/// Reports a runtime load's stages (see [`stage`]).
pub type StageFn = Arc<dyn Fn(&str) + Send + Sync>;

thread_local! {
    /// Where [`stage`] reports on this thread: set while a runtime loads.
    static STAGE: RefCell<Option<StageFn>> = const { RefCell::new(None) };
}

/// Tells whoever waits for the runtime loading on this thread what it is doing now. Loading
/// code says its stages here without knowing who, if anyone, listens.
pub fn stage(msg: &str) {
    let f = STAGE.with(|s| s.borrow().clone());
    if let Some(f) = f {
        f(msg);
    }
}

/// Runs `f` with [`stage`] reporting to `report` on this thread.
pub fn with_stages<R>(report: Option<StageFn>, f: impl FnOnce() -> R) -> R {
    let old = STAGE.with(|s| s.replace(report));
    let out = f();
    STAGE.with(|s| *s.borrow_mut() = old);
    out
}

/// This thread's stage reporter, for work it hands to another thread.
pub fn stage_reporter() -> Option<StageFn> {
    STAGE.with(|s| s.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_is_the_newest_non_blank_one() {
        assert_eq!(last_line(b"a\nb\n\n  \n"), Some("b".into()));
        assert_eq!(last_line(b"10%\r50%\r"), Some("50%".into()));
        assert_eq!(last_line(b"partial"), Some("partial".into()));
        assert_eq!(last_line(b"\n \n"), None);
    }

    #[test]
    fn a_line_is_cleaned_and_cut() {
        assert_eq!(clean_line("\x1b[31mred\x1b[0m\t!"), "[31mred [0m !");
        let long = "é".repeat(300);
        let cut = clean_line(&long);
        assert_eq!(cut.chars().count(), LAST_LINE_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
