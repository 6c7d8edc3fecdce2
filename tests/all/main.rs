//! The integration tests, one binary (as wasmtime's `tests/all`): each module is an area, and
//! they share `common` (the real binary over stdio, driven by rmcp's client). One binary links
//! wasmtime, rmcp and reqwest once instead of once per file.

mod common;

mod audit;
mod cancel;
mod cli;
mod cloud;
mod code_mode;
mod commands;
mod disk;
mod durable;
mod faults;
mod go;
mod guest_data;
mod host_bounds;
mod http;
mod images;
mod javascript;
mod job_limits;
mod load;
mod mcp_layer;
mod mcp_protocol;
mod metrics;
mod modules;
mod mounts;
mod packages;
mod progress;
mod python_oneshot;
mod python_pool;
mod reach;
mod results;
mod sandboxes;
mod security_escape;
mod security_resources;
mod setup;
mod traces;
mod waits;
