//! Why code mode could not ask the person, or could not have a server's tools.

use rmcp::service::{ElicitationError, ServiceError};

use super::link::ConnectError;

/// Why the person could not be asked for consent.
#[derive(Debug, thiserror::Error)]
pub enum CannotAsk {
    #[error("the MCP client does not support elicitation")]
    NoElicitation,
    #[error("asking the MCP client failed: {0}")]
    Failed(ElicitationError),
    #[error("the tool call that started this run has ended, so there is no one to ask")]
    CallEnded,
    #[error("the client did not come back with an answer")]
    NoAnswer,
    #[error("the retry brought no answer for consent")]
    NoneInRetry,
    #[error("the answer for consent is not an elicitation result: {0}")]
    NotElicitation(serde_json::Error),
}

/// Why a server's tools could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("MCP server {server} could not be reached: {why}")]
    Unreachable { server: String, why: ConnectError },
    #[error("MCP server {server} did not list its tools: {why}")]
    NotListed { server: String, why: ServiceError },
    #[error(
        "MCP server {server} has not answered within {secs} s (still starting?); its tools appear once it has"
    )]
    Slow { server: String, secs: u64 },
}
