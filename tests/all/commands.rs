//! `run_command` on local sandboxes, and Bash through the same tools: to a fake HOPX (a real
//! HTTP server on 127.0.0.1) when a key is set, a clear error naming HOPX_API_KEY when not.

use crate::common;
use crate::common::fake_hopx;

use common::*;
use fake_hopx::{API_KEY, FakeHopx};
use serde_json::json;

#[tokio::test]
async fn language_commands_run_locally_on_the_sandbox_files() {
    let c = server_with_env(&[("HOPX_API_KEY", "")]).await;
    let id = ok(&c, "create_sandbox", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let write =
        |path: &str, content: &str| json!({"sandbox_id": id, "path": path, "content": content});
    ok(
        &c,
        "file_write",
        write(
            "app/main.py",
            "import sys\nprint('args', sys.argv[1:], __name__)\nsys.exit(3)",
        ),
    )
    .await;
    ok(&c, "file_write", write("app/m.js", "console.log(6 * 7)")).await;
    ok(
        &c,
        "file_write",
        write(
            "app/main.go",
            "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"go ran\") }",
        ),
    )
    .await;
    let cases = [
        (
            "python app/main.py a 'b c'",
            "args ['a', 'b c'] __main__\n",
            3,
        ),
        ("python3 -c 'print(1 + 1)'", "2\n", 0),
        ("node app/m.js", "42\n", 0),
        ("go run app/main.go", "go ran\n", 0),
    ];
    for (cmd, stdout, exit) in cases {
        let r = ok(&c, "run_command", json!({"sandbox_id": id, "command": cmd})).await;
        assert_eq!(r["stdout"], stdout, "{cmd}: {r}");
        assert_eq!(r["exit_code"], exit, "{cmd}: {r}");
        assert_eq!(r["location"], "local");
    }
    // Relative to working_dir.
    let r = ok(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": "node m.js", "working_dir": "/workspace/app"}),
    )
    .await;
    assert_eq!(r["stdout"], "42\n");
    // A missing file is named.
    let e = err(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": "python nope.py"}),
    )
    .await;
    assert!(e["stderr"].as_str().unwrap().contains("nope.py"), "{e}");
    // A shell command needs the cloud: the error says how to enable it.
    let e = err(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": "ls -la | wc -l"}),
    )
    .await;
    assert_eq!(e["exit_code"], 1);
    assert!(
        e["stderr"].as_str().unwrap().contains("HOPX_API_KEY"),
        "{e}"
    );
    // In the background: listed, with its output.
    let b = ok(
        &c,
        "run_command_background",
        json!({"sandbox_id": id, "command": "python -c 'print(7)'"}),
    )
    .await;
    let pid = b["process_id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let l = ok(&c, "execute_list_processes", json!({"sandbox_id": id})).await;
        let p = l["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["process_id"] == pid.as_str())
            .cloned()
            .unwrap();
        if p["status"] != "running" {
            assert_eq!(p["stdout"], "7\n", "{p}");
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn bash_without_a_key_fails_fast_and_says_how_to_enable_it() {
    let c = server_with_env(&[("HOPX_API_KEY", "")]).await;
    let e = err(
        &c,
        "execute_code",
        json!({"language": "bash", "code": "echo hi"}),
    )
    .await;
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("HOPX_API_KEY"), "{msg}");
    assert!(msg.contains("python"), "says what runs locally: {msg}");
    assert_eq!(e["exit_code"], 1);
    let e = err(
        &c,
        "execute_code",
        json!({"code": "print(1)", "internet_access": true}),
    )
    .await;
    assert!(
        e["message"].as_str().unwrap().contains("HOPX_API_KEY"),
        "{e}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn bash_one_shots_run_in_the_cloud_and_the_cloud_sandbox_is_deleted() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    let r = ok(
        &c,
        "execute_code",
        json!({"language": "bash", "code": "echo hi", "env": {"A": "1"}}),
    )
    .await;
    assert_eq!(r["location"], "cloud", "{r}");
    assert_eq!(r["exit_code"], 0);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with("[bash] echo hi\n"), "{out}");
    assert!(out.contains("A=1"), "{out}");
    assert_eq!(fake.count("POST", "/execute"), 1);
    assert!(
        fake.live_sandboxes().is_empty(),
        "the cloud sandbox is deleted after the run"
    );
    fake.assert_clean();
    // The key appears in no result.
    assert!(!r.to_string().contains(API_KEY));
    // A one-shot that asks for the internet goes to the cloud too, in any language.
    let r = ok(
        &c,
        "execute_code_isolated",
        json!({"language": "python", "code": "print(1)", "internet_access": true}),
    )
    .await;
    assert_eq!(r["location"], "cloud", "{r}");
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .starts_with("[python] print(1)")
    );
    assert!(fake.live_sandboxes().is_empty());
    // Python still runs locally: nothing more reaches the cloud.
    let before = fake.requests().len();
    let r = py(&c, "print('local')").await;
    assert_eq!(r["location"], "local");
    assert_eq!(fake.requests().len(), before);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn offline_mode_refuses_the_cloud_without_a_request() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let c = server_with_env(&[
        ("HOPX_API_KEY", API_KEY),
        ("HOPX_BASE_URL", &base),
        ("WASMBOX_OFFLINE", "1"),
    ])
    .await;
    let e = err(
        &c,
        "execute_code",
        json!({"language": "bash", "code": "echo hi"}),
    )
    .await;
    assert!(
        e["message"].as_str().unwrap().contains("WASMBOX_OFFLINE"),
        "{e}"
    );
    assert!(fake.requests().is_empty(), "no request reached HOPX");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn cloud_sandboxes_are_wasmbox_ids_whose_calls_are_forwarded() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    let s = ok(
        &c,
        "create_sandbox",
        json!({"template_id": "code-interpreter", "internet_access": true}),
    )
    .await;
    assert_eq!(s["location"], "cloud");
    let id = s["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("wb"), "a wasmbox id: {id}");
    let hopx = fake.live_sandboxes();
    assert_eq!(hopx.len(), 1);
    assert!(!hopx.contains(&id), "the HOPX id stays behind ours");

    let r = ok(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": "ls -la | wc -l"}),
    )
    .await;
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .starts_with("[bash] ls -la | wc -l"),
        "{r}"
    );
    assert_eq!(r["location"], "cloud");
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "/workspace/a.txt", "content": "cloud file"}),
    )
    .await;
    let f = ok(
        &c,
        "file_read",
        json!({"sandbox_id": id, "path": "/workspace/a.txt"}),
    )
    .await;
    assert_eq!(f["content"], "cloud file");
    ok(
        &c,
        "env_set",
        json!({"sandbox_id": id, "env_vars": {"K": "v"}}),
    )
    .await;
    let r = ok(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": "python", "code": "print(1)"}),
    )
    .await;
    assert!(r["stdout"].as_str().unwrap().contains("K=v"), "{r}");
    assert_eq!(r["location"], "cloud");

    // Both kinds are listed, with their location.
    let local = ok(&c, "create_sandbox", json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let l = ok(&c, "list_sandboxes", json!({})).await;
    let loc = |sid: &str| {
        l["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sandbox_id"] == sid)
            .map(|s| s["location"].clone())
    };
    assert_eq!(loc(&id), Some(json!("cloud")));
    assert_eq!(loc(&local), Some(json!("local")));

    ok(&c, "delete_sandbox", json!({"id": id})).await;
    assert!(fake.live_sandboxes().is_empty(), "deleted in the cloud too");
    let e = err(&c, "file_read", json!({"sandbox_id": id, "path": "a.txt"})).await;
    assert_eq!(e["error"], "Sandbox not found");
    fake.assert_clean();
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cloud_sandbox_without_a_key_is_a_clear_error() {
    let c = server_with_env(&[("HOPX_API_KEY", "")]).await;
    for args in [
        json!({"internet_access": true}),
        json!({"template_id": "ubuntu-desktop"}),
    ] {
        // An unknown name also lists the local templates (it may be a typo).
        let e = err(&c, "create_sandbox", args.clone()).await;
        let msg = e["exception"].as_str().unwrap();
        assert!(msg.contains("HOPX_API_KEY"), "{msg}");
        let kind = if args.get("internet_access").is_some() {
            "CloudUnavailable"
        } else {
            "TemplateNotFoundError"
        };
        assert_eq!(e["details"]["error_type"], kind);
    }
    c.cancel().await.unwrap();
}

/// Cloud sandboxes cost money and cannot be stopped from the host once lost: live ones are
/// capped in all (`WASMBOX_MAX_CLOUD_SANDBOXES`) and per owner
/// (`WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN`), cloud one-shots included while they run, and a
/// deleted one frees its place.
#[tokio::test]
async fn live_cloud_sandboxes_are_capped_in_all_and_per_owner() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let cloud = json!({"internet_access": true});
    let c = server_with_env(&[
        ("HOPX_API_KEY", API_KEY),
        ("HOPX_BASE_URL", &base),
        ("WASMBOX_MAX_CLOUD_SANDBOXES", "2"),
        ("WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN", "5"),
    ])
    .await;
    let first = create_sandbox(&c, cloud.clone()).await;
    create_sandbox(&c, cloud.clone()).await;
    let e = err(&c, "create_sandbox", cloud.clone()).await;
    let msg = e["exception"].as_str().unwrap();
    assert!(
        msg.contains("WASMBOX_MAX_CLOUD_SANDBOXES ") && msg.contains("(2"),
        "{msg}"
    );
    let e = err(
        &c,
        "execute_code",
        json!({"language": "bash", "code": "echo hi"}),
    )
    .await;
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("WASMBOX_MAX_CLOUD_SANDBOXES "),
        "{e}"
    );
    assert_eq!(fake.live_sandboxes().len(), 2, "none made past the cap");
    assert_eq!(fake.count("POST", "/v1/sandboxes"), 2);
    ok(&c, "delete_sandbox", json!({"id": first})).await;
    create_sandbox(&c, cloud.clone()).await;
    c.cancel().await.unwrap();

    // Per owner, with the defaults (4 per token of 8).
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    for _ in 0..4 {
        create_sandbox(&c, cloud.clone()).await;
    }
    let e = err(&c, "create_sandbox", cloud.clone()).await;
    let msg = e["exception"].as_str().unwrap();
    assert!(
        msg.contains("WASMBOX_MAX_CLOUD_SANDBOXES_PER_TOKEN") && msg.contains("(4"),
        "{msg}"
    );
    assert_eq!(e["details"]["error_type"], "SandboxLimitError", "{e}");
    fake.assert_clean();
    c.cancel().await.unwrap();
}

/// A cloud sandbox's lifetime is HOPX's own safety net: it is always sent, at most
/// `WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT` (1 h by default); asking for more is refused before any
/// request, with the maximum in the message.
#[tokio::test]
async fn cloud_sandbox_lifetimes_are_capped_and_always_sent() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    let e = err(
        &c,
        "create_sandbox",
        json!({"internet_access": true, "timeout_seconds": 7200}),
    )
    .await;
    let msg = e["exception"].as_str().unwrap();
    assert!(
        msg.contains("7200")
            && msg.contains("3600")
            && msg.contains("WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT"),
        "{msg}"
    );
    assert_eq!(e["details"]["error_type"], "InvalidArgument", "{e}");
    assert_eq!(
        fake.count("POST", "/v1/sandboxes"),
        0,
        "refused before HOPX"
    );

    let s = ok(&c, "create_sandbox", json!({"internet_access": true})).await;
    assert_eq!(s["timeout_seconds"], 3600, "{s}");
    let s = ok(
        &c,
        "create_sandbox",
        json!({"template_id": "base", "timeout_seconds": 600}),
    )
    .await;
    assert_eq!(s["timeout_seconds"], 600, "{s}");
    // One-shots in a cloud template and bash one-shots.
    ok(
        &c,
        "execute_code_isolated",
        json!({"language": "python", "code": "print(1)", "template_name": "base"}),
    )
    .await;
    ok(
        &c,
        "execute_code",
        json!({"language": "bash", "code": "echo hi"}),
    )
    .await;
    let sent: Vec<_> = fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/sandboxes")
        .map(|r| r.json()["timeout_seconds"].as_u64())
        .collect();
    assert_eq!(sent.len(), 4);
    assert_eq!(&sent[..2], [Some(3600), Some(600)]);
    for t in &sent[2..] {
        assert!(t.is_some_and(|t| (1..=3600).contains(&t)), "{sent:?}");
    }
    c.cancel().await.unwrap();

    // A lower maximum is honoured by one-shots too.
    let c = server_with_env(&[
        ("HOPX_API_KEY", API_KEY),
        ("HOPX_BASE_URL", &base),
        ("WASMBOX_CLOUD_SANDBOX_MAX_TIMEOUT", "300"),
    ])
    .await;
    let e = err(
        &c,
        "create_sandbox",
        json!({"internet_access": true, "timeout_seconds": 301}),
    )
    .await;
    assert!(e["exception"].as_str().unwrap().contains("300"), "{e}");
    ok(
        &c,
        "execute_code",
        json!({"language": "bash", "code": "echo hi"}),
    )
    .await;
    let last = fake
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.method == "POST" && r.path == "/v1/sandboxes")
        .unwrap();
    assert_eq!(last.json()["timeout_seconds"], 300);
    fake.assert_clean();
    c.cancel().await.unwrap();
}

/// Every tool that takes a sandbox, given a cloud sandbox's id, goes to the cloud (its answer,
/// or its failure, says `location: "cloud"`) or says it works on local sandboxes only: none
/// takes the id for a local sandbox and answers "not found". Listed from `tools/list`, so a
/// new tool is checked with no list here to update.
#[tokio::test]
async fn every_tool_on_a_cloud_sandbox_goes_to_the_cloud_or_says_it_cannot() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    let s = ok(
        &c,
        "create_sandbox",
        json!({"template_id": "code-interpreter", "internet_access": true}),
    )
    .await;
    let id = s["id"].as_str().unwrap().to_string();
    let mut tools = c.list_all_tools().await.unwrap();
    // Deleting it goes last.
    tools.sort_by_key(|t| t.name == "delete_sandbox");
    let mut checked = Vec::new();
    for t in tools {
        let required: Vec<String> = t
            .input_schema
            .get("required")
            .and_then(|r| r.as_array())
            .map(|r| {
                r.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let key = ["sandbox_id", "id"]
            .into_iter()
            .find(|k| t.input_schema["properties"].get(*k).is_some());
        let Some(key) = key else { continue };
        let mut args = serde_json::Map::new();
        for r in &required {
            let v = match r.as_str() {
                "sandbox_id" | "id" => json!(id),
                "path" => json!("/workspace/x.txt"),
                "content" => json!("x"),
                "content_base64" => json!("eA=="),
                "code" => json!("print(1)"),
                "language" => json!("python"),
                "command" => json!("echo hi"),
                "process_id" => json!("p1"),
                "env_vars" => json!({"K": "v"}),
                "timeout_seconds" => json!(60),
                "callback_url" => json!("http://127.0.0.1:9/x"),
                "port" => json!(8080),
                "packages" => json!(["six"]),
                other => panic!("{}: no test value for required argument {other}", t.name),
            };
            args.insert(r.clone(), v);
        }
        args.insert(key.into(), json!(id));
        if t.name == "execute_code" {
            args.insert("mode".into(), json!("persistent"));
        }
        let r = call(&c, &t.name, serde_json::Value::Object(args)).await;
        let v = object(&r);
        let cloud = v["location"] == "cloud";
        let local_only = is_error(&r) && v["error"] == "Not supported for cloud sandboxes";
        assert!(
            cloud || local_only,
            "{} on a cloud sandbox answered neither from the cloud nor that it cannot: {v}",
            t.name
        );
        checked.push((t.name.to_string(), cloud));
    }
    let cloud_tools: Vec<&str> = checked
        .iter()
        .filter(|(_, cloud)| *cloud)
        .map(|(n, _)| n.as_str())
        .collect();
    for n in [
        "execute_code",
        "run_command",
        "file_read",
        "env_get",
        "delete_sandbox",
    ] {
        assert!(
            cloud_tools.contains(&n),
            "{n} has a cloud path: {checked:?}"
        );
    }
    c.cancel().await.unwrap();
}
