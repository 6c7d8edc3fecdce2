//! A live interpreter a sandbox keeps between calls. Python and JavaScript share this shape, so
//! saving a session's state and restoring it are written once, here.
//!
//! A live interpreter is an instance of its runtime's pre-initialised image; its state is what it holds
//! that the image does not (linear-memory pages and globals, `engine::state`) plus its clock.
//! Restoring makes a fresh instance of the same image and writes that state over it.

use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

use wasmtime::{Instance, Memory};

use super::guest::Guest;
use super::spare::FreshInstance;
use super::{ExecRequest, ExecResult, LangError as Error, Language, Result};
use crate::engine::state::{self, InstanceState, StateKey};

/// `meta` key of a state: regular files the guest held open when it was saved.
const OPEN_FILES: &str = "open_files";

/// A sandbox's interpreter for one language. After a trap, a limit or an exit it is no longer
/// [`alive`](Session::alive): its state is undefined and it must be replaced.
pub struct Session {
    pub(super) guest: Guest,
    pub(super) instance: Instance,
    pub(super) alive: bool,
}

impl Session {
    pub(super) fn new(guest: Guest, instance: Instance) -> Self {
        Self {
            guest,
            instance,
            alive: true,
        }
    }

    pub fn alive(&self) -> bool {
        self.alive
    }

    /// The result of a call on a session that has ended.
    pub(super) fn ended(&mut self, language: Language) -> ExecResult {
        self.guest.result(
            Err(wasmtime::format_err!(
                "this {} session has ended; start a new one",
                language.name()
            )),
            language,
        )
    }

    fn memory(&mut self) -> Result<Memory> {
        exported_memory(&mut self.guest, &self.instance)
    }

    /// The interpreter's state as of its last call. Only between calls: the caller holds the
    /// session exclusively, so no call runs meanwhile.
    pub fn capture(&mut self) -> Result<InstanceState> {
        if !self.alive {
            return Err(Error::InvalidArgument(
                "the session has ended; there is no state to save".into(),
            ));
        }
        let memory = self.memory()?;
        let mut st = state::capture(&mut self.guest.store, &self.instance, memory)?;
        st.clock_ns = self.guest.clock_ns();
        let open = self.guest.open_files();
        if open > 0 {
            st.meta.insert(OPEN_FILES.into(), open.to_string());
        }
        Ok(st)
    }
}

/// The linear memory every runtime's module exports as `memory`.
pub(super) fn exported_memory(guest: &mut Guest, instance: &Instance) -> Result<Memory> {
    instance
        .get_memory(&mut guest.store, "memory")
        .ok_or_else(|| Error::wasm("the runtime exports no memory"))
}

/// What a runtime that keeps sessions offers a sandbox.
pub trait SessionRuntime: Send + Sync {
    fn language(&self) -> Language;

    /// A new session in `req`'s place, ready for its first call.
    fn start(&self, req: &ExecRequest) -> Result<Session>;

    /// A new instance of the image in `req`'s place, not run, its clock reading `clock`.
    fn instantiate(&self, req: &ExecRequest, clock: Duration) -> Result<(Guest, Instance)>;

    /// Runs `req` in the session (`rich`: collect a final table too, where the language has
    /// one).
    fn call(&self, session: &mut Session, req: &ExecRequest, rich: bool) -> ExecResult;

    /// What this runtime's states are tied to; why there is none when sessions cannot be saved
    /// (the image could not be built).
    fn state_key(&self) -> std::result::Result<Arc<StateKey>, StateKeyError>;

    /// Gives a copied session random generators of its own, so a fork does not draw its
    /// parent's numbers.
    fn reseed(&self, session: &mut Session) -> Result<()>;

    /// Instances made ahead for restores and copies.
    fn spares(&self) -> &super::spare::Spares;
}

/// An instance, not run, for a state of `memory_pages` in `req`'s place: the runtime's spare
/// when it has one that fits, else a fresh one.
fn instance_for(
    rt: &dyn SessionRuntime,
    req: &ExecRequest,
    clock: Duration,
    memory_pages: u64,
) -> Result<FreshInstance> {
    // Spares are made with the server's lent folders; a token lent others gets a fresh one.
    let spare = match super::mounts::unlike_pooled(&req.owner) {
        None => rt.spares().take(req.place.as_ref(), clock, memory_pages),
        Some(_) => None,
    };
    match spare {
        Some(made) => Ok(made),
        None => rt
            .instantiate(req, clock)
            .map(|(guest, instance)| FreshInstance {
                guest,
                instance,
                ahead: Vec::new(),
            }),
    }
}

/// A session of `rt` holding `st`, and notes on what it could not keep.
pub fn restore(
    rt: &dyn SessionRuntime,
    req: &ExecRequest,
    st: &InstanceState,
) -> Result<(Session, Vec<String>)> {
    let clock = Duration::from_nanos(st.clock_ns);
    let FreshInstance {
        mut guest,
        instance,
        ahead,
    } = instance_for(rt, req, clock, st.memory_pages())?;
    let memory = exported_memory(&mut guest, &instance)?;
    state::restore(&mut guest.store, &instance, memory, st, &ahead)?;
    rt.spares().learn(st, None);
    let notes = open_files_note(rt, st.meta.get(OPEN_FILES).map(String::as_str), "saved");
    Ok((Session::new(guest, instance), notes))
}

/// A session of `rt` in `req`'s place holding what `parent` holds, its pages copied straight
/// from `parent`'s memory, and notes on what it could not keep. Only between calls of
/// `parent`, which the caller holds exclusively.
pub fn fork(
    rt: &dyn SessionRuntime,
    parent: &mut Session,
    req: &ExecRequest,
) -> Result<(Session, Vec<String>)> {
    if !parent.alive {
        return Err(Error::InvalidArgument(
            "the session has ended; there is nothing to copy".into(),
        ));
    }
    let from = parent.memory()?;
    let clock = Duration::from_nanos(parent.guest.clock_ns());
    let FreshInstance {
        mut guest,
        instance,
        ahead,
    } = instance_for(rt, req, clock, from.size(&parent.guest.store))?;
    let to = exported_memory(&mut guest, &instance)?;
    let state::Copied {
        state: copied,
        mapped,
    } = state::copy(
        &mut parent.guest.store,
        &parent.instance,
        from,
        &mut guest.store,
        &instance,
        to,
        &ahead,
    )?;
    rt.spares().learn(&copied, Some(&mapped));
    let open = parent.guest.open_files();
    let notes = open_files_note(
        rt,
        (open > 0).then(|| open.to_string()).as_deref(),
        "copied",
    );
    Ok((Session::new(guest, instance), notes))
}

/// The note on files a session held open, which a saved or copied state does not keep.
fn open_files_note(rt: &dyn SessionRuntime, open: Option<&str>, verb: &str) -> Vec<String> {
    open.map(|n| {
        format!(
            "{n} file(s) the {} session held open were closed when its state was {verb}; \
             reading or writing them again raises a bad-file-descriptor error (open them again)",
            rt.language().name()
        )
    })
    .into_iter()
    .collect()
}

/// Why a runtime's sessions cannot be saved or restored, said in the refusal.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StateKeyError {
    #[error(
        "the pre-initialised {} image could not be built, and state is saved only from it",
        .0.name()
    )]
    NoImage(Language),
    #[error("the compiled image {} could not be read: {error}", path.display())]
    Unreadable {
        path: PathBuf,
        error: Arc<std::io::Error>,
    },
}

/// The session layer words its refusals as text.
impl From<StateKeyError> for String {
    fn from(e: StateKeyError) -> Self {
        e.to_string()
    }
}

/// A runtime's [`StateKey`]: its language and the SHA-256 of its compiled image, so a state is
/// only ever restored into the very image it came from (a rebuilt image may lay memory out
/// differently). Hashed once, off the request path when [`StateKeyCell::prepare`] runs first.
pub struct StateKeyCell {
    language: Language,
    /// The compiled image, or why sessions of this runtime cannot be saved.
    image: std::result::Result<PathBuf, StateKeyError>,
    key: OnceLock<std::result::Result<Arc<StateKey>, StateKeyError>>,
    preparing: std::sync::atomic::AtomicBool,
}

impl StateKeyCell {
    pub fn new(language: Language, compiled_image: PathBuf) -> Self {
        Self {
            language,
            image: Ok(compiled_image),
            key: OnceLock::new(),
            preparing: Default::default(),
        }
    }

    /// The cell of an image runtime (Python, JavaScript): keyed by its compiled image, or, when
    /// the image could not be built (`None`), unavailable, since state is saved only from it.
    pub fn for_image(language: Language, compiled_image: Option<PathBuf>) -> Self {
        match compiled_image {
            Some(path) => Self::new(language, path),
            None => Self {
                language,
                image: Err(StateKeyError::NoImage(language)),
                key: OnceLock::new(),
                preparing: Default::default(),
            },
        }
    }

    pub fn get(&self) -> std::result::Result<Arc<StateKey>, StateKeyError> {
        self.key
            .get_or_init(|| {
                let path = self.image.as_ref().map_err(Clone::clone)?;
                let sha = sha256_file(path).map_err(|e| StateKeyError::Unreadable {
                    path: path.clone(),
                    error: Arc::new(e),
                })?;
                Ok(Arc::new(StateKey::new(sha, self.language.as_str())))
            })
            .clone()
    }

    /// Hashes the image now, on a low-priority thread of its own (once: when the first
    /// session starts, so one-shots never pay for it).
    pub fn prepare(self: &Arc<Self>) {
        if self.image.is_err()
            || self
                .preparing
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("wasmbox-image-hash".into())
            .spawn(move || {
                crate::engine::threads::lower_priority();
                let _ = me.get();
            });
    }
}

fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_runtime_without_its_image_says_why_state_is_not_saved() {
        for (language, name) in [
            (Language::Python, "Python"),
            (Language::JavaScript, "JavaScript"),
        ] {
            let why = StateKeyCell::for_image(language, None).get().unwrap_err();
            assert_eq!(
                why.to_string(),
                format!(
                    "the pre-initialised {name} image could not be built, and state is saved \
                     only from it"
                )
            );
        }
        let missing = std::env::temp_dir().join("wasmbox-no-such-compiled-image");
        let why = StateKeyCell::for_image(Language::Python, Some(missing))
            .get()
            .unwrap_err();
        assert!(why.to_string().contains("could not be read"), "{why}");
    }
}
