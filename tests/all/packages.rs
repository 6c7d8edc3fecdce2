//! Pure-Python packages for a sandbox's Python (`install_packages`, `packages` on one-shots,
//! `pip install` through `run_command`), over MCP with rmcp's client. Packages are code an
//! assistant brings in from outside, so the refusals (compiled wheels, a wrong hash, writes into
//! the shared store) matter as much as the installs. The wheels are built here with the zip
//! crate and served from a wheelhouse folder or a fake package index on 127.0.0.1, so every case
//! is exact and offline; one ignored test reaches the real PyPI.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

use crate::common::*;

/// The tag of a pure-Python wheel.
const ANY: &str = "py3-none-any";

/// `tinypkg`'s module: it reaches its dependency when called.
const TINYPKG: &str = "def hello():\n    import tinydep\n    return 'hi ' + tinydep.X\n";

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A wheel's file name and bytes: one module, METADATA, WHEEL and a RECORD of them all.
fn wheel_bytes(
    name: &str,
    version: &str,
    tag: &str,
    requires: &[&str],
    module_src: &str,
) -> (String, Vec<u8>) {
    let dist = name.replace('-', "_");
    let info = format!("{dist}-{version}.dist-info");
    let mut metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    for r in requires {
        metadata.push_str(&format!("Requires-Dist: {r}\n"));
    }
    // A compiled wheel says so as a real one does (its files go to platlib).
    let purelib = tag.ends_with("-none-any");
    let mut files = vec![
        (format!("{dist}/__init__.py"), module_src.to_string()),
        (format!("{info}/METADATA"), metadata),
        (
            format!("{info}/WHEEL"),
            format!(
                "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n"
            ),
        ),
    ];
    let mut record = String::new();
    for (path, content) in &files {
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(Sha256::digest(content.as_bytes()));
        record.push_str(&format!("{path},sha256={digest},{}\n", content.len()));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    files.push((format!("{info}/RECORD"), record));

    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, content) in &files {
        zip.start_file(path.as_str(), options).unwrap();
        zip.write_all(content.as_bytes()).unwrap();
    }
    let bytes = zip.finish().unwrap().into_inner();
    (format!("{dist}-{version}-{tag}.whl"), bytes)
}

/// Builds a wheel in `dir` and returns its path.
fn wheel(
    dir: &Path,
    name: &str,
    version: &str,
    tag: &str,
    requires: &[&str],
    module_src: &str,
) -> PathBuf {
    let (file_name, bytes) = wheel_bytes(name, version, tag, requires, module_src);
    let path = dir.join(file_name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `tinypkg 1.0` (needs `tinydep>=0.2`, `neverdep` on Windows only, and the bundled `six`), and
/// two `tinydep`s of which only the newer fits.
fn tiny_wheelhouse() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    wheel(
        dir.path(),
        "tinypkg",
        "1.0",
        ANY,
        &["tinydep>=0.2", "neverdep; sys_platform == \"win32\"", "six"],
        TINYPKG,
    );
    wheel(dir.path(), "tinydep", "0.1", ANY, &[], "X = 'from 0.1'\n");
    wheel(
        dir.path(),
        "tinydep",
        "0.2",
        "py2.py3-none-any",
        &[],
        "X = 'from 0.2'\n",
    );
    dir
}

/// A server that installs from `wheelhouse` only.
async fn offline_server(wheelhouse: &Path) -> Client {
    server_with_env(&[
        ("WASMBOX_WHEELHOUSE", wheelhouse.to_str().unwrap()),
        ("WASMBOX_OFFLINE", "1"),
    ])
    .await
}

async fn install(c: &Client, id: &str, packages: &[&str]) -> Value {
    ok(
        c,
        "install_packages",
        json!({"sandbox_id": id, "packages": packages}),
    )
    .await
}

/// The refusal of an install, as text.
async fn refused(c: &Client, id: &str, packages: &[&str]) -> String {
    err(
        c,
        "install_packages",
        json!({"sandbox_id": id, "packages": packages}),
    )
    .await
    .to_string()
}

/// Python in the sandbox's live session; an exception is a result, not a tool error.
async fn run_py(c: &Client, id: &str, code: &str) -> Value {
    object(
        &call(
            c,
            "execute_code",
            json!({"sandbox_id": id, "mode": "persistent", "language": "python", "code": code}),
        )
        .await,
    )
}

/// `tinypkg` imports in `id` and reaches `tinydep 0.2`.
async fn says_hello(c: &Client, id: &str) {
    let v = run_py(c, id, "import tinypkg\nprint(tinypkg.hello())").await;
    assert_eq!(v["stdout"], "hi from 0.2\n", "{id}: {v}");
}

fn no_module(v: &Value, module: &str) {
    let stderr = v["stderr"].as_str().unwrap_or_default();
    assert!(
        stderr.contains(&format!("ModuleNotFoundError: No module named '{module}'")),
        "{v}"
    );
}

/// The `(name, version)` pairs of `installed`.
fn installed(v: &Value) -> BTreeSet<(String, String)> {
    v["installed"]
        .as_array()
        .unwrap_or_else(|| panic!("no installed list: {v}"))
        .iter()
        .map(|p| {
            let field = |k: &str| {
                p[k].as_str()
                    .unwrap_or_else(|| panic!("no {k} in {p}"))
                    .to_string()
            };
            (field("name"), field("version"))
        })
        .collect()
}

fn set(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn bundled(v: &Value) -> BTreeSet<String> {
    v["bundled"]
        .as_array()
        .unwrap_or_else(|| panic!("no bundled list: {v}"))
        .iter()
        .filter_map(|p| p["name"].as_str())
        .map(str::to_ascii_lowercase)
        .collect()
}

/// Sends SIGTERM to the server this test started and waits until it has exited.
async fn stop_server(pid: u32) {
    // SAFETY: signalling the child server this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    for _ in 0..200 {
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid as i32, 0) } != 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server {pid} still running");
}

/// A wheel the fake index lists.
struct Served {
    name: String,
    version: String,
    filename: String,
    bytes: Vec<u8>,
    /// The `digests.sha256` the index gives: the file's own, unless the test wants a lie.
    claimed_sha256: String,
}

type IndexState = (String, Arc<Mutex<Vec<Served>>>);

/// A package index on 127.0.0.1 with PyPI's JSON API (`/pypi/{name}/json`) and its files
/// (`/files/{filename}`).
struct FakeIndex {
    url: String,
    wheels: Arc<Mutex<Vec<Served>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeIndex {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// PEP 503's normal form of a project name.
fn normalize(name: &str) -> String {
    name.to_ascii_lowercase().replace(['_', '.'], "-")
}

async fn index_project(
    axum::extract::State((base, wheels)): axum::extract::State<IndexState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<axum::Json<Value>, axum::http::StatusCode> {
    let wheels = wheels.lock().unwrap();
    let listed: Vec<&Served> = wheels
        .iter()
        .filter(|w| normalize(&w.name) == normalize(&name))
        .collect();
    let Some(latest) = listed.last() else {
        return Err(axum::http::StatusCode::NOT_FOUND);
    };
    let mut releases = serde_json::Map::new();
    for w in &listed {
        let files = releases
            .entry(w.version.clone())
            .or_insert_with(|| json!([]));
        files.as_array_mut().unwrap().push(json!({
            "filename": w.filename,
            "url": format!("{base}/files/{}", w.filename),
            "digests": {"sha256": w.claimed_sha256},
            "packagetype": "bdist_wheel",
            "python_version": "py3",
            "requires_python": null,
            "size": w.bytes.len(),
            "yanked": false,
        }));
    }
    Ok(axum::Json(json!({
        "info": {"name": latest.name, "version": latest.version},
        "releases": releases,
    })))
}

async fn index_file(
    axum::extract::State((_, wheels)): axum::extract::State<IndexState>,
    axum::extract::Path(filename): axum::extract::Path<String>,
) -> Result<Vec<u8>, axum::http::StatusCode> {
    wheels
        .lock()
        .unwrap()
        .iter()
        .find(|w| w.filename == filename)
        .map(|w| w.bytes.clone())
        .ok_or(axum::http::StatusCode::NOT_FOUND)
}

impl FakeIndex {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let wheels: Arc<Mutex<Vec<Served>>> = Arc::default();
        let app = axum::Router::new()
            .route("/pypi/{name}/json", axum::routing::get(index_project))
            .route("/files/{filename}", axum::routing::get(index_file))
            .with_state((url.clone(), wheels.clone()));
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { url, wheels, task }
    }

    /// Lists the wheel at `path` (name and version from its file name); with `lie`, under the
    /// SHA-256 of other bytes.
    fn add(&self, path: &Path, lie: bool) {
        let filename = path.file_name().unwrap().to_str().unwrap().to_string();
        let mut parts = filename.trim_end_matches(".whl").split('-');
        let name = parts.next().unwrap().to_string();
        let version = parts.next().unwrap().to_string();
        let bytes = std::fs::read(path).unwrap();
        let claimed_sha256 = if lie {
            sha256_hex(b"not the wheel")
        } else {
            sha256_hex(&bytes)
        };
        self.wheels.lock().unwrap().push(Served {
            name,
            version,
            filename,
            bytes,
            claimed_sha256,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wheelhouse_package_and_its_dependency_install_offline() {
    let house = tiny_wheelhouse();
    let c = offline_server(house.path()).await;
    let id = create_sandbox(&c, json!({})).await;
    let before = run_py(&c, &id, "import tinypkg").await;
    no_module(&before, "tinypkg");
    // The note offers the install: the wheelhouse has a pure wheel of that name.
    let notes = before["notes"].to_string();
    assert!(
        notes.contains("install_packages") && notes.contains("['tinypkg']"),
        "{before}"
    );

    let v = install(&c, &id, &["tinypkg"]).await;
    assert_eq!(v["success"], true, "{v}");
    assert_eq!(v["sandbox_id"], id.as_str(), "{v}");
    // The newer tinydep (the older does not fit), no neverdep (Windows only), no six (bundled).
    assert_eq!(
        installed(&v),
        set(&[("tinypkg", "1.0"), ("tinydep", "0.2")]),
        "{v}"
    );
    assert!(bundled(&v).contains("six"), "{v}");
    for p in v["installed"].as_array().unwrap() {
        assert_eq!(p["source"], "wheelhouse", "{v}");
        assert!(p["cached"].is_boolean(), "{v}");
        let file = house.path().join(
            p["wheel"]
                .as_str()
                .unwrap_or_else(|| panic!("no wheel: {v}")),
        );
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}: {v}", file.display()));
        assert_eq!(p["sha256"], sha256_hex(&bytes), "{v}");
    }
    // The live session that failed to import it a moment ago imports it now.
    says_hello(&c, &id).await;

    // The same again: nothing new to fetch, and it still imports.
    let again = install(&c, &id, &["tinypkg==1.0"]).await;
    for p in again["installed"].as_array().into_iter().flatten() {
        assert_eq!(p["cached"], true, "{again}");
    }
    says_hello(&c, &id).await;

    // The store is shared and read-only: the guest can change nothing in it.
    let v = run_py(
        &c,
        &id,
        r#"
import os, tinypkg
here = os.path.dirname(tinypkg.__file__)
tries = [
    lambda: open(tinypkg.__file__, 'a'),
    lambda: open(os.path.join(here, 'new.py'), 'w'),
    lambda: os.remove(tinypkg.__file__),
    lambda: os.rename(tinypkg.__file__, '/workspace/t.py'),
    lambda: os.mkdir(os.path.join(here, 'd')),
]
for i, t in enumerate(tries):
    try:
        t()
        print(i, 'did it')
    except OSError:
        pass
print('done')
"#,
    )
    .await;
    assert_eq!(v["stdout"], "done\n", "{v}");
    let v = run_py(
        &c,
        &id,
        "import tinypkg\nprint(open(tinypkg.__file__).read(), end='')",
    )
    .await;
    assert_eq!(v["stdout"], TINYPKG, "{v}");

    // Another sandbox sees none of it, and may pick another version of the same package.
    let other = create_sandbox(&c, json!({})).await;
    no_module(&run_py(&c, &other, "import tinypkg").await, "tinypkg");
    let v = install(&c, &other, &["tinydep<0.2"]).await;
    assert_eq!(installed(&v), set(&[("tinydep", "0.1")]), "{v}");
    let v = run_py(&c, &other, "import tinydep\nprint(tinydep.X)").await;
    assert_eq!(v["stdout"], "from 0.1\n", "{v}");
    says_hello(&c, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_wheels_and_unknown_packages_are_refused() {
    let house = tempfile::tempdir().unwrap();
    wheel(
        house.path(),
        "fastc",
        "1.0",
        "cp315-cp315-wasi_0_0_0_wasm32",
        &[],
        "X = 1\n",
    );
    wheel(
        house.path(),
        "needsmissing",
        "1.0",
        ANY,
        &["missingdep>=1"],
        "X = 1\n",
    );
    let c = offline_server(house.path()).await;
    let id = create_sandbox(&c, json!({})).await;

    let e = refused(&c, &id, &["fastc"]).await;
    assert!(e.contains("compiled") && e.contains("HOPX"), "{e}");
    let e = refused(&c, &id, &["nosuchpkg"]).await;
    assert!(e.contains("not found") && e.contains("nosuchpkg"), "{e}");
    let e = refused(&c, &id, &["needsmissing"]).await;
    assert!(e.contains("not found") && e.contains("missingdep"), "{e}");

    let v = run_py(&c, &id, "import fastc").await;
    no_module(&v, "fastc");
    // Compiled only: the note says so and gives the HOPX route, not an install.
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("compiled") && notes.contains("HOPX") && !notes.contains("['fastc']"),
        "{v}"
    );
    let v = run_py(&c, &id, "print(6 * 7)").await;
    assert_eq!(v["stdout"], "42\n", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_wheel_with_a_wrong_hash_is_refused() {
    let files = tempfile::tempdir().unwrap();
    let good = wheel(
        files.path(),
        "goodpkg",
        "1.0",
        ANY,
        &[],
        "def f():\n    return 'good'\n",
    );
    let bad = wheel(files.path(), "badpkg", "1.0", ANY, &[], "X = 'bad'\n");
    let index = FakeIndex::start().await;
    index.add(&good, false);
    index.add(&bad, true);
    let c = server_with_env(&[("WASMBOX_PACKAGE_INDEX", index.url.as_str())]).await;
    let id = create_sandbox(&c, json!({})).await;

    // The index has a pure wheel of that name: the note offers the install.
    let v = run_py(&c, &id, "import goodpkg.sub").await;
    no_module(&v, "goodpkg");
    assert!(v["notes"].to_string().contains("['goodpkg']"), "{v}");
    let v = install(&c, &id, &["goodpkg>=1"]).await;
    assert_eq!(installed(&v), set(&[("goodpkg", "1.0")]), "{v}");
    let p = &v["installed"][0];
    assert_eq!(p["source"], "index", "{v}");
    assert_eq!(p["wheel"], "goodpkg-1.0-py3-none-any.whl", "{v}");
    assert_eq!(
        p["sha256"],
        sha256_hex(&std::fs::read(&good).unwrap()),
        "{v}"
    );
    let v = run_py(&c, &id, "import goodpkg\nprint(goodpkg.f())").await;
    assert_eq!(v["stdout"], "good\n", "{v}");

    let e = refused(&c, &id, &["badpkg"]).await;
    assert!(e.contains("SHA-256"), "{e}");
    no_module(&run_py(&c, &id, "import badpkg").await, "badpkg");
    // The index answers 404 for a project it does not have.
    let e = refused(&c, &id, &["nosuchpkg"]).await;
    assert!(e.contains("not found"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_packages_survive_a_restart_and_a_fork() {
    let data = tempfile::tempdir().unwrap();
    let house = tiny_wheelhouse();
    let data_dir = data.path().to_str().unwrap();
    let (c, pid) = server_with_pid(&[
        ("WASMBOX_DATA", data_dir),
        ("WASMBOX_WHEELHOUSE", house.path().to_str().unwrap()),
        ("WASMBOX_OFFLINE", "1"),
    ])
    .await;
    let id = create_sandbox(&c, json!({})).await;
    let v = install(&c, &id, &["tinypkg"]).await;
    assert_eq!(
        installed(&v),
        set(&[("tinypkg", "1.0"), ("tinydep", "0.2")]),
        "{v}"
    );
    // Forked after the install (the parent never imported it): the fork has the packages.
    let fork = ok(&c, "fork_sandbox", json!({"sandbox_id": id})).await["id"]
        .as_str()
        .expect("the fork's id")
        .to_string();
    says_hello(&c, &fork).await;

    stop_server(pid).await;
    drop(c);
    // The wheels are gone from the host: what imports now comes from the store.
    house.close().unwrap();
    let (c, _) = server_with_pid(&[("WASMBOX_DATA", data_dir), ("WASMBOX_OFFLINE", "1")]).await;
    says_hello(&c, &id).await;
    says_hello(&c, &fork).await;
    // A fresh interpreter in the sandbox (isolated mode with its id) has them too.
    let v = ok(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "language": "python",
               "code": "import tinypkg\nprint(tinypkg.hello())"}),
    )
    .await;
    assert_eq!(v["stdout"], "hi from 0.2\n", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shots_take_packages_and_pip_install_is_routed() {
    let house = tiny_wheelhouse();
    let c = offline_server(house.path()).await;
    let code = "import tinypkg\nprint(tinypkg.hello())";

    let v = ok(
        &c,
        "execute_code",
        json!({"code": code, "language": "python", "packages": ["tinypkg"]}),
    )
    .await;
    assert_eq!(v["stdout"], "hi from 0.2\n", "{v}");
    // The next one-shot is fresh again.
    let v = object(
        &call(
            &c,
            "execute_code",
            json!({"code": code, "language": "python"}),
        )
        .await,
    );
    no_module(&v, "tinypkg");

    let id = create_sandbox(&c, json!({})).await;
    let r = ok(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": "pip install tinypkg"}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap_or_default();
    assert!(
        out.contains("Successfully installed")
            && out.contains("tinypkg-1.0")
            && out.contains("tinydep-0.2"),
        "{r}"
    );
    says_hello(&c, &id).await;

    // A session call's `packages` installs into its sandbox first; get_sandbox lists them.
    let other = create_sandbox(&c, json!({})).await;
    let v = ok(
        &c,
        "execute_code",
        json!({"sandbox_id": other, "mode": "persistent", "code": code, "packages": ["tinypkg==1.0"]}),
    )
    .await;
    assert_eq!(v["stdout"], "hi from 0.2\n", "{v}");
    let info = ok(&c, "get_sandbox", json!({"id": other})).await;
    let listed = info["packages"].to_string();
    assert!(
        listed.contains("tinypkg==1.0") && listed.contains("tinydep==0.2"),
        "{info}"
    );
}

/// An installed tree is compiled once, by the interpreter that imports it, before it is made
/// read-only: its modules load from bytecode that never looks at the source (the store is
/// read-only, so without it every interpreter compiled them again), and tracebacks still name
/// the file where the guest sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_trees_are_precompiled() {
    let house = tempfile::tempdir().unwrap();
    // A module of its own (the store is shared by every test server on the machine).
    let src = format!(
        "# {}\ndef boom():\n    raise ValueError('from the tree')\n",
        uuid::Uuid::new_v4()
    );
    wheel(house.path(), "compiledtree", "1.0", ANY, &[], &src);
    let c = offline_server(house.path()).await;
    let id = create_sandbox(&c, json!({})).await;
    let v = install(&c, &id, &["compiledtree"]).await;
    assert_eq!(installed(&v), set(&[("compiledtree", "1.0")]), "{v}");
    let v = run_py(
        &c,
        &id,
        r#"
import os, sys, traceback, compiledtree
pyc = compiledtree.__spec__.cached
flags = int.from_bytes(open(pyc, 'rb').read()[4:8], 'little') if os.path.exists(pyc) else None
print(pyc.startswith('/packages/'), os.path.exists(pyc), flags)
try:
    compiledtree.boom()
except ValueError:
    print(traceback.format_exc().count(compiledtree.__file__))
"#,
    )
    .await;
    // Flags 1: hash-based, source not checked.
    assert_eq!(v["stdout"], "True True 1\n1\n", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "reaches PyPI: run with WASMBOX_TEST_INDEX=1 and --ignored"]
async fn real_pypi_install() {
    if std::env::var("WASMBOX_TEST_INDEX").as_deref() != Ok("1") {
        eprintln!("skipped: set WASMBOX_TEST_INDEX=1 to reach PyPI");
        return;
    }
    let c = server_with_env(&[("WASMBOX_PACKAGE_INDEX", "https://pypi.org")]).await;
    let id = create_sandbox(&c, json!({})).await;
    let v = install(&c, &id, &["python-slugify"]).await;
    let names: BTreeSet<String> = installed(&v)
        .into_iter()
        .map(|(n, _)| normalize(&n))
        .collect();
    assert!(
        names.contains("python-slugify") && names.contains("text-unidecode"),
        "{v}"
    );
    for p in v["installed"].as_array().unwrap() {
        assert_eq!(p["source"], "index", "{v}");
        assert_eq!(p["sha256"].as_str().map(str::len), Some(64), "{v}");
    }
    let v = run_py(
        &c,
        &id,
        "from slugify import slugify\nprint(slugify('Héllo Wörld'))",
    )
    .await;
    assert_eq!(v["stdout"], "hello-world\n", "{v}");
}

/// A zip of `(name, raw deflate data, CRC-32, declared uncompressed size)` members, written
/// by hand so a member may declare any size whatever it inflates to.
fn zip_of_raw(members: &[(String, Vec<u8>, u32, u32)]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data, crc, size) in members {
        let offset = out.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&8u16.to_le_bytes()); // deflated
            v.extend_from_slice(&0u16.to_le_bytes()); // time
            v.extend_from_slice(&0x21u16.to_le_bytes()); // date: 1980-01-01
            v.extend_from_slice(&crc.to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(b"PK\x03\x04");
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(b"PK\x01\x02");
        central.extend_from_slice(&(3u16 << 8 | 20).to_le_bytes()); // made by: unix
        common(&mut central);
        central.extend_from_slice(&[0; 6]); // comment, disk, internal attributes
        central.extend_from_slice(&(0o100644u32 << 16).to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let at = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    let n = (members.len() as u16).to_le_bytes();
    out.extend_from_slice(&[n[0], n[1], n[0], n[1]]);
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// Raw deflate data of `bytes`, as a complete stream.
fn deflated(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// The raw deflate data (about 2 MiB) and CRC-32 of 2 GiB of zeros: a 1 MiB segment compressed
/// once with a full flush (byte-aligned, no reference before it) and repeated, then a final
/// empty stored block.
fn two_gib_of_zeros() -> (Vec<u8>, u32, u64) {
    const SEGMENT: usize = 1 << 20;
    const COUNT: usize = 2048;
    let zeros = vec![0u8; SEGMENT];
    let mut c = flate2::Compress::new(flate2::Compression::best(), false);
    let mut segment = Vec::with_capacity(64 << 10);
    c.compress_vec(&zeros, &mut segment, flate2::FlushCompress::Full)
        .unwrap();
    assert_eq!(c.total_in(), SEGMENT as u64);
    let mut data = Vec::with_capacity(segment.len() * COUNT + 5);
    let (mut crc, mut one) = (flate2::Crc::new(), flate2::Crc::new());
    one.update(&zeros);
    for _ in 0..COUNT {
        data.extend_from_slice(&segment);
        crc.combine(&one);
    }
    data.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
    (data, crc.sum(), (SEGMENT * COUNT) as u64)
}

/// A pure wheel of `name` 1.0 whose `{name}/zeros.bin` inflates to 2 GiB of zeros and declares
/// `declared` bytes.
fn bomb_wheel(dir: &Path, name: &str, declared: Option<u32>) -> PathBuf {
    let (zeros, zeros_crc, zeros_len) = two_gib_of_zeros();
    let info = format!("{name}-1.0.dist-info");
    let small = [
        (format!("{name}/__init__.py"), "X = 1\n".to_string()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"),
        ),
    ];
    let mut record = String::new();
    for (path, content) in &small {
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(Sha256::digest(content.as_bytes()));
        record.push_str(&format!("{path},sha256={digest},{}\n", content.len()));
    }
    // A well-formed hash that is not the member's: the size is refused before any hash is.
    let other = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(b"x"));
    record.push_str(&format!("{name}/zeros.bin,sha256={other},{zeros_len}\n"));
    record.push_str(&format!("{info}/RECORD,,\n"));
    let mut members: Vec<(String, Vec<u8>, u32, u32)> = Vec::new();
    for (path, content) in small.iter().chain([&(format!("{info}/RECORD"), record)]) {
        let mut crc = flate2::Crc::new();
        crc.update(content.as_bytes());
        members.push((
            path.clone(),
            deflated(content.as_bytes()),
            crc.sum(),
            content.len() as u32,
        ));
    }
    members.insert(
        1,
        (
            format!("{name}/zeros.bin"),
            zeros,
            zeros_crc,
            declared.unwrap_or(zeros_len as u32),
        ),
    );
    let path = dir.join(format!("{name}-1.0-{ANY}.whl"));
    std::fs::write(&path, zip_of_raw(&members)).unwrap();
    path
}

/// The peak resident memory of `pid` so far (`VmHWM`), in KiB; `None` off Linux.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A wheel whose member inflates to 2 GiB of zeros from 2 MiB is refused, whether it declares
/// its size or lies about it, and refusing it costs the server no more than 64 MiB of peak
/// memory: members stream through a bounded buffer, counted as they inflate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zip_bomb_wheel_is_refused_in_bounded_memory() {
    let files = tempfile::tempdir().unwrap();
    let good = wheel(files.path(), "warmpkg", "1.0", ANY, &[], "X = 'warm'\n");
    let bomb = bomb_wheel(files.path(), "bombpkg", None);
    // Declares 1 MiB, inflates to 2 GiB.
    let liar = bomb_wheel(files.path(), "liarpkg", Some(1 << 20));
    assert!(std::fs::metadata(&bomb).unwrap().len() < 8 << 20);
    // The archive is sound: its member reads as zeros and declares 2 GiB.
    let mut z = zip::ZipArchive::new(std::fs::File::open(&bomb).unwrap()).unwrap();
    let mut m = z.by_name("bombpkg/zeros.bin").unwrap();
    assert_eq!(m.size(), 2 << 30);
    let mut head = vec![1u8; 1 << 20];
    std::io::Read::read_exact(&mut m, &mut head).unwrap();
    assert!(head.iter().all(|b| *b == 0));
    drop(m);
    let index = FakeIndex::start().await;
    for w in [&good, &bomb, &liar] {
        index.add(w, false);
    }
    let (c, pid) = server_with_pid(&[("WASMBOX_PACKAGE_INDEX", index.url.as_str())]).await;
    let id = create_sandbox(&c, json!({})).await;
    // Warm: an install (download, unpack, compile in a guest) and an import, so the peak
    // measured from here is what refusing the bombs adds.
    let v = install(&c, &id, &["warmpkg"]).await;
    assert_eq!(installed(&v), set(&[("warmpkg", "1.0")]), "{v}");
    let v = run_py(&c, &id, "import warmpkg\nprint(warmpkg.X)").await;
    assert_eq!(v["stdout"], "warm\n", "{v}");
    let before = peak_rss_kib(pid);
    let bomb_refused = refused(&c, &id, &["bombpkg"]).await;
    let liar_refused = refused(&c, &id, &["liarpkg"]).await;
    let after = peak_rss_kib(pid);
    if let (Some(before), Some(after)) = (before, after) {
        eprintln!("server peak RSS: {before} KiB before the bombs, {after} KiB after");
        assert!(
            after - before <= 64 << 10,
            "refusing the bombs raised the server's peak RSS by {} MiB ({before} -> {after} KiB)",
            (after - before) >> 10
        );
    }
    assert!(
        bomb_refused.contains("bombpkg/zeros.bin declares 2048 MiB")
            && bomb_refused.contains("more than 512 MiB"),
        "{bomb_refused}"
    );
    // Refused one byte past what it declares (by our count or the zip reader's own).
    assert!(
        liar_refused.contains("liarpkg/zeros.bin")
            && (liar_refused.contains("inflates past its declared 1048576 bytes")
                || liar_refused.contains("1048576 bytes: File is larger than its declared")),
        "{liar_refused}"
    );
    no_module(&run_py(&c, &id, "import bombpkg").await, "bombpkg");
    no_module(&run_py(&c, &id, "import liarpkg").await, "liarpkg");
}
