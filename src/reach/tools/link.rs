//! One connection to a downstream MCP server, as rmcp's client: a child process over its stdio,
//! or streamable HTTP. Every message the server sends is bounded before it is held: over stdio
//! a line past the cap ends the connection (its calls fail as too large, the next call starts
//! the server again); over HTTP rmcp's own caps on events and bodies refuse it.

use std::collections::HashMap;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncRead, ReadBuf};

use super::config::{ServerSpec, Transport};

/// A live connection: the client, and the child it talks to (killed when this is dropped).
pub struct Link {
    pub client: RunningService<RoleClient, ()>,
    _child: Option<tokio::process::Child>,
    /// Set when the server sent a message over the cap (and the connection was ended for it).
    pub too_big: Arc<AtomicBool>,
}

/// Why a server could not be connected to. Cloneable: one failure answers every call that
/// waited for that connection, and those made while it is left alone.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot start {command:?}: {why}")]
    Start {
        command: String,
        why: Arc<std::io::Error>,
    },
    #[error("its stdio could not be opened")]
    NoStdio,
    #[error("header {0:?}: {1}")]
    HeaderName(String, Arc<http::header::InvalidHeaderName>),
    #[error("header {0:?}'s value: {1}")]
    HeaderValue(String, Arc<http::header::InvalidHeaderValue>),
    #[error("the MCP handshake failed: {0}")]
    Handshake(Arc<rmcp::service::ClientInitializeError>),
    #[error("it did not finish starting within {0} s")]
    Slow(u64),
    #[error("connecting failed: {0}")]
    Task(Arc<tokio::task::JoinError>),
}

/// Connects to `spec`; no message from it over `max_message` bytes is held.
pub async fn connect(spec: &ServerSpec, max_message: usize) -> Result<Link, ConnectError> {
    let too_big = Arc::new(AtomicBool::new(false));
    match &spec.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args)
                .envs(env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                // Its log is the person's to see, beside ours; stdout is the protocol.
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            // The server ends with wasmbox however wasmbox ends. The thread that spawns it is
            // the reach runtime's, which lives as long as the process (Linux's parent-death
            // signal is tied to the spawning thread).
            let mut child = crate::platform::process::spawn_tied(&mut cmd).map_err(|e| {
                ConnectError::Start {
                    command: command.clone(),
                    why: Arc::new(e),
                }
            })?;
            let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                return Err(ConnectError::NoStdio);
            };
            let reader = LineCap {
                inner: stdout,
                max: max_message,
                run: 0,
                over: too_big.clone(),
            };
            let transport = AsyncRwTransport::<RoleClient, _, _>::new(reader, stdin);
            handshake(transport, Some(child), too_big).await
        }
        Transport::Http { url, headers } => {
            // rmcp's client is built on reqwest 0.13 without a crypto library of its own.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .max_sse_event_size(max_message)
                .max_json_response_size(max_message);
            let mut custom = HashMap::new();
            for (k, v) in headers {
                if k.eq_ignore_ascii_case("authorization")
                    && let Some(token) = v.strip_prefix("Bearer ")
                {
                    config = config.auth_header(token);
                    continue;
                }
                let name = k
                    .parse::<http::HeaderName>()
                    .map_err(|e| ConnectError::HeaderName(k.clone(), Arc::new(e)))?;
                let value = v
                    .parse::<http::HeaderValue>()
                    .map_err(|e| ConnectError::HeaderValue(k.clone(), Arc::new(e)))?;
                custom.insert(name, value);
            }
            let transport =
                StreamableHttpClientTransport::from_config(config.custom_headers(custom));
            handshake(transport, None, too_big).await
        }
    }
}

async fn handshake<T, E, A>(
    transport: T,
    child: Option<tokio::process::Child>,
    too_big: Arc<AtomicBool>,
) -> Result<Link, ConnectError>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let client = ().serve(transport).await.map_err(|e| ConnectError::Handshake(Arc::new(e)))?;
    Ok(Link {
        client,
        _child: child,
        too_big,
    })
}

impl Link {
    pub fn is_over(&self) -> bool {
        self.too_big.load(Ordering::Relaxed)
    }
}

/// A reader that fails once a line runs past `max` bytes: the connection ends rather than
/// growing a buffer to whatever the server sends (rmcp would drop the line and leave the call
/// waiting for an answer that never comes).
struct LineCap<R> {
    inner: R,
    max: usize,
    /// Bytes since the last newline.
    run: usize,
    over: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for LineCap<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            for b in &buf.filled()[before..] {
                self.run = if *b == b'\n' { 0 } else { self.run + 1 };
                if self.run > self.max {
                    self.over.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(std::io::Error::other(format!(
                        "a message over {} bytes",
                        self.max
                    ))));
                }
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_line_past_the_cap_ends_the_stream() {
        let over = Arc::new(AtomicBool::new(false));
        let data = format!("{}\n{}\n", "a".repeat(10), "b".repeat(11));
        let mut r = LineCap {
            inner: data.as_bytes(),
            max: 10,
            run: 0,
            over: over.clone(),
        };
        let mut out = Vec::new();
        assert!(r.read_to_end(&mut out).await.is_err());
        assert!(over.load(Ordering::Relaxed));
        let ten = "a".repeat(10);
        let mut ok = LineCap {
            inner: ten.as_bytes(),
            max: 10,
            run: 0,
            over: Arc::new(AtomicBool::new(false)),
        };
        assert!(ok.read_to_end(&mut out).await.is_ok());
    }
}
