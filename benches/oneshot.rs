//! Latency of Python, JavaScript and Go one-shots through the library (fresh instance + one turn +
//! drop), the numbers the README reports. Run with `cargo bench --bench oneshot`.
//!
//! Go: `go_repeat_snippet` runs the same source again (its module is cached in memory);
//! `go_new_snippet` changes a constant every iteration, so each one runs the Go toolchain (with
//! the GOCACHE pre-warmed by ./fetch-runtimes.sh) and a Winch compile.

use criterion::{Criterion, criterion_group, criterion_main};
use wasmbox::{Config, ExecOptions, Wasmbox};

fn oneshot(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let wb = Wasmbox::new(Config::from_env()).expect("engine");
    for (lang, outcome) in rt.block_on(wb.prepare()) {
        outcome.unwrap_or_else(|e| panic!("{lang:?}: {e} (run ./fetch-runtimes.sh)"));
    }
    let mut group = c.benchmark_group("oneshot");
    group.sample_size(30);
    for (name, language, code) in [
        ("python_print", "python", "print(1+1)"),
        (
            "python_numpy_sum",
            "python",
            "import numpy as np\nprint(np.arange(1000).sum())",
        ),
        ("javascript_console_log", "javascript", "console.log(1+1)"),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let req = wb
                    .request(ExecOptions {
                        language: language.into(),
                        code: code.into(),
                        ..Default::default()
                    })
                    .unwrap();
                let r = rt.block_on(wb.execute(req)).unwrap();
                assert_eq!(r.exit_code, 0, "{}", r.stderr);
            })
        });
    }
    group.finish();

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

criterion_group!(benches, oneshot);
criterion_main!(benches);
