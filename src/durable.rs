//! Sessions that outlive their instances: saved to the sandbox's data directory when it is
//! paused, when the server stops, or after idling; restored by the next call (see
//! `sandbox::sessions`).

use std::sync::Arc;
use std::time::Duration;

use crate::lang::Language;
use crate::sandbox::budget::{self, Reservation, StateGate};
use crate::sandbox::copy::Copied;
use crate::sandbox::snapshots::{self, SnapshotError, SnapshotMeta};
use crate::sandbox::{SESSION_LANGUAGES, Sandbox, sessions};
use crate::{Error, Result, Wasmbox};

/// How long a pause waits for a call running in the sandbox to end.
pub const PAUSE_WAIT: Duration = Duration::from_secs(10);

/// After a save that failed (a state over `WASMBOX_STATE_MB` or its owner's budget, a disk
/// error), how much longer the session counts as used: the idle keeper and swap-outs try it
/// again after that, rather than capturing and compressing it on every tick.
const SAVE_RETRY: Duration = Duration::from_secs(60);

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
            if guard.session.is_none() {
                // Ended (by this save's stop, at a shutdown, with no turn saved before it): the
                // next server says so.
                if let Some(why) = &guard.ended
                    && !path.is_file()
                {
                    sessions::note_lost(&path, why);
                }
                continue;
            }
            let Some(rt) = self.inner.runtimes.loaded_session(language) else {
                continue;
            };
            let gate = self.inner.sandboxes.state_gate(&sb.owner);
            let outcome = tokio::task::spawn_blocking(move || {
                let mut guard = guard;
                let r = sessions::save_slot(&*rt, &mut guard, &path, &gate);
                if r.is_ok() {
                    guard.session = None;
                    guard.saved = false;
                }
                r
            })
            .await
            .unwrap_or_else(|e| Err(format!("saving panicked: {e}")));
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
                        error: Some(e),
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

impl Wasmbox {
    /// A new sandbox of `owner` whose files, env and session variables equal sandbox `id`'s now
    /// and are its own from then on. Live sessions are copied in memory (the child's first call
    /// finds them ready), saved ones as files; either way the child's random generators are
    /// reseeded. Calls in the source wait meanwhile.
    pub async fn fork_sandbox(&self, id: &str, owner: &str) -> Result<(Arc<Sandbox>, Vec<String>)> {
        let src = self.inner.sandboxes.get(id, owner)?;
        let mut held = Vec::new();
        for language in SESSION_LANGUAGES {
            let slot = src.slot(language).expect("a slot per session language");
            held.push((language, hold(slot, language, PAUSE_WAIT).await?));
        }
        let child = self.inner.sandboxes.create_unfilled(
            src.template.id,
            Some(src.timeout().as_secs() as i64),
            src.env(),
            owner,
        )?;
        // The files are copied on a blocking thread while the sessions are, on a guest thread.
        let files = {
            let (src, child) = (src.clone(), child.clone());
            tokio::task::spawn_blocking(move || copy_files(&src, &child))
        };
        let sessions = self.fork_sessions(&src, &child, held).await;
        let copied = files
            .await
            .unwrap_or_else(|e| Err(format!("copying panicked: {e}")));
        let failed = match (sessions, copied) {
            (Ok(notes), Ok(())) => {
                // Its meta.json is synced off the caller's path.
                self.inner.sandboxes.publish(&child, false);
                let synced = child.clone();
                tokio::task::spawn_blocking(move || synced.sync_saved());
                return Ok((child, notes));
            }
            (Err(e), _) => e,
            (_, Err(e)) => Error::wasm(format!("the sandbox's files could not be copied: {e}")),
        };
        self.inner.sandboxes.discard(&child.id);
        Err(failed)
    }

    /// Copies `src`'s sessions, whose slots are `held`, into `child`: live ones in memory, saved
    /// ones as files. Notes what could not be copied.
    async fn fork_sessions(
        &self,
        src: &Sandbox,
        child: &Sandbox,
        held: Vec<(Language, tokio::sync::OwnedMutexGuard<crate::sandbox::Slot>)>,
    ) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        for (language, guard) in held {
            if guard.session.is_none() {
                let from = src.state_path(language);
                if from.is_file()
                    && let Err(e) = self.copy_state(&from, child, language)
                {
                    notes.push(format!(
                        "the saved {} session could not be copied ({e}); the fork starts a fresh one",
                        language.name()
                    ));
                }
                continue;
            }
            let Some(rt) = self.inner.runtimes.loaded_session(language) else {
                continue;
            };
            let mut req = self.request(crate::ExecOptions {
                language: language.as_str().into(),
                ..Default::default()
            })?;
            req.place = Some(child.place(
                crate::lang::guest::WORKSPACE_GUEST.into(),
                child.stop.clone(),
            ));
            let target = child
                .slot(language)
                .expect("a slot per session language")
                .clone()
                .lock_owned()
                .await;
            let copied = self
                .inner
                .guests
                .run(move || {
                    let (mut guard, mut target) = (guard, target);
                    let session = guard.session.as_mut().expect("checked above");
                    let r = sessions::fork(&*rt, session, &req).map(|(s, n)| {
                        target.session = Some(s);
                        n
                    });
                    drop(guard);
                    Ok::<_, Error>(r)
                })
                .await?;
            match copied {
                Ok(mut n) => notes.append(&mut n),
                Err(e) => notes.push(format!(
                    "the {} session could not be copied ({e}); the fork starts a fresh one",
                    language.name()
                )),
            }
        }
        Ok(notes)
    }
}

/// A sandbox's session slot, held for a copy or a save; a call still running after `wait`
/// makes this fail clearly.
async fn hold(
    slot: &crate::sandbox::SlotLock,
    language: Language,
    wait: Duration,
) -> Result<tokio::sync::OwnedMutexGuard<crate::sandbox::Slot>> {
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

/// Copies `src`'s `/workspace` and `/tmp` into `child`'s, counted in the child's budget.
fn copy_files(src: &Sandbox, child: &Sandbox) -> std::result::Result<(), String> {
    let c = copy_dirs(
        src,
        &child.fs.host_workspace(),
        &child.fs.host_tmp(),
        child.fs.quota(),
    )?;
    child.fs.budget().changed(c.bytes as i64, c.entries as i64);
    Ok(())
}

impl Wasmbox {
    /// Keeps sandbox `id`'s files, env and sessions as a snapshot of its own (the sandbox runs
    /// on unchanged). Calls in the sandbox wait meanwhile.
    pub async fn snapshot_sandbox(&self, id: &str, owner: &str) -> Result<SnapshotMeta> {
        let src = self.inner.sandboxes.get(id, owner)?;
        let mut held = Vec::new();
        for language in SESSION_LANGUAGES {
            let slot = src.slot(language).expect("a slot per session language");
            held.push((language, hold(slot, language, PAUSE_WAIT).await?));
        }
        let sandboxes = self.inner.sandboxes.clone();
        let reservation = {
            let (src, sandboxes, owner) = (src.clone(), sandboxes.clone(), owner.to_string());
            tokio::task::spawn_blocking(move || -> Result<Reservation> {
                let estimate = snapshot_estimate(&src).map_err(|e| {
                    SnapshotError::Io(format!("the sandbox's files could not be measured: {e}"))
                })?;
                let r = sandboxes
                    .snapshots
                    .ledger()
                    .reserve(&owner, estimate, || sandboxes.owner_used(&owner, None))
                    .map_err(SnapshotError::from)?;
                Ok(r)
            })
            .await
            .unwrap_or_else(|e| Err(Error::wasm(format!("measuring panicked: {e}"))))?
        };
        let reservation = Arc::new(reservation);
        let store = &sandboxes.snapshots;
        let (snap_id, dir) = store.start()?;
        let made = self.fill_snapshot(&src, held, &dir, &reservation).await;
        let (size_bytes, languages) = match made {
            Ok(m) => m,
            Err(e) => {
                store.abandon(&snap_id);
                return Err(SnapshotError::Io(e).into());
            }
        };
        let mut meta = SnapshotMeta {
            snapshot_id: snap_id,
            sandbox_id: src.id.clone(),
            owner: owner.to_string(),
            template: src.template.id.to_string(),
            env: src.env(),
            created_at_ms: snapshots::now_ms(),
            languages,
            size_bytes,
            cost_bytes: None,
            charged_bytes: 0,
        };
        let owner = owner.to_string();
        tokio::task::spawn_blocking(move || {
            sandboxes
                .snapshots
                .finish(&mut meta, &reservation, || {
                    sandboxes.states_used(&owner, None)
                })
                .map(|()| meta)
        })
        .await
        .unwrap_or_else(|e| Err(SnapshotError::Io(format!("finishing panicked: {e}"))))
        .map_err(Error::from)
    }

    /// Writes `src`'s files and sessions into snapshot directory `dir`: their bytes, and the
    /// languages whose sessions it holds.
    async fn fill_snapshot(
        &self,
        src: &Arc<Sandbox>,
        held: Vec<(Language, tokio::sync::OwnedMutexGuard<crate::sandbox::Slot>)>,
        dir: &std::path::Path,
        reservation: &Arc<Reservation>,
    ) -> std::result::Result<(u64, Vec<Language>), String> {
        let files = {
            let (src, dir) = (src.clone(), dir.to_path_buf());
            // No more than was reserved: every byte and every entry costs at least that much.
            let q = src.fs.quota();
            let quota = crate::engine::disk::Quota {
                max_bytes: q.max_bytes.min(reservation.amount()),
                max_entries: q.max_entries.min(reservation.amount() / budget::PER_ENTRY),
            };
            tokio::task::spawn_blocking(move || {
                copy_dirs(&src, &dir.join("workspace"), &dir.join("tmp"), quota)
            })
            .await
            .unwrap_or_else(|e| Err(format!("copying panicked: {e}")))?
        };
        let mut size = files.bytes;
        let mut languages = Vec::new();
        for (language, guard) in held {
            let to = snapshots::state_path(dir, language);
            // A session saved as it is (idle) is copied as its file, like one not live.
            let bytes = if guard.session.is_some() && !guard.saved {
                let Some(rt) = self.inner.runtimes.loaded_session(language) else {
                    continue;
                };
                let gate = budget::SnapshotGate {
                    sandboxes: self.inner.sandboxes.clone(),
                    reservation: reservation.clone(),
                };
                tokio::task::spawn_blocking(move || {
                    let mut guard = guard;
                    let session = guard.session.as_mut().expect("checked above");
                    sessions::save(&*rt, session, &to, &gate).map(|s| s.bytes)
                })
                .await
                .unwrap_or_else(|e| Err(format!("saving panicked: {e}")))
                .map_err(|e| format!("the {} session: {e}", language.name()))?
            } else {
                let from = src.state_path(language);
                if !from.is_file() {
                    continue;
                }
                std::fs::copy(&from, &to)
                    .map_err(|e| format!("copying the saved {} session: {e}", language.name()))?
            };
            size += bytes;
            languages.push(language);
        }
        Ok((size, languages))
    }

    /// A new sandbox of `owner` holding snapshot `snapshot_id`'s files, env (with `env` on top)
    /// and sessions; the sessions are restored, with fresh random generators, by its first
    /// call in each language.
    pub async fn create_from_snapshot(
        &self,
        snapshot_id: &str,
        template: Option<&str>,
        timeout_secs: Option<i64>,
        env: std::collections::BTreeMap<String, String>,
        owner: &str,
    ) -> Result<Arc<Sandbox>> {
        let (meta, dir) = self.inner.sandboxes.snapshots.get(snapshot_id, owner)?;
        if let Some(t) = template.filter(|t| *t != meta.template) {
            return Err(Error::invalid(format!(
                "snapshot {snapshot_id} is of template '{}', not '{t}': create_sandbox from it \
                 takes its template (leave template_id out)",
                meta.template
            )));
        }
        let mut all_env = meta.env.clone();
        all_env.extend(env);
        let sandboxes = self.inner.sandboxes.clone();
        let sb = sandboxes.create_unfilled(&meta.template, timeout_secs, all_env, owner)?;
        let filled = {
            let (sb, dir, me, sandboxes) =
                (sb.clone(), dir.clone(), self.clone(), sandboxes.clone());
            tokio::task::spawn_blocking(move || -> std::result::Result<(), String> {
                let c = copy_into(&dir.join("workspace"), &dir.join("tmp"), &sb)?;
                sb.fs.budget().changed(c.bytes as i64, c.entries as i64);
                for language in meta.languages {
                    let from = snapshots::state_path(&dir, language);
                    me.copy_state(&from, &sb, language)
                        .map_err(|e| format!("the {} session: {e}", language.name()))?;
                }
                sandboxes.publish(&sb, true);
                Ok(())
            })
            .await
            .unwrap_or_else(|e| Err(format!("copying panicked: {e}")))
        };
        if let Err(e) = filled {
            sandboxes.discard(&sb.id);
            return Err(SnapshotError::Io(format!("the snapshot could not be copied: {e}")).into());
        }
        Ok(sb)
    }
}

impl Wasmbox {
    /// Copies the saved session at `from` into `to`'s state files, if its owner's budget has
    /// room for it.
    fn copy_state(
        &self,
        from: &std::path::Path,
        to: &Sandbox,
        language: Language,
    ) -> std::result::Result<(), String> {
        let path = to.state_path(language);
        let len = std::fs::metadata(from).map_err(|e| e.to_string())?.len();
        let _room = self
            .inner
            .sandboxes
            .state_gate(&to.owner)
            .admit(&path, len)?;
        sessions::copy_reseeded(from, &path).map_err(|e| e.to_string())
    }
}

/// What a snapshot of `src` is expected to cost before its live sessions are saved: its files
/// and saved sessions as they are now, the snapshot's own directories and its `meta.json`.
fn snapshot_estimate(src: &Sandbox) -> std::io::Result<u64> {
    let mut total = budget::measure(&src.fs.host_workspace())?
        + budget::measure(&src.fs.host_tmp())?
        // The snapshot's directory and its state/, and meta.json.
        + 2 * budget::file_cost(budget::BLOCK)
        + budget::file_cost(2 * budget::BLOCK);
    for language in SESSION_LANGUAGES {
        if let Ok(m) = std::fs::metadata(src.state_path(language)) {
            total += budget::file_cost(m.len());
        }
    }
    Ok(total)
}

/// Copies `src`'s `/workspace` and `/tmp` into the directories `ws` and `tmp`, within `quota`
/// in all.
fn copy_dirs(
    src: &Sandbox,
    ws: &std::path::Path,
    tmp: &std::path::Path,
    quota: crate::engine::disk::Quota,
) -> std::result::Result<Copied, String> {
    copy_pair(
        [
            (src.fs.host_workspace(), ws.to_path_buf()),
            (src.fs.host_tmp(), tmp.to_path_buf()),
        ],
        quota,
    )
}

/// Copies the directories `ws` and `tmp` into `dst`'s `/workspace` and `/tmp`, within its quota.
fn copy_into(
    ws: &std::path::Path,
    tmp: &std::path::Path,
    dst: &Sandbox,
) -> std::result::Result<Copied, String> {
    copy_pair(
        [
            (ws.to_path_buf(), dst.fs.host_workspace()),
            (tmp.to_path_buf(), dst.fs.host_tmp()),
        ],
        dst.fs.quota(),
    )
}

fn copy_pair(
    pairs: [(std::path::PathBuf, std::path::PathBuf); 2],
    quota: crate::engine::disk::Quota,
) -> std::result::Result<Copied, String> {
    let mut total = Copied::default();
    for (from, to) in pairs {
        let left = crate::engine::disk::Quota {
            max_bytes: quota.max_bytes.saturating_sub(total.bytes),
            max_entries: quota.max_entries.saturating_sub(total.entries),
        };
        let c = crate::sandbox::copy::copy_tree(&from, &to, left).map_err(|e| e.to_string())?;
        total.bytes += c.bytes;
        total.entries += c.entries;
    }
    Ok(total)
}

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
                    if g.session.is_none() {
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
        let Some(rt) = self.inner.runtimes.loaded_session(language) else {
            return false;
        };
        if g.session.is_none() {
            return false;
        }
        let gate = self.inner.sandboxes.state_gate(&sb.owner);
        match sessions::save_slot(&*rt, &mut g, &sb.state_path(language), &gate) {
            Ok(bytes) => {
                tracing::debug!(sandbox = %sb.id, "{} session swapped out ({bytes} bytes)", language.name());
                g.session = None;
                g.saved = false;
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
        let idle_for = match (&g.session, g.last_used) {
            (Some(_), Some(t)) => t.elapsed(),
            _ => return,
        };
        if free_idle.is_some_and(|d| idle_for >= d) {
            drop(g);
            self.swap_out(sb, language);
        } else if !g.saved
            && save_idle.is_some_and(|d| idle_for >= d)
            && let Some(rt) = self.inner.runtimes.loaded_session(language)
            && let Err(e) = sessions::save_slot(
                &*rt,
                &mut g,
                &sb.state_path(language),
                &self.inner.sandboxes.state_gate(&sb.owner),
            )
        {
            tracing::debug!(sandbox = %sb.id, "saving the idle {} session: {e}", language.name());
            g.last_used = Some(std::time::Instant::now() + SAVE_RETRY);
        }
    }
}
