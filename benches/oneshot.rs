//! Latency of Python and JavaScript one-shots through the library (fresh instance + one turn + drop), the
//! number the README reports. Run with `cargo bench --bench oneshot`.

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
}

criterion_group!(benches, oneshot);
criterion_main!(benches);
