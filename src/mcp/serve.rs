//! Transports. stdio is the default: stdout carries only the protocol, logs go to stderr.
//! `serve --http` is MCP's streamable HTTP transport behind bearer tokens, each token owning
//! its own sandboxes ([`super::streamable`]).

use crate::platform::process::shutdown_signal;
use rmcp::ServiceExt;

use super::WasmboxServer;
use crate::Wasmbox;

pub use super::streamable::{HttpOptions, http_tokens, serve_http, token_owner};

/// Serves MCP over stdin/stdout until the client closes the connection.
pub async fn serve_stdio(wasmbox: Wasmbox) -> anyhow::Result<()> {
    // The client is on this machine, reading each answer as the call's left-over work starts.
    crate::engine::threads::settle_after_reply(SETTLE);
    warm_up(&wasmbox);
    start_audit(&wasmbox, &[]);
    let keeper = wasmbox.clone();
    let service = WasmboxServer::new(wasmbox).serve(stdio()).await?;
    // The client closing stdin ends the server; so does SIGTERM/SIGINT. Either way sandboxes'
    // files and sessions stay for the next start (with a data directory).
    let ended = tokio::select! {
        r = service.waiting() => r.map(|_| ()),
        _ = shutdown_signal() => {
            tracing::info!("shutting down on a signal");
            Ok(())
        }
    };
    keeper.save_all(SAVE_AT_EXIT).await;
    keeper.end_runs_at_exit();
    crate::telemetry::audit::close();
    ended?;
    Ok(())
}

/// Starts the audit log (unless `WASMBOX_AUDIT=0`), quoting code with the secrets' values,
/// the HOPX key and the HTTP `tokens` replaced. A log that cannot be opened is said on stderr
/// and the server serves without it.
pub(super) fn start_audit(wasmbox: &Wasmbox, tokens: &[String]) {
    use crate::telemetry::audit;
    let config = wasmbox.config();
    let Some(max_bytes) = config.audit_bytes else {
        return;
    };
    let path = wasmbox.sandboxes().audit_path();
    let secrets = config.reach.secrets.clone();
    let mut hidden: Vec<String> = tokens.iter().filter(|t| !t.is_empty()).cloned().collect();
    if let Some(k) = &config.cloud.api_key
        && !k.expose().is_empty()
    {
        hidden.push(k.expose().to_string());
    }
    let redact: audit::Redact = Box::new(move |code: String| {
        let scrubbed = crate::reach::secrets::scrub(&secrets, code.into_bytes());
        let mut text = String::from_utf8_lossy(&scrubbed).into_owned();
        for h in &hidden {
            text = text.replace(h.as_str(), "***");
        }
        text
    });
    let settings = audit::Settings {
        path: path.clone(),
        max_bytes,
    };
    match audit::start(settings, redact) {
        Ok(()) => tracing::debug!("audit log: {}", path.display()),
        Err(e) => tracing::warn!(
            "audit log {}: {e}; tool calls are not logged (WASMBOX_AUDIT=0 turns it off)",
            path.display()
        ),
    }
}

/// How long a call's left-over work (a pool refill, a spent instance's teardown) waits after
/// its result over stdio: longer than the official Python SDK takes to read an answer.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(3);

/// How long a stopping server spends saving sessions (idle ones are mostly saved already).
pub const SAVE_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(5);

type Reader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;
type Writer = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// stdin and stdout for the protocol, read and written on the reactor when they are pipes (how
/// Python's SDK starts a server) or sockets (Node's `child_process`: Claude Desktop, Cursor,
/// VS Code, the Inspector). tokio's own stdin/stdout go through its blocking pool, a thread
/// hand-off each way: ~0.1-0.35 ms a call on this machine. Anything else (a terminal, a file)
/// keeps those blocking handles.
fn stdio() -> (Reader, Writer) {
    if let Some((r, w)) = crate::platform::stdio::sockets() {
        tracing::debug!("stdio: non-blocking sockets");
        return (Box::pin(r), Box::pin(w));
    }
    // FIFOs are reopened through /proc, so O_NONBLOCK stays off the inherited descriptions;
    // anything but a FIFO falls back to tokio's blocking handles.
    let (r, w) = rmcp::transport::stdio_pipes();
    (Box::pin(r), Box::pin(w))
}

/// Loads the runtimes in the background so the first call does not pay for it, while the
/// handshake is answered at once.
pub(super) fn warm_up(wasmbox: &Wasmbox) {
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
}
