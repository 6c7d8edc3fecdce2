//! The MCP front: the HOPX-compatible tools and the transports that serve them.

pub mod consent;
mod hangup;
pub mod metrics;
pub mod progress;
pub mod serve;
mod streamable;
pub mod tools;

pub use tools::WasmboxServer;
