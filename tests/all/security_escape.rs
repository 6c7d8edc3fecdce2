//! The escape suite: each case is an attempt to reach outside a sandbox, made through the MCP
//! server the way a model-written program or a tool call would. Every attempt must fail and
//! leave the host untouched; SECURITY.md lists them with the threat model.
//!
//! Guest-side cases print `BLOCKED` when the attempt raised an error and `LEAK: ...` when it
//! got through; the test fails on any `LEAK` or a missing `BLOCKED`.

use crate::common;

use common::*;
use serde_json::{Value, json};

/// A key the server process has; no guest and no result may ever show it.
const KEY: &str = "hopx_canary_key_never_visible_42";

async fn server_for_attacks() -> Client {
    // Offline: the canary key must not be used for anything, only hidden.
    server_with_env(&[("HOPX_API_KEY", KEY), ("WASMBOX_OFFLINE", "1")]).await
}

/// Runs `code` in sandbox `id` and checks it reports BLOCKED and never LEAK.
async fn attempt(c: &Client, id: &str, case: &str, language: &str, code: &str) {
    let r = call(
        c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": language, "code": code, "timeout": 60}),
    )
    .await;
    let text = format!("{:?}", r.content);
    assert!(!text.contains(KEY), "{case}: the key leaked: {text}");
    assert!(!text.contains("root:x:0:0"), "{case}: /etc/passwd leaked");
    let v = object(&r);
    let out = v["stdout"].as_str().unwrap_or_default();
    assert!(!out.contains("LEAK"), "{case}: {out} / {}", v["stderr"]);
    assert!(out.contains("BLOCKED"), "{case}: expected BLOCKED: {v}");
    eprintln!("{case}: {}", out.trim());
}

/// A Python attempt: `body` raises (BLOCKED) or prints what it got (LEAK).
fn py(body: &str) -> String {
    let body = body.replace('\n', "\n    ");
    format!("try:\n    {body}\nexcept Exception as e:\n    print('BLOCKED', type(e).__name__)")
}

fn js(body: &str) -> String {
    format!("try {{ {body} }} catch (e) {{ console.log('BLOCKED', String(e).slice(0, 80)) }}")
}

fn go(body: &str, imports: &str) -> String {
    format!(
        "package main\nimport (\"fmt\"; {imports})\nfunc main() {{\n{body}\n}}\nvar _ = fmt.Println"
    )
}

#[tokio::test]
async fn guest_code_cannot_reach_the_host() {
    let c = server_for_attacks().await;
    let id = create_sandbox(&c, json!({})).await;
    let cache = dirs_cache();
    let cases: Vec<(&str, &str, String)> = vec![
        ("py: absolute /etc/passwd", "python", py("print('LEAK', open('/etc/passwd').read()[:20])")),
        ("py: .. traversal", "python", py("print('LEAK', open('../../../../etc/passwd').read()[:20])")),
        ("py: /proc/self/environ", "python", py("print('LEAK', open('/proc/self/environ').read()[:40])")),
        ("py: /proc/self/mem", "python", py("print('LEAK', open('/proc/self/mem', 'rb').read(8))")),
        ("py: /dev/sda", "python", py("print('LEAK', open('/dev/sda', 'rb').read(8))")),
        ("py: list /", "python", py("names = sorted(os.listdir('/'))\nbad = [n for n in names if n in ('etc', 'proc', 'dev', 'root', 'home', 'var')]\nprint('LEAK' if bad else 'BLOCKED', names)").replace("try:\n", "import os\ntry:\n")),
        ("py: write the stdlib (read-only)", "python", py("open('/usr/local/lib/python315.zip', 'ab').write(b'x'); print('LEAK wrote stdlib')")),
        ("py: new file next to the stdlib", "python", py("open('/usr/local/lib/evil.py', 'w').write('x'); print('LEAK created')")),
        ("py: host env (server canary)", "python", format!("import os\nv = os.environ.get({:?}, '') + os.environ.get('HOPX_API_KEY', '')\nprint('LEAK ' + v if v else 'BLOCKED')", HOST_CANARY.0)),
        ("py: socket connect", "python", py("import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=1)\nprint('LEAK connected')")),
        ("py: urllib", "python", py("import urllib.request\nprint('LEAK', urllib.request.urlopen('http://127.0.0.1:1/', timeout=1).status)")),
        ("py: hard link to /etc/passwd", "python", py("import os\nos.link('/etc/passwd', 'hl')\nprint('LEAK', open('hl').read()[:10])")),
        ("py: symlink out, then read", "python", py("import os\nos.symlink('/etc', 'etc_link')\nprint('LEAK', open('etc_link/passwd').read()[:10])")),
        ("py: module cache dir", "python", py(&format!("import os\nprint('LEAK', os.listdir({cache:?}))"))),
        ("py: subprocess", "python", py("import subprocess\nprint('LEAK', subprocess.run(['id'], capture_output=True).stdout)")),
        ("py: ctypes", "python", py("import ctypes\nprint('LEAK', ctypes.CDLL(None))")),
        ("js: /etc/passwd", "javascript", js("console.log('LEAK', require('fs').readFileSync('/etc/passwd', 'utf8').slice(0, 20))")),
        ("js: .. traversal", "javascript", js("console.log('LEAK', require('fs').readFileSync('../../../etc/passwd', 'utf8').slice(0, 20))")),
        ("js: list /", "javascript", js("const n = require('fs').readdirSync('/'); console.log(n.some(x => ['etc','proc','dev','root'].includes(x)) ? 'LEAK ' + n : 'BLOCKED ' + n)")),
        ("js: host env", "javascript", format!("const v = (process.env[{:?}] || '') + (process.env.HOPX_API_KEY || ''); console.log(v ? 'LEAK ' + v : 'BLOCKED')", HOST_CANARY.0)),
        ("js: network", "javascript", "try { await fetch('http://127.0.0.1:1/'); console.log('LEAK fetched') } catch (e) { console.log(typeof XMLHttpRequest === 'undefined' && typeof WebSocket === 'undefined' && e.message.includes('guest network is off') ? 'BLOCKED ' + e.message : 'LEAK ' + e.message) }".into()),
        ("go: /etc/passwd", "go", go("b, err := os.ReadFile(\"/etc/passwd\")\nif err != nil { fmt.Println(\"BLOCKED\", err); return }\nfmt.Println(\"LEAK\", string(b[:10]))", "\"os\"")),
        ("go: .. traversal", "go", go("b, err := os.ReadFile(\"../../../etc/passwd\")\nif err != nil { fmt.Println(\"BLOCKED\", err); return }\nfmt.Println(\"LEAK\", string(b[:10]))", "\"os\"")),
        ("go: host env", "go", go(&format!("v := os.Getenv({:?}) + os.Getenv(\"HOPX_API_KEY\")\nif v == \"\" {{ fmt.Println(\"BLOCKED\") }} else {{ fmt.Println(\"LEAK\", v) }}", HOST_CANARY.0), "\"os\"")),
        ("go: network dial", "go", go("_, err := net.Dial(\"tcp\", \"127.0.0.1:22\")\nif err != nil { fmt.Println(\"BLOCKED\", err); return }\nfmt.Println(\"LEAK connected\")", "\"net\"")),
        ("go: GOCACHE dir", "go", go(&format!("_, err := os.ReadDir({:?})\nif err != nil {{ fmt.Println(\"BLOCKED\", err); return }}\nfmt.Println(\"LEAK listed\")", format!("{cache}/go-build")), "\"os\"")),
    ];
    for (case, language, code) in &cases {
        attempt(&c, &id, case, language, code).await;
    }
    // The host file the attempts aimed at is untouched, and nothing was created beside the stdlib.
    assert!(
        !std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("runtimes/python/lib/evil.py")
            .exists()
    );
    c.cancel().await.unwrap();
}

fn dirs_cache() -> String {
    std::env::var("WASMBOX_CACHE").unwrap_or_else(|_| {
        format!(
            "{}/.cache/wasmbox",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    })
}

#[tokio::test]
async fn go_directives_and_cgo_are_refused_or_harmless() {
    let c = server_for_attacks().await;
    let r = call(
        &c,
        "execute_code",
        json!({"language": "go", "code": "package main\n// #include <stdlib.h>\nimport \"C\"\nfunc main() { C.abort() }"}),
    )
    .await;
    let v = object(&r);
    assert_ne!(v["exit_code"], 0, "cgo is refused: {v}");
    assert!(v["stderr"].as_str().unwrap().contains("cgo"), "{v}");
    // A wasm import of a host function we do not provide cannot link.
    let r = call(
        &c,
        "execute_code",
        json!({"language": "go", "code": "package main\n//go:wasmimport env host_secret\nfunc hostSecret() int32\nfunc main() { println(hostSecret()) }"}),
    )
    .await;
    let text = format!("{:?}", r.content);
    assert!(
        is_error(&r) || object(&r)["exit_code"] != 0,
        "an unknown host import must not run: {text}"
    );
    // The server answers the next call.
    assert_eq!(common::py(&c, "print(1)").await["stdout"], "1\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn file_tools_cannot_reach_the_host_or_another_sandbox() {
    let c = server_for_attacks().await;
    let a = create_sandbox(&c, json!({})).await;
    let b = create_sandbox(&c, json!({})).await;
    let w = call(
        &c,
        "file_write",
        json!({"sandbox_id": a, "path": "secret.txt", "content": "A's secret"}),
    )
    .await;
    assert!(!is_error(&w));
    let paths = [
        "../x".to_string(),
        "/etc/passwd".to_string(),
        "/workspace/../../../../etc/passwd".to_string(),
        "/proc/self/environ".to_string(),
        format!("../../{a}/workspace/secret.txt"),
        format!("/workspace/../{a}/workspace/secret.txt"),
        "/tmp/../etc/passwd".to_string(),
    ];
    for path in &paths {
        for (tool, extra) in [
            ("file_read", json!({})),
            ("file_download", json!({})),
            ("file_list", json!({})),
            ("file_exists", json!({})),
            ("file_remove", json!({})),
            ("file_mkdir", json!({})),
            ("file_write", json!({"content": "x"})),
            ("file_upload", json!({"content_base64": "eA=="})),
        ] {
            let mut args = json!({"sandbox_id": b, "path": path});
            for (k, v) in extra.as_object().unwrap() {
                args[k] = v.clone();
            }
            let r = call(&c, tool, args).await;
            let text = format!("{:?}", r.content);
            assert!(is_error(&r), "{tool} {path}: {text}");
            assert!(
                !text.contains("A's secret") && !text.contains("root:x"),
                "{tool} {path}"
            );
            assert_eq!(
                object(&r)["error"],
                "Path not allowed",
                "{tool} {path}: {text}"
            );
        }
    }
    // B's guest cannot guess its way to A's workspace either.
    attempt(
        &c,
        &b,
        "py: another sandbox's workspace",
        "python",
        &py(&format!(
            "print('LEAK', open('/workspace/../{a}/workspace/secret.txt').read())"
        )),
    )
    .await;
    // A's file is intact.
    let r = call(
        &c,
        "file_read",
        json!({"sandbox_id": a, "path": "secret.txt"}),
    )
    .await;
    assert_eq!(object(&r)["content"], "A's secret");
    // Sandbox ids are not paths.
    for bad in ["../../etc", "/etc/passwd", "", "wb"] {
        let r = call(&c, "file_read", json!({"sandbox_id": bad, "path": "x"})).await;
        assert_eq!(object(&r)["error"], "Sandbox not found", "{bad}");
    }
    // Working directories obey the same rule.
    for wd in ["/etc", "/workspace/../..", "../"] {
        let r = call(
            &c,
            "execute_code",
            json!({"mode": "persistent", "sandbox_id": b, "code": "import os; print(os.getcwd())", "working_dir": wd}),
        )
        .await;
        assert!(is_error(&r), "working_dir {wd}: {:?}", r.content);
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn webhooks_only_reach_allowed_targets() {
    let c = server_for_attacks().await;
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/hook",
        "http://192.168.1.1/",
        "http://example.com/hook",
        "http://[fe80::1]/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:25/",
        "ftp://127.0.0.1/",
        "not a url",
    ] {
        let r = call(
            &c,
            "execute_code_async",
            json!({"code": "print(1)", "callback_url": url}),
        )
        .await;
        assert!(is_error(&r), "{url} must be refused");
        assert_eq!(object(&r)["error"], "Invalid callback_url", "{url}");
    }
    c.cancel().await.unwrap();
}

/// `WASMBOX_WEBHOOK_ALLOW_ANY=1` opens webhooks to other hosts, not to the machine's private
/// neighbourhood: link-local and cloud metadata, private and CGNAT ranges, unspecified and
/// multicast addresses (also IPv4-mapped in IPv6) stay refused unless
/// `WASMBOX_WEBHOOK_ALLOW_PRIVATE=1` is set too; loopback stays allowed. No case here sends
/// anything off the machine: they are refused before a connection, and `0.0.0.0` (which Linux
/// connects to the local host) goes first, so the code before the fix failed on it alone.
#[tokio::test]
async fn webhooks_under_allow_any_still_refuse_private_targets() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let c = server_with_env(&[("WASMBOX_WEBHOOK_ALLOW_ANY", "1"), ("WASMBOX_OFFLINE", "1")]).await;
    let unspecified = format!("http://0.0.0.0:{port}/hook");
    for url in [
        unspecified.as_str(),
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://100.100.100.200/latest/meta-data/",
        "http://192.0.0.192/opc/v2/instance/",
        "http://10.0.0.1/hook",
        "http://172.16.5.4/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[::]/",
        "http://224.0.0.1/",
        "http://[ff02::1]/",
        "http://255.255.255.255/",
        "http://167772161/",
    ] {
        let r = call(
            &c,
            "execute_code_async",
            json!({"code": "print(1)", "callback_url": url}),
        )
        .await;
        assert!(is_error(&r), "{url} must be refused: {:?}", r.content);
        let v = object(&r);
        assert_eq!(v["error"], "Invalid callback_url", "{url}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("WASMBOX_WEBHOOK_ALLOW_PRIVATE"),
            "{url}: {v}"
        );
    }
    // Loopback is still fine.
    let r = call(
        &c,
        "execute_code_async",
        json!({"code": "print(1)", "callback_url": format!("http://127.0.0.1:{port}/hook")}),
    )
    .await;
    assert!(!is_error(&r), "{:?}", r.content);
    c.cancel().await.unwrap();

    // Both switches: private targets are allowed (0.0.0.0 reaches the listener here).
    let c = server_with_env(&[
        ("WASMBOX_WEBHOOK_ALLOW_ANY", "1"),
        ("WASMBOX_WEBHOOK_ALLOW_PRIVATE", "1"),
        ("WASMBOX_OFFLINE", "1"),
    ])
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = call(
        &c,
        "execute_code_async",
        json!({"code": "print(1)", "callback_url": format!("http://0.0.0.0:{port}/hook")}),
    )
    .await;
    assert!(!is_error(&r), "{:?}", r.content);
    tokio::time::timeout(std::time::Duration::from_secs(60), listener.accept())
        .await
        .expect("the webhook was called")
        .unwrap();
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn the_key_never_appears_in_any_answer() {
    let c = server_for_attacks().await;
    let id = create_sandbox(&c, json!({})).await;
    let mut answers: Vec<Value> = Vec::new();
    for (tool, args) in [
        ("health", json!({})),
        ("get_system_metrics", json!({"sandbox_id": id})),
        ("get_vm_info", json!({"sandbox_id": id})),
        ("get_sandbox", json!({"id": id})),
        ("list_sandboxes", json!({})),
        ("cache_stats", json!({})),
        ("env_get", json!({"sandbox_id": id})),
        (
            "execute_code",
            json!({"language": "bash", "code": "echo $HOPX_API_KEY"}),
        ),
        ("create_sandbox", json!({"internet_access": true})),
        (
            "run_command",
            json!({"sandbox_id": id, "command": "env | grep HOPX"}),
        ),
    ] {
        let r = call(&c, tool, args).await;
        answers.push(object(&r));
    }
    let all = serde_json::to_string(&answers).unwrap();
    assert!(!all.contains(KEY), "the key leaked: {all}");
    c.cancel().await.unwrap();
}
