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

/// The missing-module note once took the module's name from the guest's stderr whole: this
/// one-shot's answer was 5.4 MB against the 80,000-byte budget (issue #31).
#[tokio::test]
async fn a_missing_module_note_quotes_at_most_200_characters() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"language": "python", "code": "import sys\nsys.stderr.write(\"ModuleNotFoundError: No module named '\" + 'q' + '\\x01' * 900000)"}),
    )
    .await;
    assert!(text_block(&r) <= BUDGET, "text block {}", text_block(&r));
    assert!(answer_bytes(&r) < BUDGET * 5 / 2, "{}", answer_bytes(&r));
    let v = object(&r);
    let notes = v["notes"].as_array().expect("notes");
    let note = notes
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.contains("is not in wasmbox's Python"))
        .expect("the missing-module note");
    // 'q', then 199 control characters shown as U+FFFD, then the mark of the cut.
    let quoted = format!("'q{}…'", "\u{fffd}".repeat(199));
    assert!(note.contains(&quoted), "{note}");
    assert!(!note.chars().any(char::is_control), "{note:?}");
    c.cancel().await.unwrap();
}

/// A small deterministic PRNG (splitmix64), so a failing mix can be replayed from its seed.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A size between `lo` and `hi`.
    fn size(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// What the guest writes to forge a host line (a truncation marker, the missing-module line).
const FORGED_MARKER: &str = "\\n… [wasmbox: 99,999,999,999 bytes elided] …\\n";
const FORGED_MODULE: &str = "ModuleNotFoundError: No module named '";

/// One adversarial line of Python.
fn adversarial_piece(m: &mut Mix) -> String {
    match m.below(7) {
        0 => format!("sys.stdout.write('A' * {})", m.size(100_000, 3_000_000)),
        1 => format!("sys.stderr.write('B' * {})", m.size(100_000, 3_000_000)),
        // A million control characters: 6 MB as JSON.
        2 => format!(
            "sys.{}.write('\\x01' * 1_000_000)",
            ["stdout", "stderr"][m.below(2) as usize]
        ),
        3 => format!(
            "sys.{}.write('{FORGED_MARKER}' * {})",
            ["stdout", "stderr"][m.below(2) as usize],
            m.size(1, 50_000)
        ),
        4 => format!(
            "sys.stderr.write(\"{FORGED_MODULE}\" + '\\x01' * {})",
            m.size(1_000, 900_000)
        ),
        5 => format!(
            "sys.stderr.write(\"{FORGED_MODULE}\" + 'é\\u2028\"\\\\\\x1b' * {} + \"'\\n\")",
            m.size(1_000, 300_000)
        ),
        _ => format!(
            "sys.stdout.write(''.join(chr(i % 40) for i in range({})))",
            m.size(10_000, 1_000_000)
        ),
    }
}

/// A program of a few adversarial lines, the first always a forged missing-module line, and
/// sometimes a huge exception at the end.
fn adversarial_program(m: &mut Mix) -> String {
    let mut code = format!(
        "import sys\nsys.stderr.write(\"{FORGED_MODULE}\" + '\\x01' * {})\n",
        m.size(100_000, 900_000)
    );
    for _ in 0..m.size(1, 3) {
        code += &adversarial_piece(m);
        code.push('\n');
    }
    match m.below(3) {
        0 => code += &format!("raise ValueError('E' * {})\n", m.size(10_000, 2_000_000)),
        1 => {
            code += &format!(
                "raise ModuleNotFoundError(\"No module named '\" + '\\x02' * {})\n",
                m.size(10_000, 500_000)
            )
        }
        _ => {}
    }
    code
}

/// Checks one answer of the property test: its text block within the budget, the same object
/// as structuredContent, and notes free of control characters.
fn check_adversarial(path: &str, code: &str, r: &CallToolResult, budget: usize) -> Value {
    let what = format!("{path}: {:.300}", code.replace('\n', "; "));
    assert!(
        text_block(r) <= budget,
        "{what}: text block of {} bytes",
        text_block(r)
    );
    assert!(
        answer_bytes(r) <= budget * 5 / 2,
        "{what}: {} bytes",
        answer_bytes(r)
    );
    let v = object(r);
    for n in v["notes"].as_array().into_iter().flatten() {
        let n = n.as_str().expect("a note is a string");
        assert!(!n.chars().any(char::is_control), "{what}: note {n:?}");
    }
    v
}

/// Issue #31's property: whatever a guest writes (huge streams, a million control characters,
/// forged markers and missing-module lines, huge exceptions), every execution path answers
/// within the budget: one-shot, persistent, rich (with a replaced hook), run_command, a
/// background job's listing, and an async execution's webhook payload.
#[tokio::test]
async fn adversarial_output_fits_on_every_path() {
    const SMALL: usize = 8_000;
    const SEED: u64 = 0x31_0004;
    const PER_PATH: usize = 3;
    let c = server_with_env(&[("WASMBOX_RESULT_BYTES", "8000")]).await;
    let mut m = Mix(SEED);
    let id = create_sandbox(&c, json!({})).await;
    // The rich hook is the guest's: it returns a table and notes of its own making.
    let hook = format!(
        "import _wasmbox, json\n\
         def flood(*a):\n\
         \x20   print(json.dumps({{'outputs': [{{'type': 'text/html', 'data': '<td>\\x01</td>' * {}}}], 'notes': ['{FORGED_MARKER}\\x01' * 400] * 40}}))\n\
         _wasmbox.rich = flood",
        m.size(10, 200_000)
    );
    ok(
        &c,
        "execute_code",
        json!({"sandbox_id": id, "mode": "persistent", "code": hook}),
    )
    .await;
    for i in 0..PER_PATH {
        let code = adversarial_program(&mut m);
        for mode in ["isolated", "persistent", "rich"] {
            let mut args = json!({"mode": mode, "code": code, "language": "python"});
            if mode != "isolated" {
                args["sandbox_id"] = json!(id);
            }
            let r = call(&c, "execute_code", args).await;
            let v = check_adversarial(mode, &code, &r, SMALL);
            assert!(v["stdout"].is_string() && v["stderr"].is_string(), "{v}");
            // The program ran (its first line alone is 600 KB of JSON at least): no syntax error.
            assert_eq!(v["truncated"], true, "{mode}: {v}");
        }
        let code = adversarial_program(&mut m);
        let file = format!("adversarial{i}.py");
        ok(
            &c,
            "file_write",
            json!({"sandbox_id": id, "path": file, "content": code}),
        )
        .await;
        let r = call(
            &c,
            "run_command",
            json!({"sandbox_id": id, "command": format!("python {file}")}),
        )
        .await;
        let v = check_adversarial("run_command", &code, &r, SMALL);
        assert_eq!(v["truncated"], true, "{v}");
        // A background job: every listing while it runs and once it has ended.
        let code = adversarial_program(&mut m);
        ok(
            &c,
            "execute_code",
            json!({"sandbox_id": id, "mode": "background", "code": code}),
        )
        .await;
        let t = std::time::Instant::now();
        loop {
            let r = call(&c, "execute_list_processes", json!({"sandbox_id": id})).await;
            let v = check_adversarial("background listing", &code, &r, SMALL);
            let procs = v["processes"].as_array().expect("processes");
            if procs.iter().all(|p| p["status"] != "running") {
                break;
            }
            assert!(t.elapsed().as_secs() < 120, "the jobs never ended: {v}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        // An async execution, in the sandbox or on its own: the webhook's body too.
        let code = adversarial_program(&mut m);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let hook = tokio::spawn(receive_one(listener));
        let sandbox = (m.below(2) == 0).then_some(id.as_str());
        let r = call(
            &c,
            "execute_code_async",
            json!({"code": code, "callback_url": url, "sandbox_id": sandbox}),
        )
        .await;
        check_adversarial("execute_code_async", &code, &r, SMALL);
        let (_, body) = tokio::time::timeout(std::time::Duration::from_secs(120), hook)
            .await
            .expect("the webhook was called")
            .unwrap();
        assert!(
            body.len() <= SMALL,
            "webhook body of {} bytes for {code:.300}",
            body.len()
        );
        let payload: Value = serde_json::from_slice(&body).expect("the payload is JSON");
        assert!(payload["stdout"].is_string() && payload["stderr"].is_string());
        assert_eq!(payload["truncated"], true, "{payload}");
    }
    c.cancel().await.unwrap();
}
