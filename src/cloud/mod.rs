//! The HOPX cloud fallback: what the local WebAssembly sandbox cannot do (a shell, the internet,
//! cloud-only templates) runs in a HOPX sandbox instead.
//!
//! [`route`] decides where a request runs and fails fast, before any network I/O, when the cloud
//! is needed but unavailable; [`Cloud`] is the REST client for HOPX's control plane and in-sandbox
//! agent, with [`Cloud::oneshot`] for create → run → always delete.

mod client;
mod config;
mod error;
mod route;

pub(crate) use client::read_capped;
pub use client::{
    Cloud, CloudExec, CloudSlot, CommandRequest, CreateSandbox, ExecuteRequest, FileEntry, Sandbox,
    SandboxInfo,
};
pub use config::{AGENT_REPLY_CAP, CONTROL_REPLY_CAP, CloudConfig, DEFAULT_BASE_URL, Secret};
pub use error::CloudError;
pub use route::{
    CloudReason, CommandClass, LOCAL_TEMPLATES, LocalCommand, Location, Program, RouteRequest,
    classify_command, decide, route,
};
