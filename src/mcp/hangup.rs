//! Over streamable HTTP a request's answer comes on its POST's own SSE stream. A client that
//! hangs up on that stream without sending `notifications/cancelled` (a killed process, an
//! aborted fetch) would otherwise leave the call's guest running to its deadline, holding a CPU
//! slot and the token's call allowance. MCP says a disconnect is not a cancellation, since the
//! client may resume the stream (a GET with `Last-Event-ID`, after the SSE `retry` rmcp primes
//! every stream with), so a call whose stream is cut short is cancelled only when no resume
//! comes within [`RESUME_GRACE`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use rmcp::transport::common::http_header::{
    HEADER_MCP_METHOD, HEADER_MCP_PROTOCOL_VERSION, HEADER_SESSION_ID,
};
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use super::WasmboxServer;
use super::tools::Owner;

pub(super) type Service = StreamableHttpService<WasmboxServer, LocalSessionManager>;

/// How long a cut-short stream waits for its client to resume it: past the 3 s `retry` rmcp
/// sends, which SDK clients wait before reconnecting.
pub(super) const RESUME_GRACE: Duration = Duration::from_secs(5);

/// Answer streams of requests, watched for clients that hang up on them.
pub(super) struct Hangups {
    /// rmcp's transport, which the cancellation is sent into as if the client had sent it.
    service: Service,
    grace: Duration,
    /// Cut-short streams, by session and rmcp's stream number (the `N` of its event ids
    /// `i/N`): the call, and a count of cuts and resumes that a pending cancellation checks is
    /// still its own (a resume since voids it).
    cut: Mutex<HashMap<StreamKey, (Arc<Call>, u64)>>,
}

/// A session id and rmcp's number for one of its streams.
type StreamKey = (Arc<str>, u64);

/// A JSON-RPC request whose answer streams to an HTTP client: what its cancellation needs.
pub(super) struct Call {
    pub session: Arc<str>,
    pub id: serde_json::Value,
    /// The token's owner, so the cancellation counts as the client's own.
    pub owner: Owner,
    /// The request's headers, whose Host, Origin and protocol version rmcp checks again.
    pub headers: http::HeaderMap,
}

/// The `id` of a JSON-RPC request (not a notification, a response or a batch).
pub(super) fn request_id(body: &[u8]) -> Option<serde_json::Value> {
    #[derive(serde::Deserialize)]
    struct Probe {
        id: Option<serde_json::Value>,
        method: Option<serde::de::IgnoredAny>,
    }
    let probe: Probe = serde_json::from_slice(body).ok()?;
    probe.method?;
    probe.id.filter(|id| !id.is_null())
}

impl Hangups {
    pub(super) fn new(service: Service, grace: Duration) -> Self {
        Self {
            service,
            grace,
            cut: Mutex::default(),
        }
    }

    /// `resp`, answering `call`, with its body watched: dropped before its end, the call is
    /// cancelled unless resumed in time. `stream` is rmcp's stream number when known (a resume).
    pub(super) fn watch(
        self: &Arc<Self>,
        call: Arc<Call>,
        stream: Option<u64>,
        resp: axum::response::Response,
    ) -> axum::response::Response {
        if !resp.status().is_success() {
            // A request refused before it ran has nothing to cancel; a failed resume leaves
            // the stream as cut as it was.
            if stream.is_some() {
                self.cut_short(call, stream);
            }
            return resp;
        }
        let guard = Guard {
            hangups: self.clone(),
            call,
            stream,
            ended: false,
        };
        resp.map(|inner| axum::body::Body::new(Watched { inner, guard }))
    }

    /// A client resuming stream `last_event_id` of `session`: the call it carries, if that
    /// stream was cut short, now no longer to be cancelled.
    pub(super) fn resume(&self, session: &str, last_event_id: &str) -> Option<(Arc<Call>, u64)> {
        let stream = last_event_id.split_once('/')?.1.trim().parse().ok()?;
        let mut cut = self.cut.lock().unwrap();
        let (call, count) = cut.get_mut(&(Arc::from(session), stream))?;
        *count += 1;
        Some((call.clone(), stream))
    }

    fn cut_short(self: &Arc<Self>, call: Arc<Call>, stream: Option<u64>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mine = stream.map(|n| {
            let mut cut = self.cut.lock().unwrap();
            let (_, count) = cut
                .entry((call.session.clone(), n))
                .or_insert_with(|| (call.clone(), 0));
            *count += 1;
            (n, *count)
        });
        let this = self.clone();
        rt.spawn(async move {
            tokio::time::sleep(this.grace).await;
            if let Some((n, mine)) = mine {
                let mut cut = this.cut.lock().unwrap();
                let key = (call.session.clone(), n);
                if cut.get(&key).is_none_or(|(_, count)| *count != mine) {
                    return;
                }
                cut.remove(&key);
            }
            this.cancel(&call).await;
        });
    }

    fn ended(&self, call: &Call, stream: Option<u64>) {
        if let Some(n) = stream {
            self.cut.lock().unwrap().remove(&(call.session.clone(), n));
        }
    }

    /// Sends `notifications/cancelled` for `call` into its session, as its client would have.
    async fn cancel(&self, call: &Call) {
        use http::header::{ACCEPT, CONTENT_TYPE, HOST, ORIGIN};
        let note = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": call.id, "reason": "client disconnected"},
        });
        let mut req = http::Request::post("/")
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .header(HEADER_MCP_METHOD, "notifications/cancelled")
            .body(axum::body::Body::from(note.to_string()))
            .expect("a valid request");
        for name in [HOST, ORIGIN, HEADER_MCP_PROTOCOL_VERSION.parse().unwrap()] {
            if let Some(v) = call.headers.get(&name) {
                req.headers_mut().insert(name, v.clone());
            }
        }
        if let Ok(v) = http::HeaderValue::from_str(&call.session) {
            req.headers_mut().insert(HEADER_SESSION_ID, v);
        }
        req.extensions_mut().insert(call.owner.clone());
        let status = self.service.handle(req).await.status();
        let (owner, id) = (&call.owner.id, &call.id);
        if status == http::StatusCode::ACCEPTED {
            tracing::info!(%owner, %id, "the client hung up on a call's stream: cancelled it");
        } else {
            // The session is gone (closed, expired), and its calls with it.
            tracing::debug!(%owner, %id, %status, "a hung-up call's session refused its cancellation");
        }
    }
}

/// A response body whose drop before its end cuts its stream short.
struct Watched {
    inner: axum::body::Body,
    guard: Guard,
}

struct Guard {
    hangups: Arc<Hangups>,
    call: Arc<Call>,
    stream: Option<u64>,
    ended: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.ended {
            self.hangups.ended(&self.call, self.stream);
        } else {
            self.hangups.cut_short(self.call.clone(), self.stream);
        }
    }
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if this.guard.stream.is_none()
                    && let Some(data) = frame.data_ref()
                {
                    this.guard.stream = stream_number(data);
                }
                // A body that knows it is complete may not be polled again.
                this.guard.ended = this.inner.is_end_stream();
            }
            Poll::Ready(None) => this.guard.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// rmcp's stream number from an SSE event's `id: i/N` line (its priming event comes first).
fn stream_number(event: &[u8]) -> Option<u64> {
    event.split(|b| *b == b'\n').find_map(|line| {
        let id = std::str::from_utf8(line.strip_prefix(b"id:")?).ok()?;
        id.trim().split_once('/')?.1.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_are_watched() {
        let id = |s: &str| request_id(s.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#),
            Some(7.into())
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#),
            Some("a".into())
        );
        for not_a_request in [
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            "{not json",
        ] {
            assert_eq!(id(not_a_request), None, "{not_a_request}");
        }
    }

    #[test]
    fn the_stream_number_is_read_from_event_ids() {
        assert_eq!(
            stream_number(b"id: 0/12\nretry: 3000\ndata: \n\n"),
            Some(12)
        );
        assert_eq!(stream_number(b"data: {}\nid:3/4\n\n"), Some(4));
        assert_eq!(stream_number(b"id: 5\ndata: {}\n\n"), None);
        assert_eq!(stream_number(b": keep-alive\n\n"), None);
    }
}
