//! Background and async work counts against the server's limits (issue 21, class 3): job caps
//! in all and per owner, a bounded queue and the one-shot deadline cap for sandbox-less async
//! executions, and CPU slots reserved for calls a client waits on.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// A webhook target on 127.0.0.1 that accepts and answers every POST, so async executions have
/// somewhere to deliver.
async fn sink() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let _ = sock
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    .await;
            });
        }
    });
    url
}

/// Asserts that a plain one-shot is answered within `within` of being sent.
async fn answers_promptly(c: &Client, within: Duration) {
    let t = Instant::now();
    let r = tokio::time::timeout(within, py(c, "print('alive')"))
        .await
        .unwrap_or_else(|_| panic!("a plain one-shot waited more than {within:?}"));
    assert_eq!(r["stdout"], "alive\n", "{r}");
    assert!(t.elapsed() < within, "{:?}", t.elapsed());
}

/// Spinning async executions (sandbox-less) and background jobs together cannot keep a plain
/// call from starting: they compute only in the slots background work may take. Before, every
/// sandbox-less async execution held one of the concurrency permits for its whole run, so two
/// of them on a 2-slot server held a plain call back for their full 20 s.
#[tokio::test]
async fn spinning_background_work_leaves_room_for_plain_calls() {
    let c = server_with_env(&[
        ("WASMBOX_CONCURRENCY", "2"),
        ("WASMBOX_MAX_JOBS", "4"),
        ("WASMBOX_MAX_JOBS_PER_TOKEN", "4"),
    ])
    .await;
    let url = sink().await;
    for _ in 0..2 {
        let r = ok(
            &c,
            "execute_code_async",
            json!({"code": "while True: pass", "callback_url": url, "timeout": 20}),
        )
        .await;
        assert_eq!(r["status"], "queued", "{r}");
    }
    let id = create_sandbox(&c, json!({})).await;
    for _ in 0..2 {
        ok(
            &c,
            "execute_code_background",
            json!({"sandbox_id": id, "code": "while True: pass", "timeout": 20}),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        answers_promptly(&c, Duration::from_secs(2)).await;
    }
    let metrics = ok(&c, "get_system_metrics", json!({})).await;
    let cpu = &metrics["cpu_slots"];
    assert_eq!(cpu["total"], 2, "{metrics}");
    assert_eq!(cpu["reserved_for_calls"], 1, "{metrics}");
    assert_eq!(cpu["background"], 1, "{metrics}");
    assert_eq!(metrics["jobs"]["running"], 4, "{metrics}");
    c.cancel().await.unwrap();
}

/// A sandbox-less async execution is a one-shot: its deadline is capped like one (300 s).
/// Before, it accepted up to 3600 s.
#[tokio::test]
async fn sandboxless_async_obeys_the_one_shot_deadline_cap() {
    let c = server().await;
    let url = sink().await;
    let e = err(
        &c,
        "execute_code_async",
        json!({"code": "print(1)", "callback_url": url, "timeout": 1000}),
    )
    .await;
    assert!(e.to_string().contains("300"), "{e}");
    // A sandbox's async execution is a background job, which may run longer.
    let id = create_sandbox(&c, json!({})).await;
    ok(
        &c,
        "execute_code_async",
        json!({"code": "print(1)", "callback_url": url, "timeout": 1000, "sandbox_id": id}),
    )
    .await;
    c.cancel().await.unwrap();
}

/// Background jobs count against the owner's cap (over stdio there is one owner), whatever
/// sandbox they run in; killing one frees its place. Before, only the per-sandbox cap existed.
#[tokio::test]
async fn background_jobs_are_capped_per_owner() {
    let c = server_with_env(&[
        ("WASMBOX_MAX_JOBS", "4"),
        ("WASMBOX_MAX_JOBS_PER_TOKEN", "2"),
    ])
    .await;
    let a = create_sandbox(&c, json!({})).await;
    let b = create_sandbox(&c, json!({})).await;
    let mut pids = Vec::new();
    for id in [&a, &b] {
        let r = ok(
            &c,
            "execute_code_background",
            json!({"sandbox_id": id, "code": "import time\ntime.sleep(30)", "timeout": 60}),
        )
        .await;
        pids.push((id.clone(), r["process_id"].as_str().unwrap().to_string()));
    }
    let e = err(
        &c,
        "execute_code_background",
        json!({"sandbox_id": a, "code": "print(1)"}),
    )
    .await;
    assert!(e.to_string().contains("WASMBOX_MAX_JOBS_PER_TOKEN"), "{e}");
    let url = sink().await;
    let e = err(
        &c,
        "execute_code_async",
        json!({"sandbox_id": b, "code": "print(1)", "callback_url": url}),
    )
    .await;
    assert!(e.to_string().contains("WASMBOX_MAX_JOBS_PER_TOKEN"), "{e}");
    // Killing a job gives its place back (the sleeper stops within a slice).
    let (id, pid) = &pids[0];
    ok(
        &c,
        "execute_kill_process",
        json!({"sandbox_id": id, "process_id": pid}),
    )
    .await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let r = call(
            &c,
            "execute_code_background",
            json!({"sandbox_id": a, "code": "print(1)"}),
        )
        .await;
        if !is_error(&r) {
            break;
        }
        assert!(Instant::now() < until, "the killed job kept its place");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.cancel().await.unwrap();
}

/// Sandbox-less async executions beyond the job cap wait in a bounded queue; past it they are
/// refused with a clear error. Before, every one was accepted and held a permit or waited.
#[tokio::test]
async fn the_async_queue_is_bounded() {
    let c = server_with_env(&[("WASMBOX_MAX_JOBS", "1"), ("WASMBOX_ASYNC_QUEUE", "1")]).await;
    let url = sink().await;
    let code = "import time\ntime.sleep(5)";
    for _ in 0..2 {
        let r = ok(
            &c,
            "execute_code_async",
            json!({"code": code, "callback_url": url, "timeout": 10}),
        )
        .await;
        assert_eq!(r["status"], "queued", "{r}");
    }
    let e = err(
        &c,
        "execute_code_async",
        json!({"code": code, "callback_url": url, "timeout": 10}),
    )
    .await;
    assert!(e.to_string().contains("WASMBOX_ASYNC_QUEUE"), "{e}");
    answers_promptly(&c, Duration::from_secs(2)).await;
    c.cancel().await.unwrap();
}
