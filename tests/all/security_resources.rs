//! The resource suite for sandboxes: each abuse is stopped by a named limit with a clear
//! result, and the server answers the next call. (One-shot loops, memory bombs and output
//! floods per language are in the language test files.)

use crate::common;

use common::*;
use serde_json::{Value, json};

async fn persistent(c: &Client, id: &str, language: &str, code: &str, timeout: u64) -> Value {
    let r = call(
        c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": language, "code": code, "timeout": timeout}),
    )
    .await;
    assert!(!is_error(&r), "{:?}", r.content);
    object(&r)
}

async fn still_serving(c: &Client, id: &str) {
    let r = persistent(c, id, "python", "print('alive')", 30).await;
    assert_eq!(r["stdout"], "alive\n", "{r}");
}

#[tokio::test]
async fn session_abuse_is_stopped_by_named_limits() {
    let c = server_with_env(&[("WASMBOX_SANDBOX_FILES", "200")]).await;
    let id = create_sandbox(&c, json!({})).await;
    // Memory bomb in the session: denied growth, the session is replaced.
    let r = persistent(
        &c,
        &id,
        "python",
        "x = [bytearray(64 << 20) for _ in range(40)]",
        30,
    )
    .await;
    assert_eq!(r["exit_code"], 1, "{r}");
    assert_eq!(r["limit"], "memory", "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("MemoryError"), "{r}");
    still_serving(&c, &id).await;
    // Deep recursion: a Python error, not a crash.
    let r = persistent(&c, &id, "python", "def f(n): return f(n + 1)\nf(0)", 30).await;
    assert!(
        r["stderr"].as_str().unwrap().contains("RecursionError"),
        "{r}"
    );
    still_serving(&c, &id).await;
    let r = persistent(
        &c,
        &id,
        "javascript",
        "function f(n) { return f(n + 1) + 1 }\nf(0)",
        30,
    )
    .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    still_serving(&c, &id).await;
    // Infinite loops in each language stop at the deadline.
    for (lang, code) in [
        ("python", "while True: pass"),
        ("javascript", "for (;;) {}"),
        ("go", "package main\nfunc main() { for {} }"),
    ] {
        let r = persistent(&c, &id, lang, code, 2).await;
        assert_eq!(r["limit"], "timeout", "{lang}: {r}");
    }
    // Output flood: cut, then stopped.
    let r = persistent(&c, &id, "python", "while True: print('x' * 1000)", 30).await;
    assert_eq!(r["limit"], "output", "{r}");
    assert_eq!(r["truncated"], true);
    // File-count bomb: the quota on entries stops it.
    let r = persistent(
        &c,
        &id,
        "python",
        "import os, time\nos.makedirs('many', exist_ok=True)\ni = 0\nwhile True:\n    open(f'many/{i}', 'w').close(); i += 1\n    if i % 50 == 0: time.sleep(0.01)",
        30,
    )
    .await;
    assert_eq!(r["limit"], "disk", "{r}");
    let rm = call(&c, "file_remove", json!({"sandbox_id": id, "path": "many"})).await;
    assert!(!is_error(&rm));
    still_serving(&c, &id).await;
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn giant_inputs_and_too_many_of_anything_are_clear_errors() {
    let c = server_with_env(&[
        ("WASMBOX_MAX_SANDBOXES", "3"),
        ("WASMBOX_SANDBOX_JOBS", "2"),
        // The per-sandbox cap is what this checks: the server-wide caps are well above it.
        ("WASMBOX_MAX_JOBS", "8"),
        ("WASMBOX_MAX_JOBS_PER_TOKEN", "8"),
    ])
    .await;
    // A code input over 10 MiB is refused before anything runs.
    let big = format!("x = '{}'", "a".repeat(11 << 20));
    let r = call(&c, "execute_code", json!({"code": big})).await;
    assert!(is_error(&r));
    let v = object(&r);
    assert!(
        v["message"].as_str().unwrap().contains("limit"),
        "{}",
        v["message"]
    );
    // Background jobs are bounded per sandbox.
    let id = create_sandbox(&c, json!({})).await;
    for _ in 0..2 {
        let r = call(
            &c,
            "execute_code_background",
            json!({"sandbox_id": id, "code": "while True: pass", "timeout": 60}),
        )
        .await;
        assert!(!is_error(&r), "{:?}", r.content);
    }
    let r = call(
        &c,
        "execute_code_background",
        json!({"sandbox_id": id, "code": "print(1)"}),
    )
    .await;
    assert!(is_error(&r));
    assert!(
        object(&r)["message"]
            .as_str()
            .unwrap()
            .contains("background jobs are running"),
        "{:?}",
        r.content
    );
    // Sandboxes are bounded; deleting one (which stops its jobs) makes room.
    create_sandbox(&c, json!({})).await;
    create_sandbox(&c, json!({})).await;
    let r = call(&c, "create_sandbox", json!({})).await;
    assert!(is_error(&r));
    let d = call(&c, "delete_sandbox", json!({"id": id})).await;
    assert!(!is_error(&d));
    let r = call(&c, "create_sandbox", json!({})).await;
    assert!(!is_error(&r), "{:?}", r.content);
    assert_eq!(py(&c, "print(2)").await["stdout"], "2\n");
    c.cancel().await.unwrap();
}

/// Context switches of the server's epoch ticker threads so far.
fn ticker_switches(pid: u32) -> u64 {
    entries(std::path::Path::new(&format!("/proc/{pid}/task")))
        .iter()
        .filter(|t| {
            std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim() == "wasmbox-epoch")
        })
        .filter_map(|t| std::fs::read_to_string(t.join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// An idle server does not wake up 100 times a second per engine to advance epochs (a laptop's
/// battery), yet the first guests after a quiet spell still stop at their deadlines.
#[tokio::test]
async fn an_idle_server_stops_ticking_and_deadlines_still_hold() {
    let (c, pid) = server_with_pid(&[]).await;
    let id = create_sandbox(&c, json!({})).await;
    assert_eq!(py(&c, "print(1)").await["stdout"], "1\n");
    // A second without a guest pauses the tickers.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let before = ticker_switches(pid);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let woke = ticker_switches(pid) - before;
    assert!(woke < 10, "the idle tickers woke {woke} times in a second");
    // A one-shot loop after the quiet spell, and one in a session after another.
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        call(
            &c,
            "execute_code",
            json!({"code": "while True: pass", "timeout": 1}),
        ),
    )
    .await
    .expect("the loop was never stopped: no ticker woke for its deadline");
    assert_eq!(object(&r)["limit"], "timeout", "{:?}", r.content);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        persistent(&c, &id, "javascript", "for (;;) {}", 1),
    )
    .await
    .expect("the session's loop was never stopped");
    assert_eq!(r["limit"], "timeout", "{r}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    still_serving(&c, &id).await;
    c.cancel().await.unwrap();
}
