"""Waits and shares, checked with the official MCP Python SDK (a client we did not write) against
`wasmbox serve` over stdio: sleeping guests stop at their deadline, kill stops a sleeping job,
sleepers and spinning async runs leave room for a plain call.

Usage: python scripts/mcp_waits.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
SLEEPERS = {
    "python": "import time\ntime.sleep(60)",
    "javascript": "os.sleep(60000)",
    "go": 'package main\nimport "time"\nfunc main() { time.Sleep(60 * time.Second) }',
}


def result(r):
    return json.loads(r.content[0].text)


async def call(s, tool, **args):
    return result(await s.call_tool(tool, args))


async def timed(coro):
    t = time.monotonic()
    v = await coro
    return v, time.monotonic() - t


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        check.failed = True


check.failed = False


async def main():
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    env["WASMBOX_CONCURRENCY"] = "2"
    params = StdioServerParameters(command=BIN, args=["serve"], env=env)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        # Warm Go's build of the sleeper (the deadline covers the build).
        await call(s, "execute_code", code=SLEEPERS["go"].replace("60 *", "0 *"), language="go", timeout=120)
        for lang, code in SLEEPERS.items():
            v, dt = await timed(call(s, "execute_code", code=code, language=lang, timeout=2))
            check(v.get("limit") == "timeout" and dt < 3, f"{lang} sleep(60), timeout 2: {dt:.2f} s, {v.get('limit')}")

        # Eight sleepers on a server with 2 CPU slots, then a plain call.
        sleepers = [
            asyncio.create_task(timed(call(s, "execute_code", code=SLEEPERS["python"], language="python", timeout=2)))
            for _ in range(8)
        ]
        await asyncio.sleep(0.5)
        v, dt = await timed(call(s, "execute_code", code="print('alive')", language="python"))
        check(v.get("stdout") == "alive\n" and dt < 2, f"print('alive') beside 8 sleepers: {dt:.2f} s")
        done = await asyncio.gather(*sleepers)
        check(all(d[0].get("limit") == "timeout" and d[1] < 3.5 for d in done),
              "8 sleepers all stopped near their deadline: " + ", ".join(f"{d[1]:.1f}" for d in done))

        # Kill a sleeping background job.
        sb = (await call(s, "create_sandbox"))["id"]
        job = await call(s, "execute_code_background", sandbox_id=sb, code=SLEEPERS["python"], timeout=120)
        await asyncio.sleep(0.5)
        await call(s, "execute_kill_process", sandbox_id=sb, process_id=job["process_id"])
        t = time.monotonic()
        status = "running"
        while status == "running" and time.monotonic() - t < 5:
            procs = await call(s, "execute_list_processes", sandbox_id=sb)
            status = next(p["status"] for p in procs["processes"] if p["process_id"] == job["process_id"])
            await asyncio.sleep(0.05)
        check(status == "killed", f"killed sleeping job: {status} after {time.monotonic() - t:.2f} s")

        # Spinning async runs (no sandbox) cannot keep a plain call waiting.
        server = await asyncio.start_server(lambda r, w: w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
                                            "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
        answers = [await call(s, "execute_code_async", code="while True: pass", callback_url=url, timeout=20)
                   for _ in range(6)]
        print("     async answers: " + ", ".join(a.get("status", a.get("error", "?")) for a in answers))
        await asyncio.sleep(0.5)
        v, dt = await timed(call(s, "execute_code", code="print('alive')", language="python"))
        check(v.get("stdout") == "alive\n" and dt < 2, f"print('alive') beside spinning async runs: {dt:.2f} s")
        over = await call(s, "execute_code_async", code="print(1)", callback_url=url, timeout=1000)
        check("300" in json.dumps(over), "sandbox-less async with timeout 1000 refused: " + over.get("message", "")[:80])
        server.close()
    sys.exit(1 if check.failed else 0)


asyncio.run(main())
