//! MCP progress: a tool call whose request names a progress token (`_meta.progressToken`) gets
//! `notifications/progress` for what the library reports on it (a runtime loading, a Go build,
//! then about once a second while its code runs). A call without a token reports nothing: no
//! sink is made, so the guest's checks find none.
//!
//! `progress` is the call's elapsed time in seconds, kept strictly increasing as MCP requires
//! across stages; there is no `total` (a run's length is not known ahead); `message` says what
//! happens.

use std::future::Future;
use std::time::Instant;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc;

use crate::engine::progress::{Progress, ProgressSink};

tokio::task_local! {
    /// Where the running tool call's reports go, when its client asked for progress.
    static CALL_PROGRESS: ProgressSink;
}

/// The progress sink of the tool call this runs in, if its client gave a progress token.
pub fn call_progress() -> Option<ProgressSink> {
    CALL_PROGRESS.try_with(Clone::clone).ok()
}

/// Runs a tool call, sending what it reports as progress notifications for the request's
/// token (nothing without one). Notifications go out from this task, in order; those reported
/// before the call ended are sent before its result.
pub async fn scope<F: Future>(context: &RequestContext<RoleServer>, call: F) -> F::Output {
    let Some(token) = context.meta.get_progress_token() else {
        return call.await;
    };
    // Unbounded: reports come from guest and loader threads, which must never wait on the
    // client; they are at most one a second per call, plus a few stages.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink = ProgressSink::new(move |p| {
        let _ = tx.send(p);
    });
    let mut out = Notifier {
        peer: context.peer.clone(),
        token,
        start: Instant::now(),
        last: 0.0,
    };
    let call = CALL_PROGRESS.scope(sink, call);
    tokio::pin!(call);
    loop {
        tokio::select! {
            biased;
            result = &mut call => {
                while let Ok(p) = rx.try_recv() {
                    out.send(p).await;
                }
                return result;
            }
            Some(p) = rx.recv() => out.send(p).await,
        }
    }
}

/// Sends one call's notifications.
struct Notifier {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    start: Instant,
    /// The last `progress` sent: each must exceed it.
    last: f64,
}

impl Notifier {
    async fn send(&mut self, p: Progress) {
        let elapsed = self.start.elapsed().as_millis() as f64 / 1000.0;
        let progress = if elapsed > self.last {
            elapsed
        } else {
            self.last + 0.001
        };
        self.last = progress;
        let param =
            ProgressNotificationParam::new(self.token.clone(), progress).with_message(p.message());
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!("a progress notification was not sent: {e}");
        }
    }
}
