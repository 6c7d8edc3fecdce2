//! wasmbox: a local WebAssembly code-execution sandbox for AI assistants.
//!
//! The library is the product: [`Wasmbox`] (in `service`) runs code; the MCP server (`mcp`) and
//! the CLI are thin fronts over it, so tests, benches and both fronts drive the same code.

pub mod bounded;
pub mod cloud;
pub mod config;
pub mod engine;
mod error;
pub mod fit;
pub mod lang;
pub mod mcp;
pub mod packages;
pub mod platform;
pub mod reach;
pub mod sandbox;
mod service;
pub mod setup;
pub mod telemetry;
#[cfg(test)]
mod testing;

pub use config::Config;
pub use engine::limits::{LimitHit, Limits};
pub use error::{Error, Result};
pub use lang::{ExecRequest, ExecResult, Language};
pub use service::{
    CloudSandbox, ExecOptions, Load, OneShot, PAUSE_WAIT, RuntimeState, RuntimeStatus,
    SavedSession, Wasmbox, cancelled, check_env,
};
