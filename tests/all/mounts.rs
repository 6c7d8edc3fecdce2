//! Host folders lent with WASMBOX_MOUNTS (#34), over MCP with rmcp's client: every language
//! reads them at `/data/...` and `/mnt`, read-only mounts refuse every change, and nothing
//! leads out of a mount.

use serde_json::{Value, json};

use crate::common::*;

async fn run(c: &Client, language: &str, code: &str, extra: Value) -> Value {
    let mut args = json!({"code": code, "language": language});
    args.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    object(&call(c, "execute_code", args).await)
}

fn lent() -> (tempfile::TempDir, tempfile::TempDir, String) {
    let sales = tempfile::tempdir().unwrap();
    std::fs::write(
        sales.path().join("q.csv"),
        "region,amount\nnorth,3\nsouth,4\n",
    )
    .unwrap();
    std::fs::create_dir(sales.path().join("2026")).unwrap();
    let notes = tempfile::tempdir().unwrap();
    std::fs::write(notes.path().join("n.txt"), "lent").unwrap();
    let mounts = format!(
        "{}:/data/sales,{}:/mnt",
        sales.path().display(),
        notes.path().display()
    );
    (sales, notes, mounts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_reads_lent_folders() {
    let (sales, notes, mounts) = lent();
    let c = server_with_env(&[("WASMBOX_MOUNTS", &mounts)]).await;
    let py = run(
        &c,
        "python",
        "import os, pandas as pd\nprint(os.listdir('/data'), sorted(os.listdir('/data/sales')), open('/mnt/n.txt').read())\nprint(pd.read_csv('/data/sales/q.csv')['amount'].sum())",
        json!({}),
    )
    .await;
    assert_eq!(
        py["stdout"], "['sales'] ['2026', 'q.csv'] lent\n7\n",
        "{py}"
    );
    let js = run(
        &c,
        "javascript",
        "const fs = require('fs'); console.log(fs.readFileSync('/data/sales/q.csv', 'utf8').split('\\n').length, fs.readdirSync('/data'))",
        json!({}),
    )
    .await;
    assert_eq!(js["stdout"], "4 [ 'sales' ]\n", "{js}");
    let go = run(
        &c,
        "go",
        "package main\nimport (\"fmt\"; \"os\")\nfunc main() { b, err := os.ReadFile(\"/data/sales/q.csv\"); fmt.Println(len(b), err) }",
        json!({}),
    )
    .await;
    assert_eq!(go["stdout"], "30 <nil>\n", "{go}");
    // A sandbox sees them too.
    let sb = object(&call(&c, "create_sandbox", json!({})).await)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = run(
        &c,
        "python",
        "print(open('/data/sales/q.csv').readline().strip())",
        json!({"sandbox_id": sb, "mode": "persistent"}),
    )
    .await;
    assert_eq!(r["stdout"], "region,amount\n", "{r}");
    let info = object(&call(&c, "get_sandbox", json!({"id": sb})).await);
    assert_eq!(
        info["mounts"],
        json!([{"path": "/data/sales", "mode": "ro"}, {"path": "/mnt", "mode": "ro"}]),
        "{info}"
    );
    // The file tools read there, and refuse to change anything.
    let read = object(
        &call(
            &c,
            "file_read",
            json!({"sandbox_id": sb, "path": "/data/sales/q.csv"}),
        )
        .await,
    );
    assert_eq!(
        read["content"], "region,amount\nnorth,3\nsouth,4\n",
        "{read}"
    );
    let list = object(&call(&c, "file_list", json!({"sandbox_id": sb, "path": "/mnt"})).await);
    assert_eq!(list["files"][0]["name"], "n.txt", "{list}");
    // `/data` shows the folders lent below it; health lists them; a fork says they stay.
    let list = object(&call(&c, "file_list", json!({"sandbox_id": sb, "path": "/data"})).await);
    assert_eq!(list["files"][0]["path"], "/data/sales", "{list}");
    let health = object(&call(&c, "health", json!({})).await);
    assert_eq!(health["mounts"], info["mounts"], "{health}");
    let fork = object(&call(&c, "fork_sandbox", json!({"sandbox_id": sb})).await);
    assert!(
        fork["notes"].to_string().contains("are not copied"),
        "{fork}"
    );
    for (tool, args) in [
        (
            "file_write",
            json!({"sandbox_id": sb, "path": "/mnt/x", "content": "no"}),
        ),
        (
            "file_remove",
            json!({"sandbox_id": sb, "path": "/data/sales/q.csv"}),
        ),
        (
            "file_mkdir",
            json!({"sandbox_id": sb, "path": "/data/sales/d"}),
        ),
    ] {
        let r = call(&c, tool, args).await;
        assert_eq!(r.is_error, Some(true), "{tool}: {:?}", r.content);
    }
    assert!(sales.path().join("q.csv").exists() && !notes.path().join("x").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_mounts_refuse_changes_and_nothing_leads_out() {
    let (sales, _notes, mounts) = lent();
    std::os::unix::fs::symlink("/etc/passwd", sales.path().join("out")).unwrap();
    std::os::unix::fs::symlink("/", sales.path().join("root")).unwrap();
    let c = server_with_env(&[("WASMBOX_MOUNTS", &mounts)]).await;
    let code = r#"
import os
tries = [
    lambda: open('/data/sales/new', 'w'),
    lambda: open('/data/sales/q.csv', 'a'),
    lambda: os.rename('/data/sales/q.csv', '/data/sales/r.csv'),
    lambda: os.rename('/data/sales/q.csv', '/workspace/q.csv'),
    lambda: os.remove('/data/sales/q.csv'),
    lambda: os.mkdir('/data/sales/d'),
    lambda: os.rmdir('/data/sales/2026'),
    lambda: os.symlink('/x', '/data/sales/l'),
    lambda: os.link('/data/sales/q.csv', '/workspace/l'),
    lambda: open('/data/sales/out').read(),
    lambda: open('/data/sales/root/etc/passwd').read(),
    lambda: open('/data/sales/../../etc/passwd').read(),
    lambda: open('/mnt/../etc/passwd').read(),
    lambda: os.listdir('/data/sales/root'),
]
for i, t in enumerate(tries):
    try:
        t()
        print(i, 'did it')
    except OSError as e:
        pass
print(open('/data/sales/q.csv').read()[:6], 'done')
"#;
    let r = run(&c, "python", code, json!({})).await;
    // The mount is there (the read works); every change and every way out is refused.
    assert_eq!(r["stdout"], "region done\n", "{r}");
    let mut names: Vec<String> = std::fs::read_dir(sales.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["2026", "out", "q.csv", "root"]);
    assert_eq!(
        std::fs::read_to_string(sales.path().join("q.csv")).unwrap(),
        "region,amount\nnorth,3\nsouth,4\n"
    );
}

#[test]
fn a_missing_folder_stops_the_server_naming_the_setting() {
    prepare();
    let out = std::process::Command::new(BIN)
        .args(["run", "--code", "print(1)"])
        .env("WASMBOX_MOUNTS", "/no/such/folder:/data")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WASMBOX_MOUNTS") && err.contains("/no/such/folder"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writable_mounts_take_writes_up_to_their_room_and_nothing_crosses_out() {
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("owners.bin"), vec![7u8; 3 << 20]).unwrap();
    let c = server_with_env(&[
        (
            "WASMBOX_MOUNTS",
            &format!("{}:/data/out:rw", out.path().display()),
        ),
        ("WASMBOX_MOUNT_DISK_MB", "1"),
        ("WASMBOX_MOUNT_FILES", "20"),
    ])
    .await;
    // Python and JavaScript write there; the owner's 3 MiB are not counted against the room.
    let code = r#"
import errno, os, pandas as pd
pd.DataFrame({'a': [1, 2]}).to_csv('/data/out/result.csv', index=False)
open('/workspace/w.txt', 'w').write('w')
for name, t in [
    ('rename out', lambda: os.rename('/data/out/result.csv', '/workspace/r.csv')),
    ('rename in', lambda: os.rename('/workspace/w.txt', '/data/out/w.txt')),
    ('link in', lambda: os.link('/workspace/w.txt', '/data/out/w.txt')),
]:
    try:
        t()
        print(name, 'did it')
    except OSError as e:
        print(name, e.errno == errno.EXDEV)
try:
    os.symlink('/etc/passwd', '/data/out/l')
    print('symlink did it')
except OSError as e:
    print('symlink', type(e).__name__)
os.rename('/data/out/result.csv', '/data/out/kept.csv')
print(sorted(os.listdir('/data/out')))
"#;
    let r = run(&c, "python", code, json!({})).await;
    assert_eq!(
        r["stdout"],
        "rename out True\nrename in True\nlink in True\nsymlink PermissionError\n['kept.csv', 'owners.bin']\n",
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(out.path().join("kept.csv")).unwrap(),
        "a\n1\n2\n"
    );
    let js = run(
        &c,
        "javascript",
        "require('fs').writeFileSync('/data/out/js.txt', 'from js'); console.log('ok')",
        json!({}),
    )
    .await;
    assert_eq!(js["stdout"], "ok\n", "{js}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("js.txt")).unwrap(),
        "from js"
    );
    // The file tools write there too, against the same room.
    let sb = object(&call(&c, "create_sandbox", json!({})).await)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let w = call(
        &c,
        "file_write",
        json!({"sandbox_id": sb, "path": "/data/out/notes/tool.txt", "content": "x".repeat(600_000)}),
    )
    .await;
    assert_ne!(w.is_error, Some(true), "{:?}", w.content);
    assert_eq!(
        std::fs::metadata(out.path().join("notes/tool.txt"))
            .unwrap()
            .len(),
        600_000
    );
    let full = call(
        &c,
        "file_write",
        json!({"sandbox_id": sb, "path": "/data/out/more.txt", "content": "y".repeat(600_000)}),
    )
    .await;
    assert_eq!(full.is_error, Some(true), "{:?}", full.content);
    assert!(
        format!("{:?}", full.content).contains("the lent folder /data/out is full"),
        "{:?}",
        full.content
    );
    // A guest stops at the room too, with a note that names the folder.
    let r = run(
        &c,
        "python",
        "f = open('/data/out/big.bin', 'wb')\nfor _ in range(8): f.write(b'z' * 100_000); f.flush()\nprint('wrote all')",
        json!({"sandbox_id": sb}),
    )
    .await;
    assert_ne!(r["stdout"], "wrote all\n", "{r}");
    assert!(
        r.to_string().contains("the lent folder /data/out is full"),
        "{r}"
    );
    let total: u64 = walk_bytes(out.path());
    assert!(
        total <= (3 << 20) + (1 << 20),
        "{total} bytes: more than the owner's plus 1 MiB"
    );
    // Removing frees room: the tools and guests write again.
    let rm = call(
        &c,
        "file_remove",
        json!({"sandbox_id": sb, "path": "/data/out/notes"}),
    )
    .await;
    assert_ne!(rm.is_error, Some(true), "{:?}", rm.content);
    let again = call(
        &c,
        "file_write",
        json!({"sandbox_id": sb, "path": "/data/out/more.txt", "content": "y".repeat(300_000)}),
    )
    .await;
    assert_ne!(again.is_error, Some(true), "{:?}", again.content);
    assert!(out.path().join("owners.bin").exists());
    let health = object(&call(&c, "health", json!({})).await);
    let room = health["mounts"][0]["room_bytes"].as_u64().unwrap();
    assert!(room < 1 << 20, "{health}");
}

fn walk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk_bytes(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

const A: &str = "token-alice-0123456789abcdef";
const B: &str = "token-bob-fedcba9876543210";
const C: &str = "token-carol-00112233445566";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_each_token_sees_only_its_own_folders() {
    let a = tempfile::tempdir().unwrap();
    std::fs::write(a.path().join("f.txt"), "alice's").unwrap();
    let b = tempfile::tempdir().unwrap();
    let lent = format!(
        "{A}={}:/data/a;{B}={}:/mnt:rw",
        a.path().display(),
        b.path().display()
    );
    let tokens = format!("{A},{B},{C}");
    let server = HttpServer::start(
        &[("WASMBOX_TOKEN", &tokens), ("WASMBOX_TOKEN_MOUNTS", &lent)],
        &[],
    )
    .await;
    let alice = server.client(A).await.unwrap();
    let bob = server.client(B).await.unwrap();
    let carol = server.client(C).await.unwrap();
    let probe = "import os\ntry:\n    print(open('/data/a/f.txt').read())\nexcept OSError as e:\n    print(type(e).__name__)\nprint(os.listdir('/mnt'))";
    let r = run(&alice, "python", probe, json!({})).await;
    assert_eq!(r["stdout"], "alice's\n[]\n", "{r}");
    let r = run(
        &bob,
        "python",
        &format!("{probe}\nopen('/mnt/b.txt', 'w').write('bob')"),
        json!({}),
    )
    .await;
    assert_eq!(r["stdout"], "FileNotFoundError\n[]\n", "{r}");
    assert_eq!(
        std::fs::read_to_string(b.path().join("b.txt")).unwrap(),
        "bob"
    );
    // A token lent nothing sees nothing.
    let r = run(&carol, "python", probe, json!({})).await;
    assert_eq!(r["stdout"], "FileNotFoundError\n[]\n", "{r}");
    // Sandboxes, their sessions and the file tools follow the same line.
    for (c, sees) in [(&alice, true), (&bob, false), (&carol, false)] {
        let sb = object(&call(c, "create_sandbox", json!({})).await)["id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = run(
            c,
            "javascript",
            "const fs = require('fs'); try { console.log(fs.readFileSync('/data/a/f.txt', 'utf8')) } catch (e) { console.log(e.code) }",
            json!({"sandbox_id": sb, "mode": "persistent"}),
        )
        .await;
        let want = if sees { "alice's\n" } else { "ENOENT\n" };
        assert_eq!(r["stdout"], want, "{r}");
        let read = call(
            c,
            "file_read",
            json!({"sandbox_id": sb, "path": "/data/a/f.txt"}),
        )
        .await;
        assert_eq!(read.is_error == Some(true), !sees, "{:?}", read.content);
    }
    let ha = object(&call(&alice, "health", json!({})).await);
    assert_eq!(
        ha["mounts"],
        json!([{"path": "/data/a", "mode": "ro"}]),
        "{ha}"
    );
    let hb = object(&call(&bob, "health", json!({})).await);
    assert_eq!(hb["mounts"][0]["path"], "/mnt", "{hb}");
    assert_eq!(hb["mounts"][0]["mode"], "rw", "{hb}");
    let hc = object(&call(&carol, "health", json!({})).await);
    assert!(hc.get("mounts").is_none(), "{hc}");
}

#[test]
fn token_mounts_name_only_served_tokens() {
    prepare();
    let d = tempfile::tempdir().unwrap();
    for (lent, says) in [
        (
            format!("not-a-served-token-000000={}:/data", d.path().display()),
            "not one of WASMBOX_TOKEN's",
        ),
        (
            format!("{A}={0}:/data:rw;{B}={0}:/mnt:rw", d.path().display()),
            "lent rw to two tokens",
        ),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--http", "127.0.0.1:0"])
            .env("WASMBOX_TOKEN", format!("{A},{B}"))
            .env("WASMBOX_TOKEN_MOUNTS", &lent)
            .env("WASMBOX_DATA", "none")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("WASMBOX_TOKEN_MOUNTS") && err.contains(says),
            "{err}"
        );
        assert!(
            !err.contains("not-a-served-token"),
            "the token is never printed: {err}"
        );
    }
}

#[test]
fn serve_over_http_refuses_lent_folders() {
    prepare();
    let d = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0"])
        .env("WASMBOX_MOUNTS", format!("{}:/data", d.path().display()))
        .env("WASMBOX_HTTP_TOKENS", "a-token-of-enough-length-1234")
        .env("WASMBOX_DATA", d.path().join("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WASMBOX_MOUNTS") && err.contains("WASMBOX_TOKEN_MOUNTS"),
        "{err}"
    );
}

/// #54: a run stopped at a lent folder's room says so in its `notes` (which folder, how much
/// room it had), one-shot or persistent, Python or JavaScript; and the room is back at once
/// when the files are removed (a guest's removal or `file_remove`), for a guest and for the
/// file tools. Before, `notes` was empty: only stderr named the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_at_a_lent_folders_room_names_it_in_notes_and_removal_frees_it_at_once() {
    let out = tempfile::tempdir().unwrap();
    let c = server_with_env(&[
        (
            "WASMBOX_MOUNTS",
            &format!("{}:/data/out:rw", out.path().display()),
        ),
        ("WASMBOX_MOUNT_DISK_MB", "1"),
        ("WASMBOX_MOUNT_FILES", "20"),
    ])
    .await;
    let sb = create_sandbox(&c, json!({})).await;
    let fill = [
        (
            "python",
            "f = open('/data/out/big.bin', 'wb')\nfor _ in range(30): f.write(b'z' * 100_000); f.flush()\nprint('wrote all')",
        ),
        (
            "javascript",
            "const fs = require('fs'); for (let i = 0; i < 30; i++) fs.appendFileSync('/data/out/big.bin', 'z'.repeat(100000)); console.log('wrote all')",
        ),
    ];
    for (language, code) in fill {
        for extra in [json!({}), json!({"sandbox_id": sb, "mode": "persistent"})] {
            let r = run(&c, language, code, extra.clone()).await;
            assert_eq!(r["limit"], "disk", "{language} {extra}: {r}");
            let notes = r["notes"].to_string();
            assert!(
                notes.contains("lent folder /data/out") && notes.contains("1048576 bytes"),
                "{language} {extra}: {r}"
            );
            // The room is back as soon as the file goes: the whole room at once.
            let again = run(
                &c,
                "python",
                "import os\nos.remove('/data/out/big.bin')\nopen('/data/out/room.bin', 'wb').write(b'r' * (1 << 20))\nos.remove('/data/out/room.bin')\nprint('room')",
                json!({}),
            )
            .await;
            assert_eq!(again["stdout"], "room\n", "{language} {extra}: {again}");
        }
    }
    let r = run(&c, "python", fill[0].1, json!({})).await;
    assert_eq!(r["limit"], "disk", "{r}");
    ok(
        &c,
        "file_remove",
        json!({"sandbox_id": sb, "path": "/data/out/big.bin"}),
    )
    .await;
    let w = ok(
        &c,
        "file_write",
        json!({"sandbox_id": sb, "path": "/data/out/tool.bin", "content": "t".repeat(1 << 20)}),
    )
    .await;
    assert_eq!(w["size"], 1 << 20, "{w}");
    c.cancel().await.unwrap();
}
