//! Latency of a Python one-shot through the library (fresh instance + one turn + drop), the
//! number the README reports. Run with `cargo bench --bench oneshot`.

use criterion::{Criterion, criterion_group, criterion_main};
use wasmbox::{Config, ExecOptions, Wasmbox};

fn oneshot(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let wb = Wasmbox::new(Config::from_env()).expect("engine");
    rt.block_on(wb.prepare())
        .expect("runtimes: run ./fetch-runtimes.sh");
    let mut group = c.benchmark_group("python_oneshot");
    group.sample_size(30);
    for (name, code) in [
        ("print", "print(1+1)"),
        (
            "numpy_sum",
            "import numpy as np\nprint(np.arange(1000).sum())",
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let req = wb
                    .request(ExecOptions {
                        language: "python".into(),
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
