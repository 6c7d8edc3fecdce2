//! Transports. stdio is the default: stdout carries only the protocol, logs go to stderr.
//! `serve --http` is MCP's streamable HTTP transport behind bearer tokens, each token owning
//! its own sandboxes ([`super::streamable`]).

use rmcp::ServiceExt;

use super::WasmboxServer;
use crate::Wasmbox;

pub use super::streamable::{HttpOptions, http_tokens, serve_http, token_owner};

/// Serves MCP over stdin/stdout until the client closes the connection.
pub async fn serve_stdio(wasmbox: Wasmbox) -> anyhow::Result<()> {
    // The client is on this machine, reading each answer as the call's left-over work starts.
    crate::engine::threads::settle_after_reply(SETTLE);
    warm_up(&wasmbox);
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
    ended?;
    Ok(())
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
    if let Some((r, w)) = stdio_sockets() {
        tracing::debug!("stdio: non-blocking sockets");
        return (Box::pin(r), Box::pin(w));
    }
    // FIFOs are reopened through /proc, so O_NONBLOCK stays off the inherited descriptions;
    // anything but a FIFO falls back to tokio's blocking handles.
    let (r, w) = rmcp::transport::stdio_pipes();
    (Box::pin(r), Box::pin(w))
}

/// stdin and stdout as non-blocking sockets, when both are. A socket cannot be reopened with
/// its own flags, so O_NONBLOCK lands on the inherited description: harmless, since nothing else
/// here reads stdin or writes stdout, and children get neither; but not when stderr shares
/// stdout's socket (`2>&1`), whose log writes must not fail with EAGAIN.
fn stdio_sockets() -> Option<(tokio::net::UnixStream, tokio::net::UnixStream)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let socket = |fd: std::os::fd::BorrowedFd<'_>| {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        let meta = file.metadata().ok()?;
        meta.file_type()
            .is_socket()
            .then(|| (std::os::fd::OwnedFd::from(file), (meta.dev(), meta.ino())))
    };
    let (input, _) = socket(std::io::stdin().as_fd())?;
    let (output, out_id) = socket(std::io::stdout().as_fd())?;
    if socket(std::io::stderr().as_fd()).is_some_and(|(_, err_id)| err_id == out_id) {
        return None;
    }
    let stream = |fd: std::os::fd::OwnedFd| {
        let s = std::os::unix::net::UnixStream::from(fd);
        s.set_nonblocking(true).ok()?;
        tokio::net::UnixStream::from_std(s).ok()
    };
    Some((stream(input)?, stream(output)?))
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

/// SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
