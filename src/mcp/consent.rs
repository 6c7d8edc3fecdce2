//! Consent for code mode's destructive tools: the person behind the client is asked through MCP
//! elicitation (a form with one yes-or-no field) when the client supports it: as a request of
//! the server's own before protocol 2026-07-28, and from 2026-07-28 as the tool call's
//! `input_required` answer, the run parked until the client retries the call with the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
use rmcp::service::ElicitationError;
use rmcp::{Peer, RoleServer};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use crate::reach::tools::{CannotAsk, Consent};

/// The one answer asked for.
#[derive(Deserialize, JsonSchema)]
struct Approval {
    /// Allow this call.
    approve: bool,
}
rmcp::elicit_safe!(Approval);

/// Asks the client of the call a run was started by.
pub struct PeerConsent(pub Peer<RoleServer>);

impl Consent for PeerConsent {
    fn ask(
        &self,
        message: String,
    ) -> Pin<Box<dyn Future<Output = Result<bool, CannotAsk>> + Send>> {
        let peer = self.0.clone();
        Box::pin(async move {
            match peer.elicit::<Approval>(message).await {
                Ok(a) => Ok(a.is_some_and(|a| a.approve)),
                Err(ElicitationError::UserDeclined | ElicitationError::UserCancelled) => Ok(false),
                Err(ElicitationError::CapabilityNotSupported) => Err(CannotAsk::NoElicitation),
                Err(e) => Err(CannotAsk::Failed(e)),
            }
        })
    }
}

tokio::task_local! {
    /// Who to ask in the running tool call.
    static CALL_CONSENT: Arc<dyn Consent>;
}

/// Runs `call` with `consent` known to [`call_consent`].
pub async fn scope<F: Future>(consent: Arc<dyn Consent>, call: F) -> F::Output {
    CALL_CONSENT.scope(consent, call).await
}

/// Who to ask for consent in the tool call this runs in.
pub fn call_consent() -> Option<Arc<dyn Consent>> {
    CALL_CONSENT.try_with(Arc::clone).ok()
}

/// A question from a run to the person, and where the answer goes.
pub struct Question {
    pub message: String,
    pub answer: oneshot::Sender<Result<bool, CannotAsk>>,
}

/// Asks through the tool call that owns the run (protocol 2026-07-28 and later, where a server
/// may not send requests of its own): the call answers `input_required` with the question, and
/// the client's retry brings the answer back (see [`Parked`]).
pub struct AskThroughCall(pub mpsc::UnboundedSender<Question>);

impl Consent for AskThroughCall {
    fn ask(
        &self,
        message: String,
    ) -> Pin<Box<dyn Future<Output = Result<bool, CannotAsk>> + Send>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.0.send(Question {
            message,
            answer: tx,
        });
        Box::pin(async move {
            if sent.is_err() {
                return Err(CannotAsk::CallEnded);
            }
            rx.await.unwrap_or(Err(CannotAsk::NoAnswer))
        })
    }
}

/// A run waiting for the person's answer while its call has returned `input_required`: the
/// client's retry of the call (with `requestState`) takes it up again.
pub struct Parked {
    pub run: tokio::task::JoinHandle<rmcp::model::CallToolResult>,
    pub answer: oneshot::Sender<Result<bool, CannotAsk>>,
    pub questions: mpsc::UnboundedReceiver<Question>,
    pub cancel: Arc<crate::engine::limits::Stop>,
    pub owner: Arc<str>,
    pub tool: String,
    pub since: std::time::Instant,
}

/// Runs parked for an answer, by their `requestState`.
#[derive(Default)]
pub struct ParkedRuns(std::sync::Mutex<std::collections::HashMap<String, Parked>>);

impl ParkedRuns {
    /// Parks a run; runs whose answer never came and that have ended since are let go.
    pub fn park(&self, p: Parked) -> String {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut runs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        runs.retain(|_, r| !(r.run.is_finished() && r.since.elapsed() > ABANDONED));
        runs.insert(token.clone(), p);
        token
    }

    /// The run parked as `token` by this owner for this tool.
    pub fn take(&self, token: &str, owner: &str, tool: &str) -> Option<Parked> {
        let mut runs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match runs.get(token) {
            Some(p) if *p.owner == *owner && p.tool == tool => runs.remove(token),
            _ => None,
        }
    }
}

/// How long an ended run whose answer never came is kept for a late retry.
const ABANDONED: std::time::Duration = std::time::Duration::from_secs(60);

/// The question as MCP's `input_required` carries it: one form elicitation, `consent`.
pub fn input_required(message: String, token: String) -> rmcp::model::InputRequiredResult {
    use rmcp::model::{ElicitRequest, ElicitationSchema, InputRequest, InputRequests};
    let schema = ElicitationSchema::from_type::<Approval>().expect("a boolean form");
    let mut requests = InputRequests::new();
    requests.insert(
        "consent".into(),
        InputRequest::Elicitation(ElicitRequest::new(
            ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: schema,
            },
        )),
    );
    rmcp::model::InputRequiredResult::new(Some(requests), Some(token))
}

/// The person's answer in a retry's `inputResponses`.
pub fn answer_of(responses: Option<&rmcp::model::InputResponses>) -> Result<bool, CannotAsk> {
    let Some(r) = responses.and_then(|r| r.get("consent")) else {
        return Err(CannotAsk::NoneInRetry);
    };
    let r: ElicitResult = serde_json::from_value(r.clone()).map_err(CannotAsk::NotElicitation)?;
    Ok(r.action == ElicitationAction::Accept
        && r.content
            .as_ref()
            .and_then(|c| c.get("approve"))
            .and_then(|v| v.as_bool())
            == Some(true))
}
