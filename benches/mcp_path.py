"""What the MCP path costs, in one run: the official MCP Python SDK (`mcp`) over stdio against
`wasmbox serve`, beside the same one-shot through the library.

Per round, each call once: `ping` (the client's and the transport's own floor), `health` (a tool
that does nothing), a Python one-shot `print(1+1)`, a persistent turn `x += 1`; first with 20 ms
between calls (an assistant's rhythm: the server has gone idle), then back to back. Then the
library's pool-hit p50 of the same one-shot (`cargo bench --bench oneshot` with
WASMBOX_BENCH_P50), and the overheads: a call's p50 less ping's p50 less the library's.
Run with benches/mcp_path.sh (it builds first); or directly:
  python benches/mcp_path.py path/to/wasmbox [rounds] [path/to/baseline-wasmbox]
With a baseline binary, both servers run at once and each call goes to one and then the other,
so the A/B ratios come from the same sitting. With `replay` as the baseline, the second server is
benches/replay_server.py in front of the same binary: wasmbox's own answers at no server cost,
so its calls over its ping are the client's own work for those answers.
"""

from __future__ import annotations

import asyncio
import contextlib
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


def library_p50(calls: int) -> dict[str, float] | None:
    """The pool-hit p50s (ms) of `print(1+1)` through `Wasmbox::execute`, from the oneshot bench:
    back to back, and after 20 ms idle (the rhythm's own floor: caches and CPUs gone cold)."""
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
            return {"back to back": d["execute_p50_ms"], "20 ms apart": d["execute_idle_p50_ms"]}
    return None


class Server:
    """One stdio session with a server, its calls by name."""

    def __init__(self, s: ClientSession, sb: str):
        self.s = s

        def unchecked(name: str, args: dict):
            """tools/call without the SDK's check of the result against the output schema."""
            req = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args))
            return s.send_request(req, s._call_tool_adapter)

        self.calls = {
            "ping": lambda: s.send_ping(),
            "health": lambda: s.call_tool("health", {}),
            "one-shot": lambda: s.call_tool("execute_code", {"code": "print(1+1)"}),
            "turn": lambda: s.call_tool("execute_code", {"code": "x += 1", "mode": "persistent", "sandbox_id": sb}),
            "health*": lambda: unchecked("health", {}),
            "one-shot*": lambda: unchecked("execute_code", {"code": "print(1+1)"}),
        }


async def open_server(stack: contextlib.AsyncExitStack, binary: str) -> Server:
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    if binary.startswith("replay:"):
        here = os.path.dirname(os.path.abspath(__file__))
        args = [os.path.join(here, "replay_server.py"), binary.removeprefix("replay:")]
        params = StdioServerParameters(command=sys.executable, args=args, env=env)
    else:
        params = StdioServerParameters(command=binary, args=["serve"], env=env)
    r, w = await stack.enter_async_context(stdio_client(params))
    s = await stack.enter_async_context(ClientSession(r, w))
    await s.initialize()
    sb = (await s.call_tool("create_sandbox", {})).structured_content["id"]
    await s.list_tools()
    await s.call_tool("execute_code", {"code": "x = 0", "mode": "persistent", "sandbox_id": sb})
    server = Server(s, sb)
    for _ in range(20):  # warm: runtimes loaded, pools full, the session live
        for f in server.calls.values():
            await f()
    return server


async def measure(binaries: list[str], rounds: int) -> list[dict[str, dict[str, list[float]]]]:
    async with contextlib.AsyncExitStack() as stack:
        servers = [await open_server(stack, b) for b in binaries]
        outs: list[dict[str, dict[str, list[float]]]] = [{} for _ in servers]
        for rhythm, gap in (("20 ms apart", 0.02), ("back to back", 0.0)):
            times = [{k: [] for k in CALLS} for _ in servers]
            # 20 ms apart, the servers take turns call by call. Back to back, a call would meet
            # the other server's work left over from its last call: they take turns by blocks.
            block = 1 if gap else 10
            for _ in range(0, rounds, block):
                for server, t_of in zip(servers, times):
                    for _ in range(block):
                        for name in CALLS:
                            if gap:
                                await asyncio.sleep(gap)
                            t = time.perf_counter()
                            r = await server.calls[name]()
                            t_of[name].append(time.perf_counter() - t)
                            if name in ("one-shot", "turn", "one-shot*"):
                                assert r.structured_content["exit_code"] == 0, r
            for out, t_of in zip(outs, times):
                out[rhythm] = t_of
        return outs


CALLS = ("ping", "health", "one-shot", "turn", "health*", "one-shot*")


def report(label: str, out: dict[str, dict[str, list[float]]], rounds: int, lib: dict[str, float] | None) -> None:
    print(f"{label}: {'call':<10} {'20 ms apart p50':>16} {'back to back p50':>17}  (official MCP SDK, stdio, {rounds} rounds)")
    for name in CALLS:
        print(f"{label}: {name:<10} {p50(out['20 ms apart'][name]):>13.3f} ms {p50(out['back to back'][name]):>14.3f} ms")
    if lib is not None:
        for rhythm in ("20 ms apart", "back to back"):
            t = out[rhythm]
            floor = p50(t["ping"]) + lib[rhythm]
            print(f"{label}: over ping + library, {rhythm}: one-shot {p50(t['one-shot']) - floor:+.3f} ms, "
                  f"turn {p50(t['turn']) - floor:+.3f} ms; health over ping {p50(t['health']) - p50(t['ping']):+.3f} ms")


def main() -> int:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    binaries = [binary] + [f"replay:{binary}" if b == "replay" else b for b in sys.argv[3:4]]
    outs = asyncio.run(measure(binaries, rounds))
    lib = library_p50(100)
    print("* without the SDK's own check of the result against the tool's output schema (client work)")
    if lib is not None:
        print(f"library: {lib['back to back']:.3f} ms back to back, {lib['20 ms apart']:.3f} ms after 20 ms idle "
              "(pool-hit print(1+1) through Wasmbox::execute)")
    labels = ["this"] if len(outs) == 1 else ["this", "replay" if binaries[1].startswith("replay:") else "base"]
    for label, out in zip(labels, outs):
        report(label, out, rounds, lib)
    if len(outs) == 2:
        for rhythm in ("20 ms apart", "back to back"):
            ratios = ", ".join(
                f"{n} {p50(outs[0][rhythm][n]) / p50(outs[1][rhythm][n]):.2f}" for n in CALLS
            )
            print(f"this/base p50, {rhythm}: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
