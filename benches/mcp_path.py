"""What the MCP path costs, in one run: the official MCP Python SDK (`mcp`) over stdio against
`wasmbox serve`, beside the same one-shot through the library.

Per round, each call once: `ping` (the client's and the transport's own floor), `health` (a tool
that does nothing), a Python one-shot `print(1+1)`, a persistent turn `x += 1`; first with 20 ms
between calls (an assistant's rhythm: the server has gone idle), then back to back. Then the
library's pool-hit p50 of the same one-shot (`cargo bench --bench oneshot` with
WASMBOX_BENCH_P50), and the overheads: a call's p50 less ping's p50 less the library's.
Run with benches/mcp_path.sh (it builds first); or directly:
  python benches/mcp_path.py path/to/wasmbox [rounds]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client


def p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def library_p50(calls: int) -> float | None:
    """The pool-hit p50 (ms) of `print(1+1)` through `Wasmbox::execute`, from the oneshot bench."""
    try:
        out = subprocess.run(
            ["cargo", "bench", "-q", "--bench", "oneshot"],
            env={**os.environ, "WASMBOX_BENCH_P50": str(calls)},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"(library p50 skipped: cargo bench failed: {e})")
        return None
    for d in map(json.loads, out.splitlines()):
        if d["code"] == "print(1+1)":
            return d["execute_p50_ms"]
    return None


async def measure(binary: str, rounds: int) -> dict[str, dict[str, list[float]]]:
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    params = StdioServerParameters(command=binary, args=["serve"], env=env)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        sb = (await s.call_tool("create_sandbox", {})).structured_content["id"]
        def unchecked(name: str, args: dict):
            """tools/call without the SDK's check of the result against the output schema."""
            req = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args))
            return s.send_request(req, s._call_tool_adapter)

        await s.list_tools()
        calls = {
            "ping": lambda: s.send_ping(),
            "health": lambda: s.call_tool("health", {}),
            "one-shot": lambda: s.call_tool("execute_code", {"code": "print(1+1)"}),
            "turn": lambda: s.call_tool("execute_code", {"code": "x += 1", "mode": "persistent", "sandbox_id": sb}),
            "health*": lambda: unchecked("health", {}),
            "one-shot*": lambda: unchecked("execute_code", {"code": "print(1+1)"}),
        }
        await s.call_tool("execute_code", {"code": "x = 0", "mode": "persistent", "sandbox_id": sb})
        for _ in range(20):  # warm: runtimes loaded, pools full, the session live
            for f in calls.values():
                await f()
        out: dict[str, dict[str, list[float]]] = {}
        for rhythm, gap in (("20 ms apart", 0.02), ("back to back", 0.0)):
            times: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(rounds):
                for name, f in calls.items():
                    if gap:
                        await asyncio.sleep(gap)
                    t = time.perf_counter()
                    r = await f()
                    times[name].append(time.perf_counter() - t)
                    if name in ("one-shot", "turn", "one-shot*"):
                        assert r.structured_content["exit_code"] == 0, r
            out[rhythm] = times
        await s.call_tool("delete_sandbox", {"id": sb})
        return out


def main() -> int:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    out = asyncio.run(measure(binary, rounds))
    lib = library_p50(100)
    print(f"{'call':<10} {'20 ms apart p50':>16} {'back to back p50':>17}  (official MCP SDK, stdio, {rounds} rounds)")
    for name in ("ping", "health", "one-shot", "turn", "health*", "one-shot*"):
        print(f"{name:<10} {p50(out['20 ms apart'][name]):>13.3f} ms {p50(out['back to back'][name]):>14.3f} ms")
    if lib is not None:
        print("* without the SDK's own check of the result against the tool's output schema (client work)")
        print(f"{'library':<10} {lib:>13.3f} ms  (pool-hit print(1+1) through Wasmbox::execute)")
        for rhythm in ("20 ms apart", "back to back"):
            t = out[rhythm]
            floor = p50(t["ping"]) + lib
            print(f"over ping + library, {rhythm}: one-shot {p50(t['one-shot']) - floor:+.3f} ms, "
                  f"turn {p50(t['turn']) - floor:+.3f} ms; health over ping {p50(t['health']) - p50(t['ping']):+.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
