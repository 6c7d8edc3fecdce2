//! A sandbox's sessions over their whole life: a call in a slot's session (started, restored
//! from its state file, or reported lost), saved at pause, at shutdown and when idle, swapped
//! out past the live-session cap, forked and snapshotted. `slot` is one slot and its files on
//! disk; the rest is the facade's side, across a sandbox's (or every sandbox's) slots.

mod fork;
mod room;
mod save;
pub mod slot;
mod snapshot;

pub use save::{PAUSE_WAIT, SavedSession};
pub use slot::{SESSION_LANGUAGES, Slot, SlotLock};

use std::time::Duration;

use crate::lang::Language;
use crate::{Error, Result};

/// A sandbox's session slot, held for a copy or a save; a call still running after `wait`
/// makes this fail clearly.
async fn hold(
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
