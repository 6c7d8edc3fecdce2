//! The HOPX cloud fallback: what the local WebAssembly sandbox cannot do (a shell, the internet,
//! cloud-only templates) runs in a HOPX sandbox instead.
//!
//! [`route`] decides where a request runs and fails fast, before any network I/O, when the cloud
//! is needed but unavailable; [`Cloud`] is the REST client for HOPX's control plane and in-sandbox
//! agent ([`Agent`]), with [`Cloud::oneshot`] for create → run → always delete. The client is
//! four files, as `hopx-api.md` is read: `wire` (request and reply shapes), `transport` (how any
//! call is sent, retried and its errors read), `control` (sandboxes and their limits) and `agent`
//! (what runs inside one).

mod agent;
mod config;
mod control;
mod error;
mod route;
mod transport;
mod wire;

pub use agent::Agent;
pub use config::{AGENT_REPLY_CAP, CONTROL_REPLY_CAP, CloudConfig, DEFAULT_BASE_URL, Secret};
pub use control::{Cloud, CloudSlot};
pub use error::CloudError;
pub use route::{
    CloudReason, CommandClass, LOCAL_TEMPLATES, LocalCommand, Location, Program, RouteRequest,
    classify_command, decide, route,
};
pub(crate) use transport::read_capped;
pub use wire::{CloudExec, CommandRequest, CreateSandbox, ExecuteRequest, FileEntry, SandboxInfo};
