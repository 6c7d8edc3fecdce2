//! Python one-shots over stdio MCP, through the real binary and a real MCP client.

use crate::common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn print_returns_stdout_and_exit_code() {
    let c = server().await;
    let r = py(&c, "print(6*7)").await;
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(r["stderr"], "");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["success"], true);
    assert_eq!(r["mode"], "isolated");
    assert_eq!(r["truncated"], false);
    assert_eq!(r["limit"], serde_json::Value::Null);
    assert!(r["execution_time"].as_f64().unwrap() > 0.0);
    assert!(r["sandbox_id"].as_str().unwrap().starts_with("local-"));
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn one_shot_does_not_echo_final_expression() {
    let c = server().await;
    let r = py(&c, "x = 41\nx + 1").await;
    assert_eq!(r["stdout"], "");
    assert_eq!(r["exit_code"], 0);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn exception_gives_exit_1_and_traceback() {
    let c = server().await;
    let r = py(&c, "def f():\n    raise ValueError('boom')\nf()").await;
    assert_eq!(r["exit_code"], 1);
    assert_eq!(r["success"], false);
    let err = r["stderr"].as_str().unwrap();
    assert!(err.contains("Traceback (most recent call last)"), "{err}");
    assert!(err.contains("ValueError: boom"), "{err}");
    assert!(err.contains("File \"<code>\", line 2, in f"), "{err}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn sys_exit_code_is_reported() {
    let c = server().await;
    let r = py(&c, "import sys\nprint('bye')\nsys.exit(3)").await;
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["stdout"], "bye\n");
    assert_eq!(r["success"], false);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn pandas_and_numpy_work() {
    let c = server().await;
    let r = py(
        &c,
        "import numpy as np, pandas as pd\n\
         df = pd.DataFrame({'a': np.arange(5), 'b': np.arange(5) ** 2})\n\
         print(int(df['b'].sum()), float(np.linalg.norm([3, 4])))",
    )
    .await;
    assert_eq!(r["stdout"], "30 5.0\n", "{r}");
    assert_eq!(r["exit_code"], 0);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn infinite_loop_stops_at_deadline_and_server_keeps_serving() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": "while True:\n    pass", "timeout": 2}),
    )
    .await;
    assert!(!is_error(&r));
    let r = object(&r);
    assert_eq!(r["limit"], "timeout");
    assert_eq!(r["exit_code"], 124);
    assert_eq!(r["success"], false);
    assert!(r["stderr"].as_str().unwrap().contains("deadline"));
    let t = r["execution_time"].as_f64().unwrap();
    assert!((1.9..60.0).contains(&t), "stopped after {t} s");
    assert_eq!(
        py(&c, "print('still here')").await["stdout"],
        "still here\n"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn memory_bomb_is_contained() {
    let c = server().await;
    let r = py(
        &c,
        "a = []\nwhile True:\n    a.append(bytearray(16 * 1024 * 1024))",
    )
    .await;
    assert_eq!(r["limit"], "memory", "{r}");
    assert_ne!(r["exit_code"], 0);
    assert_eq!(r["success"], false);
    assert_eq!(py(&c, "print(sum(range(10)))").await["stdout"], "45\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn output_flood_is_truncated() {
    let c = server().await;
    let r = py(
        &c,
        "import sys\nfor _ in range(3000):\n    sys.stdout.write('y' * 1000 + '\\n')",
    )
    .await;
    assert_eq!(r["truncated"], true, "{}", r["stderr"]);
    assert_eq!(r["exit_code"], 0);
    // The output cap keeps the start and the end; the answer keeps what fits its budget
    // (tests/all/results.rs).
    let out = r["stdout"].as_str().unwrap();
    assert!(out.len() < 80_000 && out.starts_with("yyy") && out.ends_with("y\n"));
    assert!(out.contains("bytes elided]"), "{out}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("stdout over the output cap")
    );
    // An endless flood is stopped by the output limit long before its deadline.
    let r = py(&c, "while True:\n    print('z' * 4096)").await;
    assert_eq!(r["limit"], "output");
    assert_eq!(r["truncated"], true);
    assert_eq!(py(&c, "print('ok')").await["stdout"], "ok\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn unknown_language_is_a_clear_tool_error() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": "puts 1", "language": "ruby"}),
    )
    .await;
    assert!(is_error(&r));
    let o = object(&r);
    assert_eq!(o["error"], "Invalid language");
    assert_eq!(o["provided"], "ruby");
    assert!(
        o["message"]
            .as_str()
            .unwrap()
            .contains("python, javascript, bash, go")
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn languages_not_built_yet_say_so() {
    let c = server().await;
    for (lang, needle) in [("bash", "HOPX_API_KEY")] {
        let r = call(
            &c,
            "execute_code_isolated",
            json!({"code": "x", "language": lang}),
        )
        .await;
        assert!(is_error(&r), "{lang}");
        let msg = object(&r)["message"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "{lang}: {msg}");
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn one_shots_share_nothing() {
    let c = server().await;
    let r = py(
        &c,
        "open('note.txt', 'w').write('secret')\nimport os\nprint(os.getcwd(), os.listdir('.'))",
    )
    .await;
    assert_eq!(r["stdout"], "/workspace ['note.txt']\n");
    let r = py(
        &c,
        "import os\nprint(os.listdir('/workspace'))\nprint(globals().get('secret_var'))",
    )
    .await;
    assert_eq!(r["stdout"], "[]\nNone\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn host_files_and_environment_are_unreachable() {
    let c = server().await;
    let r = py(&c, "open('/etc/passwd').read()").await;
    assert_eq!(r["exit_code"], 1);
    assert!(
        r["stderr"].as_str().unwrap().contains("FileNotFoundError"),
        "{r}"
    );
    let r = py(&c, "open('../../etc/passwd').read()").await;
    assert_eq!(r["exit_code"], 1);
    let r = py(&c, "import os\nprint(sorted(os.environ))").await;
    assert_eq!(r["stdout"], "['HOME', 'PWD', 'PYTHONTZPATH', 'TMPDIR']\n");
    // The runtime files are read-only.
    let r = py(&c, "open('/usr/local/lib/evil.txt', 'w').write('x')").await;
    assert_eq!(r["exit_code"], 1, "{r}");
    let r = py(
        &c,
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 80))",
    )
    .await;
    assert_eq!(r["exit_code"], 1, "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn per_call_env_reaches_the_guest_and_only_that_call() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code_isolated",
        json!({"code": "import os\nprint(os.environ['GREETING'])", "env": {"GREETING": "hello"}}),
    )
    .await;
    assert_eq!(object(&r)["stdout"], "hello\n");
    let r = py(&c, "import os\nprint(os.environ.get('GREETING'))").await;
    assert_eq!(r["stdout"], "None\n");
    c.cancel().await.unwrap();
}
