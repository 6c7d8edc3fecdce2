//! A sandbox's sessions on disk: written when the sandbox is paused, when the server shuts down
//! and (`WASMBOX_SAVE_EVERY_CALL`) after each call; read back by the next call, in this server
//! or the next one. A file is only ever restored into the image it was saved from
//! ([`crate::engine::state`] checks the key, the format and a checksum).

use std::io::Read;
use std::path::Path;

use super::Slot;
use crate::engine::state::InstanceState;
use crate::lang::guest::{EXIT_CANCELLED, EXIT_KILLED};
use crate::lang::session::{self, Session, SessionRuntime};
use crate::lang::{ExecRequest, ExecResult};

/// Largest state file read back: a 4 GiB memory, uncompressed, and its framing. The file is the
/// server's own, but its size still does not get to decide what the host allocates.
const MAX_STATE_FILE: u64 = (4 << 30) + (1 << 20);

/// What saving a session wrote.
#[derive(Clone, Debug)]
pub struct Saved {
    pub bytes: u64,
    pub pages: u64,
}

/// Captures `session` and writes it to `path` (atomically, owner-only). The session lives on;
/// the caller drops it when saving is to free it.
pub fn save(rt: &dyn SessionRuntime, session: &mut Session, path: &Path) -> Result<Saved, String> {
    let key = rt.state_key()?;
    let st = session.capture().map_err(|e| e.to_string())?;
    write(&st, &key, path)
}

/// Writes a captured state.
pub fn write(
    st: &InstanceState,
    key: &crate::engine::state::StateKey,
    path: &Path,
) -> Result<Saved, String> {
    let bytes = st.encode(key);
    if let Some(dir) = path.parent() {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    super::write_atomic(path, &bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(Saved {
        bytes: bytes.len() as u64,
        pages: st.saved_pages(),
    })
}

/// Reads and checks the state at `path` for `rt`; `None` when there is none. The file is
/// removed either way: a restored session moves on from it, and one that cannot be used would
/// fail again.
pub fn read(rt: &dyn SessionRuntime, path: &Path) -> Option<Result<InstanceState, String>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("its state file could not be opened: {e}"))),
    };
    let mut bytes = Vec::new();
    let read = file
        .take(MAX_STATE_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("its state file could not be read: {e}"));
    let _ = std::fs::remove_file(path);
    Some(read.and_then(|n| {
        if n as u64 > MAX_STATE_FILE {
            return Err("its state file is larger than any session's state".into());
        }
        let key = rt.state_key()?;
        InstanceState::decode(&bytes, &key).map_err(|e| e.to_string())
    }))
}

/// Beside where a session would be saved: why it could not be (it ended as the server
/// stopped), for the next server's first call to say.
fn lost_marker(state_path: &Path) -> std::path::PathBuf {
    state_path.with_extension("lost")
}

/// Records that the session saved at `state_path` ended, and why, instead of being saved.
pub fn note_lost(state_path: &Path, why: &str) {
    let _ = std::fs::create_dir_all(state_path.parent().unwrap_or(Path::new(".")));
    let _ = super::write_atomic(&lost_marker(state_path), why.as_bytes());
}

/// Why a session was lost at the last stop, once (the marker is removed); short and bounded.
fn take_lost(state_path: &Path) -> Option<String> {
    let marker = lost_marker(state_path);
    let mut why = String::new();
    let read = std::fs::File::open(&marker)
        .and_then(|f| f.take(512).read_to_string(&mut why))
        .is_ok();
    let _ = std::fs::remove_file(&marker);
    read.then_some(why)
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

/// The saved session at `path` restored for `req`, and notes on what it could not keep; `None`
/// when nothing is saved there.
pub fn restore(
    rt: &dyn SessionRuntime,
    req: &ExecRequest,
    path: &Path,
) -> Option<Result<(Session, Vec<String>), String>> {
    let marker = reseed_marker(path);
    let reseed = marker.is_file();
    let _ = std::fs::remove_file(&marker);
    let st = match read(rt, path)? {
        Ok(st) => st,
        Err(e) => return Some(Err(e)),
    };
    Some(
        session::restore(rt, req, &st)
            .and_then(|(mut s, n)| {
                if reseed {
                    rt.reseed(&mut s)?;
                }
                Ok((s, n))
            })
            .map_err(|e| e.to_string()),
    )
}

/// A copy of `session` for `req`'s place, with random generators of its own. Runs wasm (the
/// reseed): call it on a guest thread.
pub fn fork(
    rt: &dyn SessionRuntime,
    session: &mut Session,
    req: &ExecRequest,
) -> Result<(Session, Vec<String>), String> {
    let (mut child, notes) = session::fork(rt, session, req).map_err(|e| e.to_string())?;
    rt.reseed(&mut child).map_err(|e| e.to_string())?;
    Ok((child, notes))
}

/// Runs one call in a sandbox's session for `rt`'s language: restores the saved session or
/// starts one if there is none live (and says so when earlier state is gone), and reports when
/// this call ended it. With `save_after`, the session is saved after the call.
pub fn call(
    slot: &mut Slot,
    rt: &dyn SessionRuntime,
    req: &ExecRequest,
    rich: bool,
    state_path: &Path,
    save_after: bool,
) -> crate::Result<ExecResult> {
    let name = rt.language().name();
    let mut notes = Vec::new();
    if slot.session.as_ref().is_none_or(|s| !s.alive()) {
        if let Some(why) = slot.ended.take() {
            notes.push(format!(
                "the previous {name} session ended ({why}); this call ran in a fresh one, so earlier variables are gone (files in /workspace remain)"
            ));
        }
        let session = match restore(rt, req, state_path) {
            Some(Ok((s, mut n))) => {
                notes.append(&mut n);
                s
            }
            Some(Err(why)) => {
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
        slot.session = Some(session);
    }
    let session = slot.session.as_mut().expect("just started");
    // A panic inside a host function leaves the session's store in an unknown state: drop the
    // session (its files stay) and fail this call only.
    let run =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.call(session, req, rich)));
    let mut r = match run {
        Ok(r) => r,
        Err(_) => {
            slot.session = None;
            slot.ended = Some("wasmbox failed inside it (a host panic)".into());
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
        notes.push(format!(
            "the {name} session ended ({why}); the next call starts a fresh one"
        ));
        slot.ended = Some(why);
        slot.session = None;
        // Saved after an earlier call: the next one starts fresh, as the note says.
        let _ = std::fs::remove_file(state_path);
    } else if save_after && let Err(e) = save(rt, session, state_path) {
        notes.push(format!(
            "the {name} session could not be saved after this call: {e}"
        ));
    }
    slot.last_used = Some(std::time::Instant::now());
    notes.append(&mut r.notes);
    r.notes = notes;
    Ok(r)
}
