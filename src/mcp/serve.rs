//! Transports. stdio is the default: stdout carries only the protocol, logs go to stderr.

use rmcp::ServiceExt;

use super::WasmboxServer;
use crate::Wasmbox;

/// Serves MCP over stdin/stdout until the client closes the connection.
pub async fn serve_stdio(wasmbox: Wasmbox) -> anyhow::Result<()> {
    // Load the runtimes in the background so the first call does not pay for it, while the
    // handshake is answered at once.
    let warm = wasmbox.clone();
    tokio::spawn(async move {
        for (lang, outcome) in warm.prepare().await {
            match outcome {
                Ok((origin, took)) => tracing::info!(
                    "{} runtime ready ({origin:?}, {:.0} ms)",
                    lang.as_str(),
                    took.as_secs_f64() * 1e3
                ),
                Err(e) => tracing::warn!("{} runtime not loaded: {e}", lang.as_str()),
            }
        }
    });
    let service = WasmboxServer::new(wasmbox)
        .serve(rmcp::transport::stdio())
        .await?;
    service.waiting().await?;
    Ok(())
}
