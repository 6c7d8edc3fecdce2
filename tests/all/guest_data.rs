//! What the host parses or keeps of a guest's data is capped by the host, while parsing (issue
//! #22, class 2): a replaced rich-output hook, job output that JSON escaping inflates, and a
//! sandbox's env.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

async fn run(c: &Client, id: &str, code: &str) -> Value {
    ok(
        c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": code}),
    )
    .await
}

/// The length `s` takes as a JSON string (with its quotes).
fn json_len(v: &Value) -> usize {
    serde_json::to_string(v).unwrap().len()
}

#[tokio::test]
async fn a_replaced_rich_hook_cannot_flood_the_host() {
    let c = server().await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    // The guest owns `_wasmbox.rich`: it prints 300,000 outputs, one of them far over the size
    // of an image, one of a type the host never asked for, and a thousand long notes.
    let r = run(
        &c,
        &id,
        "import _wasmbox, json\n\
         def flood(*a):\n\
         \x20   big = {'type': 'image/png', 'data': 'A' * 8_000_000}\n\
         \x20   odd = {'type': 'application/x-evil', 'data': 'x'}\n\
         \x20   small = {'type': 'image/png', 'data': 'iVBORw0KGgo='}\n\
         \x20   print(json.dumps({'outputs': [big, odd] + [small] * 300000, 'notes': ['n' * 10000] * 1000}))\n\
         _wasmbox.rich = flood\n\
         print('replaced')",
    )
    .await;
    assert_eq!(r["stdout"], "replaced\n", "{r}");
    let t = Instant::now();
    // Before the host bounded the reply this call never came back (the server answered with
    // 300,000 image blocks).
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        call(
            &c,
            "execute_code",
            json!({"mode": "rich", "sandbox_id": id, "code": "print('cell')"}),
        ),
    )
    .await
    .expect("the rich call returns");
    let took = t.elapsed();
    assert!(!is_error(&r), "{:?}", r.content.first());
    assert!(took < Duration::from_secs(5), "rich turn took {took:?}");
    let v = object(&r);
    assert_eq!(v["stdout"], "cell\n");
    // Images come only from the turn's own figures (through the door): a rich reply's are
    // dropped, however many.
    let outs = v["rich_outputs"].as_array().unwrap();
    assert!(outs.is_empty(), "{outs:?}");
    assert_eq!(
        r.content.iter().filter(|c| c.as_image().is_some()).count(),
        0
    );
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.len() <= 24, "{} notes", notes.len());
    assert!(
        notes.iter().all(|n| n.as_str().unwrap().len() <= 1100),
        "notes are cut short"
    );
    let text = notes
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(text.contains("dropped"), "{text}");
    // The session and the server go on.
    assert_eq!(run(&c, &id, "print(2)").await["stdout"], "2\n");
    c.cancel().await.unwrap();
}

/// Waits until every job of sandbox `id` has ended and returns the listing.
async fn all_ended(c: &Client, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Before output was capped by its JSON size, a listing of 12 MiB never came back.
        let list = tokio::time::timeout(
            Duration::from_secs(60),
            ok(c, "execute_list_processes", json!({"sandbox_id": id})),
        )
        .await
        .expect("the listing comes back");
        let procs = list["processes"].as_array().unwrap();
        if procs.iter().all(|p| p["status"] != "running") {
            return list;
        }
        assert!(Instant::now() < deadline, "jobs never ended: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn job_output_is_capped_after_json_escaping() {
    // A listing fits WASMBOX_RESULT_BYTES by cutting each job's output further; a wide budget
    // shows what the job itself keeps.
    let c = server_with_env(&[("WASMBOX_RESULT_BYTES", "67108864")]).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    // 1 MiB of control characters: 6 MiB once escaped as JSON (`\u0001`).
    ok(
        &c,
        "execute_code",
        json!({"mode": "background", "sandbox_id": id,
               "code": "import sys\nsys.stdout.write('\\x01' * (1 << 20))\nsys.stderr.write('\\x02' * (1 << 20))"}),
    )
    .await;
    let list = all_ended(&c, &id).await;
    let p = &list["processes"][0];
    assert_eq!(p["status"], "completed", "{}", p["status"]);
    let kept = json_len(&p["stdout"]) + json_len(&p["stderr"]);
    assert!(kept <= 256 << 10, "{kept} bytes of output kept");
    assert!(
        p["stdout"].as_str().unwrap().starts_with("\u{1}\u{1}"),
        "the start is kept"
    );
    assert!(
        p["stderr"].as_str().unwrap().contains("wasmbox: "),
        "a note says it was cut"
    );
    assert_eq!(p["truncated"], true);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn ended_jobs_output_is_capped_per_sandbox_oldest_first() {
    // A listing fits WASMBOX_RESULT_BYTES by cutting each job's output further; a wide budget
    // shows what the job itself keeps.
    let c = server_with_env(&[("WASMBOX_RESULT_BYTES", "67108864")]).await;
    let id = create_sandbox(&c, json!({"template_id": "python"})).await;
    // 24 jobs of 200 KiB each: 4.7 MiB, over the sandbox's 4 MiB of kept output.
    let mut pids = Vec::new();
    for _ in 0..24 {
        let deadline = Instant::now() + Duration::from_secs(60);
        let started = loop {
            let r = call(
                &c,
                "execute_code",
                json!({"mode": "background", "sandbox_id": id,
                       "code": "print('y' * (200 << 10))"}),
            )
            .await;
            if !is_error(&r) {
                break object(&r);
            }
            // Four run at once per sandbox: wait for one to end.
            assert!(Instant::now() < deadline, "{:?}", r.content);
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        pids.push(started["process_id"].as_str().unwrap().to_string());
    }
    let list = all_ended(&c, &id).await;
    let procs = list["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 24);
    let total: usize = procs
        .iter()
        .map(|p| json_len(&p["stdout"]) + json_len(&p["stderr"]))
        .sum();
    assert!(total <= (4 << 20) + (64 << 10), "{total} bytes kept in all");
    let by_pid = |pid: &str| procs.iter().find(|p| p["process_id"] == pid).unwrap();
    let newest = by_pid(pids.last().unwrap());
    assert_eq!(newest["stdout"].as_str().unwrap().len(), (200 << 10) + 1);
    let oldest = by_pid(&pids[0]);
    assert_eq!(oldest["stdout"], "", "the oldest job's output went first");
    assert_eq!(oldest["exit_code"], 0, "its status stays");
    assert!(
        oldest["stderr"].as_str().unwrap().contains("dropped"),
        "{}",
        oldest["stderr"]
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_sandbox_env_is_capped_in_all() {
    let c = server().await;
    // 80 variables of 1 KiB: 80 KiB, over the 64 KiB a sandbox may hold.
    let big: serde_json::Map<String, Value> = (0..80)
        .map(|i| (format!("V{i}"), json!("v".repeat(1024))))
        .collect();
    let e = err(&c, "create_sandbox", json!({"env_vars": big})).await;
    assert!(e.to_string().contains("64 KiB"), "{e}");
    let id = create_sandbox(&c, json!({"env_vars": {"KEEP": "me"}})).await;
    let e = err(&c, "env_set", json!({"sandbox_id": id, "env_vars": big})).await;
    assert!(e["exception"].as_str().unwrap().contains("64 KiB"), "{e}");
    // Within the cap in one call, over it with the next merge: refused, nothing changed.
    let half: serde_json::Map<String, Value> = (0..40)
        .map(|i| (format!("A{i}"), json!("a".repeat(1024))))
        .collect();
    ok(&c, "env_set", json!({"sandbox_id": id, "env_vars": half})).await;
    let more: serde_json::Map<String, Value> = (0..40)
        .map(|i| (format!("B{i}"), json!("b".repeat(1024))))
        .collect();
    let e = err(&c, "env_set", json!({"sandbox_id": id, "env_vars": more})).await;
    assert!(e["exception"].as_str().unwrap().contains("64 KiB"), "{e}");
    let env = ok(&c, "env_get", json!({"sandbox_id": id})).await;
    let vars = env["env_vars"].as_object().unwrap();
    assert_eq!(vars.len(), 41, "the refused merge changed nothing");
    assert_eq!(vars["KEEP"], "me");
    // Replacing (merge: false) is judged on the result.
    ok(
        &c,
        "env_set",
        json!({"sandbox_id": id, "env_vars": more, "merge": false}),
    )
    .await;
    let env = ok(&c, "env_get", json!({"sandbox_id": id})).await;
    assert_eq!(env["env_vars"].as_object().unwrap().len(), 40);
    c.cancel().await.unwrap();
}
