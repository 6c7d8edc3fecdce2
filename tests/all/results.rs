//! Execution answers that fit (issue #23): stdout and stderr share `WASMBOX_RESULT_BYTES`, cut in
//! the middle so a traceback at the end survives, measured as JSON text, in every tool that
//! returns an execution's output (one-shots, sessions, rich mode, run_command, the cloud's).

use crate::common;
use crate::common::fake_hopx;

use common::*;
use fake_hopx::{API_KEY, FakeHopx};
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

/// The default `WASMBOX_RESULT_BYTES`.
const BUDGET: usize = 80_000;

/// 50,000 lines of 100 bytes (5 MB), numbered, then an exception.
const FLOOD_THEN_RAISE: &str = "for i in range(50_000):\n    print(f'line {i:05d} ' + 'x' * 88)\n\
                                raise ValueError('the end of the story')";
const FIRST_LINE: &str = "line 00000 ";
const LAST_LINE: &str = "line 49999 ";

/// Bytes the whole answer takes on the wire: every text block plus `structuredContent`.
fn answer_bytes(r: &CallToolResult) -> usize {
    let text: usize = r
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.len())
        .sum();
    text + serde_json::to_string(&r.structured_content).unwrap().len()
}

fn text_block(r: &CallToolResult) -> usize {
    r.content[0].as_text().expect("a text block").text.len()
}

/// The number in a stream's `\n… [wasmbox: N bytes elided] …\n` marker, and the marker's length.
fn elided(s: &str) -> (u64, usize) {
    let start = s.find("\n… [wasmbox: ").expect("a marker");
    let at = start + "\n… [wasmbox: ".len();
    let n: String = s[at..].chars().take_while(|c| *c != ' ').collect();
    let end = at
        + s[at..]
            .find(" bytes elided] …\n")
            .expect("the marker's end");
    let len = end + " bytes elided] …\n".len() - start;
    (
        n.replace(',', "").parse().expect("a number in the marker"),
        len,
    )
}

/// Checks that an answer to [`FLOOD_THEN_RAISE`] fits `budget` and kept what matters.
fn check_flood(r: &CallToolResult, budget: usize) -> Value {
    assert!(!is_error(r));
    assert!(
        answer_bytes(r) < budget * 5 / 2,
        "{} bytes for a budget of {budget}",
        answer_bytes(r)
    );
    assert!(text_block(r) <= budget, "text block {}", text_block(r));
    let v = object(r);
    let out = v["stdout"].as_str().unwrap();
    let err = v["stderr"].as_str().unwrap();
    assert!(out.starts_with(FIRST_LINE), "{}", &out[..100]);
    let last_line = format!("{LAST_LINE}{}\n", "x".repeat(88));
    assert!(out.ends_with(&last_line), "{}", &out[out.len() - 200..]);
    // What is kept and what the marker says was elided make up the 5,000,000 bytes printed.
    let (n, marker) = elided(out);
    assert_eq!(out.matches("bytes elided]").count(), 1, "one marker");
    assert_eq!(out.len() - marker + n as usize, 5_000_000);
    assert!(
        err.contains("ValueError: the end of the story"),
        "the traceback's last line survives: {err}"
    );
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["truncated"], true);
    let notes = v["notes"].to_string();
    assert!(notes.contains("elided from the middle of stdout"), "{v}");
    v
}

#[tokio::test]
async fn a_five_megabyte_print_then_a_traceback_fits_the_budget() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": FLOOD_THEN_RAISE, "language": "python"}),
    )
    .await;
    let v = check_flood(&r, BUDGET);
    // The budget is used, not squandered: stdout gets most of what stderr does not need.
    let out = v["stdout"].as_str().unwrap();
    assert!(out.len() > BUDGET / 2, "{}", out.len());
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_small_budget_keeps_the_same_proportions() {
    let c = server_with_env(&[("WASMBOX_RESULT_BYTES", "2000")]).await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": FLOOD_THEN_RAISE, "language": "python"}),
    )
    .await;
    let v = check_flood(&r, 2000);
    // stderr (short) is whole; stdout has the rest of the room, start and end alike.
    let err = v["stderr"].as_str().unwrap();
    assert!(
        err.starts_with("Traceback (most recent call last)"),
        "{err}"
    );
    assert!(!err.contains("bytes elided]"), "{err}");
    let out = v["stdout"].as_str().unwrap();
    let marker_at = out.find("\n… [wasmbox:").unwrap();
    let tail = out.len() - out.rfind("] …\n").unwrap() - 4;
    assert!(
        marker_at.abs_diff(tail) < 120,
        "head {marker_at}, tail {tail}"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn control_characters_count_as_their_json_escapes() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": "import sys\nsys.stdout.write('\\x01' * 10**6)", "language": "python"}),
    )
    .await;
    // A million `\u0001` are 6 MB of JSON.
    assert!(answer_bytes(&r) < BUDGET * 5 / 2, "{}", answer_bytes(&r));
    assert!(text_block(&r) <= BUDGET, "{}", text_block(&r));
    let v = object(&r);
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with('\u{1}') && out.ends_with('\u{1}'));
    let (n, marker) = elided(out);
    assert_eq!(out.len() - marker + n as usize, 1_000_000);
    assert_eq!(v["truncated"], true);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn an_answer_within_the_budget_is_unchanged() {
    let c = server().await;
    let v = py(
        &c,
        "import sys\nfor i in range(600):\n    print(f'{i:04d}', 'é' * 40)\nsys.stderr.write('warned\\n')",
    )
    .await;
    let expected: String = (0..600)
        .map(|i| format!("{i:04} {}\n", "é".repeat(40)))
        .collect();
    assert_eq!(v["stdout"], expected);
    assert_eq!(v["stderr"], "warned\n");
    assert_eq!(v["truncated"], false);
    assert!(v.get("notes").is_none(), "{}", v["notes"]);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn sessions_commands_and_rich_mode_fit_too() {
    let c = server().await;
    let id = create_sandbox(&c, json!({})).await;
    for mode in ["persistent", "rich"] {
        let r = call(
            &c,
            "execute_code",
            json!({"sandbox_id": id, "mode": mode, "code": FLOOD_THEN_RAISE}),
        )
        .await;
        check_flood(&r, BUDGET);
    }
    ok(
        &c,
        "file_write",
        json!({"sandbox_id": id, "path": "flood.py", "content": FLOOD_THEN_RAISE}),
    )
    .await;
    let r = call(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": "python flood.py"}),
    )
    .await;
    check_flood(&r, BUDGET);
    // An isolated run on the sandbox's files.
    let r = call(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "isolated", "code": FLOOD_THEN_RAISE}),
    )
    .await;
    check_flood(&r, BUDGET);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn cloud_answers_fit_too() {
    let fake = FakeHopx::start().await;
    let base = fake.base_url();
    let c = server_with_env(&[("HOPX_API_KEY", API_KEY), ("HOPX_BASE_URL", &base)]).await;
    // The fake's stdout repeats the code: 1 MB of it.
    let code = format!("echo START{}END", "y".repeat(1_000_000));
    let check = |r: &CallToolResult| {
        assert!(answer_bytes(r) < BUDGET * 5 / 2, "{}", answer_bytes(r));
        let v = object(r);
        let out = v["stdout"].as_str().unwrap();
        assert!(out.starts_with("[bash] echo START"), "{}", &out[..40]);
        assert!(out.ends_with("END\n"), "{}", &out[out.len() - 40..]);
        assert!(elided(out).0 > 900_000, "{out:.200}");
        assert_eq!(v["truncated"], true);
        assert_eq!(v["location"], "cloud");
    };
    let r = call(
        &c,
        "execute_code",
        json!({"language": "bash", "code": code}),
    )
    .await;
    check(&r);
    let id = create_sandbox(&c, json!({"internet_access": true})).await;
    let r = call(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent", "language": "bash", "code": code}),
    )
    .await;
    check(&r);
    let r = call(
        &c,
        "run_command",
        json!({"sandbox_id": id, "command": code}),
    )
    .await;
    check(&r);
    c.cancel().await.unwrap();
}
