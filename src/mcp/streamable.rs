//! `serve --http`: MCP's streamable HTTP transport (rmcp's service in an axum router) behind
//! bearer tokens, each token owning its own sandboxes and sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::transport::common::http_header::{HEADER_LAST_EVENT_ID, HEADER_SESSION_ID};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};

use super::WasmboxServer;
use super::hangup::{self, Call, Hangups};
use super::serve::warm_up;
use super::tools::Owner;
use crate::Wasmbox;
use crate::platform::process::shutdown_signal;

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
    /// Tool calls one token may have waiting for a running place.
    pub queue_per_token: usize,
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

/// The owner id calls made with `token` carry.
pub fn token_owner(token: &str) -> String {
    owner_id(&Sha256::digest(token.as_bytes()).into())
}

/// Serves MCP's streamable HTTP transport at `/mcp`, and the metrics at `/metrics`, until
/// SIGINT/SIGTERM, every request authenticated by a bearer token.
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
    super::serve::start_audit(&wasmbox, &opts.tokens);
    let keeper = wasmbox.clone();
    let tokens: Vec<TokenEntry> = opts
        .tokens
        .iter()
        .map(|t| {
            let digest: [u8; 32] = Sha256::digest(t.as_bytes()).into();
            TokenEntry {
                digest,
                owner: Owner::new(
                    &owner_id(&digest),
                    opts.calls_per_token,
                    opts.queue_per_token,
                ),
            }
        })
        .collect();
    let owners: std::collections::HashSet<_> = tokens.iter().map(|t| t.digest).collect();
    wasmbox.set_owners(owners.len());
    let sessions = Arc::new(LocalSessionManager::default());
    let per_token = wasmbox.config().sessions_per_token;
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
        sessions.clone(),
        config,
    );
    let gate = Arc::new(Gate {
        tokens,
        sessions: SessionBook {
            manager: sessions,
            per_token,
            owner_of: Mutex::default(),
        },
        hangups: Arc::new(Hangups::new(service.clone(), hangup::RESUME_GRACE)),
    });
    let scraped = keeper.clone();
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .route(
            "/metrics",
            axum::routing::get(move || {
                let wb = scraped.clone();
                async move { scrape(&wb).await }
            }),
        )
        .layer(axum::middleware::from_fn_with_state(gate, authenticate));
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
    keeper.save_all(super::serve::SAVE_AT_EXIT).await;
    keeper.end_runs_at_exit();
    crate::telemetry::audit::close();
    Ok(())
}

/// `GET /metrics`: the figures as OpenMetrics text, behind the same token check as `/mcp`.
async fn scrape(wasmbox: &Wasmbox) -> axum::response::Response {
    use axum::response::IntoResponse;
    let text = super::metrics::gather(wasmbox).await.encode();
    (
        [(http::header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)],
        text,
    )
        .into_response()
}

/// Largest HTTP request body: a 4 MiB code input or a file upload, base64-encoded, with room.
const MAX_HTTP_BODY: usize = 16 << 20;

/// What the auth layer checks a request against.
struct Gate {
    tokens: Vec<TokenEntry>,
    sessions: SessionBook,
    hangups: Arc<Hangups>,
}

/// Lets a request through only with a known bearer token, tagging it with the token's owner,
/// and only into MCP sessions that token opened (see [`SessionBook`]).
async fn authenticate(
    axum::extract::State(gate): axum::extract::State<Arc<Gate>>,
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
    let owner = presented.and_then(|d| gate.tokens.iter().find(|t| t.digest == d));
    match owner {
        Some(t) => {
            req.extensions_mut().insert(t.owner.clone());
            gate.admit(&t.owner, req, next).await
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

/// Which token opened each MCP session. rmcp serves any request carrying a live
/// `Mcp-Session-Id`, whoever sends it; the book binds a session to the token that opened it (a
/// session id seen by another token is "not found" to it) and caps the sessions a token holds,
/// since each keeps a task and buffers until it is closed or idle past rmcp's keep-alive.
struct SessionBook {
    manager: Arc<LocalSessionManager>,
    per_token: usize,
    /// Session id → the owner that opened it.
    owner_of: Mutex<HashMap<String, Arc<str>>>,
}

impl Gate {
    /// Runs `req` for `owner` if any session it names is the owner's, and books the session an
    /// `initialize` opens (closing and refusing it past the owner's cap).
    async fn admit(
        &self,
        owner: &Owner,
        req: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let book = &self.sessions;
        if let Some(id) = req.headers().get(HEADER_SESSION_ID) {
            // A header that is not text names no booked session: refused, not passed on (rmcp
            // would read it as no session at all).
            let id = id.to_str().unwrap_or_default().to_owned();
            let opener = book.owner_of.lock().unwrap().get(&id).cloned();
            match opener {
                Some(o) if o == owner.id => {}
                Some(_) => {
                    tracing::warn!(owner = %owner.id, "refused a request in another token's MCP session");
                    return session_not_found();
                }
                None => return session_not_found(),
            }
            let closing = req.method() == http::Method::DELETE;
            let mut resp = self.in_session(owner, &id, req, next).await;
            if closing || resp.status() == http::StatusCode::NOT_FOUND {
                book.forget_if_gone(&id).await;
            }
            // rmcp answers a closed session 202; the Python SDK takes only 200 or 204 (else it
            // logs "Session termination failed: 202"), the TypeScript SDK any 2xx.
            if closing && resp.status() == http::StatusCode::ACCEPTED {
                *resp.status_mut() = http::StatusCode::NO_CONTENT;
            }
            return resp;
        }
        // Booked once rmcp has opened it: telling an `initialize` apart beforehand would mean
        // reading the body, and booking under the lock cannot overshoot the cap.
        let resp = next.run(req).await;
        let Some(id) = resp
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        else {
            return resp;
        };
        if book.book(&owner.id, id).await {
            return resp;
        }
        let _ = book.manager.close_session(&id.into()).await;
        tracing::warn!(owner = %owner.id, cap = book.per_token, "refused an MCP session past the cap");
        book.too_many()
    }

    /// Runs a request in `session`, watching the answer stream of a JSON-RPC request (or of a
    /// resumed one) for a client that hangs up on it (see [`hangup`]).
    async fn in_session(
        &self,
        owner: &Owner,
        session: &str,
        req: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        use http_body_util::BodyExt;
        match *req.method() {
            http::Method::POST => {
                let (parts, body) = req.into_parts();
                // The bound rmcp applies too, so nothing it would refuse is held here.
                let body = match http_body_util::Limited::new(body, MAX_HTTP_BODY)
                    .collect()
                    .await
                {
                    Ok(b) => b.to_bytes(),
                    Err(e) => return body_refused(&*e),
                };
                let Some(id) = hangup::request_id(&body) else {
                    return next
                        .run(axum::extract::Request::from_parts(parts, body.into()))
                        .await;
                };
                let call = Arc::new(Call {
                    session: session.into(),
                    id,
                    owner: owner.clone(),
                    headers: parts.headers.clone(),
                });
                let resp = next
                    .run(axum::extract::Request::from_parts(parts, body.into()))
                    .await;
                self.hangups.watch(call, None, resp)
            }
            http::Method::GET => {
                let resumed = req
                    .headers()
                    .get(HEADER_LAST_EVENT_ID)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|last| self.hangups.resume(session, last));
                let resp = next.run(req).await;
                match resumed {
                    Some((call, stream)) => self.hangups.watch(call, Some(stream), resp),
                    None => resp,
                }
            }
            _ => next.run(req).await,
        }
    }
}

/// A request body past [`MAX_HTTP_BODY`] (413, as rmcp answers it) or that could not be read.
fn body_refused(e: &(dyn std::error::Error + 'static)) -> axum::response::Response {
    use axum::response::IntoResponse;
    if e.is::<http_body_util::LengthLimitError>() {
        let why = format!("Payload Too Large: request body exceeds {MAX_HTTP_BODY} bytes");
        return (http::StatusCode::PAYLOAD_TOO_LARGE, why).into_response();
    }
    (
        http::StatusCode::BAD_REQUEST,
        format!("Failed to read request body: {e}"),
    )
        .into_response()
}

impl SessionBook {
    /// Books session `id` for `owner` unless that passes its cap, counting only sessions rmcp
    /// still has (it ends idle ones on its own, unseen here).
    async fn book(&self, owner: &Arc<str>, id: &str) -> bool {
        if self.try_book(owner, id) {
            return true;
        }
        let held: Vec<String> = {
            let book = self.owner_of.lock().unwrap();
            book.iter()
                .filter(|(_, o)| *o == owner)
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in held {
            self.forget_if_gone(&id).await;
        }
        self.try_book(owner, id)
    }

    fn try_book(&self, owner: &Arc<str>, id: &str) -> bool {
        let mut book = self.owner_of.lock().unwrap();
        if book.values().filter(|o| *o == owner).count() >= self.per_token {
            return false;
        }
        book.insert(id.to_owned(), owner.clone());
        true
    }

    /// Drops a booked session that rmcp no longer has (closed, or ended on its own).
    async fn forget_if_gone(&self, id: &str) {
        if let Ok(false) = self.manager.has_session(&id.into()).await {
            self.owner_of.lock().unwrap().remove(id);
        }
    }

    fn too_many(&self) -> axum::response::Response {
        use axum::response::IntoResponse;
        let idle = self
            .manager
            .session_config
            .keep_alive
            .map_or(String::new(), |d| format!(" ({} s)", d.as_secs()));
        let why = format!(
            "this token already holds {} open MCP sessions (its limit; WASMBOX_SESSIONS_PER_TOKEN raises it): close one (HTTP DELETE with its Mcp-Session-Id) or wait for an idle one to expire{idle}",
            self.per_token
        );
        (http::StatusCode::TOO_MANY_REQUESTS, why).into_response()
    }
}

/// rmcp's answer for an unknown session, so another token's session looks like none at all.
fn session_not_found() -> axum::response::Response {
    use axum::response::IntoResponse;
    (http::StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
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
    crate::platform::fs::private_file(&mut o);
    use std::io::Write;
    o.open(&path)
        .and_then(|mut f| f.write_all(token.as_bytes()))
        .with_context(|| format!("saving the token to {}", path.display()))?;
    Ok((vec![token], Some(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sessions rmcp ends on its own (idle past its keep-alive) are never seen over HTTP: only
    /// the cap's check against rmcp's own sessions frees their places.
    #[tokio::test]
    async fn the_cap_counts_only_sessions_rmcp_still_has() {
        let sessions = SessionBook {
            manager: Arc::new(LocalSessionManager::default()),
            per_token: 1,
            owner_of: Mutex::default(),
        };
        let owner: Arc<str> = "token-a".into();
        let (live, _transport) = sessions.manager.create_session().await.unwrap();
        assert!(sessions.book(&owner, &live).await);
        assert!(!sessions.book(&owner, "another").await, "at the cap");
        assert!(
            sessions.book(&"token-b".into(), "b's").await,
            "caps are per token"
        );

        sessions.manager.close_session(&live).await.unwrap();
        assert!(sessions.book(&owner, "another").await, "a place freed");
        assert!(!sessions.owner_of.lock().unwrap().contains_key(&*live));
    }
}
