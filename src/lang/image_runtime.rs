//! The runtime a pre-initialised image makes; Python and JavaScript are both one. The image is
//! pre-linked once, a pool keeps instances of it ready for one-shots, a spare is kept for
//! restores and forks, and each session is an instance of its own. What differs per language
//! (the guest's layout, how a fresh instance is readied, how code runs in it) is its
//! [`Flavour`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::{Engine, Instance, InstancePre, Linker, Module};

use super::guest::{Guest, GuestSpec, GuestState, engine_err};
use super::live::{Session, SessionRuntime, StateKeyCell, StateKeyError};
use super::mounts::{Layout, unlike_pooled};
use super::spare::{Spares, rebind_with};
use super::{ExecRequest, ExecResult, Language, Place};
use super::{LangError as Error, Result};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::pool::{IdleWork, Pool, PoolStats};
use crate::engine::state::{Pristine, Reset, StateKey};
use crate::engine::threads::{drop_later, on_guest_stack, reap_later};

/// Ready instances kept per language, and the threads that make them.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Ready instances kept (0: every one-shot instantiates on demand).
    pub size: usize,
    pub refill_threads: usize,
}

/// What one language adds to [`ImageRuntime`].
pub trait Flavour: Send + Sync + Sized + 'static {
    const LANGUAGE: Language;
    /// What calibration measured to ready instances faster; the default: nothing measured.
    type Calibration: Default + Send + Sync;

    fn spec(&self) -> GuestSpec<'_>;
    fn linker(engine: &Engine) -> Result<Linker<GuestState>>;
    /// Measures, on throwaway instances, what readies later ones faster.
    fn calibrate(shared: &Shared<Self>) -> Result<Self::Calibration>;
    /// Readies a fresh instance for its first code.
    fn ready(shared: &Shared<Self>, guest: &mut Guest, instance: &Instance) -> Result<()>;
    /// Gives a spare instance the pages a first run touches, as pooled instances have them.
    fn prefault(shared: &Shared<Self>, guest: &mut Guest, instance: &Instance);
    /// Work for pooled instances once the pool is full, if the language has any.
    fn polish(_shared: &Arc<Shared<Self>>) -> Option<IdleWork<Ready, Error>> {
        None
    }
    /// Runs an armed one-shot in a ready instance, which is then reset for another or dropped.
    fn oneshot(guest: &mut Guest, instance: &Instance, req: &ExecRequest) -> ExecResult;
    /// Runs a call in a session that is armed and alive.
    fn call(s: &mut Session, req: &ExecRequest, rich: bool) -> ExecResult;
    fn reseed(s: &mut Session) -> Result<()>;
}

/// An instance readied for its first code, which has never run user code.
pub struct Ready {
    pub guest: Guest,
    pub instance: Instance,
}

/// What every instance is made from; the pool's and spare's threads hold it too.
pub struct Shared<F: Flavour> {
    engine: Engine,
    pre: InstancePre<GuestState>,
    /// Instances start from the pre-initialised image (false if it could not be built).
    pub image: bool,
    pub flavour: F,
    pub calibration: F::Calibration,
    state_key: Arc<StateKeyCell>,
}

impl<F: Flavour> Shared<F> {
    /// A fresh instance in `place` (or fresh directories), not run and not armed, its clock
    /// reading `clock`.
    pub fn instantiate_at(
        &self,
        place: Option<&Place>,
        clock: Duration,
    ) -> Result<(Guest, Instance)> {
        self.instantiate_for(place, clock, None)
    }

    /// As [`Shared::instantiate_at`], lent `mounts` instead of the server's folders.
    pub fn instantiate_for(
        &self,
        place: Option<&Place>,
        clock: Duration,
        mounts: Option<&'static Layout>,
    ) -> Result<(Guest, Instance)> {
        let mut spec = self.flavour.spec();
        if let Some(m) = mounts {
            spec.mounts = m;
        }
        let mut guest = Guest::unarmed_at(&self.engine, &spec, &BTreeMap::new(), place, clock)?;
        let instance = self.pre.instantiate(&mut guest.store).map_err(engine_err)?;
        Ok((guest, instance))
    }

    pub fn instantiate_in(&self, place: Option<&Place>) -> Result<(Guest, Instance)> {
        self.instantiate_at(place, Duration::ZERO)
    }

    /// A fresh instance in `place`, readied for its first code.
    pub fn ready_in(&self, place: Option<&Place>) -> Result<Ready> {
        self.ready_for(place, None)
    }

    /// As [`Shared::ready_in`], lent `mounts` instead of the server's folders.
    pub fn ready_for(
        &self,
        place: Option<&Place>,
        mounts: Option<&'static Layout>,
    ) -> Result<Ready> {
        let (mut guest, instance) = self.instantiate_for(place, Duration::ZERO, mounts)?;
        F::ready(self, &mut guest, &instance)?;
        Ok(Ready { guest, instance })
    }
}

/// A loaded runtime of one language: its image pre-linked once, a pool of ready instances and a
/// spare for restores and forks.
pub struct ImageRuntime<F: Flavour> {
    shared: Arc<Shared<F>>,
    pool: Arc<Pool<Ready, Error>>,
    spares: Spares,
    /// Set once the image is known to be recyclable (checked in the background after load);
    /// `None` inside: it is not, or recycling is off.
    recycler: Arc<OnceLock<Option<Recycler>>>,
}

/// Most host pages a spent one-shot instance may have made its own and still be reset: beyond
/// this (8 MiB), copying them back costs more than a new instance.
const RECYCLE_MOST_PAGES: u64 = 2048;

/// A never-run instance of the image, kept to reset spent one-shot instances from
/// (`engine::state::reset`): their next guest then finds memory and globals byte for byte as a
/// new instance's, and a fresh store state (`Guest::recycle`).
struct Recycler {
    pristine: Mutex<(Guest, wasmtime::Memory)>,
    reset: Pristine,
}

impl Recycler {
    /// A recycler for `shared`'s image, if its module (the code at `code`) keeps no state a
    /// reset would miss.
    fn new<F: Flavour>(shared: &Shared<F>, code: &Path) -> Result<Self> {
        let wasm = std::fs::read(code)
            .map_err(|e| Error::wasm(format!("reading {}: {e}", code.display())))?;
        let beyond = crate::engine::globals::state_beyond_memory(&wasm)?;
        drop(wasm);
        if !beyond.is_empty() {
            return Err(Error::wasm(format!(
                "its module can change more than memory and globals: {}",
                beyond.join(", ")
            )));
        }
        let (mut guest, instance) = shared.instantiate_in(None)?;
        let memory = super::live::exported_memory(&mut guest, &instance)?;
        let reset = Pristine::of(&mut guest.store, &instance, memory)?;
        Ok(Self {
            pristine: Mutex::new((guest, memory)),
            reset,
        })
    }

    /// Resets `guest`'s instance from the pristine one and readies it as a new one; false when
    /// it cannot be (grown memory, too many pages), and it is then to be dropped.
    fn recycle<F: Flavour>(
        &self,
        shared: &Shared<F>,
        guest: &mut Guest,
        instance: &Instance,
    ) -> Result<bool> {
        let memory = super::live::exported_memory(guest, instance)?;
        let reset = {
            let pristine = self.pristine.lock().unwrap();
            self.reset.reset(
                &pristine.0.store,
                pristine.1,
                &mut guest.store,
                instance,
                memory,
                RECYCLE_MOST_PAGES,
            )
        }?;
        if !matches!(reset, Reset::Done { .. }) {
            tracing::trace!(
                "{}: a spent instance is not reset: {reset:?}",
                F::LANGUAGE.as_str()
            );
            return Ok(false);
        }
        guest.recycle(&shared.flavour.spec())?;
        F::ready(shared, guest, instance)?;
        Ok(true)
    }
}

impl<F: Flavour> ImageRuntime<F> {
    /// Loads the image `built` gave (the module cache's, or built now), else the plain module at
    /// `plain` (each instance then costs `without_image`); measures what readies instances
    /// faster, and starts the pool and the spare.
    pub(crate) fn assemble(
        engine: &Engine,
        cache: &ModuleCache,
        built: Option<Result<((Module, Origin), String)>>,
        plain: &Path,
        without_image: &str,
        flavour: F,
        pool: &PoolOptions,
    ) -> Result<(Self, Origin)> {
        let name = F::LANGUAGE.as_str();
        let image: Option<((Module, Origin), PathBuf)> = match built {
            Some(Ok((loaded, key))) => Some((loaded, cache.compiled_path(engine, &key))),
            Some(Err(e)) => {
                tracing::warn!(
                    "{name}: the pre-initialised image could not be built ({e}); falling back \
                     to the plain module, where {without_image}"
                );
                None
            }
            None => None,
        };
        let ((module, origin), compiled_image) = match image {
            Some((loaded, path)) => (loaded, Some(path)),
            None => (cache.load(engine, plain, name)?, None),
        };
        let pre = F::linker(engine)?
            .instantiate_pre(&module)
            .map_err(engine_err)?;
        let mut shared = Shared {
            engine: engine.clone(),
            pre,
            image: compiled_image.is_some(),
            flavour,
            calibration: F::Calibration::default(),
            state_key: Arc::new(StateKeyCell::for_image(F::LANGUAGE, compiled_image)),
        };
        match on_guest_stack(&format!("{name} calibration"), || F::calibrate(&shared)) {
            Ok(c) => shared.calibration = c,
            Err(e) => tracing::info!("{name}: instances are readied without calibration: {e}"),
        }
        let shared = Arc::new(shared);
        let made = shared.clone();
        let polish = F::polish(&shared);
        let recycling =
            pool.size > 0 && std::env::var_os("WASMBOX_RECYCLE").is_none_or(|v| v != "0");
        let pool = Arc::new(Pool::new(
            name,
            pool.size,
            pool.refill_threads,
            move || made.ready_in(None),
            polish,
        ));
        let recycler = Arc::new(OnceLock::new());
        if recycling {
            let (cell, s, code) = (recycler.clone(), shared.clone(), plain.to_path_buf());
            std::thread::Builder::new()
                .name(format!("wasmbox-{name}-recycler"))
                .spawn(move || {
                    super::super::engine::threads::idle_priority();
                    let start = std::time::Instant::now();
                    let r = Recycler::new(&s, &code)
                        .inspect(|_| {
                            tracing::debug!(
                                "{name}: one-shot instances are reused (checked in {:?})",
                                start.elapsed()
                            )
                        })
                        .inspect_err(|e| {
                            tracing::info!("{name}: one-shot instances are not reused: {e}")
                        })
                        .ok();
                    let _ = cell.set(r);
                })
                .map_err(|e| Error::wasm(format!("spawning the recycler thread: {e}")))?;
        } else {
            let _ = recycler.set(None);
        }
        let (made, bound) = (shared.clone(), shared.clone());
        let spares = Spares::new(
            &format!("{name}-spare"),
            move || {
                let (mut guest, instance) = made.instantiate_at(None, Duration::ZERO)?;
                F::prefault(&made, &mut guest, &instance);
                Ok((guest, instance))
            },
            move |guest, place, clock| rebind_with(&bound.flavour.spec(), guest, place, clock),
        );
        Ok((
            Self {
                shared,
                pool,
                spares,
                recycler,
            },
            origin,
        ))
    }

    /// Whether instances start from the pre-initialised image.
    pub fn has_image(&self) -> bool {
        self.shared.image
    }

    pub(crate) fn shared(&self) -> &Shared<F> {
        &self.shared
    }

    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            pristine: usize::from(matches!(self.recycler.get(), Some(Some(_)))),
            ..self.pool.stats()
        }
    }

    /// The counters of the spare instance kept for restores and forks, once there is one.
    pub fn spare_stats(&self) -> Option<PoolStats> {
        self.spares.stats()
    }

    /// Waits until the pool is full (tests and benches measure the hit path with this).
    pub fn wait_pool_full(&self, timeout: Duration) -> bool {
        self.pool.wait_full(timeout)
    }

    /// Waits until the spare instance for restores and forks is made ([`Spares::wait_ready`]).
    pub fn wait_spare(&self, timeout: Duration) -> bool {
        self.spares.wait_ready(timeout)
    }

    /// Runs `req` in a ready instance (from the pool, or made now; in a sandbox's directories
    /// one made for it, as pooled ones have their own), then resets a pooled one for the next
    /// one-shot or drops it. Blocking: call it on a guest thread.
    pub fn run_oneshot(&self, req: &ExecRequest) -> Result<ExecResult> {
        let pooled = req.place.is_none() && unlike_pooled(&req.owner).is_none();
        let Ready {
            mut guest,
            instance,
        } = match (&req.place, unlike_pooled(&req.owner)) {
            (None, None) => self.pool.take_or_make()?,
            (place, mounts) => self.shared.ready_for(place.as_ref(), mounts)?,
        };
        guest.arm(req);
        let r = F::oneshot(&mut guest, &instance, req);
        guest.close_files();
        match (pooled, self.recycler.get()) {
            (true, Some(Some(_))) => self.recycle_later(guest, instance),
            (true, _) => {
                drop_later(guest);
                self.pool.refill();
            }
            (false, _) => drop_later(guest),
        }
        Ok(r)
    }

    /// Once the reply is out, resets a spent pooled instance and puts it back in the pool (its
    /// replacement, so no refill is woken). One that cannot be reset is dropped and a refill
    /// woken; one that finds the pool full (it ran beside a call that missed) is only dropped:
    /// a wake arriving after the next call took the pooled instance would make a needless one.
    fn recycle_later(&self, mut guest: Guest, instance: Instance) {
        let (shared, pool, recycler) = (
            self.shared.clone(),
            self.pool.clone(),
            self.recycler.clone(),
        );
        reap_later(move || {
            let Some(Some(recycler)) = recycler.get() else {
                return;
            };
            let reused = recycler
                .recycle(&shared, &mut guest, &instance)
                .inspect_err(|e| tracing::debug!("a spent instance is not reset: {e}"))
                .unwrap_or(false);
            match reused {
                true => drop(pool.put(Ready { guest, instance })),
                false => {
                    drop(Ready { guest, instance });
                    pool.wake();
                }
            }
        });
    }

    /// Waits until it is known whether spent one-shot instances are reused, and says whether
    /// they are (tests and benches).
    pub fn wait_recycling(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(r) = self.recycler.get() {
                return r.is_some();
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl<F: Flavour> SessionRuntime for ImageRuntime<F> {
    fn language(&self) -> Language {
        F::LANGUAGE
    }

    /// An instance of its own in `req`'s place, readied like a pooled one; `req` gives the
    /// session's env and limits (its code is not run).
    fn start(&self, req: &ExecRequest) -> Result<Session> {
        self.shared.state_key.prepare();
        let Ready {
            mut guest,
            instance,
        } = self
            .shared
            .ready_for(req.place.as_ref(), unlike_pooled(&req.owner))?;
        guest.arm(req);
        Ok(Session::new(guest, instance))
    }

    fn instantiate(&self, req: &ExecRequest, clock: Duration) -> Result<(Guest, Instance)> {
        self.shared
            .instantiate_for(req.place.as_ref(), clock, unlike_pooled(&req.owner))
    }

    /// Runs `req` with its limits, env and working directory, applied first: a sandbox's env
    /// may have changed since the last call.
    fn call(&self, s: &mut Session, req: &ExecRequest, rich: bool) -> ExecResult {
        s.guest.arm(req);
        if !s.alive {
            return s.ended(F::LANGUAGE);
        }
        F::call(s, req, rich)
    }

    fn state_key(&self) -> std::result::Result<Arc<StateKey>, StateKeyError> {
        self.shared.state_key.get()
    }

    fn reseed(&self, s: &mut Session) -> Result<()> {
        F::reseed(s)
    }

    fn spares(&self) -> &Spares {
        &self.spares
    }
}
