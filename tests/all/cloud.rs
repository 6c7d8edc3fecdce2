//! The cloud fallback against a fake HOPX (a real HTTP server on 127.0.0.1, see
//! `common/fake_hopx.rs`), plus the routing rules. Nothing here talks to the internet.

use crate::common::fake_hopx;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::Method;
use serde_json::json;
use wasmbox::cloud::*;
use wasmbox::lang::Language;

use fake_hopx::{API_KEY, FakeHopx, Fault};

/// Every log line of this test binary (all levels, all crates).
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .init();
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned()
}

/// A config as `from_env` would build it (trailing `/` on the base URL included), with timings
/// that keep the tests fast.
fn config(fake: &FakeHopx, key: Option<&str>) -> CloudConfig {
    capture_logs();
    let base = format!("{}/", fake.base_url());
    let key = key.map(String::from);
    let mut c = CloudConfig::from_vars(|k| match k {
        "HOPX_API_KEY" => key.clone(),
        "HOPX_BASE_URL" => Some(base.clone()),
        _ => None,
    });
    assert_eq!(c.base_url, fake.base_url());
    c.request_timeout = Duration::from_secs(3);
    c.execute_grace = Duration::from_millis(300);
    c.ready_timeout = Duration::from_secs(3);
    c.poll_interval = Duration::from_millis(10);
    c.retry_delay = Duration::from_millis(10);
    c.max_retry_delay = Duration::from_millis(50);
    c
}

fn cloud(fake: &FakeHopx) -> Cloud {
    Cloud::new(config(fake, Some(API_KEY))).unwrap()
}

/// A code-interpreter sandbox started in the fake cloud.
async fn started(cloud: &Cloud) -> Agent {
    cloud
        .start(&CreateSandbox::new("code-interpreter"))
        .await
        .unwrap()
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Asserts the key appears in none of the texts a user or a log could see.
fn assert_no_key(texts: &[String]) {
    for t in texts {
        assert!(!t.contains(API_KEY), "the API key leaked into: {t}");
    }
}

/// Waits until the fake has no live sandbox (a spawned deletion may still be on its way).
async fn assert_all_deleted(fake: &FakeHopx) {
    let until = Instant::now() + Duration::from_secs(3);
    while !fake.live_sandboxes().is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        fake.live_sandboxes(),
        Vec::<String>::new(),
        "sandboxes left behind"
    );
}

#[tokio::test]
async fn bash_oneshot_creates_executes_and_deletes() {
    let fake = FakeHopx::start().await;
    let out = cloud(&fake)
        .oneshot(
            "bash",
            "echo hi && uname",
            Duration::from_secs(5),
            &env(&[("A", "1")]),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, "[bash] echo hi && uname\nA=1\n");
    assert_eq!((out.exit_code, out.success), (0, true));
    assert_eq!(out.execution_time, 0.012);
    let id = out.sandbox_id.clone();
    let local_shape = out.clone().into_exec_result(Language::Bash);
    assert_eq!(
        (
            local_shape.stdout.as_str(),
            local_shape.exit_code,
            local_shape.success
        ),
        (out.stdout.as_str(), 0, true)
    );
    assert_eq!(
        fake.calls(),
        [
            "POST /v1/sandboxes".to_string(),
            format!("GET /v1/sandboxes/{id}"),
            "GET /agent/health".into(),
            "POST /agent/execute".into(),
            format!("DELETE /v1/sandboxes/{id}"),
        ]
    );
    let reqs = fake.requests();
    for r in &reqs {
        if r.path.starts_with("/v1/") {
            assert_eq!(r.header("x-api-key"), Some(API_KEY), "{r:?}");
            assert_eq!(r.header("authorization"), None);
        } else {
            assert_eq!(
                r.header("authorization"),
                Some(format!("Bearer jwt-{id}-1").as_str())
            );
            assert_eq!(r.header("x-api-key"), None);
        }
        assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    }
    assert_eq!(
        reqs[0].json(),
        json!({"template_name": "code-interpreter", "timeout_seconds": 600, "internet_access": true})
    );
    assert_eq!(
        reqs[3].json(),
        json!({"language": "bash", "code": "echo hi && uname", "workdir": "/workspace",
               "timeout": 5, "env": {"A": "1"}})
    );
    assert_all_deleted(&fake).await;
    fake.assert_clean();
}

#[tokio::test]
async fn a_failing_program_is_a_result_not_an_error() {
    let fake = FakeHopx::start().await;
    let out = cloud(&fake)
        .oneshot(
            "python",
            "import sys; exit 3",
            Duration::from_millis(1500),
            &BTreeMap::new(),
        )
        .await
        .unwrap();
    assert_eq!((out.exit_code, out.success), (3, false));
    // Whole seconds, rounded up; no env key when there is none.
    let exec = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/execute"))
        .unwrap();
    assert_eq!(exec.json()["timeout"], 2);
    assert!(exec.json().get("env").is_none());
    assert_all_deleted(&fake).await;
    fake.assert_clean();
}

#[tokio::test]
async fn commands_files_env_and_processes_in_one_sandbox() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    let sb = started(&cloud).await;

    let mut cmd = CommandRequest::new("ls -la | wc -l");
    cmd.env = env(&[("X", "y")]);
    let out = sb.run_command(&cmd).await.unwrap();
    assert_eq!(out.stdout, "[bash] ls -la | wc -l\nX=y\n");
    assert_eq!(out.sandbox_id, sb.id());
    let run = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/commands/run"))
        .unwrap();
    assert_eq!(
        run.json(),
        json!({"command": "bash", "args": ["-c", "ls -la | wc -l"], "timeout": 30,
               "workdir": "/workspace", "env": {"X": "y"}})
    );

    // Files: a round trip, listing, existence, removal, and the agent's coded errors.
    sb.write_file("/workspace/a.txt", "héllo\n").await.unwrap();
    assert_eq!(
        fake.file(sb.id(), "/workspace/a.txt").as_deref(),
        Some("héllo\n")
    );
    assert_eq!(sb.read_file("/workspace/a.txt").await.unwrap(), "héllo\n");
    sb.mkdir("/workspace/sub").await.unwrap();
    let files = sb.list_files("/workspace").await.unwrap();
    let names: Vec<(&str, bool)> = files
        .iter()
        .map(|f| (f.name.as_str(), f.is_directory))
        .collect();
    assert_eq!(names, [("a.txt", false), ("sub", true)]);
    assert_eq!(files[0].size, 7);
    assert_eq!(files[0].permissions.as_deref(), Some("0644"));
    assert!(sb.file_exists("/workspace/a.txt").await.unwrap());
    sb.remove_file("/workspace/a.txt").await.unwrap();
    assert!(!sb.file_exists("/workspace/a.txt").await.unwrap());
    let err = sb.read_file("/workspace/a.txt").await.unwrap_err();
    assert!(
        matches!(&err, CloudError::Agent { code, status: 404, .. } if code == "FILE_NOT_FOUND"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the HOPX sandbox refused file read: File not found (FILE_NOT_FOUND)"
    );
    let err = sb.write_file("/etc/passwd", "x").await.unwrap_err();
    assert!(err.to_string().contains("PATH_NOT_ALLOWED"), "{err}");
    let q = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/files/read"))
        .unwrap();
    assert_eq!(q.query, "path=%2Fworkspace%2Fa.txt");

    // Env: merge (PATCH, 204, then GET), replace (PUT), clear.
    let vars = sb
        .env_set(&env(&[("DEBUG", "1"), ("API_TOKEN", "t0p")]), true)
        .await
        .unwrap();
    assert_eq!(vars, env(&[("API_TOKEN", "***MASKED***"), ("DEBUG", "1")]));
    let out = sb
        .execute(&ExecuteRequest::new("python", "print(1)"))
        .await
        .unwrap();
    assert_eq!(out.stdout, "[python] print(1)\nAPI_TOKEN=t0p\nDEBUG=1\n");
    let vars = sb.env_set(&env(&[("ONLY", "this")]), false).await.unwrap();
    assert_eq!(vars, env(&[("ONLY", "this")]));
    assert_eq!(sb.env_get().await.unwrap(), env(&[("ONLY", "this")]));
    sb.env_clear().await.unwrap();
    assert_eq!(sb.env_get().await.unwrap(), BTreeMap::new());
    let calls = fake.calls();
    let env_calls: Vec<&str> = calls
        .iter()
        .map(String::as_str)
        .filter(|c| c.ends_with("/env"))
        .collect();
    assert_eq!(
        env_calls,
        [
            "PATCH /agent/env",
            "GET /agent/env",
            "PUT /agent/env",
            "GET /agent/env",
            "PUT /agent/env",
            "GET /agent/env"
        ]
    );

    // Background runs.
    let started = sb
        .run_command_background(&CommandRequest::new("sleep 100"))
        .await
        .unwrap();
    assert_eq!(started["process_id"], "cmd_1");
    let mut bg = ExecuteRequest::new("python", "import time; time.sleep(100)");
    bg.timeout = Duration::from_secs(300);
    let started = sb.execute_background(&bg, Some("sleeper")).await.unwrap();
    assert_eq!(started["process_id"], "proc_2");
    let procs = sb.list_processes().await.unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(sb.kill_process("proc_2").await.unwrap()["status"], "killed");
    let err = sb.kill_process("nope").await.unwrap_err();
    assert!(err.to_string().contains("PROCESS_NOT_FOUND"), "{err}");

    // Listing and deleting through the control plane.
    let listed = cloud.list_sandboxes(10, Some("running")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sb.id());
    assert_eq!(listed[0].agent_url().unwrap(), sb.agent_url());
    assert!(!sb.agent_url().ends_with('/'));
    let list = fake
        .requests()
        .into_iter()
        .find(|r| r.method == "GET" && r.path == "/v1/sandboxes")
        .unwrap();
    assert_eq!(list.query, "limit=10&status=running");
    sb.delete().await.unwrap();
    // Deleting again is fine: the sandbox is gone either way.
    sb.delete().await.unwrap();
    assert_all_deleted(&fake).await;
    fake.assert_clean();
}

#[tokio::test]
async fn numeric_templates_go_as_template_id_and_env_vars_are_applied() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    let mut req = CreateSandbox::new("291");
    req.env_vars = env(&[("MODE", "test")]);
    req.region = Some("eu-west".into());
    let sb = cloud.start(&req).await.unwrap();
    let reqs = fake.requests();
    // The lifetime is always sent: the maximum when none was asked for.
    assert_eq!(
        reqs[0].json(),
        json!({"template_id": "291", "region": "eu-west", "env_vars": {"MODE": "test"},
               "timeout_seconds": 3600})
    );
    // The SDK's way: create-time variables are applied through the agent as well.
    assert!(fake.calls().contains(&"PATCH /agent/env".to_string()));
    assert_eq!(sb.env_get().await.unwrap(), env(&[("MODE", "test")]));
    sb.delete().await.unwrap();
    fake.assert_clean();
}

#[tokio::test]
async fn the_sandbox_is_deleted_when_execute_fails_with_500_and_execute_is_sent_once() {
    let fake = FakeHopx::start().await;
    fake.fail(
        Method::POST,
        "/execute",
        5,
        Fault::Status(
            500,
            json!({"error": "kernel died", "code": "INTERNAL_ERROR"}),
        ),
    );
    let err = cloud(&fake)
        .oneshot(
            "python",
            "print(1)",
            Duration::from_secs(5),
            &BTreeMap::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, CloudError::Server { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "HOPX server error (500) during code execution: kernel died; not retried, because running \
         it again could run the code twice"
    );
    assert_eq!(fake.count("POST", "/execute"), 1);
    assert_eq!(fake.count("DELETE", ""), 1);
    assert_all_deleted(&fake).await;
    fake.assert_clean();
}

#[tokio::test]
async fn a_rate_limited_execute_is_not_resent() {
    let fake = FakeHopx::start().await;
    fake.fail(
        Method::POST,
        "/execute",
        5,
        Fault::Status(
            429,
            json!({"error": {"message": "Too many requests", "code": "rate_limited",
                                            "details": {"retry_after_seconds": 5}}}),
        ),
    );
    let err = cloud(&fake)
        .oneshot("bash", "echo 1", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX rate limit (429) during code execution, retry after 5 s"
    );
    assert_eq!(err.status(), Some(429));
    assert_eq!(fake.count("POST", "/execute"), 1);
    assert_all_deleted(&fake).await;

    let fake = FakeHopx::start().await;
    fake.fail(
        Method::POST,
        "/commands/run",
        5,
        Fault::Status(503, json!({"error": "busy", "code": "INTERNAL_ERROR"})),
    );
    let sb = cloud(&fake)
        .start(&CreateSandbox::new("code-interpreter"))
        .await
        .unwrap();
    let err = sb
        .run_command(&CommandRequest::new("echo 1"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(503));
    assert_eq!(fake.count("POST", "/commands/run"), 1);
    sb.delete().await.unwrap();
    fake.assert_clean();
}

#[tokio::test]
async fn the_sandbox_is_deleted_when_execute_times_out() {
    let fake = FakeHopx::start().await;
    fake.fail(
        Method::POST,
        "/execute",
        1,
        Fault::Delay(Duration::from_secs(20)),
    );
    let t = Instant::now();
    let err = cloud(&fake)
        .oneshot(
            "python",
            "while True: pass",
            Duration::from_secs(1),
            &BTreeMap::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Timeout { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("HOPX code execution timed out after 2 s; not retried"),
        "{err}"
    );
    // The run's timeout plus the grace (1.3 s), not the fake's delay.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(fake.count("POST", "/execute"), 1);
    assert_all_deleted(&fake).await;
}

#[tokio::test]
async fn the_sandbox_is_deleted_when_the_caller_gives_up() {
    let fake = FakeHopx::start().await;
    fake.fail(
        Method::POST,
        "/execute",
        1,
        Fault::Delay(Duration::from_secs(20)),
    );
    let cloud = cloud(&fake);
    let no_env = BTreeMap::new();
    let mut run = Box::pin(cloud.oneshot(
        "python",
        "import time; time.sleep(60)",
        Duration::from_secs(60),
        &no_env,
    ));
    // Give up once the code is running, as an MCP client cancelling a call would.
    tokio::select! {
        r = &mut run => panic!("the run should still be going: {r:?}"),
        _ = async {
            while fake.count("POST", "/execute") == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } => {}
    }
    assert!(!fake.live_sandboxes().is_empty());
    drop(run);
    assert_all_deleted(&fake).await;
    assert_eq!(fake.count("POST", "/execute"), 1);
}

#[tokio::test]
async fn a_sandbox_that_never_gets_healthy_is_deleted() {
    let fake = FakeHopx::start().await;
    fake.knobs().health_not_ready(u32::MAX);
    let mut c = config(&fake, Some(API_KEY));
    c.ready_timeout = Duration::from_millis(300);
    let cloud = Cloud::new(c).unwrap();
    let err = cloud
        .oneshot("bash", "true", Duration::from_secs(1), &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::NotReady { .. }), "{err:?}");
    assert!(err.to_string().contains("last: status 'starting'"), "{err}");
    assert_eq!(fake.count("POST", "/execute"), 0);
    assert_all_deleted(&fake).await;
    // `start` hands a sandbox over only once it is ready; a failed start cleans up too.
    let err = cloud.start(&CreateSandbox::new("base")).await.unwrap_err();
    assert!(matches!(err, CloudError::NotReady { .. }), "{err:?}");
    assert_eq!(fake.count("DELETE", ""), 2);
    assert_all_deleted(&fake).await;
}

#[tokio::test]
async fn readiness_waits_for_a_healthy_agent_and_fetches_a_missing_token() {
    let fake = FakeHopx::start().await;
    fake.knobs().health_not_ready(3);
    fake.knobs().create_token(false);
    let out = cloud(&fake)
        .oneshot(
            "go",
            "package main",
            Duration::from_secs(5),
            &BTreeMap::new(),
        )
        .await
        .unwrap();
    let id = &out.sandbox_id;
    assert_eq!(fake.count("GET", "/health"), 4);
    let calls = fake.calls();
    assert_eq!(calls[2], format!("POST /v1/sandboxes/{id}/token/refresh"));
    let exec = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/execute"))
        .unwrap();
    assert_eq!(
        exec.header("authorization"),
        Some(format!("Bearer jwt-{id}-2").as_str())
    );
    assert_all_deleted(&fake).await;
    fake.assert_clean();
}

#[tokio::test]
async fn an_expired_token_is_refreshed_before_use() {
    let fake = FakeHopx::start().await;
    fake.knobs().token_ttl(-10);
    let out = cloud(&fake)
        .oneshot(
            "python",
            "print(1)",
            Duration::from_secs(5),
            &BTreeMap::new(),
        )
        .await
        .unwrap();
    let id = &out.sandbox_id;
    // Every agent call went out with a token from a refresh, never the expired first one.
    let reqs = fake.requests();
    for r in reqs.iter().filter(|r| r.path.starts_with("/agent/")) {
        let auth = r.header("authorization").unwrap();
        assert_ne!(auth, format!("Bearer jwt-{id}-1"), "{r:?}");
    }
    assert!(fake.count("POST", "/token/refresh") >= 2);
    assert_eq!(fake.count("POST", "/execute"), 1);
    fake.assert_clean();
}

#[tokio::test]
async fn an_agent_401_refreshes_the_token_and_resends_once() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    let sb = started(&cloud).await;
    let id = sb.id().to_string();
    fake.revoke_token(&id);
    let out = sb
        .execute(&ExecuteRequest::new("python", "print(2)"))
        .await
        .unwrap();
    assert_eq!(out.stdout, "[python] print(2)\n");
    let execs: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/execute"))
        .collect();
    assert_eq!(
        execs.len(),
        2,
        "a 401 means nothing ran, so the run is sent again once"
    );
    assert_eq!(
        execs[0].header("authorization"),
        Some(format!("Bearer jwt-{id}-1").as_str())
    );
    assert_eq!(
        execs[1].header("authorization"),
        Some(format!("Bearer jwt-{id}-2").as_str())
    );

    // A token the agent keeps refusing: one refresh, one resend, then a clear error.
    fake.fail(
        Method::POST,
        "/execute",
        5,
        Fault::Status(401, json!({"error": "nope", "code": "UNAUTHORIZED"})),
    );
    let err = sb
        .execute(&ExecuteRequest::new("python", "print(3)"))
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::BadToken { .. }), "{err:?}");
    assert_eq!(fake.count("POST", "/execute"), 4);
    sb.delete().await.unwrap();
    fake.assert_clean();
}

#[tokio::test]
async fn a_rejected_api_key_is_a_clear_error_without_retries() {
    let fake = FakeHopx::start().await;
    let cloud = Cloud::new(config(&fake, Some("hopx_wrong_key"))).unwrap();
    let err = cloud
        .oneshot("bash", "ls", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX rejected the API key (401): check HOPX_API_KEY"
    );
    assert_eq!(fake.calls(), ["POST /v1/sandboxes"]);
    let err = cloud.list_sandboxes(5, None).await.unwrap_err();
    assert!(matches!(err, CloudError::BadApiKey));
    assert_eq!(
        fake.count("GET", "/v1/sandboxes"),
        1,
        "a 401 is not retried"
    );
}

#[tokio::test]
async fn creation_is_never_retried_but_idempotent_calls_are() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    fake.fail(
        Method::POST,
        "/v1/sandboxes",
        1,
        Fault::Status(502, json!({"error": {"message": "bad gateway"}})),
    );
    let err = cloud
        .oneshot("bash", "ls", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX server error (502) during sandbox creation: bad gateway; not retried, because it \
         could create a second sandbox"
    );
    assert_eq!(fake.count("POST", "/v1/sandboxes"), 1);

    fake.fail(
        Method::GET,
        "/v1/sandboxes",
        2,
        Fault::Status(503, json!({"error": "busy"})),
    );
    assert!(cloud.list_sandboxes(5, None).await.unwrap().is_empty());
    assert_eq!(fake.count("GET", "/v1/sandboxes"), 3);

    fake.fail(
        Method::GET,
        "/v1/sandboxes",
        3,
        Fault::Status(503, json!({"error": "busy"})),
    );
    let err = cloud.list_sandboxes(5, None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX server error (503) during sandbox list: busy (after retries)"
    );
    assert_eq!(fake.count("GET", "/v1/sandboxes"), 6, "3 attempts in all");

    // A 429 on an idempotent call waits (capped) and tries again.
    fake.fail(
        Method::GET,
        "/v1/sandboxes",
        1,
        Fault::Status(
            429,
            json!({"error": {"message": "slow down", "details": {"retry_after_seconds": 1}}}),
        ),
    );
    cloud.list_sandboxes(5, None).await.unwrap();
    assert_eq!(fake.count("GET", "/v1/sandboxes"), 8);

    let err = cloud.get_sandbox("nope").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX: sandbox nope not found (404): Sandbox not found"
    );
    let err = cloud.connect("nope").await.unwrap_err();
    assert!(matches!(err, CloudError::NotFound { .. }));
    fake.fail(
        Method::POST,
        "/v1/sandboxes",
        1,
        Fault::Status(
            403,
            json!({"error": {"message": "Sandbox limit reached: 5 of 5", "code": "limit"}}),
        ),
    );
    let err = cloud
        .create_sandbox(&CreateSandbox::new("base"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX account limit reached (403) during sandbox creation: Sandbox limit reached: 5 of 5"
    );
    fake.assert_clean();
}

#[tokio::test]
async fn connect_attaches_to_an_existing_sandbox() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    let first = started(&cloud).await;
    let again = cloud.connect(first.id()).await.unwrap();
    assert_eq!(again.agent_url(), first.agent_url());
    let out = again
        .execute(&ExecuteRequest::new("javascript", "1"))
        .await
        .unwrap();
    assert_eq!(out.sandbox_id, first.id());
    // Connecting takes a fresh token (the first handle's is stale now, and refreshes on 401).
    let out = first
        .execute(&ExecuteRequest::new("javascript", "2"))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    again.delete().await.unwrap();
    let err = cloud.connect(first.id()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the HOPX sandbox {} is stopped, not running; create a new sandbox",
            first.id()
        )
    );
    fake.assert_clean();
}

#[tokio::test]
async fn idempotent_calls_are_retried_after_a_timeout() {
    let fake = FakeHopx::start().await;
    let mut c = config(&fake, Some(API_KEY));
    c.request_timeout = Duration::from_millis(300);
    let cloud = Cloud::new(c).unwrap();
    let sb = started(&cloud).await;
    sb.write_file("/workspace/x", "1").await.unwrap();
    fake.fail(
        Method::GET,
        "/files/read",
        1,
        Fault::Delay(Duration::from_secs(5)),
    );
    assert_eq!(sb.read_file("/workspace/x").await.unwrap(), "1");
    assert_eq!(fake.count("GET", "/files/read"), 2);
    // Every attempt timing out gives a timeout error that says it was retried.
    fake.fail(
        Method::GET,
        "/v1/sandboxes",
        3,
        Fault::Delay(Duration::from_secs(5)),
    );
    let err = cloud.list_sandboxes(5, None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "HOPX sandbox list timed out after 1 s (after retries)"
    );
    assert_eq!(fake.count("GET", "/v1/sandboxes"), 3);
    // A write is not retried.
    fake.fail(
        Method::POST,
        "/files/write",
        1,
        Fault::Delay(Duration::from_secs(5)),
    );
    let err = sb.write_file("/workspace/y", "2").await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout { .. }), "{err:?}");
    assert_eq!(fake.count("POST", "/files/write"), 2);
    sb.delete().await.unwrap();
    fake.assert_clean();
}

#[tokio::test]
async fn without_a_key_or_offline_nothing_is_sent() {
    let fake = FakeHopx::start().await;
    let no_key = config(&fake, None);
    let err = Cloud::new(no_key.clone())
        .unwrap()
        .oneshot("bash", "ls", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(err.is_unavailable());
    assert!(err.to_string().contains("set HOPX_API_KEY"), "{err}");
    let bash = RouteRequest {
        language: Some("bash"),
        ..Default::default()
    };
    let err = route(&bash, &no_key).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bash needs the HOPX cloud fallback: set HOPX_API_KEY (get a key at https://hopx.ai) to \
         run it there; python, javascript and go run locally without it"
    );

    let mut offline = config(&fake, Some(API_KEY));
    offline.offline = true;
    let cloud = Cloud::new(offline.clone()).unwrap();
    let err = cloud
        .oneshot("bash", "ls", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the cloud is disabled (--offline / WASMBOX_OFFLINE=1)"),
        "{err}"
    );
    assert!(
        cloud
            .list_sandboxes(1, None)
            .await
            .unwrap_err()
            .is_unavailable()
    );
    let err = route(&bash, &offline).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the cloud is disabled (--offline / WASMBOX_OFFLINE=1), and bash needs"),
        "{err}"
    );
    assert!(fake.requests().is_empty(), "{:?}", fake.calls());
}

#[tokio::test]
async fn the_api_key_never_leaks_into_logs_errors_or_results() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    let mut texts = Vec::new();

    let out = cloud
        .oneshot("bash", "echo ok", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap();
    texts.push(format!("{out:?}"));
    texts.push(serde_json::to_string(&out).unwrap());

    // A server that echoes the key back in an error body.
    fake.fail(
        Method::POST,
        "/v1/sandboxes",
        1,
        Fault::Status(
            500,
            json!({"error": {"message": "internal error for key {key}"}}),
        ),
    );
    let err = cloud
        .oneshot("bash", "echo", Duration::from_secs(5), &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("internal error for key ***"),
        "{err}"
    );
    texts.push(err.to_string());
    texts.push(format!("{err:?}"));
    fake.fail(
        Method::GET,
        "/v1/sandboxes",
        1,
        Fault::Status(400, json!("bad request, key={key}")),
    );
    let err = cloud.list_sandboxes(5, None).await.unwrap_err();
    assert!(err.to_string().contains("key=***"), "{err}");
    texts.push(err.to_string());

    let sb = started(&cloud).await;
    texts.push(format!("{sb:?}"));
    texts.push(format!("{cloud:?}"));
    texts.push(format!("{:?}", cloud.config()));
    let info = cloud.get_sandbox(sb.id()).await.unwrap();
    texts.push(format!("{info:?}"));
    texts.push(serde_json::to_string(&info).unwrap());
    for t in &texts[texts.len() - 4..] {
        assert!(!t.contains("jwt-"), "a sandbox token leaked into: {t}");
    }
    sb.delete().await.unwrap();

    let wrong = Cloud::new(config(&fake, Some("hopx_wrong_key"))).unwrap();
    let err = wrong.list_sandboxes(1, None).await.unwrap_err();
    texts.push(err.to_string());
    assert_no_key(&texts);

    let logs = logs();
    assert!(logs.contains("HOPX request"), "logs were not captured");
    assert!(
        logs.contains("HOPX sandbox created"),
        "logs were not captured"
    );
    assert!(!logs.contains(API_KEY), "the API key leaked into the logs");
    assert!(
        !logs.contains("hopx_wrong_key"),
        "a rejected API key leaked into the logs"
    );
    assert!(
        !logs.contains("Bearer jwt-"),
        "a sandbox token leaked into the logs"
    );
}

/// A redirect is an error on both planes: the key or a token would go where it points (reqwest
/// keeps `X-API-Key` across hosts), and a 307 would send the code to run there too.
#[tokio::test]
async fn redirects_are_refused_on_both_planes_and_nothing_reaches_their_target() {
    let fake = FakeHopx::start().await;
    let thief = FakeHopx::start().await;
    let cloud = cloud(&fake);
    fake.fail(
        Method::GET,
        "/v1/sandboxes",
        1,
        Fault::Redirect(307, format!("{}/v1/sandboxes", thief.base_url())),
    );
    let control = cloud.list_sandboxes(5, None).await.map(|l| l.len());
    let sb = started(&cloud).await;
    fake.fail(
        Method::POST,
        "/execute",
        1,
        Fault::Redirect(307, format!("{}/agent/x/execute", thief.base_url())),
    );
    let agent = sb
        .execute(&ExecuteRequest::new("python", "print(1)"))
        .await
        .map(|r| r.stdout);
    assert!(
        thief.requests().is_empty(),
        "a redirect was followed: {:?} (X-API-Key: {:?})",
        thief.calls(),
        thief.requests().first().and_then(|r| r.header("x-api-key"))
    );
    for (plane, r) in [
        ("control", control.map(|n| n.to_string())),
        ("agent", agent),
    ] {
        let msg = r.expect_err(plane).to_string();
        assert!(
            msg.contains("redirect (307)") && msg.contains("HOPX_BASE_URL"),
            "{plane}: {msg}"
        );
        assert_no_key(&[msg]);
    }
    // Sent once and not retried.
    assert_eq!(fake.count("GET", "/v1/sandboxes"), 1);
    assert_eq!(fake.count("POST", "/execute"), 1);
    sb.delete().await.unwrap();
}

/// Replies are read in chunks and dropped past a cap (1 MiB for the control plane, 16 MiB for
/// an agent), with or without a `Content-Length`, instead of being buffered whole.
#[tokio::test]
async fn huge_replies_are_cut_off_while_reading() {
    let fake = FakeHopx::start().await;
    let cloud = cloud(&fake);
    let sb = started(&cloud).await;
    let id = sb.id().to_string();
    sb.write_file("/workspace/big.txt", "x").await.unwrap();
    let cases: [(Method, &str, Fault, &str); 4] = [
        (Method::GET, "/v1/sandboxes", Fault::Huge(8 << 20), "1 MiB"),
        (
            Method::GET,
            "/v1/sandboxes",
            Fault::HugeSized(8 << 20),
            "1 MiB",
        ),
        (Method::GET, "/files/read", Fault::Huge(64 << 20), "16 MiB"),
        (
            Method::GET,
            "/files/read",
            Fault::HugeSized(64 << 20),
            "16 MiB",
        ),
    ];
    for (method, path, fault, cap) in cases {
        let what = format!("{path} {fault:?}");
        fake.fail(method, path, 1, fault);
        let r = if path == "/files/read" {
            sb.read_file("/workspace/big.txt").await.map(|c| c.len())
        } else {
            cloud.list_sandboxes(5, None).await.map(|l| l.len())
        };
        let msg = r.expect_err(&what).to_string();
        assert!(
            msg.contains("more than") && msg.contains(cap),
            "{what}: {msg}"
        );
    }
    // Nothing was retried, and a large reply under the cap is fine.
    assert_eq!(fake.count("GET", "/files/read"), 2);
    fake.fail(Method::GET, "/files/read", 1, Fault::Huge(4 << 20));
    let content = sb.read_file("/workspace/big.txt").await.unwrap();
    assert!(content.len() > 4_000_000, "{}", content.len());
    assert_eq!(cloud.get_sandbox(&id).await.unwrap().id, id);
    sb.delete().await.unwrap();
}

mod routing {
    use super::*;

    fn local(cmd: &str) -> LocalCommand {
        match classify_command(cmd) {
            CommandClass::Local(l) => l,
            other => panic!("{cmd:?} should run locally, got {other:?}"),
        }
    }

    fn needs_shell(cmd: &str) -> String {
        match classify_command(cmd) {
            CommandClass::NeedsShell(why) => why,
            other => panic!("{cmd:?} should need a shell, got {other:?}"),
        }
    }

    #[test]
    fn plain_interpreter_commands_run_locally() {
        let l = local("python main.py a 'b c'");
        assert_eq!(l.language, Language::Python);
        assert_eq!(l.program, Program::File("main.py".into()));
        assert_eq!(l.args, ["a", "b c"]);

        let l = local(r#"python3 -c "print('a | b; x')""#);
        assert_eq!(l.program, Program::Code("print('a | b; x')".into()));

        let l = local("python3 -c 'import sys; print(sys.argv[1:], 2*3)' one");
        assert_eq!(
            l.program,
            Program::Code("import sys; print(sys.argv[1:], 2*3)".into())
        );
        assert_eq!(l.args, ["one"]);

        let l = local("node app.js --port 3");
        assert_eq!(l.language, Language::JavaScript);
        assert_eq!(l.args, ["--port", "3"]);
        assert_eq!(
            local("node -e 'console.log(1)'").program,
            Program::Code("console.log(1)".into())
        );

        let l = local("  go run main.go x ");
        assert_eq!(l.language, Language::Go);
        assert_eq!(l.program, Program::File("main.go".into()));
        assert_eq!(l.args, ["x"]);
    }

    #[test]
    fn shell_syntax_needs_a_shell() {
        for cmd in [
            "python a.py | wc -l",
            "python a.py > out.txt",
            "python a.py < in.txt",
            "python a.py && echo ok",
            "python a.py; ls",
            "python a.py &",
            "python $FILE",
            "python \"$FILE\"",
            "python `which x`.py",
            "python *.py",
            "python a?.py",
            "X=1 python a.py",
            "python a.py\nls",
            "python ~/a.py",
            "python a.py # comment",
            "python a\\ b.py",
            "python 'a.py",
            "(python a.py)",
            "python {a,b}.py",
        ] {
            let why = needs_shell(cmd);
            assert!(why.contains("shell syntax"), "{cmd:?}: {why}");
        }
        // Quoted metacharacters are literal, so these stay local.
        local("python -c 'print(1 | 2 > 0; x = [1])'");
        local("python a.py 'a&b' \"c;d\" x=1");
    }

    #[test]
    fn other_programs_and_options_need_a_shell() {
        assert!(needs_shell("ls -la").contains("`ls` is not python"));
        assert!(needs_shell("pip install requests").contains("`pip`"));
        needs_shell("python");
        needs_shell("python -m pip install x");
        needs_shell("python -u a.py");
        needs_shell("python3 a.txt");
        needs_shell("node");
        needs_shell("go build .");
        needs_shell("go run .");
        needs_shell("/usr/bin/python3 a.py");
        assert!(needs_shell("   ").contains("empty"));
        assert!(needs_shell("").contains("empty"));
    }

    #[test]
    fn decide_sends_shells_network_and_cloud_templates_to_the_cloud() {
        let cloud = |r: RouteRequest| match decide(&r) {
            Location::Cloud { reason } => reason,
            Location::Local => panic!("{r:?} should go to the cloud"),
        };
        for lang in ["bash", "sh", "shell", " Bash "] {
            let r = cloud(RouteRequest {
                language: Some(lang),
                ..Default::default()
            });
            assert_eq!(
                r,
                CloudReason::Shell {
                    language: lang.trim().to_lowercase()
                }
            );
        }
        assert_eq!(
            cloud(RouteRequest {
                language: Some("python"),
                internet_access: true,
                ..Default::default()
            }),
            CloudReason::InternetAccess
        );
        assert_eq!(
            cloud(RouteRequest {
                template: Some("base"),
                ..Default::default()
            }),
            CloudReason::Template {
                name: "base".into()
            }
        );
        assert!(matches!(
            cloud(RouteRequest {
                template: Some("291"),
                ..Default::default()
            }),
            CloudReason::Template { .. }
        ));
        let r = cloud(RouteRequest {
            command: Some("ls | wc -l"),
            ..Default::default()
        });
        assert!(
            r.to_string()
                .starts_with("the command `ls | wc -l` (it uses shell syntax: `|`")
        );
    }

    #[test]
    fn decide_keeps_local_work_local() {
        for r in [
            RouteRequest::default(),
            RouteRequest {
                language: Some("python"),
                ..Default::default()
            },
            RouteRequest {
                language: Some("javascript"),
                template: Some("code-interpreter"),
                ..Default::default()
            },
            RouteRequest {
                language: Some("go"),
                template: Some("Go"),
                ..Default::default()
            },
            RouteRequest {
                command: Some("python3 main.py"),
                template: Some(""),
                ..Default::default()
            },
            // Unknown languages stay local, where validation names the valid ones.
            RouteRequest {
                language: Some("cobol"),
                ..Default::default()
            },
        ] {
            assert_eq!(decide(&r), Location::Local, "{r:?}");
        }
    }

    fn cfg(key: Option<&str>, offline: bool) -> CloudConfig {
        CloudConfig {
            api_key: key.map(Secret::from),
            offline,
            ..CloudConfig::default()
        }
    }

    #[test]
    fn route_fails_fast_when_the_cloud_is_unavailable() {
        let bash = RouteRequest {
            language: Some("bash"),
            ..Default::default()
        };
        let no_key = cfg(None, false);
        let err = route(&bash, &no_key).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bash needs the HOPX cloud fallback: set HOPX_API_KEY (get a key at https://hopx.ai) \
                 to run it there; python, javascript and go run locally without it"
        );
        let offline = cfg(Some("k"), true);
        let msg = route(&bash, &offline).unwrap_err().to_string();
        assert!(
            msg.starts_with("the cloud is disabled (--offline / WASMBOX_OFFLINE=1), and bash"),
            "{msg}"
        );
        let python = RouteRequest {
            language: Some("python"),
            ..Default::default()
        };
        assert_eq!(route(&python, &offline).unwrap(), Location::Local);
        assert_eq!(route(&python, &no_key).unwrap(), Location::Local);
        let with_key = cfg(Some("k"), false);
        assert!(matches!(
            route(&bash, &with_key).unwrap(),
            Location::Cloud { .. }
        ));
    }
}
