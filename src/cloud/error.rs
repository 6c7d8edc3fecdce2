//! Cloud errors. Every message is meant to be shown to a user as is: it says what failed and
//! what to do, and never contains the API key or a sandbox token (server text is scrubbed
//! before it lands here).

use std::time::Duration;

use super::route::CloudReason;

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// The request needs the cloud and no API key is configured.
    #[error(
        "{reason} needs the HOPX cloud fallback: set HOPX_API_KEY (get a key at https://hopx.ai) \
         to run it there; python, javascript and go run locally without it"
    )]
    MissingApiKey { reason: CloudReason },

    /// The request needs the cloud and the cloud was turned off.
    #[error(
        "the cloud is disabled (--offline / WASMBOX_OFFLINE=1), and {reason} needs the HOPX \
         cloud; python, javascript and go run locally"
    )]
    Offline { reason: CloudReason },

    #[error("HOPX rejected the API key (401): check HOPX_API_KEY")]
    BadApiKey,

    #[error(
        "the HOPX sandbox agent rejected the sandbox token (401) during {op}, even after a token \
         refresh"
    )]
    BadToken { op: &'static str },

    #[error("HOPX account limit reached (403) during {op}: {message}")]
    LimitReached { op: &'static str, message: String },

    #[error("HOPX refused {op} (403): {message}")]
    Forbidden { op: &'static str, message: String },

    #[error("HOPX: {what} not found (404): {message}")]
    NotFound { what: String, message: String },

    #[error("HOPX rate limit (429) during {op}, {}", retry_hint(*retry_after))]
    RateLimited {
        op: &'static str,
        retry_after: Option<u64>,
    },

    #[error("HOPX server error ({status}) during {op}: {message}{note}")]
    Server {
        op: &'static str,
        status: u16,
        message: String,
        /// Whether and why the call was (not) retried.
        note: &'static str,
    },

    /// A structured error from the in-sandbox agent (`FILE_NOT_FOUND`, `PATH_NOT_ALLOWED`, ...).
    #[error("the HOPX sandbox refused {op}: {message} ({code})")]
    Agent {
        op: &'static str,
        status: u16,
        code: String,
        message: String,
    },

    #[error("HOPX {op} failed ({status}): {message}")]
    Api {
        op: &'static str,
        status: u16,
        message: String,
    },

    #[error("HOPX {op} timed out after {} s{note}", after.as_secs_f64().ceil())]
    Timeout {
        op: &'static str,
        after: Duration,
        note: &'static str,
    },

    #[error("could not reach HOPX during {op}: {message}")]
    Network { op: &'static str, message: String },

    #[error("HOPX sent an unexpected reply to {op}: {message}")]
    BadResponse { op: &'static str, message: String },

    #[error(
        "the HOPX sandbox {sandbox_id} did not become ready within {} s (last: {last})",
        waited.as_secs()
    )]
    NotReady {
        sandbox_id: String,
        waited: Duration,
        last: String,
    },

    /// `connect` to a sandbox that cannot run anything any more (or not yet).
    #[error("the HOPX sandbox {sandbox_id} is {status}, not running; create a new sandbox")]
    SandboxUnavailable { sandbox_id: String, status: String },

    #[error("could not set up the HTTP client for HOPX: {0}")]
    Setup(String),

    /// A 3xx from either plane. Following it would send the key or a token (and a code run's
    /// body, on a 307) wherever the reply points.
    #[error(
        "HOPX answered {op} with a redirect ({status}) to {location}; wasmbox does not follow \
         redirects, so the API key and sandbox tokens only ever go to HOPX_BASE_URL: check \
         HOPX_BASE_URL (https, the API's own host)"
    )]
    Redirect {
        op: &'static str,
        status: u16,
        location: String,
    },

    /// A reply over its cap: reading stopped there.
    #[error(
        "HOPX sent more than {} MiB in reply to {op}; wasmbox stopped reading it",
        limit >> 20
    )]
    TooLarge { op: &'static str, limit: usize },

    #[error(
        "too many live HOPX cloud sandboxes ({max}, the limit; WASMBOX_MAX_CLOUD_SANDBOXES \
         raises it): delete one with delete_sandbox, or wait for a running cloud one-shot to end"
    )]
    TooManySandboxes { max: usize },

    #[error(
        "this client already holds the most live HOPX cloud sandboxes it may ({max}; \
         WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN raises it): delete one with delete_sandbox"
    )]
    TooManyForOwner { max: usize },

    #[error(
        "Invalid timeout_seconds {asked}: a cloud sandbox may live at most {max} s \
         (WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT sets the maximum); ask for {max} or less"
    )]
    BadTimeout { asked: u64, max: u64 },
}

fn retry_hint(after: Option<u64>) -> String {
    match after {
        Some(s) => format!("retry after {s} s"),
        None => "retry in a little while".into(),
    }
}

impl CloudError {
    /// True for errors that mean the cloud was never contacted (no key, offline).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CloudError::MissingApiKey { .. } | CloudError::Offline { .. }
        )
    }

    /// The HTTP status behind the error, if one was received.
    pub fn status(&self) -> Option<u16> {
        match self {
            CloudError::BadApiKey | CloudError::BadToken { .. } => Some(401),
            CloudError::LimitReached { .. } | CloudError::Forbidden { .. } => Some(403),
            CloudError::NotFound { .. } => Some(404),
            CloudError::RateLimited { .. } => Some(429),
            CloudError::Server { status, .. }
            | CloudError::Agent { status, .. }
            | CloudError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}
