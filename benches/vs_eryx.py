"""wasmbox's library one-shot against eryx's (pyeryx), in one run on one machine.

#35 sets wasmbox's pool-hit `print(1+1)` at <= 0.2x eryx's pooled one-shot. Both sides are
in-process library calls made back to back:
  - eryx (pyeryx 0.11.0): `SandboxFactory().create_pool()`, then per call `with pool.acquire() as s:
    s.execute(code)` (its pooled path), and, for reference, `factory.create_sandbox()` and one
    `execute` (a fresh sandbox per call);
  - wasmbox: `cargo bench --bench oneshot` in its p50 mode (`WASMBOX_BENCH_P50`, as
    benches/compare.py uses it): pool-hit one-shots through `Wasmbox::execute`.
The two sides alternate in rounds, so that this machine's drift meets both. Run with
benches/vs_eryx.sh (it makes the venv), or with a Python that has pyeryx, from the checkout:
  PYTHONPATH=benches python benches/vs_eryx.py [calls] [rounds]
"""

from __future__ import annotations

import sys
import time

from compare import library_p50, pct

CODE = "print(1+1)"


def eryx_p50s(calls: int) -> tuple[float, float]:
    """p50 (ms) of eryx's pooled one-shot and of a fresh sandbox's one-shot."""
    import eryx

    factory = eryx.SandboxFactory()
    pool = factory.create_pool(max_size=4, min_idle=4)
    try:
        for _ in range(20):
            with pool.acquire() as s:
                s.execute(CODE)
        pooled = []
        for _ in range(calls):
            t = time.perf_counter()
            with pool.acquire() as s:
                r = s.execute(CODE)
            pooled.append((time.perf_counter() - t) * 1e3)
            assert r.stdout_text.strip() == "2", r.stdout_text
    finally:
        pool.close()
    fresh = []
    for _ in range(max(calls // 10, 20)):
        t = time.perf_counter()
        r = factory.create_sandbox().execute(CODE)
        fresh.append((time.perf_counter() - t) * 1e3)
        assert r.stdout_text.strip() == "2", r.stdout_text
    return pct(pooled, 0.5), pct(fresh, 0.5)


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(f"{'round':<6} {'eryx pooled p50':>16} {'eryx fresh p50':>15} {'wasmbox p50':>12} {'ratio':>7}")
    ratios = []
    for r in range(rounds):
        pooled, fresh = eryx_p50s(calls)
        lib = library_p50(calls).get(CODE)
        if lib is None:
            return 1
        ours = lib["execute_p50_ms"]
        ratios.append(ours / pooled)
        print(f"{r:<6} {pooled:>13.3f} ms {fresh:>12.3f} ms {ours:>9.3f} ms {ours / pooled:>7.3f}")
    print(f"wasmbox pool-hit print(1+1) / eryx pooled one-shot: {min(ratios):.3f}-{max(ratios):.3f} (goal <= 0.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
