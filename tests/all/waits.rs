//! Guests blocked in a wait (a sleep, a timer, an idle event loop) obey deadlines, kills and
//! sandbox deletion, and waiting guests or queued calls cannot starve the server.
//!
//! A guest that waits makes no wasm progress, so the epoch deadline (checked while wasm code
//! runs) cannot stop it while the host blocks in `poll_oneoff`. Each test here puts a guest in
//! such a wait for far longer than it may last and measures how soon the server gets it out.
//! Every test is bounded: a failure is an assertion with the time it took, never a hang.

use crate::common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::*;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

/// The deadline given to calls that wait far longer.
const DEADLINE_S: f64 = 2.0;
/// How long after its deadline a waiting call may take to come back.
const GRACE: Duration = Duration::from_millis(500);
/// How long a test waits for a call that should have stopped long before (a little more than
/// the guests' 30 s waits, so today's behaviour shows up as "returned after 30.x s").
const PATIENCE: Duration = Duration::from_secs(35);
/// The bound on the part of a test that attacks (setup, such as a Go build, is bounded apart).
const TEST_BOUND: Duration = Duration::from_secs(40);
/// The bound on a test's setup: server start, warm-up runs, a first Go build.
const SETUP_BOUND: Duration = Duration::from_secs(120);

/// A `wasmbox serve` that is killed when the test ends, passing or failing: a guest still
/// asleep in it must not outlive the test.
struct Server {
    c: Client,
    pid: u32,
}

impl Server {
    async fn start(env: &[(&str, &str)]) -> Self {
        let (c, pid) = server_with_pid(env).await;
        Self { c, pid }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only if the pid is still our server (not reaped and reused).
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.pid)).unwrap_or_default();
        if comm.trim() == "wasmbox" {
            // SAFETY: kill only sends a signal.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
}

/// Runs `f`, failing the test if it takes longer than `bound`.
async fn bounded<T>(what: &str, bound: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: did not finish within {bound:?}"))
}

/// Awaits `f` for at most `patience`: its output and how long it took, or `None` if it had
/// not finished by then.
async fn timed<T>(patience: Duration, f: impl Future<Output = T>) -> (Option<T>, Duration) {
    let t = Instant::now();
    let r = tokio::time::timeout(patience, f).await.ok();
    (r, t.elapsed())
}

/// The result object of a call that must not be a tool error.
fn result_of(r: &CallToolResult) -> Value {
    assert!(!is_error(r), "unexpected tool error: {:?}", r.content);
    object(r)
}

/// Runs a one-shot (or, with `sandbox`, a persistent call) and returns its result object.
async fn run(c: &Client, sandbox: Option<&str>, language: &str, code: &str, timeout: f64) -> Value {
    run_env(c, sandbox, language, code, timeout, json!({})).await
}

async fn run_env(
    c: &Client,
    sandbox: Option<&str>,
    language: &str,
    code: &str,
    timeout: f64,
    env: Value,
) -> Value {
    let mut args = json!({"language": language, "code": code, "timeout": timeout, "env": env});
    if let Some(id) = sandbox {
        args["mode"] = json!("persistent");
        args["sandbox_id"] = json!(id);
    }
    result_of(&call(c, "execute_code", args).await)
}

/// Asserts a call with the deadline `DEADLINE_S` whose guest waits far longer came back within
/// the grace period, stopped by its deadline after it began to wait (its stdout holds
/// `sleeping`, printed just before the wait).
async fn assert_stopped_at_deadline(
    what: &str,
    call: impl Future<Output = Value>,
) -> (Value, Duration) {
    let (r, took) = timed(PATIENCE, call).await;
    let bound = Duration::from_secs_f64(DEADLINE_S) + GRACE;
    let Some(r) = r else {
        panic!("{what}: timeout {DEADLINE_S} s, but the call had not returned after {took:.1?}")
    };
    assert!(
        took <= bound,
        "{what}: timeout {DEADLINE_S} s, but the call returned after {took:.1?} (bound {bound:?}): {r}"
    );
    assert_eq!(r["limit"], "timeout", "{what}: {r}");
    assert_ne!(r["success"], true, "{what}: {r}");
    assert!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("sleeping"),
        "{what}: the guest never got to its wait, so this proves nothing: {r}"
    );
    (r, took)
}

// ---------------------------------------------------------------- one-shots, per language

/// A one-shot whose guest waits 30 s, with a 2 s deadline.
async fn one_shot_wait_stops(what: &str, language: &str, code: &str) {
    let s = bounded("setup", SETUP_BOUND, Server::start(&[])).await;
    // Warm the runtime so the deadline is spent waiting, not loading.
    bounded("warm-up", SETUP_BOUND, async {
        run(&s.c, None, language, warm_code(language), 60.0).await
    })
    .await;
    bounded(what, TEST_BOUND, async {
        assert_stopped_at_deadline(what, run(&s.c, None, language, code, DEADLINE_S)).await;
        // The server still serves.
        let r = run(&s.c, None, "python", "print('alive')", 10.0).await;
        assert_eq!(r["stdout"], "alive\n", "{r}");
    })
    .await;
}

fn warm_code(language: &str) -> &'static str {
    match language {
        "python" => "print('warm')",
        "javascript" => "console.log('warm')",
        _ => panic!("no warm-up for {language}"),
    }
}

#[tokio::test]
async fn python_time_sleep_stops_at_the_deadline() {
    one_shot_wait_stops(
        "python time.sleep(30)",
        "python",
        "import time\nprint('sleeping', flush=True)\ntime.sleep(30)\nprint('woke')",
    )
    .await;
}

#[tokio::test]
async fn python_select_timeout_stops_at_the_deadline() {
    one_shot_wait_stops(
        "python select.select([], [], [], 30)",
        "python",
        "import select\nprint('sleeping', flush=True)\nselect.select([], [], [], 30)\nprint('woke')",
    )
    .await;
}

#[tokio::test]
async fn javascript_os_sleep_stops_at_the_deadline() {
    // `os` is QuickJS's qjs:os module, a global in our prelude; os.sleep(ms) is a blocking
    // nanosleep, one poll_oneoff for the whole wait.
    one_shot_wait_stops(
        "javascript os.sleep(30000)",
        "javascript",
        "console.log('sleeping');\nos.sleep(30000);\nconsole.log('woke');",
    )
    .await;
}

#[tokio::test]
async fn javascript_set_timeout_stops_at_the_deadline() {
    // The event loop waits for a timer in short slices (wasmbox_qjs.c), so this one holds
    // already: it must keep holding.
    one_shot_wait_stops(
        "javascript setTimeout 30 s",
        "javascript",
        "console.log('sleeping');\nsetTimeout(() => console.log('woke'), 30000);",
    )
    .await;
}

/// A Go program that prints `sleeping` and then waits `SLEEP_S` seconds with `wait`. The
/// length comes from the environment so the same source (one build) first runs with 0 to warm
/// the build cache: the deadline covers build and run.
fn go_sleeper(wait: &str) -> String {
    format!(
        "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\t\"strconv\"\n\t\"time\"\n)\n\n\
         func main() {{\n\
         \ts, _ := strconv.Atoi(os.Getenv(\"SLEEP_S\"))\n\
         \td := time.Duration(s) * time.Second\n\
         \tfmt.Println(\"sleeping\")\n\
         \t{wait}\n\
         \tfmt.Println(\"woke\")\n\
         }}\n"
    )
}

async fn go_wait_stops(what: &str, wait: &str) {
    let code = go_sleeper(wait);
    let s = bounded("setup", SETUP_BOUND, Server::start(&[])).await;
    let warm = bounded("go build (warm-up)", SETUP_BOUND, async {
        run_env(&s.c, None, "go", &code, 110.0, json!({"SLEEP_S": "0"})).await
    })
    .await;
    assert_eq!(warm["stdout"], "sleeping\nwoke\n", "{warm}");
    bounded(what, TEST_BOUND, async {
        let (r, _) = assert_stopped_at_deadline(
            what,
            run_env(
                &s.c,
                None,
                "go",
                &code,
                DEADLINE_S,
                json!({"SLEEP_S": "30"}),
            ),
        )
        .await;
        assert_eq!(
            r["stage"], "run",
            "the deadline hit the build, not the wait: {r}"
        );
        let r = run(&s.c, None, "python", "print('alive')", 10.0).await;
        assert_eq!(r["stdout"], "alive\n", "{r}");
    })
    .await;
}

#[tokio::test]
async fn go_time_sleep_stops_at_the_deadline() {
    go_wait_stops("go time.Sleep(30 s)", "time.Sleep(d)").await;
}

#[tokio::test]
async fn go_select_on_time_after_stops_at_the_deadline() {
    go_wait_stops(
        "go select on time.After(30 s)",
        "select {\n\tcase <-time.After(d):\n\t}",
    )
    .await;
}

// ---------------------------------------------------------------- persistent sessions

async fn session_wait_stops(language: &str, sleeper: &str, alive: &str) {
    let s = bounded("setup", SETUP_BOUND, Server::start(&[])).await;
    let id = bounded("setup", SETUP_BOUND, async {
        let id = create_sandbox(&s.c, json!({})).await;
        // Start the session so the deadline is spent waiting, not starting it.
        run(&s.c, Some(&id), language, warm_code(language), 60.0).await;
        id
    })
    .await;
    let what = format!("{language} session: {sleeper:?}");
    bounded(&what, TEST_BOUND, async {
        assert_stopped_at_deadline(&what, run(&s.c, Some(&id), language, sleeper, DEADLINE_S))
            .await;
        // The sandbox serves again, in this language and in Python, promptly.
        let (r, took) = timed(Duration::from_secs(10), async {
            run(&s.c, Some(&id), language, alive, 10.0).await
        })
        .await;
        let r = r.unwrap_or_else(|| panic!("{language} did not answer within {took:.1?}"));
        assert_eq!(r["stdout"], "alive\n", "{r}");
        let r = run(&s.c, Some(&id), "python", "print('alive')", 10.0).await;
        assert_eq!(r["stdout"], "alive\n", "{r}");
    })
    .await;
}

#[tokio::test]
async fn python_session_sleep_stops_at_the_deadline() {
    session_wait_stops(
        "python",
        "import time\nprint('sleeping', flush=True)\ntime.sleep(30)",
        "print('alive')",
    )
    .await;
}

#[tokio::test]
async fn javascript_session_sleep_stops_at_the_deadline() {
    session_wait_stops(
        "javascript",
        "console.log('sleeping');\nos.sleep(30000);",
        "console.log('alive')",
    )
    .await;
}

// ---------------------------------------------------------------- kill and delete

const PY_SLEEP_60: &str = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)";

/// The job `pid` as `execute_list_processes` shows it.
async fn job(c: &Client, sandbox: &str, pid: &str) -> Value {
    let list = ok(c, "execute_list_processes", json!({"sandbox_id": sandbox})).await;
    list["processes"]
        .as_array()
        .expect("a processes array")
        .iter()
        .find(|p| p["process_id"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("no process {pid} in {list}"))
}

/// Starts a background job that prints `sleeping` and sleeps 60 s, and waits until it sleeps.
async fn start_sleeping_job(c: &Client, sandbox: &str) -> String {
    let started = ok(
        c,
        "execute_code_background",
        json!({"sandbox_id": sandbox, "language": "python", "code": PY_SLEEP_60, "timeout": 120}),
    )
    .await;
    let pid = started["process_id"]
        .as_str()
        .expect("a process_id")
        .to_string();
    let t = Instant::now();
    loop {
        let p = job(c, sandbox, &pid).await;
        assert_eq!(p["status"], "running", "the job ended early: {p}");
        if p["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("sleeping")
        {
            return pid;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the job never got to its sleep: {p}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn kill_stops_a_sleeping_background_job() {
    let s = bounded("setup", SETUP_BOUND, Server::start(&[])).await;
    let (id, pid) = bounded("setup", SETUP_BOUND, async {
        let id = create_sandbox(&s.c, json!({})).await;
        let pid = start_sleeping_job(&s.c, &id).await;
        (id, pid)
    })
    .await;
    bounded("kill", TEST_BOUND, async {
        let k = ok(
            &s.c,
            "execute_kill_process",
            json!({"sandbox_id": id, "process_id": pid}),
        )
        .await;
        assert_eq!(k["status"], "killed", "{k}");
        let t = Instant::now();
        let bound = Duration::from_millis(1500);
        let ended = loop {
            let p = job(&s.c, &id, &pid).await;
            if p["status"] != "running" {
                break p;
            }
            assert!(
                t.elapsed() < bound,
                "the sleeping job was still running {:.1?} after execute_kill_process: {p}",
                t.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(ended["status"], "killed", "{ended}");
        assert_eq!(ended["exit_code"], 137, "{ended}");
        // The sandbox serves again.
        let r = run(&s.c, Some(&id), "python", "print('alive')", 10.0).await;
        assert_eq!(r["stdout"], "alive\n", "{r}");
    })
    .await;
}

/// The server's threads running background jobs (`wasmbox-job-<id>`, cut to 15 bytes).
fn job_threads(pid: u32) -> usize {
    entries(std::path::Path::new(&format!("/proc/{pid}/task")))
        .iter()
        .filter(|t| {
            std::fs::read_to_string(t.join("comm"))
                .is_ok_and(|comm| comm.starts_with("wasmbox-job"))
        })
        .count()
}

#[tokio::test]
async fn delete_sandbox_stops_a_sleeping_job_and_a_sleeping_call() {
    let s = bounded("setup", SETUP_BOUND, Server::start(&[])).await;
    let id = bounded("setup", SETUP_BOUND, async {
        let id = create_sandbox(&s.c, json!({})).await;
        // Start the session, so the foreground call below is asleep well before the deletion.
        run(&s.c, Some(&id), "python", "print('warm')", 60.0).await;
        start_sleeping_job(&s.c, &id).await;
        id
    })
    .await;
    assert_eq!(
        job_threads(s.pid),
        1,
        "the sleeping job's thread: this test sees jobs by their threads' name, wasmbox-job-<id> \
         (Wasmbox::start_job); update job_threads if that changes"
    );
    bounded("delete_sandbox", TEST_BOUND, async {
        let foreground = spawn_call(
            &s.c,
            "execute_code",
            json!({"mode": "persistent", "sandbox_id": id, "language": "python",
                   "code": PY_SLEEP_60, "timeout": 120}),
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!foreground.is_finished(), "the foreground call ended early");
        let (deleted, took) = timed(Duration::from_secs(5), async {
            ok(&s.c, "delete_sandbox", json!({"id": id})).await
        })
        .await;
        deleted.unwrap_or_else(|| panic!("delete_sandbox had not returned after {took:.1?}"));
        // Within 2 s of the deletion, the foreground call has returned and the job's thread has
        // ended: nothing of the sandbox runs on.
        let t = Instant::now();
        let bound = Duration::from_secs(2);
        let mut foreground = Some(foreground);
        let mut returned_after = None;
        let mut result = None;
        let mut threads_ended_after = None;
        while t.elapsed() < bound && (foreground.is_some() || threads_ended_after.is_none()) {
            if foreground.as_ref().is_some_and(|h| h.is_finished()) {
                returned_after = Some(t.elapsed());
                result = Some(foreground.take().unwrap().await.expect("the call task"));
            }
            if threads_ended_after.is_none() && job_threads(s.pid) == 0 {
                threads_ended_after = Some(t.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let state = format!(
            "{:.1?} after delete_sandbox: the sleeping foreground call {}; the sleeping job's thread {}",
            t.elapsed(),
            returned_after.map_or("had not returned".into(), |d| format!("returned after {d:.1?}")),
            threads_ended_after.map_or(
                format!("was still running ({} job thread(s))", job_threads(s.pid)),
                |d| format!("ended after {d:.1?}")
            ),
        );
        assert!(
            returned_after.is_some() && threads_ended_after.is_some(),
            "{state}"
        );
        // It came back as a tool error or as a result that is not a success.
        if let Some(Ok(r)) = &result
            && !is_error(r)
        {
            let v = object(r);
            assert_ne!(v["success"], true, "{state}: {v}");
        }
    })
    .await;
}

// ---------------------------------------------------------------- starvation and queueing

#[tokio::test]
async fn sleepers_beyond_the_guest_threads_do_not_starve_the_server() {
    let s = bounded(
        "setup",
        SETUP_BOUND,
        Server::start(&[("WASMBOX_CONCURRENCY", "2")]),
    )
    .await;
    bounded("warm-up", SETUP_BOUND, async {
        run(&s.c, None, "python", "print('warm')", 60.0).await
    })
    .await;
    bounded("6 sleepers on 2 guest threads", TEST_BOUND, async {
        let start = Instant::now();
        let sleepers: Vec<_> = (0..6)
            .map(|_| {
                spawn_call(
                    &s.c,
                    "execute_code",
                    json!({"language": "python", "timeout": 3,
                           "code": "import time\nprint('sleeping', flush=True)\ntime.sleep(30)"}),
                )
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (alive, took) = timed(Duration::from_secs(2), async {
            run(&s.c, None, "python", "print('alive')", 10.0).await
        })
        .await;
        let alive = alive.unwrap_or_else(|| {
            panic!("with 6 sleepers on 2 guest threads, print('alive') had not returned {took:.1?} after being sent")
        });
        assert_eq!(alive["stdout"], "alive\n", "{alive}");
        let bound = Duration::from_millis(4500);
        for (i, h) in sleepers.into_iter().enumerate() {
            let r = tokio::time::timeout(bound.saturating_sub(start.elapsed()), h)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "sleeper {i} (timeout 3 s) had not returned {:.1?} after the start",
                        start.elapsed()
                    )
                })
                .expect("the call task")
                .expect("the call");
            let v = result_of(&r);
            assert_eq!(v["limit"], "timeout", "sleeper {i}: {v}");
        }
    })
    .await;
}

#[tokio::test]
async fn waiting_for_a_guest_thread_is_bounded() {
    let s = bounded(
        "setup",
        SETUP_BOUND,
        Server::start(&[("WASMBOX_CONCURRENCY", "1"), ("WASMBOX_QUEUE_WAIT_S", "1")]),
    )
    .await;
    bounded("warm-up", SETUP_BOUND, async {
        run(&s.c, None, "python", "print('warm')", 60.0).await
    })
    .await;
    bounded("a queued call", TEST_BOUND, async {
        let spinner = spawn_call(
            &s.c,
            "execute_code",
            json!({"language": "python", "code": "while True: pass", "timeout": 10}),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!spinner.is_finished(), "the spinner ended early");
        let (r, took) = timed(Duration::from_secs(15), async {
            call(
                &s.c,
                "execute_code",
                json!({"language": "python", "code": "print('queued')", "timeout": 10}),
            )
            .await
        })
        .await;
        let r = r.unwrap_or_else(|| panic!("the queued call had not returned after {took:.1?}"));
        // Its result on one line (the text block is the same JSON, indented).
        let text = r
            .structured_content
            .as_ref()
            .map(Value::to_string)
            .or_else(|| {
                r.content
                    .first()
                    .and_then(|c| c.as_text())
                    .map(|t| t.text.clone())
            })
            .unwrap_or_default();
        assert!(
            took <= Duration::from_secs(2),
            "with the only guest thread busy and WASMBOX_QUEUE_WAIT_S=1, the queued call returned after {took:.1?} (isError {:?}): {text}",
            r.is_error
        );
        assert!(is_error(&r), "the queued call should be refused: {text}");
        assert!(
            text.to_lowercase().contains("busy"),
            "the refusal should say the server is busy: {text}"
        );
        // The spinner still ends at its own deadline.
        let r = result_of(&spinner.await.expect("the call task").expect("the call"));
        assert_eq!(r["limit"], "timeout", "{r}");
    })
    .await;
}
