//! JavaScript one-shots over stdio MCP (QuickJS-NG in WebAssembly), and sessions through the
//! library.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use wasmbox::lang::javascript::JsRuntime;
use wasmbox::lang::live::SessionRuntime;

async fn js(c: &Client, code: &str) -> Value {
    let r = call(
        c,
        "execute_code",
        json!({"code": code, "language": "javascript"}),
    )
    .await;
    assert!(!is_error(&r), "unexpected tool error: {:?}", r.content);
    object(&r)
}

#[tokio::test]
async fn console_output_goes_to_the_right_streams() {
    let c = server().await;
    let r = js(
        &c,
        "console.log('hi', 1 + 1, {a: [1, 2]}); console.error('bad'); console.warn('careful')",
    )
    .await;
    assert_eq!(r["stdout"], "hi 2 { a: [ 1, 2 ] }\n");
    assert_eq!(r["stderr"], "bad\ncareful\n");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["language"], "javascript");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn aliases_are_accepted() {
    let c = server().await;
    for lang in ["js", "node", "nodejs", "JavaScript"] {
        let r = call(
            &c,
            "execute_code_isolated",
            json!({"code": "console.log(typeof Date.now())", "language": lang}),
        )
        .await;
        assert!(!is_error(&r), "{lang}");
        assert_eq!(object(&r)["stdout"], "number\n", "{lang}");
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn promises_timers_and_top_level_await_run_to_completion() {
    let c = server().await;
    let r = js(
        &c,
        "setTimeout(() => console.log('timer'), 30);\n\
         Promise.resolve().then(() => console.log('micro'));\n\
         console.log('sync');\n\
         const v = await new Promise(r => setTimeout(() => r(42), 5));\n\
         console.log('awaited', v);\n\
         (async () => { await null; console.log('async fn'); })();",
    )
    .await;
    assert_eq!(r["stdout"], "sync\nmicro\nawaited 42\nasync fn\ntimer\n");
    assert_eq!(r["exit_code"], 0);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn thrown_errors_and_rejections_exit_1_with_stack() {
    let c = server().await;
    let r = js(
        &c,
        "console.log('before');\nfunction f() { throw new TypeError('boom'); }\nf();",
    )
    .await;
    assert_eq!(r["exit_code"], 1);
    assert_eq!(r["stdout"], "before\n");
    let err = r["stderr"].as_str().unwrap();
    assert!(err.contains("TypeError: boom"), "{err}");
    assert!(err.contains("at f"), "stack on stderr: {err}");
    let r = js(&c, "Promise.reject(new Error('nope'));").await;
    assert_eq!(r["exit_code"], 1);
    assert!(r["stderr"].as_str().unwrap().contains("nope"));
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn process_exit_code() {
    let c = server().await;
    let r = js(
        &c,
        "console.log('bye'); process.exit(3); console.log('never')",
    )
    .await;
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["stdout"], "bye\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn infinite_loop_and_memory_bomb_are_stopped() {
    let c = server().await;
    let r = object(
        &call(
            &c,
            "execute_code",
            json!({"code": "while (true) {}", "language": "javascript", "timeout": 1}),
        )
        .await,
    );
    assert_eq!(r["limit"], "timeout");
    assert_eq!(r["exit_code"], 124);
    let r = js(
        &c,
        "const a = []; while (true) a.push(new Array(1e6).fill(1.5));",
    )
    .await;
    assert_eq!(r["limit"], "memory", "{r}");
    assert_ne!(r["exit_code"], 0);
    assert_eq!(js(&c, "console.log('alive')").await["stdout"], "alive\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn workspace_files_and_isolation() {
    let c = server().await;
    let r = js(
        &c,
        "const fs = require('fs');\n\
         fs.mkdirSync('data/sub', {recursive: true});\n\
         fs.writeFileSync('data/sub/x.json', JSON.stringify({n: 7}));\n\
         console.log(JSON.parse(fs.readFileSync('/workspace/data/sub/x.json', 'utf8')).n, fs.existsSync('data'), fs.readdirSync('data'));\n\
         globalThis.leak = 1;",
    )
    .await;
    assert_eq!(r["stdout"], "7 true [ 'sub' ]\n", "{r}");
    let r = js(
        &c,
        "const fs = require('fs'); console.log(fs.readdirSync('/workspace').length, typeof leak)",
    )
    .await;
    assert_eq!(r["stdout"], "0 undefined\n");
    let r = js(&c, "require('fs').readFileSync('/etc/passwd', 'utf8')").await;
    assert_eq!(r["exit_code"], 1);
    let r = js(
        &c,
        "console.log(JSON.stringify(Object.keys(process.env).sort()))",
    )
    .await;
    assert_eq!(r["stdout"], "[\"HOME\",\"PWD\",\"TMPDIR\"]\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn es_module_imports_work() {
    let c = server().await;
    let r = js(&c, "import * as std from 'qjs:std';\nimport fs from 'fs';\nconsole.log(typeof std.open, typeof fs.writeFileSync);").await;
    assert_eq!(r["stdout"], "function function\n", "{r}");
    c.cancel().await.unwrap();
}

/// A session keeps its globals across calls and echoes a final expression, like a REPL.
#[test]
fn session_keeps_state_across_calls() {
    prepare();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox::Wasmbox::new(wasmbox::Config::from_env()).unwrap();
    let js = rt.block_on(wb.javascript()).unwrap();
    assert!(js.has_image(), "the pre-initialised image must build");
    let req = wb
        .request(wasmbox::ExecOptions {
            language: "javascript".into(),
            ..Default::default()
        })
        .unwrap();
    // Guests run on threads with a stack deeper than the wasm stack limit.
    on_guest_stack(move || {
        let t = Duration::from_secs(10);
        let mut s = js.start(&req).unwrap();
        assert_eq!(
            JsRuntime::eval(&mut s, "let x = 1; const f = (a) => a * 2;", t).stdout,
            ""
        );
        assert_eq!(JsRuntime::eval(&mut s, "x + 1", t).stdout, "2\n");
        assert_eq!(
            JsRuntime::eval(&mut s, "x = f(x + 20); x", t).stdout,
            "42\n"
        );
        let r = JsRuntime::eval(&mut s, "throw new Error('oops')", t);
        assert_eq!(r.exit_code, 1);
        assert!(s.alive(), "an exception does not end the session");
        assert_eq!(
            JsRuntime::eval(&mut s, "'still ' + x", t).stdout,
            "'still 42'\n"
        );
        let r = JsRuntime::eval(&mut s, "while (true) {}", Duration::from_millis(300));
        assert_eq!(r.limit, Some(wasmbox::LimitHit::Timeout));
        assert!(!s.alive(), "a trapped session must be replaced");
        assert_ne!(JsRuntime::eval(&mut s, "x", t).exit_code, 0);
    });
}

/// A pooled context arrives with the pages its first eval writes already copied and those it
/// reads mapped (measured once at load): left to faults, each one-shot took 64-71 of them on the
/// request's path, about half of its time; 14-21 with the copies alone; 4-11 now.
#[cfg(target_os = "linux")]
#[test]
fn a_pooled_one_shot_finds_its_pages_copied() {
    prepare();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox::Wasmbox::new(wasmbox::Config::from_env()).unwrap();
    let js = rt.block_on(wb.javascript()).unwrap();
    assert!(
        js.prefaulted_pages() > 16,
        "a first eval writes dozens of pages; measured {}",
        js.prefaulted_pages()
    );
    let req = wb
        .request(wasmbox::ExecOptions {
            language: "javascript".into(),
            code: "console.log(6 * 7)".into(),
            ..Default::default()
        })
        .unwrap();
    let pool = js.clone();
    let faults = faults_per_call(
        move || assert!(pool.wait_pool_full(Duration::from_secs(30))),
        move || assert_eq!(js.run_oneshot(&req).unwrap().stdout, "42\n"),
    );
    assert!(
        faults[faults.len() / 2] <= 12,
        "page faults per pooled one-shot: {faults:?}"
    );
}

#[tokio::test]
async fn per_call_env_applies_to_pooled_contexts() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": "console.log(process.env.WORD, process.env.HOME)", "language": "js", "env": {"WORD": "hi"}}),
    )
    .await;
    assert_eq!(object(&r)["stdout"], "hi /tmp\n");
    let r = js(&c, "console.log(process.env.WORD)").await;
    assert_eq!(
        r["stdout"], "undefined\n",
        "an earlier call's env must not leak"
    );
    c.cancel().await.unwrap();
}

/// Instances start from a snapshot taken after the context was made; each must still get its own
/// `Math.random` sequence and a `performance` clock that starts at its own first call, not the
/// image's.
#[tokio::test]
async fn each_one_shot_has_its_own_random_sequence_and_clock() {
    let c = server().await;
    let (mut draws, mut origins) = (HashSet::new(), HashSet::new());
    for _ in 0..4 {
        let r = js(
            &c,
            "const draws = [Math.random(), Math.random(), Math.random()];\n\
             const lag = Date.now() - (performance.timeOrigin + performance.now());\n\
             console.log(JSON.stringify({draws, lag, origin: performance.timeOrigin}));",
        )
        .await;
        let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap()).expect("JSON line");
        assert!(
            draws.insert(v["draws"].to_string()),
            "Math.random repeated another one-shot's sequence: {v}"
        );
        assert!(
            origins.insert(v["origin"].to_string()),
            "performance.timeOrigin repeated another one-shot's: {v}"
        );
        let lag = v["lag"].as_f64().unwrap();
        assert!(
            lag.abs() < 1000.0,
            "timeOrigin + now() must be the wall clock: {v}"
        );
    }
    c.cancel().await.unwrap();
}

/// Appends a custom section (ignored by the runtime) to a wasm module: a new artifact, the same
/// program.
fn with_custom_section(mut wasm: Vec<u8>, payload: &[u8]) -> Vec<u8> {
    let name = b"wasmbox-test";
    let body_len = 1 + name.len() + payload.len();
    assert!(body_len < 128, "a one-byte LEB128 length");
    wasm.extend_from_slice(&[0, body_len as u8, name.len() as u8]);
    wasm.extend_from_slice(name);
    wasm.extend_from_slice(payload);
    wasm
}

/// Images are keyed by their runtime artifact's hash: an unchanged artifact loads its image
/// from the cache, a changed one is snapshotted and compiled again (and works), and the old
/// image stays for a process still using it. Python's image is keyed the same way (its unit
/// test covers every input of the key); JavaScript's takes under a second to build.
#[test]
fn the_image_is_rebuilt_when_the_artifact_changes() {
    use wasmbox::engine::cache::{ModuleCache, Origin};
    use wasmbox::lang::javascript::{JsRuntime, module_path};
    prepare();
    let tmp = tempfile::tempdir().unwrap();
    let runtimes = tmp.path().join("runtimes");
    let artifact = module_path(&runtimes);
    std::fs::create_dir_all(artifact.parent().unwrap()).unwrap();
    let original = std::fs::read(module_path(&wasmbox::Config::from_env().runtimes_dir)).unwrap();
    std::fs::write(&artifact, &original).unwrap();
    let cache = ModuleCache::new(tmp.path().join("cache"));
    let engine = wasmbox::engine::build_engine(8, 64 << 20).unwrap();
    let images = || {
        std::fs::read_dir(cache.dir())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("cwasm".as_ref()))
            .count()
    };
    let load = || {
        let (js, origin) = JsRuntime::load(
            &engine,
            &cache,
            &runtimes,
            &wasmbox::lang::image_runtime::PoolOptions {
                size: 1,
                refill_threads: 1,
            },
        )
        .unwrap();
        assert!(js.has_image(), "the image must build");
        (js, origin)
    };
    assert_eq!(
        load().1,
        Origin::Compiled,
        "an empty cache builds the image"
    );
    assert_eq!(load().1, Origin::Cached, "an unchanged artifact reuses it");
    assert_eq!(images(), 1);

    std::fs::write(&artifact, with_custom_section(original, b"v2")).unwrap();
    let (js, origin) = load();
    assert_eq!(
        origin,
        Origin::Compiled,
        "a changed artifact rebuilds the image"
    );
    assert_eq!(images(), 2, "a new image beside the old one");
    let req = wasmbox::Wasmbox::new(wasmbox::Config::from_env())
        .unwrap()
        .request(wasmbox::ExecOptions {
            language: "javascript".into(),
            code: "console.log(6 * 7)".into(),
            ..Default::default()
        })
        .unwrap();
    let out = on_guest_stack(move || js.run_oneshot(&req).unwrap());
    assert_eq!(out.stdout, "42\n");
    assert_eq!(load().1, Origin::Cached, "and is reused in turn");
}
