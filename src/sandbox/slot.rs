//! A sandbox's sessions on disk: written once a session is idle (`WASMBOX_SAVE_IDLE_MS`, the
//! session stays live), when the sandbox is paused, when the server shuts down and
//! (`WASMBOX_SAVE_EVERY_CALL`) after each call; read back by the next call, in this server or
//! the next one. A file is only ever restored into the image it was saved from
//! ([`crate::engine::state`] checks the key, the format and a checksum).
//!
//! Beside `<language>.state`, while a call runs in a session that was saved as it is, the file
//! is `<language>.before`: the turn before the call. A server stopped mid-call, by a signal or
//! by a crash, leaves that, and the next server restores it and says so. A live session with
//! turns no file holds has a `<language>.lost` marker, so that a server killed before saving it
//! leaves a note rather than silently fresh variables.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::engine::state::InstanceState;
use crate::lang::guest::{EXIT_CANCELLED, EXIT_KILLED};
use crate::lang::live::{self, Session, SessionRuntime};
use crate::lang::{ExecRequest, ExecResult, Language};
use crate::sandbox::budget::StateGate;

/// A session slot: what it holds, and when its last call ended (idle sessions, and the least
/// recently used ones when live sessions reach their cap, are saved to disk and freed). A
/// session saved to disk (paused, swapped out, or left by a previous server) is in the
/// sandbox's state file instead, until the next call restores it.
#[derive(Default)]
pub struct Slot {
    state: State,
    pub last_used: Option<std::time::Instant>,
}

/// What a slot holds between calls.
#[derive(Default)]
enum State {
    /// Nothing live: the next call restores the state file, or starts fresh.
    #[default]
    Empty,
    /// The last session ended, for this reason: the next call says so once and starts fresh.
    Ended(String),
    /// A live session. `saved`: the state file holds it as it is, so freeing it needs no new
    /// save. `marked`: a `.lost` marker says it has turns no file holds (see [`Slot::call`]).
    Live {
        session: Session,
        saved: bool,
        marked: bool,
    },
}

/// A sandbox's slot for one language, held for the length of a call.
pub type SlotLock = Arc<tokio::sync::Mutex<Slot>>;

/// The languages whose sessions a sandbox keeps, in the order of [`crate::sandbox::Sandbox::slot`]'s slots.
pub const SESSION_LANGUAGES: [Language; 2] = [Language::Python, Language::JavaScript];

/// Largest state file read back: a 4 GiB memory, uncompressed, and its framing. The file is the
/// server's own, but its size still does not get to decide what the host allocates.
const MAX_STATE_FILE: u64 = (4 << 30) + (1 << 20);

/// Why a session could not be saved, read back or copied; its text is what notes and errors
/// say.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("no live session")]
    NotLive,
    #[error("creating {}: {source}", dir.display())]
    CreateDir {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("its state file could not be opened: {0}")]
    Open(std::io::Error),
    #[error("its state file could not be read: {0}")]
    Read(std::io::Error),
    #[error("its state file is larger than any session's state")]
    TooLarge,
    #[error("saving panicked: {0}")]
    Panicked(tokio::task::JoinError),
    /// The runtime, the budget or the state's checks refused, in their words.
    #[error("{0}")]
    Refused(String),
}

impl SlotError {
    fn refused(e: impl std::fmt::Display) -> Self {
        SlotError::Refused(e.to_string())
    }
}

/// What saving a session wrote.
#[derive(Clone, Debug)]
pub struct Saved {
    pub bytes: u64,
    pub pages: u64,
}

/// Captures `session` and writes it to `path` (atomically, owner-only) if `gate` admits it.
/// The session lives on; the caller drops it when saving is to free it.
pub fn save(
    rt: &dyn SessionRuntime,
    session: &mut Session,
    path: &Path,
    gate: &dyn StateGate,
) -> Result<Saved, SlotError> {
    let key = rt.state_key().map_err(SlotError::refused)?;
    let st = session.capture().map_err(SlotError::refused)?;
    write(&st, &key, path, gate)
}

/// Writes a captured state, if `gate` admits its size; nothing is written otherwise.
pub fn write(
    st: &InstanceState,
    key: &crate::engine::state::StateKey,
    path: &Path,
    gate: &dyn StateGate,
) -> Result<Saved, SlotError> {
    let bytes = st.encode(key);
    // Held until the file is in place, where it then counts as it is.
    let _room = gate
        .admit(path, bytes.len() as u64)
        .map_err(SlotError::refused)?;
    if let Some(dir) = path.parent() {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        crate::platform::fs::private_dir(&mut b);
        b.create(dir).map_err(|source| SlotError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    crate::platform::fs::write_atomic(path, &bytes).map_err(|source| SlotError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Saved {
        bytes: bytes.len() as u64,
        pages: st.saved_pages(),
    })
}

/// Reads and checks the state at `path` for `rt`; `None` when there is none.
pub fn read(rt: &dyn SessionRuntime, path: &Path) -> Option<Result<InstanceState, SlotError>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(SlotError::Open(e))),
    };
    let mut bytes = Vec::new();
    let read = file
        .take(MAX_STATE_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(SlotError::Read);
    Some(read.and_then(|n| {
        if n as u64 > MAX_STATE_FILE {
            return Err(SlotError::TooLarge);
        }
        let key = rt.state_key().map_err(SlotError::refused)?;
        InstanceState::decode(&bytes, &key).map_err(SlotError::refused)
    }))
}

/// Beside where a session would be saved: why it could not be (it ended as the server
/// stopped), for the next server's first call to say.
fn lost_marker(state_path: &Path) -> std::path::PathBuf {
    state_path.with_extension("lost")
}

/// Records why the session of `state_path` would be lost: it has turns no file holds (a call
/// runs or ran in it), or it ended instead of being saved. The next call says so unless a state
/// file comes first. The marker's one writer: atomic but not synced, since it has to outlive
/// the process, not the host (unsaved turns do not either).
pub fn note_lost(state_path: &Path, why: &str) {
    let _ = std::fs::create_dir_all(state_path.parent().unwrap_or(Path::new(".")));
    let _ = crate::platform::fs::write_replacing(&lost_marker(state_path), why.as_bytes(), false);
}

/// A state file while it is restored: set aside, so that a restore that cannot finish puts it
/// back and one cut off by a stop leaves it for the next server.
fn restoring_path(state_path: &Path) -> std::path::PathBuf {
    state_path.with_extension("restoring")
}

/// Beside a session's state file while a call runs in it: the session as of the turn before.
fn before_path(state_path: &Path) -> std::path::PathBuf {
    state_path.with_extension("before")
}

/// Beside a state file: a note for the call that restores it.
fn note_path(state_path: &Path) -> std::path::PathBuf {
    state_path.with_extension("note")
}

/// What a server stopped mid-call leaves: the turn before the call, to be restored with `note`.
fn keep_before(state_path: &Path, note: &str) {
    if std::fs::rename(before_path(state_path), state_path).is_ok() {
        let _ = crate::platform::fs::write_atomic(&note_path(state_path), note.as_bytes());
    }
}

/// A short file's text, removed once read.
fn take_text(path: &Path) -> Option<String> {
    let mut text = String::new();
    let read = std::fs::File::open(path)
        .and_then(|f| f.take(512).read_to_string(&mut text))
        .is_ok();
    let _ = std::fs::remove_file(path);
    read.then_some(text)
}

/// Why a session was lost at the last stop, once (the marker is removed); short and bounded.
fn take_lost(state_path: &Path) -> Option<String> {
    take_text(&lost_marker(state_path))
}

/// Beside a state file copied for another sandbox (a fork, a sandbox made from a snapshot):
/// its restore reseeds the random generators, which a resume does not.
fn reseed_marker(state_path: &Path) -> std::path::PathBuf {
    state_path.with_extension("reseed")
}

/// Copies a saved session to another sandbox's `to`, marked so that its restore reseeds.
pub fn copy_reseeded(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to.parent().unwrap_or(Path::new(".")))?;
    std::fs::copy(from, to)?;
    std::fs::write(reseed_marker(to), b"")
}

/// Why a saved session was not restored.
pub enum Unrestored {
    /// The file failed its checks and was removed: the call goes on in a fresh session.
    Unusable(SlotError),
    /// No instance could be made to hold it now (memory, instance slots): the file is where it
    /// was, for the next call to try again.
    Kept(String),
}

/// The saved session at `path` (or, from a server that died mid-call, its `.before`) restored
/// for `req`, and notes on what it could not keep; `None` when nothing is saved there. The file
/// is removed only once restored, or once it failed its checks.
pub fn restore(
    rt: &dyn SessionRuntime,
    req: &ExecRequest,
    path: &Path,
) -> Option<Result<(Session, Vec<String>), Unrestored>> {
    let aside = restoring_path(path);
    let before = before_path(path);
    // Newest first; an aside file is one whose restore a stop cut off.
    let from = if std::fs::rename(path, &aside).is_ok() || aside.is_file() {
        path
    } else if std::fs::rename(&before, &aside).is_ok() {
        before.as_path()
    } else {
        return None;
    };
    let put_back = || {
        let _ = std::fs::rename(&aside, from);
    };
    let spent = || {
        for p in [&aside, &reseed_marker(path), &lost_marker(path)] {
            let _ = std::fs::remove_file(p);
        }
    };
    let st = match read(rt, &aside) {
        None => return None,
        Some(Ok(st)) => st,
        Some(Err(e)) => {
            spent();
            let _ = std::fs::remove_file(note_path(path));
            return Some(Err(Unrestored::Unusable(e)));
        }
    };
    let reseed = reseed_marker(path).is_file();
    let restored = live::restore(rt, req, &st).and_then(|(mut s, n)| {
        if reseed {
            rt.reseed(&mut s)?;
        }
        Ok((s, n))
    });
    let (session, mut n) = match restored {
        Ok(r) => r,
        Err(e) => {
            put_back();
            return Some(Err(Unrestored::Kept(e.to_string())));
        }
    };
    spent();
    let mut notes: Vec<String> = take_text(&note_path(path)).into_iter().collect();
    if from == before.as_path() {
        notes.push(format!(
            "the server stopped during a {} call without shutting down cleanly; variables are \
             as of the turn before that call",
            rt.language().name()
        ));
    }
    notes.append(&mut n);
    Some(Ok((session, notes)))
}

/// Where and when a call's session is saved on disk.
pub struct Persistence<'a> {
    /// Its state file.
    pub state: &'a Path,
    /// Save it after the call (`WASMBOX_SAVE_EVERY_CALL`).
    pub save_after: bool,
    /// Sandboxes outlive the server: a stop mid-call must leave the turn before, or a note.
    pub durable: bool,
    /// What a save must fit: the session's cap and its owner's budget.
    pub gate: &'a dyn StateGate,
}

impl Slot {
    /// Whether a session is live in the slot (it may have ended in its last call).
    pub fn is_live(&self) -> bool {
        matches!(self.state, State::Live { .. })
    }

    /// Why the last session ended, until the next call has said so.
    pub fn ended(&self) -> Option<&str> {
        match &self.state {
            State::Ended(why) => Some(why),
            _ => None,
        }
    }

    /// Whether the state file holds the live session as it is (copying the file copies it).
    pub fn saved_as_is(&self) -> bool {
        matches!(self.state, State::Live { saved: true, .. })
    }

    /// How long the live session has been idle; `None` with none live.
    pub fn idle_for(&self) -> Option<std::time::Duration> {
        match (&self.state, self.last_used) {
            (State::Live { .. }, Some(t)) => Some(t.elapsed()),
            _ => None,
        }
    }

    /// Saves the live session to `path` unless the file already holds it as it is; the session
    /// lives on. Returns the file's size.
    pub fn save(
        &mut self,
        rt: &dyn SessionRuntime,
        path: &Path,
        gate: &dyn StateGate,
    ) -> Result<u64, SlotError> {
        let State::Live {
            session,
            saved,
            marked,
        } = &mut self.state
        else {
            return Err(SlotError::NotLive);
        };
        if *saved && let Ok(m) = std::fs::metadata(path) {
            return Ok(m.len());
        }
        let span = tracing::debug_span!(
            "session.save",
            language = rt.language().name(),
            bytes = tracing::field::Empty
        );
        let s = span.in_scope(|| save(rt, session, path, gate))?;
        span.record("bytes", s.bytes);
        *saved = true;
        if std::mem::take(marked) {
            let _ = std::fs::remove_file(lost_marker(path));
        }
        Ok(s.bytes)
    }

    /// Saves the live session to `path` and frees its instance: the next call restores it.
    /// A session that cannot be saved stays live.
    pub fn swap_out(
        &mut self,
        rt: &dyn SessionRuntime,
        path: &Path,
        gate: &dyn StateGate,
    ) -> Result<u64, SlotError> {
        let bytes = self.save(rt, path, gate)?;
        self.state = State::Empty;
        Ok(bytes)
    }

    fn live(&mut self) -> Result<&mut Session, SlotError> {
        match &mut self.state {
            State::Live { session, .. } => Ok(session),
            _ => Err(SlotError::NotLive),
        }
    }

    /// Writes the live session to `to`, another sandbox's (a snapshot's) file, leaving this
    /// slot's own file and state as they are.
    pub fn save_copy(
        &mut self,
        rt: &dyn SessionRuntime,
        to: &Path,
        gate: &dyn StateGate,
    ) -> Result<u64, SlotError> {
        save(rt, self.live()?, to, gate).map(|s| s.bytes)
    }

    /// Copies the live session into `target` (another sandbox's slot) for `req`'s place, with
    /// random generators of its own. Runs wasm (the reseed): call it on a guest thread.
    pub fn fork_into(
        &mut self,
        rt: &dyn SessionRuntime,
        req: &ExecRequest,
        target: &mut Slot,
    ) -> Result<Vec<String>, SlotError> {
        let (mut child, notes) = live::fork(rt, self.live()?, req).map_err(SlotError::refused)?;
        rt.reseed(&mut child).map_err(SlotError::refused)?;
        target.state = State::Live {
            session: child,
            saved: false,
            marked: false,
        };
        Ok(notes)
    }

    /// The session a call runs in: the live one, else the saved one restored, else a fresh one
    /// (with notes on what earlier state is gone). Errors leave the slot as it was.
    fn open(
        &mut self,
        rt: &dyn SessionRuntime,
        req: &ExecRequest,
        state_path: &Path,
        notes: &mut Vec<String>,
    ) -> crate::Result<()> {
        if matches!(&self.state, State::Live { session, .. } if session.alive()) {
            return Ok(());
        }
        let name = rt.language().name();
        let session = match restore(rt, req, state_path) {
            Some(Ok((s, mut n))) => {
                notes.append(&mut n);
                s
            }
            Some(Err(Unrestored::Kept(why))) => {
                return Err(crate::Error::wasm(format!(
                    "the saved {name} session could not be restored now ({why}); it is kept on disk and the next call tries again (files in /workspace are unaffected)"
                )));
            }
            Some(Err(Unrestored::Unusable(why))) => {
                tracing::warn!("a saved {name} session could not be restored: {why}");
                notes.push(format!(
                    "the saved {name} session could not be restored ({why}); this call ran in a fresh one, so earlier variables are gone (files in /workspace remain)"
                ));
                rt.start(req)?
            }
            None => {
                if let Some(why) = take_lost(state_path) {
                    notes.push(format!(
                        "the {name} session was not saved when the server last stopped ({why}); this call ran in a fresh one, so earlier variables are gone (files in /workspace remain)"
                    ));
                }
                rt.start(req)?
            }
        };
        if let State::Ended(why) = &self.state {
            notes.insert(0, format!(
                "the previous {name} session ended ({why}); this call ran in a fresh one, so earlier variables are gone (files in /workspace remain)"
            ));
        }
        // A session that died outside a call keeps its marker: its turns are still unsaved.
        let marked = matches!(self.state, State::Live { marked: true, .. });
        self.state = State::Live {
            session,
            saved: false,
            marked,
        };
        Ok(())
    }

    /// Runs one call in a sandbox's session for `rt`'s language: restores the saved session or
    /// starts one if there is none live (and says so when earlier state is gone), and reports when
    /// this call ended it.
    pub fn call(
        &mut self,
        rt: &dyn SessionRuntime,
        req: &ExecRequest,
        rich: bool,
        disk: &Persistence,
    ) -> crate::Result<ExecResult> {
        let state_path = disk.state;
        let name = rt.language().name();
        let mut notes = Vec::new();
        self.open(rt, req, state_path, &mut notes)?;
        let State::Live {
            session,
            saved,
            marked,
        } = &mut self.state
        else {
            unreachable!("open leaves a live session");
        };
        // What a stop during this call leaves: the saved turn before it, or a note that the
        // session's variables are gone.
        let before = before_path(state_path);
        let mut kept_before = false;
        if disk.durable {
            // Before `.before` is there to be removed after the call: a stop between then and the
            // next save finds the marker (a stop during the call finds `.before`, which wins).
            if !*marked {
                note_lost(
                    state_path,
                    "the server stopped without saving it: it was killed or crashed",
                );
                *marked = true;
            }
            if std::mem::take(saved) {
                kept_before = std::fs::rename(state_path, &before).is_ok();
            }
        } else {
            *saved = false;
        }
        // A panic inside a host function leaves the session's store in an unknown state: drop the
        // session (its files stay) and fail this call only.
        let run =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.call(session, req, rich)));
        let mut r = match run {
            Ok(r) => r,
            Err(_) => {
                forget(state_path);
                self.state = State::Ended("wasmbox failed inside it (a host panic)".into());
                return Err(crate::Error::wasm(format!(
                    "the execution failed inside wasmbox (a host panic); the {name} session was discarded, files in /workspace remain"
                )));
            }
        };
        if !session.alive() {
            let why = match r.limit {
                Some(l) => format!("it hit the {} limit", l.as_str()),
                None if r.exit_code == EXIT_KILLED => "it was stopped".to_string(),
                None if r.exit_code == EXIT_CANCELLED => {
                    "its call was cancelled by the client".to_string()
                }
                None => format!("it exited with status {}", r.exit_code),
            };
            let shutdown = req.place.as_ref().and_then(|p| p.stop.reason())
                == Some(crate::engine::limits::StopReason::Shutdown);
            if shutdown && kept_before {
                // The server stops: the next one restores the turn before this call.
                keep_before(
                    state_path,
                    &format!(
                        "the {name} call running when the server stopped was ended; variables are \
                         as of the turn before it"
                    ),
                );
                notes.push(format!(
                    "the {name} session ended ({why}); the next server restores it as of the turn before this call"
                ));
                self.state = State::Empty;
            } else {
                forget(state_path);
                notes.push(format!(
                    "the {name} session ended ({why}); the next call starts a fresh one"
                ));
                self.state = State::Ended(why);
            }
        } else {
            if kept_before {
                let _ = std::fs::remove_file(&before);
            }
            if disk.save_after
                && let Err(e) = self.save(rt, state_path, disk.gate)
            {
                notes.push(format!(
                    "the {name} session could not be saved after this call: {e}"
                ));
            }
        }
        self.last_used = Some(std::time::Instant::now());
        notes.append(&mut r.notes);
        r.notes = notes;
        Ok(r)
    }
}

/// Drops what disk holds of an ended session: the next call starts fresh, as its note says.
fn forget(state_path: &Path) {
    for p in [
        state_path.to_path_buf(),
        before_path(state_path),
        restoring_path(state_path),
        lost_marker(state_path),
    ] {
        let _ = std::fs::remove_file(p);
    }
}
