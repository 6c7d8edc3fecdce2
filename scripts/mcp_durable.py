"""Durable sessions as the official MCP Python SDK sees them (a client we did not write): a
DataFrame and a JavaScript global survive pause/resume and a server restart on the same data
directory; a fork sees the parent's variables and then diverges; a sandbox made from a snapshot
has the snapshot's state; a corrupted state file gives a note and a fresh session; a server
killed (SIGKILL) during a call leaves the session as of the turn before it, and the next server
says so. Every answer is validated by the SDK against the tool's output schema.

Usage: python scripts/mcp_durable.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import signal
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
failed = 0


def report(good, what, detail=""):
    global failed
    failed += not good
    print(("ok  " if good else "FAIL"), what, str(detail)[:200])


async def call(session, name, args):
    res = await session.call_tool(name, args)
    return res, json.loads(res.content[0].text)


async def run(session, sid, code, language="python"):
    _, obj = await call(
        session, "execute_code",
        {"sandbox_id": sid, "mode": "persistent", "code": code, "language": language},
    )
    return obj


def server_pid(data):
    """The pid of the server the SDK started on `data` (the SDK does not expose it)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"WASMBOX_DATA={data}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except OSError:
            pass
    raise RuntimeError("server not found")


def server(data):
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    env["WASMBOX_DATA"] = data
    return stdio_client(StdioServerParameters(command=BIN, args=["serve"], env=env))


async def main() -> int:
    data = tempfile.mkdtemp(prefix="wasmbox-durable-")
    async with server(data) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        _, sb = await call(s, "create_sandbox", {})
        sid = sb["id"]
        await run(s, sid, "import pandas as pd\ndf = pd.DataFrame({'a': range(10000)})\nx = 41")
        await run(s, sid, "var y = 'js kept'", "javascript")
        res, p = await call(s, "pause_sandbox", {"id": sid})
        report(not res.is_error and p["status"] == "paused", "pause", p.get("notes"))
        await call(s, "resume_sandbox", {"id": sid})
        o = await run(s, sid, "print(x + 1, len(df))")
        report(o["stdout"] == "42 10000\n", "resume keeps the DataFrame", o)

        _, fk = await call(s, "fork_sandbox", {"sandbox_id": sid})
        child = fk["id"]
        o = await run(s, child, "x = 'child'\nprint(len(df))")
        report(o["stdout"] == "10000\n", "the fork sees the DataFrame", o)
        o = await run(s, sid, "print(x)")
        report(o["stdout"] == "41\n", "the parent keeps its own x", o)

        # The resume and the fork left a spare instance made to the session's measure.
        spare = {}
        for _ in range(200):
            _, m = await call(s, "get_system_metrics", {})
            spare = next((p for p in m["pools"] if p["name"] == "python-spare"), {})
            if spare.get("ready") == 1:
                break
            await asyncio.sleep(0.05)
        _, fk2 = await call(s, "fork_sandbox", {"sandbox_id": sid})
        o = await run(s, fk2["id"], "print(x, len(df))")
        _, m = await call(s, "get_system_metrics", {})
        after = next((p for p in m["pools"] if p["name"] == "python-spare"), {})
        report(
            o["stdout"] == "41 10000\n" and after.get("hits", 0) == spare.get("hits", -1) + 1,
            "a fork into the spare instance sees the parent's state",
            (o, spare, after),
        )

        _, snap = await call(s, "snapshot_sandbox", {"sandbox_id": sid})
        report(snap["size_bytes"] > 0, "snapshot", snap)
        await run(s, sid, "x = 'later'")
        _, made = await call(s, "create_sandbox", {"from_snapshot": snap["snapshot_id"]})
        o = await run(s, made["id"], "print(x)")
        report(o["stdout"] == "41\n", "from_snapshot has the snapshot's state", o)
        _, lst = await call(s, "list_snapshots", {})
        report(lst["count"] == 1, "list_snapshots", lst)
        _, d = await call(s, "delete_snapshot", {"snapshot_id": snap["snapshot_id"]})
        report(d["deleted"] is True, "delete_snapshot", d)
        await run(s, sid, "x = 41")

    # The client went away: the server saved the sessions on its way out.
    async with server(data) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        o = await run(s, sid, "print(x + 1, len(df), int(df.a.sum()))")
        report(o["stdout"] == "42 10000 49995000\n", "a restart keeps the DataFrame", o)
        o = await run(s, sid, "console.log(y)", "javascript")
        report(o["stdout"] == "js kept\n", "a restart keeps the JavaScript global", o)
        await call(s, "pause_sandbox", {"id": sid})
        path = os.path.join(data, "sandboxes", sid, "state", "python.state")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
        await call(s, "resume_sandbox", {"id": sid})
        o = await run(s, sid, "print('x' in globals())")
        report(o["stdout"] == "False\n" and "corrupted" in json.dumps(o.get("notes")),
               "a corrupted state: a note and a fresh session", o.get("notes"))

    # Killed outright during a call: the session idled long enough to be saved
    # (WASMBOX_SAVE_IDLE_MS, 1 s), so the next server has the turn before the call.
    try:
        async with server(data) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await run(s, sid, "x = 'before the call'")
            await asyncio.sleep(2.5)
            busy = asyncio.create_task(run(s, sid, "x = 'cut off'\nimport time; time.sleep(30)"))
            await asyncio.sleep(1)
            os.kill(server_pid(data), signal.SIGKILL)
            try:
                await asyncio.wait_for(busy, 10)
            except BaseException:
                pass
    except BaseException:
        pass  # the transport breaks with the server: expected here
    async with server(data) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        o = await run(s, sid, "print(x)")
        report(o["stdout"] == "before the call\n"
               and "without shutting down cleanly" in json.dumps(o.get("notes")),
               "SIGKILL mid-call: the turn before it, and a note", o)

    print("passed" if not failed else f"{failed} failed")
    return 1 if failed else 0


sys.exit(asyncio.run(main()))
