//! Languages: the request and result types every adapter shares, and one adapter per language.

// The disk probe is the unit tests' and the fuzz targets' (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod disk_probe;
mod error;
pub mod go;
pub mod guest;
pub mod host_call;
pub mod image_runtime;
pub mod images;
pub mod javascript;
pub mod live;
pub mod mounts;
pub mod outcome;
pub mod python;
pub(crate) mod scratch;
pub mod spare;
pub mod wasi;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::engine::limits::{CappedOutput, LimitHit, Stop};
use LangError as Error;
pub use error::{LangError, Result, set_setup_note};

/// A language a caller can ask for. Parsing accepts the usual aliases.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    JavaScript,
    Go,
    Bash,
}

impl Language {
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Ok(Language::Python),
            "javascript" | "js" | "node" | "nodejs" => Ok(Language::JavaScript),
            "go" | "golang" => Ok(Language::Go),
            "bash" | "sh" | "shell" => Ok(Language::Bash),
            _ => Err(Error::UnknownLanguage(s.to_string())),
        }
    }

    /// The language's name in prose ("Python").
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "Python",
            Language::JavaScript => "JavaScript",
            Language::Go => "Go",
            Language::Bash => "Bash",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::Go => "go",
            Language::Bash => "bash",
        }
    }
}

/// One execution as the library sees it, already validated.
#[derive(Clone, Debug)]
pub struct ExecRequest {
    pub language: Language,
    pub code: String,
    /// Extra environment for the guest; the host's environment never reaches it.
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub output_bytes: usize,
    /// Print the value of a final expression (notebook style); one-shots default to no echo,
    /// like `python -c`.
    pub echo: bool,
    /// Run in a persistent sandbox's directories; `None` gives fresh empty ones (a one-shot).
    pub place: Option<Place>,
    /// What a one-shot's fresh directories may hold (`WASMBOX_ONESHOT_DISK_MB`).
    pub scratch_quota: crate::engine::disk::Quota,
    /// Raised when the caller gives up on the call (MCP cancellation): the guest, or a Go
    /// build, stops as it would at its deadline.
    pub cancel: Option<Arc<Stop>>,
    /// Where reports on the call's stages and running go, for a caller that shows them
    /// (MCP progress); without one nothing is reported.
    pub progress: Option<crate::engine::progress::ProgressSink>,
    /// The figures a Python run leaves open come back as images within this (`None`: they are
    /// left alone, as for background work whose result carries no images).
    pub images: Option<images::ImageBudget>,
    /// Whose call it is: the CPU slots are shared between owners (`engine::cpu`).
    pub owner: crate::engine::cpu::Owner,
    /// What the run's guest may reach through `host.call` (`None`: nothing).
    pub reach: Option<Arc<crate::reach::Reach>>,
    /// Installed packages' trees (guest paths) a Python run has on `sys.path`, after the
    /// bundled ones.
    pub packages: Vec<String>,
    /// The tool call this run belongs to, when the audit log is on: a background run writes
    /// its own line there when it ends.
    pub audit: Option<Arc<crate::telemetry::audit::Origin>>,
}

/// Where a sandboxed execution runs: its sandbox's `/workspace` and `/tmp` (host directories
/// that outlive the execution), its working directory, and the flag that stops it from outside.
#[derive(Clone)]
pub struct Place {
    pub workspace: PathBuf,
    pub tmp: PathBuf,
    /// Guest path of the working directory (under `/workspace` or `/tmp`).
    pub cwd: String,
    pub stop: Arc<Stop>,
    /// What the sandbox may hold on disk (`/workspace` and `/tmp`), counted as guests write.
    pub disk: Option<Arc<crate::engine::disk::DiskBudget>>,
    /// Where stdout and stderr go, when the caller wants to read them while the guest runs
    /// (background jobs); fresh buffers otherwise.
    pub output: Option<(CappedOutput, CappedOutput)>,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place")
            .field("workspace", &self.workspace)
            .field("cwd", &self.cwd)
            .finish_non_exhaustive()
    }
}

/// The outcome of one execution, the same for every language (and, later, the cloud).
#[derive(Clone, Debug, Serialize)]
pub struct ExecResult {
    pub stdout: String,
    pub stderr: String,
    /// The guest's exit status: 0 on success, `sys.exit(n)` gives n, an uncaught exception 1,
    /// a deadline 124, a trap 1 (the message is on stderr).
    pub exit_code: i32,
    /// Wall-clock seconds of the execution.
    pub execution_time: f64,
    /// `exit_code == 0` and no limit hit.
    pub success: bool,
    /// Some output was dropped at the output cap.
    pub truncated: bool,
    /// Which limit stopped or cut the execution, if any.
    pub limit: Option<LimitHit>,
    pub language: Language,
    /// For languages that are built before they run (Go): which stage the result comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// Images (the figures a Python run left open or showed, as PNG; first) and, in rich mode,
    /// a final DataFrame as HTML.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rich: Vec<RichOutput>,
    /// What the host wants the caller to know about this run (a session replaced, a plot
    /// dropped), kept apart from the guest's own stderr.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Set when the code ran in the HOPX cloud: the cloud sandbox it ran in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_sandbox_id: Option<String>,
    /// Where stdout's and stderr's middles were dropped at the output cap (the markers in the
    /// text say so), for the cut to a tool answer's budget to take them in.
    #[serde(skip)]
    pub gaps: Gaps,
}

/// The markers [`crate::engine::limits::Captured::text`] left in a result's streams.
#[derive(Clone, Debug, Default)]
pub struct Gaps {
    pub stdout: Option<crate::fit::Gap>,
    pub stderr: Option<crate::fit::Gap>,
}

/// One rich output of a run, in HOPX's `rich_outputs` terms.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct RichOutput {
    /// `image/png` or `text/html`.
    #[serde(rename = "type")]
    pub mime: String,
    /// Base64 for images, the text itself otherwise.
    pub data: String,
}

/// The stage of a built language's execution that a result comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Building the snippet (a compile error, or the deadline passed while building).
    Compile,
    /// Running the built program.
    Run,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Compile => "compile",
            Stage::Run => "run",
        }
    }
}

/// Exit code reported when the deadline stopped a guest (as `timeout(1)` does).
pub const EXIT_TIMEOUT: i32 = 124;
