//! MCP cancellation (`notifications/cancelled`, sent by rmcp's client): a cancelled call's
//! guest stops and frees its slot, a cancelled persistent call ends its session (the next
//! result says so), and a cancelled cloud one-shot deletes its HOPX sandbox.

use crate::common;
use crate::common::fake_hopx;

use std::time::{Duration, Instant};

use axum::http::Method;
use common::*;
use fake_hopx::{API_KEY, FakeHopx, Fault};
use rmcp::model::{CallToolRequestParams, ClientRequest, Request};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};

/// Starts `tool` as a cancellable request and cancels it after `after`.
pub(crate) async fn cancel_after(c: &Client, tool: &str, args: Value, after: Duration) {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let req = ClientRequest::CallToolRequest(Request::new(
        CallToolRequestParams::new(tool.to_string()).with_arguments(args),
    ));
    let handle = c
        .peer()
        .send_cancellable_request(req, PeerRequestOptions::no_options())
        .await
        .expect("sent");
    tokio::time::sleep(after).await;
    handle
        .cancel(Some("the test gave up".into()))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cancelled_one_shot_frees_its_slot() {
    // One CPU slot and a 5 s queue wait: while the spinner holds the slot, nothing else runs.
    let c = server_with_env(&[
        ("WASMBOX_CONCURRENCY", "1"),
        ("WASMBOX_FOREGROUND_SLOTS", "1"),
        ("WASMBOX_QUEUE_WAIT_S", "5"),
    ])
    .await;
    py(&c, "print('warm')").await;
    for (language, code) in [
        ("python", "while True:\n    pass"),
        ("python", "import time\ntime.sleep(60)"),
        ("javascript", "while (true) {}"),
    ] {
        cancel_after(
            &c,
            "execute_code",
            json!({"language": language, "code": code, "timeout": 60}),
            Duration::from_millis(500),
        )
        .await;
        // Before cancellation was honoured, this waited 5 s for the slot and was refused.
        let r = py(&c, "print('next')").await;
        assert_eq!(
            r["stdout"], "next\n",
            "after cancelling {language} {code:?}: {r}"
        );
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_persistent_call_ends_its_session_and_the_next_result_says_so() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    let run = |code: &str| json!({"mode": "persistent", "sandbox_id": id, "code": code});
    ok(&c, "execute_code", run("x = 41")).await;
    cancel_after(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "code": "while True:\n    pass", "timeout": 60}),
        Duration::from_millis(500),
    )
    .await;
    // Before, this queued behind the spinner's session until its 60 s deadline.
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        ok(&c, "execute_code", run("print('x' in globals())")),
    )
    .await
    .expect("the next call runs");
    assert_eq!(r["stdout"], "False\n", "a fresh session: {r}");
    let notes = r["notes"].to_string();
    assert!(notes.contains("cancelled"), "{notes}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_cloud_one_shot_deletes_its_cloud_sandbox() {
    let fake = FakeHopx::start().await;
    fake.fail(
        Method::POST,
        "/execute",
        1,
        Fault::Delay(Duration::from_secs(30)),
    );
    let base = fake.base_url();
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    let Value::Object(args) = json!({"language": "bash", "code": "sleep 60", "timeout": 60}) else {
        unreachable!()
    };
    let req = ClientRequest::CallToolRequest(Request::new(
        CallToolRequestParams::new("execute_code".to_string()).with_arguments(args),
    ));
    let handle = c
        .peer()
        .send_cancellable_request(req, PeerRequestOptions::no_options())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake.count("POST", "/execute") == 0 {
        assert!(Instant::now() < deadline, "the code never reached HOPX");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!fake.live_sandboxes().is_empty());
    handle.cancel(None).await.unwrap();
    // Before, the sandbox lived until the 30 s execute came back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fake.live_sandboxes().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the cloud sandbox was not deleted: {:?}",
            fake.calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server goes on serving.
    assert_eq!(py(&c, "print(2)").await["stdout"], "2\n");
    c.cancel().await.unwrap();
}
