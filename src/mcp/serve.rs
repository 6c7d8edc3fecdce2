//! Transports. stdio is the default: stdout carries only the protocol, logs go to stderr.
//! `serve --http` is MCP's streamable HTTP transport behind bearer tokens, each token owning
//! its own sandboxes.

use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};

use super::WasmboxServer;
use super::tools::Owner;
use crate::Wasmbox;

/// Serves MCP over stdin/stdout until the client closes the connection.
pub async fn serve_stdio(wasmbox: Wasmbox) -> anyhow::Result<()> {
    warm_up(&wasmbox);
    let service = WasmboxServer::new(wasmbox).serve(stdio()).await?;
    // The client closing stdin ends the server; so does SIGTERM/SIGINT. Either way sandboxes'
    // files stay for the next start (with a data directory).
    tokio::select! {
        r = service.waiting() => { r?; }
        _ = shutdown_signal() => tracing::info!("shutting down on a signal"),
    }
    Ok(())
}

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
fn warm_up(wasmbox: &Wasmbox) {
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

/// How `serve --http` listens and whom it lets in.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    pub addr: std::net::SocketAddr,
    /// Bind to a non-loopback address (the token is then all that guards the sandboxes).
    pub allow_remote: bool,
    /// Accepted bearer tokens; each one owns its own sandboxes.
    pub tokens: Vec<String>,
    /// Tool calls one token may have running at once.
    pub calls_per_token: usize,
}

/// The identity and limits of one token.
struct TokenEntry {
    digest: [u8; 32],
    owner: Owner,
}

/// A token's owner id, from its digest: a fingerprint, so that the token itself is never stored
/// or logged.
fn owner_id(digest: &[u8; 32]) -> String {
    format!("token-{}", hex::encode(&digest[..8]))
}

/// Serves MCP's streamable HTTP transport at `/mcp` until SIGINT/SIGTERM, every request
/// authenticated by a bearer token.
pub async fn serve_http(wasmbox: Wasmbox, opts: HttpOptions) -> anyhow::Result<()> {
    use anyhow::Context;
    if !opts.addr.ip().is_loopback() && !opts.allow_remote {
        anyhow::bail!(
            "refusing to listen on {} (not a loopback address): pass --allow-remote to expose the sandboxes to the network",
            opts.addr
        );
    }
    if opts.tokens.is_empty() || opts.tokens.iter().any(|t| t.len() < 16) {
        anyhow::bail!("every HTTP token must be at least 16 characters long");
    }
    warm_up(&wasmbox);
    let tokens: Arc<Vec<TokenEntry>> = Arc::new(
        opts.tokens
            .iter()
            .map(|t| {
                let digest: [u8; 32] = Sha256::digest(t.as_bytes()).into();
                TokenEntry {
                    digest,
                    owner: Owner {
                        id: owner_id(&digest).into(),
                        calls: Arc::new(tokio::sync::Semaphore::new(opts.calls_per_token)),
                        max_calls: opts.calls_per_token,
                    },
                }
            })
            .collect(),
    );
    let ct = tokio_util::sync::CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(ct.child_token())
        .with_max_request_body_bytes(MAX_HTTP_BODY);
    if opts.allow_remote {
        // Host-header checks guard loopback servers against DNS rebinding; a server meant for
        // the network is reached under names we cannot know, and the token guards it.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        {
            let server = WasmboxServer::new(wasmbox);
            move || Ok(server.clone())
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(tokens, authenticate));
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .with_context(|| format!("listening on {}", opts.addr))?;
    let local = listener.local_addr()?;
    tracing::info!("serving MCP over HTTP at http://{local}/mcp");
    // Tests and scripts read the address from here (the port may have been 0).
    eprintln!("wasmbox: listening on http://{local}/mcp");
    let stopping = Arc::new(tokio::sync::Notify::new());
    let server = axum::serve(listener, app).with_graceful_shutdown({
        let stopping = stopping.clone();
        async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            ct.cancel();
            stopping.notify_one();
        }
    });
    // Open streams get a moment to end; then the server stops regardless.
    tokio::select! {
        r = server => r?,
        _ = async {
            stopping.notified().await;
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        } => {}
    }
    Ok(())
}

/// Largest HTTP request body: a 4 MiB code input or a file upload, base64-encoded, with room.
const MAX_HTTP_BODY: usize = 16 << 20;

/// Lets a request through only with a known bearer token, tagging it with the token's owner.
async fn authenticate(
    axum::extract::State(tokens): axum::extract::State<Arc<Vec<TokenEntry>>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let presented = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(|t| <[u8; 32]>::from(Sha256::digest(t.trim().as_bytes())));
    // Digests are compared, so timing says nothing about a token's bytes.
    let owner = presented.and_then(|d| tokens.iter().find(|t| t.digest == d));
    match owner {
        Some(t) => {
            req.extensions_mut().insert(t.owner.clone());
            next.run(req).await
        }
        None => {
            let why = if presented.is_some() {
                "invalid bearer token"
            } else {
                "missing bearer token: send 'Authorization: Bearer <token>' (WASMBOX_TOKEN, or the token wasmbox printed on first start)"
            };
            (
                http::StatusCode::UNAUTHORIZED,
                [(http::header::WWW_AUTHENTICATE, "Bearer realm=\"wasmbox\"")],
                axum::Json(serde_json::json!({"error": why})),
            )
                .into_response()
        }
    }
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

/// The HTTP bearer tokens: `WASMBOX_TOKEN` (comma-separated for several clients, each with its
/// own sandboxes), else one generated on first start and kept in `<dir>/http-token` (mode 0600).
/// Returns the tokens and, when one was just generated, where it was saved.
pub fn http_tokens(
    from_env: Option<String>,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<String>, Option<std::path::PathBuf>)> {
    use anyhow::Context;
    if let Some(v) = from_env.filter(|v| !v.trim().is_empty()) {
        let tokens: Vec<String> = v
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect();
        return Ok((tokens, None));
    }
    let path = dir.join("http-token");
    if let Ok(t) = std::fs::read_to_string(&path)
        && !t.trim().is_empty()
    {
        return Ok((vec![t.trim().to_string()], None));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let token = format!(
        "wbt_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    use std::io::Write;
    o.open(&path)
        .and_then(|mut f| f.write_all(token.as_bytes()))
        .with_context(|| format!("saving the token to {}", path.display()))?;
    Ok((vec![token], Some(path)))
}
