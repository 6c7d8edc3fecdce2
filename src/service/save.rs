//! Saving a sandbox's sessions: at pause, at shutdown; and holding a sandbox's slot for a
//! save or a copy.

use std::sync::Arc;
use std::time::Duration;

use crate::lang::Language;
use crate::sandbox::Sandbox;
use crate::sandbox::slot::{self, SESSION_LANGUAGES, Slot, SlotError, SlotLock};
use crate::{Error, Result, Wasmbox};

/// How long a pause waits for a call running in the sandbox to end.
pub const PAUSE_WAIT: Duration = Duration::from_secs(10);

/// What saving one session did.
#[derive(Clone, Debug)]
pub struct SavedSession {
    pub language: Language,
    /// Bytes of its state file; `None` when it could not be saved (see `error`).
    pub bytes: Option<u64>,
    pub error: Option<String>,
}

impl SavedSession {
    /// The note a tool's reply carries.
    pub fn note(&self) -> String {
        match (&self.bytes, &self.error) {
            (Some(b), _) => format!(
                "the {} session was saved to disk ({b} bytes); the next call restores it",
                self.language.name()
            ),
            (None, Some(e)) => format!(
                "the {} session could not be saved ({e}); it stays in memory",
                self.language.name()
            ),
            (None, None) => String::new(),
        }
    }
}

impl Wasmbox {
    /// Saves `sb`'s live sessions to its state files and frees their instances; the next call
    /// in each restores it. Waits up to `wait` for a running call to end, then fails clearly.
    /// A session that cannot be saved stays live (its note says why).
    pub async fn save_sessions(
        &self,
        sb: &Arc<Sandbox>,
        wait: Duration,
    ) -> Result<Vec<SavedSession>> {
        let mut saved = Vec::new();
        for language in SESSION_LANGUAGES {
            let Some(slot) = sb.slot(language) else {
                continue;
            };
            let guard = hold(slot, language, wait).await?;
            let path = sb.state_path(language);
            if !guard.is_live() {
                // Ended (by this save's stop, at a shutdown, with no turn saved before it): the
                // next server says so.
                if let Some(why) = guard.ended()
                    && !path.is_file()
                {
                    slot::note_lost(&path, why);
                }
                continue;
            }
            let Some(rt) = self.inner.runtimes.loaded_session(language) else {
                continue;
            };
            let gate = self.inner.sandboxes.state_gate(&sb.owner);
            let outcome = tokio::task::spawn_blocking(move || {
                let mut guard = guard;
                guard.swap_out(&*rt, &path, &gate)
            })
            .await
            .unwrap_or_else(|e| Err(SlotError::Panicked(e)));
            saved.push(match outcome {
                Ok(bytes) => SavedSession {
                    language,
                    bytes: Some(bytes),
                    error: None,
                },
                Err(e) => {
                    tracing::warn!(sandbox = %sb.id, "saving the {} session: {e}", language.name());
                    SavedSession {
                        language,
                        bytes: None,
                        error: Some(e.to_string()),
                    }
                }
            });
        }
        Ok(saved)
    }

    /// Pauses `owner`'s sandbox `id`: executions are refused until it is resumed, and its
    /// sessions are written to disk and their instances freed.
    pub async fn pause_sandbox(
        &self,
        id: &str,
        owner: &str,
    ) -> Result<(Arc<Sandbox>, Vec<String>)> {
        let sb = self.inner.sandboxes.get(id, owner)?;
        let saved = self.save_sessions(&sb, PAUSE_WAIT).await?;
        let sb = self.inner.sandboxes.set_paused(id, owner, true)?;
        Ok((sb, saved.iter().map(SavedSession::note).collect()))
    }

    /// Saves every sandbox's idle sessions before the server exits, so a restart on the same
    /// data directory finds its variables. Calls still running are stopped as by a kill; their
    /// sessions are kept as of the turn before, when that turn was saved (`WASMBOX_SAVE_IDLE_MS`)
    /// and otherwise end with a note for the next server. Bounded by `within` in all.
    pub async fn save_all(&self, within: Duration) {
        if !self.inner.sandboxes.persistent() {
            return;
        }
        let all = self.inner.sandboxes.all();
        let work = async {
            for sb in &all {
                for language in SESSION_LANGUAGES {
                    let busy = sb.slot(language).is_some_and(|s| s.try_lock().is_err());
                    if busy {
                        sb.stop_all(crate::engine::limits::StopReason::Shutdown);
                    }
                }
            }
            for sb in &all {
                if let Err(e) = self.save_sessions(sb, Duration::from_secs(2)).await {
                    tracing::warn!(sandbox = %sb.id, "sessions not saved at shutdown: {e}");
                }
            }
        };
        if tokio::time::timeout(within, work).await.is_err() {
            tracing::warn!(
                "saving sessions at shutdown took over {within:?}; the rest start fresh"
            );
        }
    }
}

/// A sandbox's session slot, held for a copy or a save; a call still running after `wait`
/// makes this fail clearly.
pub(super) async fn hold(
    slot: &SlotLock,
    language: Language,
    wait: Duration,
) -> Result<tokio::sync::OwnedMutexGuard<Slot>> {
    tokio::time::timeout(wait, slot.clone().lock_owned())
        .await
        .map_err(|_| {
            Error::busy(format!(
                "a call is still running in the sandbox's {} session after {} s; try again once \
                 it ends",
                language.name(),
                wait.as_secs()
            ))
        })
}
