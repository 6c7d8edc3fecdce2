//! Live sessions kept within their cap (the least recently used idle one swapped out) and
//! idle ones saved by the idle keeper.

use std::sync::Arc;
use std::time::Duration;

use crate::Wasmbox;
use crate::lang::Language;
use crate::sandbox::Sandbox;
use crate::sandbox::slot::{SESSION_LANGUAGES, Slot};

/// After a save that failed (a state over `WASMBOX_STATE_MB` or its owner's budget, a disk
/// error), how much longer the session counts as used: the idle keeper and swap-outs try it
/// again after that, rather than capturing and compressing it on every tick.
const SAVE_RETRY: Duration = Duration::from_secs(60);

impl Wasmbox {
    /// Before a session starts in `(sandbox, language)`: while live sessions are at their cap,
    /// saves the least recently used idle one to disk and frees it, so sessions never run the
    /// engine out of instance slots (or the host out of memory). Sessions in a call are left.
    /// The saving (of any owner's sessions) is done on the blocking pool, not on a guest thread
    /// in the caller's CPU slot.
    pub(crate) async fn make_room(&self, for_sandbox: &str, for_language: Language) {
        let (me, id) = (self.clone(), for_sandbox.to_string());
        let saved = tokio::task::spawn_blocking(move || me.make_room_now(&id, for_language));
        if let Err(e) = saved.await {
            tracing::warn!("making room for a session: {e}");
        }
    }

    fn make_room_now(&self, for_sandbox: &str, for_language: Language) {
        let max = self.inner.config.sandbox.max_live_sessions;
        loop {
            let mut live = 0usize;
            let mut oldest: Option<(std::time::Instant, Arc<Sandbox>, Language)> = None;
            for sb in self.inner.sandboxes.all() {
                for language in SESSION_LANGUAGES {
                    if sb.id == for_sandbox && language == for_language {
                        continue;
                    }
                    let slot = sb.slot(language).expect("a slot per session language");
                    let Ok(g) = slot.try_lock() else {
                        live += 1;
                        continue;
                    };
                    if !g.is_live() {
                        continue;
                    }
                    live += 1;
                    let used = g.last_used.unwrap_or_else(std::time::Instant::now);
                    if oldest.as_ref().is_none_or(|(t, ..)| used < *t) {
                        oldest = Some((used, sb.clone(), language));
                    }
                }
            }
            if live < max {
                return;
            }
            let Some((_, sb, language)) = oldest else {
                return;
            };
            if !self.swap_out(&sb, language) {
                return;
            }
        }
    }

    /// Saves `sb`'s idle `language` session to disk and frees it; false when it was busy, had
    /// ended, or could not be saved (then it stays live).
    fn swap_out(&self, sb: &Sandbox, language: Language) -> bool {
        let Some(slot) = sb.slot(language) else {
            return false;
        };
        let Ok(mut g) = slot.try_lock() else {
            return false;
        };
        self.swap_out_held(sb, language, &mut g)
    }

    /// [`Self::swap_out`] with the slot already held.
    fn swap_out_held(&self, sb: &Sandbox, language: Language, g: &mut Slot) -> bool {
        let Some(rt) = self.inner.runtimes.loaded_session(language) else {
            return false;
        };
        if !g.is_live() {
            return false;
        }
        let gate = self.inner.sandboxes.state_gate(&sb.owner);
        match g.swap_out(&*rt, &sb.state_path(language), &gate) {
            Ok(bytes) => {
                tracing::debug!(sandbox = %sb.id, "{} session swapped out ({bytes} bytes)", language.name());
                true
            }
            Err(e) => {
                tracing::warn!(sandbox = %sb.id, "swapping out the {} session: {e}", language.name());
                g.last_used = Some(std::time::Instant::now() + SAVE_RETRY);
                false
            }
        }
    }

    /// Saves sessions idle for `WASMBOX_SAVE_IDLE_MS` (they stay live: a stop, clean or not,
    /// then loses no turn) and frees those idle for `WASMBOX_IDLE_PAUSE_S`, on a thread of its
    /// own that ends with the service.
    pub(crate) fn start_idle_keeper(&self) {
        let config = &self.inner.config.sandbox;
        let save_idle = config
            .save_idle
            .filter(|_| self.inner.sandboxes.persistent());
        let free_idle = config.idle_pause;
        let Some(shortest) = [save_idle, free_idle].into_iter().flatten().min() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let every = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let spawned = std::thread::Builder::new()
            .name("wasmbox-idle-sessions".into())
            .spawn(move || {
                crate::engine::threads::lower_priority();
                loop {
                    std::thread::sleep(every);
                    let Some(inner) = weak.upgrade() else {
                        return;
                    };
                    let wb = Wasmbox { inner };
                    for sb in wb.inner.sandboxes.all() {
                        for language in SESSION_LANGUAGES {
                            wb.keep_idle(&sb, language, save_idle, free_idle);
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("idle sessions will stay in memory: {e}");
        }
    }

    /// Saves or frees `sb`'s `language` session if it has idled long enough.
    fn keep_idle(
        &self,
        sb: &Sandbox,
        language: Language,
        save_idle: Option<Duration>,
        free_idle: Option<Duration>,
    ) {
        let Some(mut g) = sb.slot(language).and_then(|s| s.try_lock().ok()) else {
            return;
        };
        let Some(idle_for) = g.idle_for() else {
            return;
        };
        if free_idle.is_some_and(|d| idle_for >= d) {
            self.swap_out_held(sb, language, &mut g);
        } else if !g.saved_as_is()
            && save_idle.is_some_and(|d| idle_for >= d)
            && let Some(rt) = self.inner.runtimes.loaded_session(language)
            && let Err(e) = g.save(
                &*rt,
                &sb.state_path(language),
                &self.inner.sandboxes.state_gate(&sb.owner),
            )
        {
            tracing::debug!(sandbox = %sb.id, "saving the idle {} session: {e}", language.name());
            g.last_used = Some(std::time::Instant::now() + SAVE_RETRY);
        }
    }
}
