//! Consent for code mode's destructive tools: the person behind the client is asked through MCP
//! elicitation (a form with one yes-or-no field) when the client supports it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::service::ElicitationError;
use rmcp::{Peer, RoleServer};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::reach::tools::Consent;

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
    fn ask(&self, message: String) -> Pin<Box<dyn Future<Output = Result<bool, String>> + Send>> {
        let peer = self.0.clone();
        Box::pin(async move {
            match peer.elicit::<Approval>(message).await {
                Ok(a) => Ok(a.is_some_and(|a| a.approve)),
                Err(ElicitationError::UserDeclined | ElicitationError::UserCancelled) => Ok(false),
                Err(ElicitationError::CapabilityNotSupported) => {
                    Err("the MCP client does not support elicitation".into())
                }
                Err(e) => Err(format!("asking the MCP client failed: {e}")),
            }
        })
    }
}

tokio::task_local! {
    /// The client of the running tool call.
    static CALL_PEER: Peer<RoleServer>;
}

/// Runs `call` with its client known to [`call_consent`].
pub async fn scope<F: Future>(peer: Peer<RoleServer>, call: F) -> F::Output {
    CALL_PEER.scope(peer, call).await
}

/// Who to ask for consent in the tool call this runs in.
pub fn call_consent() -> Option<Arc<dyn Consent>> {
    CALL_PEER
        .try_with(|p| Arc::new(PeerConsent(p.clone())) as Arc<dyn Consent>)
        .ok()
}
