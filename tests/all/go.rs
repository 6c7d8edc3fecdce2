//! Go one-shots over stdio MCP: built on the host by the pinned Go toolchain for wasip1, run in
//! wasmtime (Winch). Needs `./fetch-runtimes.sh` (toolchain + warm GOCACHE).

use crate::common;

use common::*;
use serde_json::{Value, json};

async fn go(c: &Client, code: &str) -> Value {
    go_with(c, code, None).await
}

async fn go_with(c: &Client, code: &str, timeout: Option<f64>) -> Value {
    let mut args = json!({"code": code, "language": "go"});
    if let Some(t) = timeout {
        args["timeout"] = json!(t);
    }
    let r = call(c, "execute_code", args).await;
    assert!(!is_error(&r), "unexpected tool error: {:?}", r.content);
    object(&r)
}

/// A constant unique to this test run, so snippets are new to the cache and really get built.
fn nonce() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

#[tokio::test]
async fn hello_world() {
    let c = server().await;
    let r = go(
        &c,
        "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"hello from go\")\n\tfmt.Fprintln(os.Stderr, \"to stderr\")\n}\n",
    )
    .await;
    assert_eq!(r["stdout"], "hello from go\n", "{r}");
    assert_eq!(r["stderr"], "to stderr\n");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["success"], true);
    assert_eq!(r["language"], "go");
    assert_eq!(r["stage"], "run");
    // The alias works too, and so does a snippet without a package clause.
    let r = object(
        &call(
            &c,
            "execute_code_isolated",
            json!({"code": "import \"fmt\"\n\nfor i := 0; i < 3; i++ {\n\tfmt.Print(i)\n}\nfmt.Println()", "language": "golang"}),
        )
        .await,
    );
    assert_eq!(r["stdout"], "012\n", "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn json_sort_and_strings() {
    let c = server().await;
    let r = go(
        &c,
        r#"package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

type Item struct {
	Name  string `json:"name"`
	Score int    `json:"score"`
}

func main() {
	var items []Item
	if err := json.Unmarshal([]byte(`[{"name":"b","score":2},{"name":"a","score":3},{"name":"c","score":1}]`), &items); err != nil {
		panic(err)
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Score > items[j].Score })
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = strings.ToUpper(it.Name)
	}
	out, _ := json.Marshal(map[string]any{"order": strings.Join(names, ","), "n": len(items)})
	fmt.Println(string(out))
}
"#,
    )
    .await;
    assert_eq!(r["stdout"], "{\"n\":3,\"order\":\"A,B,C\"}\n", "{r}");
    assert_eq!(r["exit_code"], 0);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn compile_error_is_a_normal_result() {
    let c = server().await;
    let r = go(
        &c,
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tx := 1\n\tfmt.Println(\"hi\")\n}\n",
    )
    .await;
    assert_eq!(r["stage"], "compile", "{r}");
    assert_ne!(r["exit_code"], 0);
    assert_eq!(r["success"], false);
    assert_eq!(r["stdout"], "");
    let err = r["stderr"].as_str().unwrap();
    assert!(
        err.contains("./main.go:6:2: declared and not used: x"),
        "{err}"
    );
    assert!(!err.contains("wasmbox-gobuild"), "no host paths: {err}");
    // Positions name the snippet's own lines when wasmbox wrapped it in func main.
    let r = go(&c, "import \"fmt\"\n\nfmt.Println(\"ok\")\ny := 2\n").await;
    assert_eq!(r["stage"], "compile", "{r}");
    let err = r["stderr"].as_str().unwrap();
    assert!(
        err.contains("./main.go:4:1: declared and not used: y"),
        "{err}"
    );
    // cgo is refused clearly.
    let r = go(&c, "package main\n\nimport \"C\"\n\nfunc main() {}\n").await;
    assert_eq!(r["stage"], "compile");
    assert!(r["stderr"].as_str().unwrap().contains("cgo"), "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn panic_exits_2_with_goroutine_trace() {
    let c = server().await;
    let r = go(
        &c,
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"before\")\n\tvar s []int\n\t_ = s[5]\n}\n",
    )
    .await;
    assert_eq!(r["exit_code"], 2, "{r}");
    assert_eq!(r["stage"], "run");
    assert_eq!(r["stdout"], "before\n");
    let err = r["stderr"].as_str().unwrap();
    assert!(
        err.contains("panic: runtime error: index out of range"),
        "{err}"
    );
    assert!(err.contains("goroutine 1 [running]"), "{err}");
    assert!(err.contains("./main.go:8"), "{err}");
    let r = go(&c, "package main\n\nfunc main() {\n\tpanic(\"boom\")\n}\n").await;
    assert_eq!(r["exit_code"], 2);
    assert!(r["stderr"].as_str().unwrap().starts_with("panic: boom\n"));
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn os_exit_code() {
    let c = server().await;
    let r = go(
        &c,
        "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"bye\")\n\tos.Exit(3)\n}\n",
    )
    .await;
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["stdout"], "bye\n");
    assert_eq!(r["success"], false);
    assert!(r["limit"].is_null());
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn infinite_loop_is_stopped_by_the_deadline() {
    let c = server().await;
    let r = go_with(
        &c,
        "package main\n\nfunc main() {\n\tx := 0\n\tfor {\n\t\tx++\n\t}\n}\n",
        Some(3.0),
    )
    .await;
    assert_eq!(r["limit"], "timeout", "{r}");
    assert_eq!(r["exit_code"], 124);
    assert_eq!(r["stage"], "run");
    let t = r["execution_time"].as_f64().unwrap();
    assert!(t < 6.0, "deadline covers build + run: {t}");
    // A deadline too short for the build stops the build and says so.
    let r = go_with(
        &c,
        &format!(
            "package main\n\nimport \"fmt\"\n\nfunc main() {{ fmt.Println(\"{}\") }}\n",
            nonce()
        ),
        Some(0.01),
    )
    .await;
    assert_eq!(r["limit"], "timeout", "{r}");
    assert_eq!(r["stage"], "compile");
    assert_eq!(r["exit_code"], 124);
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn files_in_workspace() {
    let c = server().await;
    let r = go(
        &c,
        r#"package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	wd, _ := os.Getwd()
	if err := os.MkdirAll("data/sub", 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile("data/sub/x.txt", []byte("seven"), 0o644); err != nil {
		panic(err)
	}
	b, err := os.ReadFile("/workspace/data/sub/x.txt")
	if err != nil {
		panic(err)
	}
	entries, _ := os.ReadDir("data")
	abs, _ := filepath.Abs("data")
	fmt.Println(wd, string(b), len(entries), entries[0].Name(), abs)
	_, err = os.ReadFile("/etc/passwd")
	fmt.Println(err != nil)
}
"#,
    )
    .await;
    assert_eq!(
        r["stdout"], "/workspace seven 1 sub /workspace/data\ntrue\n",
        "{r}"
    );
    // The next run starts with an empty workspace and sees no host environment.
    let r = go(
        &c,
        "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\te, _ := os.ReadDir(\"/workspace\")\n\tfmt.Println(len(e), os.Getenv(\"WASMBOX_TEST_HOST_SECRET\") == \"\")\n}\n",
    )
    .await;
    assert_eq!(r["stdout"], "0 true\n", "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn same_snippet_twice_hits_the_cache() {
    let c = server().await;
    let code = format!(
        "package main\n\nimport \"fmt\"\n\nfunc main() {{ fmt.Println(\"cached {}\") }}\n",
        nonce()
    );
    let stats = |h: &Value, k: &str| h["go_cache"][k].as_u64().unwrap();
    let r = go(&c, &code).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let h1 = object(&call(&c, "health", json!({})).await);
    assert_eq!(stats(&h1, "builds"), 1, "{h1}");
    assert_eq!(stats(&h1, "wasm_hits"), 0);
    let r2 = go(&c, &code).await;
    assert_eq!(r2["stdout"], r["stdout"]);
    let h2 = object(&call(&c, "health", json!({})).await);
    assert_eq!(stats(&h2, "builds"), 1, "no second build: {h2}");
    assert_eq!(stats(&h2, "wasm_hits"), 1, "{h2}");
    assert_eq!(stats(&h2, "module_hits"), 1, "{h2}");
    assert!(
        h2["runtimes"]["go"].as_str().unwrap().starts_with("ready"),
        "{h2}"
    );
    // Seen again, it is recompiled with Cranelift in the background; later runs use that.
    let mut waited = 0;
    loop {
        let h = object(&call(&c, "health", json!({})).await);
        if stats(&h, "optimized") == 1 {
            break;
        }
        waited += 1;
        assert!(waited < 600, "never optimized: {h}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(go(&c, &code).await["stdout"], r["stdout"]);
    c.cancel().await.unwrap();

    // A fresh server finds the built program on disk: still no build.
    let c = server().await;
    assert_eq!(go(&c, &code).await["stdout"], r["stdout"]);
    let h = object(&call(&c, "health", json!({})).await);
    assert_eq!(stats(&h, "builds"), 0, "{h}");
    assert_eq!(stats(&h, "wasm_hits"), 1, "{h}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn concurrent_requests_for_a_new_snippet_build_once() {
    let c = server().await;
    let code = format!(
        "package main\n\nimport \"fmt\"\n\nfunc main() {{ fmt.Println(\"twin {}\") }}\n",
        nonce()
    );
    let args = json!({"code": code, "language": "go"});
    let (a, b) = tokio::join!(
        call(&c, "execute_code", args.clone()),
        call(&c, "execute_code", args)
    );
    assert_eq!(object(&a)["exit_code"], 0, "{:?}", a.content);
    assert_eq!(object(&b)["exit_code"], 0, "{:?}", b.content);
    let h = object(&call(&c, "health", json!({})).await);
    assert_eq!(h["go_cache"]["builds"], 1, "{h}");
    c.cancel().await.unwrap();
}

/// A snippet that takes the toolchain many seconds to build (12,000 functions), new to every
/// cache.
fn slow_to_build() -> String {
    let mut s = String::from("package main\n\nimport \"fmt\"\n\nvar sink int\n\n");
    for i in 0..12_000 {
        s.push_str(&format!(
            "func f{i}(a, b int) int {{ s := 0; for j := 0; j < a; j++ {{ if j%{} == 0 {{ s += j*b ^ {i} }} else {{ s -= b >> 1 }} }}; return s + {i} }}\n",
            i + 2
        ));
    }
    s.push_str("func main() {\n");
    for i in 0..12_000 {
        s.push_str(&format!("\tsink += f{i}(sink, {i})\n"));
    }
    s.push_str(&format!("\tfmt.Println(sink, \"{}\")\n}}\n", nonce()));
    s
}

/// The server's child processes (the Go toolchain while it builds).
fn children(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        if let Ok(c) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(c.split_whitespace().map(str::to_string));
        }
    }
    out
}

/// The Go build directories left in `tmp` (the server's TMPDIR).
fn build_dirs(tmp: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![tmp.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("gobuild-") || name.starts_with("wasmbox-gobuild-") {
                found.push(e.path().display().to_string());
            } else if e.file_type().is_ok_and(|t| t.is_dir()) && name.starts_with("wasmbox-run-") {
                stack.push(e.path());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_background_go_job_still_building_is_killed_promptly() {
    let tmp = tempfile::tempdir().unwrap();
    let (c, pid) = server_with_pid(&[("TMPDIR", tmp.path().to_str().unwrap())]).await;
    let id = create_sandbox(&c, json!({"template_id": "go"})).await;
    let started = ok(
        &c,
        "execute_code",
        json!({"mode": "background", "sandbox_id": id, "language": "go",
               "code": slow_to_build(), "timeout": 120}),
    )
    .await;
    let job = started["process_id"].as_str().unwrap().to_string();
    // Well into the build: the toolchain runs.
    let t = std::time::Instant::now();
    while children(pid).is_empty() {
        assert!(t.elapsed().as_secs() < 30, "the build never started");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    assert!(!build_dirs(tmp.path()).is_empty(), "building in TMPDIR");
    let k = ok(
        &c,
        "execute_kill_process",
        json!({"sandbox_id": id, "process_id": job}),
    )
    .await;
    assert_eq!(k["status"], "killed", "{k}");
    let killed_at = std::time::Instant::now();
    let p = loop {
        let list = ok(&c, "execute_list_processes", json!({"sandbox_id": id})).await;
        let p = list["processes"][0].clone();
        if p["status"] != "running" {
            break p;
        }
        assert!(
            killed_at.elapsed().as_secs() < 30,
            "the kill did not stop the build: {p}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let took = killed_at.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "the build ended {took:?} after the kill"
    );
    assert_eq!(p["status"], "killed", "{p}");
    assert_eq!(p["exit_code"], 137, "{p}");
    assert!(p["stderr"].as_str().unwrap().contains("killed"), "{p}");
    assert!(
        children(pid).is_empty(),
        "the toolchain's processes are gone"
    );
    assert_eq!(
        build_dirs(tmp.path()),
        Vec::<String>::new(),
        "its files too"
    );
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn deleting_a_sandbox_stops_a_go_build_in_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (c, pid) = server_with_pid(&[("TMPDIR", tmp.path().to_str().unwrap())]).await;
    let id = create_sandbox(&c, json!({"template_id": "go"})).await;
    let call = spawn_call(
        &c,
        "execute_code",
        json!({"mode": "persistent", "sandbox_id": id, "language": "go",
               "code": slow_to_build(), "timeout": 120}),
    );
    let t = std::time::Instant::now();
    while children(pid).is_empty() {
        assert!(t.elapsed().as_secs() < 30, "the build never started");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    ok(&c, "delete_sandbox", json!({"id": id})).await;
    let deleted_at = std::time::Instant::now();
    let r = tokio::time::timeout(std::time::Duration::from_secs(30), call)
        .await
        .expect("the call returns")
        .unwrap()
        .unwrap();
    let took = deleted_at.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "the build ended {took:?} after the deletion"
    );
    let r = object(&r);
    assert_eq!(r["exit_code"], 137, "{r}");
    assert_eq!(r["stage"], "compile", "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("deleted"),
        "{}",
        r["stderr"]
    );
    assert!(children(pid).is_empty());
    assert_eq!(build_dirs(tmp.path()), Vec::<String>::new());
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_built_program_over_the_size_cap_is_refused() {
    // 1 MiB: a program that imports fmt is about 2.4 MiB.
    let c = server_with_env(&[("WASMBOX_GO_MAX_WASM_MB", "1")]).await;
    let r = go(
        &c,
        &format!(
            "package main\n\nimport \"fmt\"\n\nfunc main() {{ fmt.Println(\"{}\") }}\n",
            nonce()
        ),
    )
    .await;
    assert_eq!(r["stage"], "compile", "{r}");
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("WASMBOX_GO_MAX_WASM_MB"),
        "{r}"
    );
    c.cancel().await.unwrap();
}
