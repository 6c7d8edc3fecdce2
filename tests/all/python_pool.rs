//! The fast path: a pre-initialised Python image (scientific stack already imported) served from
//! a pool of ready instances, over stdio MCP.

use crate::common;

use common::*;
use std::time::Duration;

use serde_json::{Value, json};

#[tokio::test]
async fn scientific_stack_is_already_imported() {
    let c = server().await;
    let r = py(
        &c,
        "import sys\n\
         print(all(m in sys.modules for m in ['numpy', 'pandas', 'matplotlib.pyplot', 'scipy', 'sklearn']))",
    )
    .await;
    assert_eq!(r["stdout"], "True\n", "{r}");
    let r = py(
        &c,
        "import io\nimport matplotlib.pyplot as plt\n\
         fig, ax = plt.subplots()\nax.plot([1, 2, 3], [1, 4, 9])\n\
         buf = io.BytesIO()\nfig.savefig(buf, format='png')\n\
         print(buf.getvalue()[:4] == b'\\x89PNG', len(buf.getvalue()) > 1000)",
    )
    .await;
    assert_eq!(r["stdout"], "True True\n", "{r}");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn each_one_shot_has_its_own_random_sequence() {
    let c = server().await;
    // Every way to draw from the two global generators the image holds (their states are
    // written by the host into each instance), in one-shots and in sandbox sessions.
    let code = "import random\nimport numpy as np\nprint(random.random(), random.getrandbits(64), \
                random.gauss(0, 1), np.random.rand(), np.random.randint(1 << 30), np.random.randn())";
    let mut seen: Vec<Vec<String>> = Vec::new();
    for i in 0..6 {
        let r = if i < 4 {
            py(&c, code).await
        } else {
            let id = create_sandbox(&c, json!({})).await;
            ok(
                &c,
                "execute_code",
                json!({"mode": "persistent", "sandbox_id": id, "code": code}),
            )
            .await
        };
        let draws: Vec<String> = r["stdout"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(draws.len(), 6, "{r}");
        for earlier in &seen {
            for (k, (a, b)) in earlier.iter().zip(&draws).enumerate() {
                assert_ne!(a, b, "draw {k} repeated across sandboxes: {draws:?}");
            }
        }
        seen.push(draws);
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn env_and_working_dir_apply_per_call() {
    let c = server().await;
    for (i, word) in ["first", "second"].iter().enumerate() {
        let r = call(
            &c,
            "execute_code",
            json!({"code": "import os\nprint(os.environ.get('WORD'), os.environ['HOME'], os.getcwd(), os.environ.get('N'))",
                   "env": {"WORD": word, "N": i.to_string()}}),
        )
        .await;
        assert_eq!(
            object(&r)["stdout"],
            format!("{word} /tmp /workspace {i}\n")
        );
    }
    let r = py(&c, "import os\nprint(os.environ.get('WORD'))").await;
    assert_eq!(r["stdout"], "None\n", "an earlier call's env must not leak");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn echo_prints_the_final_expression_when_asked() {
    let c = server().await;
    let r = call(
        &c,
        "execute_code",
        json!({"code": "import pandas as pd\npd.Series([1, 2, 3]).sum()", "echo": true}),
    )
    .await;
    assert_eq!(object(&r)["stdout"], "np.int64(6)\n");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn pool_exhaustion_falls_back_to_fresh_instances() {
    let c = server_with_env(&[("WASMBOX_POOL_SIZE", "1")]).await;
    let calls = (0..6).map(|i| {
        let c = &c;
        async move { py(c, &format!("print({i} * 2)")).await }
    });
    let results = futures::future::join_all(calls).await;
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["stdout"], format!("{}\n", i * 2));
    }
    // A trap and a deadline in pooled instances leave the pool serving.
    let r = call(
        &c,
        "execute_code",
        json!({"code": "while True: pass", "timeout": 1}),
    )
    .await;
    assert_eq!(object(&r)["limit"], "timeout");
    assert_eq!(py(&c, "print('after')").await["stdout"], "after\n");
    let m = object(&call(&c, "get_system_metrics", json!({})).await);
    let pool = &m["pools"][0];
    assert_eq!(pool["name"], "python");
    assert_eq!(pool["target"], 1);
    assert_eq!(m["runtimes"]["python"], "ready", "{m}");
    let (hits, misses) = (
        pool["hits"].as_u64().unwrap(),
        pool["misses"].as_u64().unwrap(),
    );
    assert_eq!(hits + misses, 8, "{m}");
    assert!(
        misses >= 1,
        "6 concurrent calls on a pool of 1 must miss: {m}"
    );
    assert!(m["memory"]["rss_bytes"].as_u64().unwrap() > 0);
    c.cancel().await.unwrap();
}

/// Under sustained concurrent load, spent instances are torn down fast enough that the
/// allocator's instance slots never run out (teardown falls back to inline when it lags).
#[tokio::test]
async fn sustained_load_does_not_exhaust_instance_slots() {
    let c = server_with_env(&[("WASMBOX_POOLED_INSTANCES", "32")]).await;
    let callers = (0..8).map(|k| {
        let c = &c;
        async move {
            for i in 0..12 {
                let r = py(c, &format!("print({k} * 100 + {i})")).await;
                assert_eq!(r["stdout"], format!("{}\n", k * 100 + i), "{r}");
            }
        }
    });
    futures::future::join_all(callers).await;
    // Once settled (pools full, teardown done), the allocator holds the ready instances and
    // nothing else: none leaked by the load. Each Python instance also holds a memory slot for
    // its GC heap (where its wasm exceptions live), beside its linear memory.
    let m = settled(&c).await;
    let slots = &m["slots"];
    assert_eq!(slots["limit"], 32, "{m}");
    // Ready instances, and the never-run one each pool keeps to reset spent ones from.
    let ready = |name: Option<&str>| -> u64 {
        m["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| name.is_none_or(|n| p["name"] == n))
            .map(|p| p["ready"].as_u64().unwrap() + p["pristine"].as_u64().unwrap_or(0))
            .sum()
    };
    let (instances, gc_heaps) = (
        slots["core_instances"].as_u64().unwrap(),
        slots["gc_heaps"].as_u64().unwrap(),
    );
    assert_eq!(
        instances,
        ready(None),
        "instances beyond the ready ones: {m}"
    );
    assert_eq!(gc_heaps, ready(Some("python")), "{m}");
    assert_eq!(slots["memories"], instances + gc_heaps, "{m}");
    c.cancel().await.unwrap();
}

/// `get_system_metrics` once every pool is full and the allocator's counts have stopped moving
/// (refills and teardown run in the background after each call).
async fn settled(c: &Client) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        let m = object(&call(c, "get_system_metrics", json!({})).await);
        let full = m["pools"]
            .as_array()
            .is_some_and(|p| !p.is_empty() && p.iter().all(|p| p["ready"] == p["target"]));
        if full && m["slots"] == last["slots"] {
            return m;
        }
        last = m;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the pools never settled: {last}");
}

/// A pooled instance arrives with the pages a small turn writes copied, and those it reads
/// mapped (by the polish, or ahead when the polish does not read them): measured once at load
/// after a polish and a sample turn, since the polish moves the heap on. The guest's turn then
/// takes no page fault on the request's path: the call takes 1-2, the host's own (3-5 without
/// the read pages mapped ahead).
#[cfg(target_os = "linux")]
#[test]
fn a_polished_one_shot_takes_no_page_faults() {
    prepare();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wb = wasmbox::Wasmbox::new(wasmbox::Config::from_env()).unwrap();
    let python = rt.block_on(wb.python()).unwrap();
    let req = wb
        .request(wasmbox::ExecOptions {
            language: "python".into(),
            code: "print(6 * 7)".into(),
            ..Default::default()
        })
        .unwrap();
    let pool = python.clone();
    let faults = faults_per_call(
        move || assert!(pool.wait_pool_full(Duration::from_secs(60))),
        move || {
            let r = python.run_oneshot(&req).unwrap();
            assert_eq!(r.stdout, "42\n", "{r:?}");
        },
    );
    assert!(
        faults[faults.len() / 2] <= 2,
        "page faults per pooled one-shot: {faults:?}"
    );
}

/// A pooled slot is reset in place between guests (dirty pages copied back from the image):
/// nothing the last guest wrote, in the image's pages or in memory it grew, reaches the next
/// one. A fresh instance's heap layout is deterministic, so the second program's zero-filled
/// buffer lands where the first one's 0xab-filled buffer was.
#[tokio::test]
async fn a_reused_slot_shows_nothing_of_its_last_guest() {
    let c = server_with_env(&[("WASMBOX_POOL_SIZE", "1")]).await;
    for round in 0..4 {
        let r = py(
            &c,
            "import sys\nsys.wb_marker = 'left behind'\nbig = bytearray(b'\\xab' * (24 << 20))\nprint(len(big))",
        )
        .await;
        assert_eq!(r["stdout"], format!("{}\n", 24 << 20), "{r}");
        let r = py(
            &c,
            "import sys\nb = bytearray(24 << 20)\nprint(hasattr(sys, 'wb_marker'), b.count(0) == len(b))",
        )
        .await;
        assert_eq!(r["stdout"], "False True\n", "round {round}: {r}");
        // Files left behind, and files made and removed (an empty pair of directories may
        // serve again): the next one-shot finds its directories empty either way.
        for code in [
            "open('/workspace/left', 'w').write('x')\nopen('/tmp/left', 'w').write('x')",
            "import os\nfor p in ('/workspace/gone', '/tmp/gone'):\n    open(p, 'w').write('x')\n    os.remove(p)",
        ] {
            let r = py(&c, code).await;
            assert_eq!(r["exit_code"], 0, "{r}");
            let r = py(
                &c,
                "import os\nprint(os.listdir('/workspace'), os.listdir('/tmp'))",
            )
            .await;
            assert_eq!(r["stdout"], "[] []\n", "round {round}: {r}");
        }
    }
    c.cancel().await.unwrap();
}

/// A polished pooled instance (its idle-time turn ran) shows user code the same globals and
/// modules as one made on the request, which was never polished.
#[tokio::test]
async fn polish_leaves_nothing_for_user_code_to_see() {
    let code = "import sys\nprint(sorted(globals()), len(sys.modules), sys.last_value if hasattr(sys, 'last_value') else None)";
    let pooled = server().await;
    py(&pooled, "print(0)").await;
    // Let the pool refill and polish.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = ok(&pooled, "get_system_metrics", json!({})).await;
        let p = &m["pools"][0];
        assert_eq!(p["name"], "python", "{m}");
        assert!(p["target"].as_u64().unwrap() > 0, "{m}");
        if p["polished"] == p["target"] || std::time::Instant::now() > deadline {
            assert_eq!(p["polished"], p["target"], "{m}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = py(&pooled, code).await;
    let fresh = server_with_env(&[("WASMBOX_POOL_SIZE", "0")]).await;
    let b = py(&fresh, code).await;
    assert_eq!(a["stdout"], b["stdout"], "{a}\n{b}");
    pooled.cancel().await.unwrap();
    fresh.cancel().await.unwrap();
}

/// The `name` pool's counters.
async fn pool_of(c: &Client, name: &str) -> Value {
    let m = object(&call(c, "get_system_metrics", json!({})).await);
    m["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no {name} pool: {m}"))
}

/// Waits until the `name` pool keeps a never-run instance to reset spent ones from (it is made
/// once the image's code is checked, in the background after load).
async fn recycling(c: &Client, name: &str) {
    for _ in 0..1500 {
        if pool_of(c, name).await["pristine"] == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{name}'s one-shot instances are never reused: {}",
        pool_of(c, name).await
    );
}

/// Waits until the `name` pool (of one) holds an instance and has put back `least` reset ones
/// in all, and returns that count: with `least` one past the last count, the next one-shot
/// runs in the instance the last one-shot ran in, reset. Python's pool polishes a put-back
/// instance out of the pool for a moment (a one-shot then would miss and run in a new one), so
/// for Python the instance must be polished too.
async fn recycled_at_least(c: &Client, name: &str, least: u64) -> u64 {
    for _ in 0..600 {
        let p = pool_of(c, name).await;
        let recycled = p["recycled"].as_u64().unwrap();
        let settled = name != "python" || p["polished"] == 1;
        if recycled >= least && p["ready"] == 1 && settled {
            return recycled;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "no {name} instance was reset and put back: {}",
        pool_of(c, name).await
    );
}

/// A one-shot's instance is reset in place and serves the next one-shot (memory and globals
/// copied back from a never-run instance of the image, a fresh store state): nothing the last
/// guest changed, in the interpreter's state, its memory, its files, its environment or its
/// random generators, reaches the next one, which sees what a new instance shows. A guest that
/// ended in a trap (its deadline) leaves an instance that is reset and serves as well.
#[tokio::test]
async fn a_recycled_instance_shows_nothing_of_its_last_guest() {
    let c = server_with_env(&[("WASMBOX_POOL_SIZE", "1")]).await;
    let fresh = server_with_env(&[("WASMBOX_POOL_SIZE", "0")]).await;
    let probe = "import sys, os, random, builtins, json\nimport numpy as np\n\
                 print(sorted(globals()), len(sys.modules), sorted(vars(sys))[:0], os.getcwd(), \
                 sys.getrecursionlimit(), sorted(k for k in os.environ), hasattr(builtins, 'wb'), \
                 hasattr(json, 'wb'), len(sys.path), os.listdir('/workspace'), os.listdir('/tmp'))";
    let expected = py(&fresh, probe).await;
    assert_eq!(expected["exit_code"], 0, "{expected}");
    let draw = "import random\nimport numpy as np\nprint(random.random(), np.random.rand())";
    // What a guest leaves behind: module state, builtins, the environment, the working
    // directory, interpreter settings, files, a buffer kept alive, its random generators.
    let messy = "import sys, os, random, builtins, json\nimport numpy as np\n\
                 sys.wb_marker = 'left behind'\nbuiltins.wb = 1\njson.wb = 1\nsecret = 'x' * 100\n\
                 os.environ['WB_LEFT'] = '1'\nos.chdir('/tmp')\nsys.setrecursionlimit(77)\n\
                 sys.path.append('/tmp/wb')\nsys.wb_keep = bytearray(b'\\xab' * 100000)\n\
                 open('/workspace/left', 'w').write('x')\nopen('/tmp/left', 'w').write('x')\n\
                 random.seed(1)\nnp.random.seed(1)\nprint('messy')";
    recycling(&c, "python").await;
    let mut recycled = recycled_at_least(&c, "python", 0).await;
    let mut draws = Vec::new();
    for round in 0..3 {
        let r = py(&c, messy).await;
        assert_eq!(r["stdout"], "messy\n", "{r}");
        recycled = recycled_at_least(&c, "python", recycled + 1).await;
        let r = py(&c, probe).await;
        assert_eq!(r["stdout"], expected["stdout"], "round {round}: {r}");
        recycled = recycled_at_least(&c, "python", recycled + 1).await;
        let r = py(&c, draw).await;
        assert_eq!(r["exit_code"], 0, "{r}");
        draws.push(r["stdout"].as_str().unwrap().to_string());
        // Each step waits for its instance: a call arriving while it is reset or polished
        // misses and runs in a new one, and the spare this leaves, dropped later, wakes the
        // refill to make another while the next step holds the pooled one, whose reset is then
        // refused (the pool is full) and never counted.
        recycled = recycled_at_least(&c, "python", recycled + 1).await;
        // A trap mid-turn (the deadline) leaves the interpreter anywhere: reset all the same.
        let r = call(
            &c,
            "execute_code",
            json!({"code": "while True: pass", "timeout": 1}),
        )
        .await;
        assert_eq!(object(&r)["limit"], "timeout", "{r:?}");
        recycled = recycled_at_least(&c, "python", recycled + 1).await;
        let r = py(&c, probe).await;
        assert_eq!(
            r["stdout"], expected["stdout"],
            "round {round}, after a trap: {r}"
        );
        recycled = recycled_at_least(&c, "python", recycled + 1).await;
    }
    let mut distinct = draws.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        draws.len(),
        "random draws repeated: {draws:?}"
    );
    assert!(
        !draws.iter().any(|d| d.starts_with("0.134364")),
        "seed(1)'s first draw: {draws:?}"
    );
    c.cancel().await.unwrap();
    fresh.cancel().await.unwrap();
}

/// The same for JavaScript's instances: globals a guest set are not in the next one-shot,
/// which runs in the same (reset) instance. (A guest that grows QuickJS's memory, as most
/// larger ones do, leaves an instance that is dropped, not reset.)
#[tokio::test]
async fn a_recycled_javascript_instance_shows_nothing_of_its_last_guest() {
    let c = server_with_env(&[("WASMBOX_POOL_SIZE", "1")]).await;
    let js = |code: &str| json!({"language": "javascript", "code": code});
    let probe = "console.log(typeof m, typeof q, typeof Math.w, \
                 JSON.stringify(Object.keys(globalThis).sort()))";
    let fresh = server_with_env(&[("WASMBOX_POOL_SIZE", "0")]).await;
    let expected = object(&call(&fresh, "execute_code", js(probe)).await);
    assert_eq!(expected["exit_code"], 0, "{expected}");
    // JavaScript loads on first use.
    let r = object(&call(&c, "execute_code", js("console.log(0)")).await);
    assert_eq!(r["stdout"], "0\n", "{r}");
    recycling(&c, "javascript").await;
    let mut recycled = recycled_at_least(&c, "javascript", 0).await;
    for messy in [
        "globalThis.m = 1; console.log('messy')",
        "var q = 2; console.log('messy')",
        "Math.w = 3; console.log('messy')",
    ] {
        let r = object(&call(&c, "execute_code", js(messy)).await);
        assert_eq!(r["stdout"], "messy\n", "{r}");
        recycled = recycled_at_least(&c, "javascript", recycled + 1).await;
        let r = object(&call(&c, "execute_code", js(probe)).await);
        assert_eq!(r["stdout"], expected["stdout"], "after {messy:?}: {r}");
        // The probe's instance may have grown (then a new one is made): wait for either.
        recycled = recycled_at_least(&c, "javascript", recycled).await;
    }
    c.cancel().await.unwrap();
    fresh.cancel().await.unwrap();
}
