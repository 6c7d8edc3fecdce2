"""Smoke test with the official MCP Python SDK (a client we did not write) against `wasmbox serve`,
over stdio or (with --http) over streamable HTTP with a bearer token.

Usage: python scripts/mcp_smoke.py [--http] [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HTTP = "--http" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--http"]
BIN = ARGS[0] if ARGS else "target/release/wasmbox"


@contextlib.asynccontextmanager
async def connect():
    # The SDK starts servers with a minimal environment; pass wasmbox's own settings through.
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    if not HTTP:
        async with stdio_client(StdioServerParameters(command=BIN, args=["serve"], env=env)) as (r, w):
            yield r, w
        return
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    token = "smoke-" + secrets.token_hex(16)
    proc = subprocess.Popen([BIN, "serve", "--http", "127.0.0.1:0"], env={**env, "WASMBOX_TOKEN": token},
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            if line.startswith("wasmbox: listening on "):
                url = line.split()[-1]
                break
        assert url, "the server did not start"
        print("http:", url)
        # Without the token the server answers 401.
        async with create_mcp_http_client() as plain:
            r = await plain.post(url, json={})
            print("ok  " if r.status_code == 401 else "FAIL", "no token ->", r.status_code)
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as client:
            async with streamable_http_client(url, http_client=client) as streams:
                yield streams[0], streams[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def main() -> int:
    async with connect() as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            print("server:", init.server_info.name, init.server_info.version)
            tools = await session.list_tools()
            print("tools:", ", ".join(t.name for t in tools.tools))
            checks = [
                ("execute_code", {"code": "print(6*7)"}, lambda r: r["stdout"] == "42\n" and r["exit_code"] == 0),
                ("execute_code_isolated", {"code": "import pandas as pd; print(pd.__version__)"}, lambda r: r["exit_code"] == 0),
                ("execute_code", {"code": "console.log([1,2].map(x => x * 21))", "language": "javascript"},
                 lambda r: r["stdout"] == "[ 21, 42 ]\n"),
                ("execute_code", {"code": "while True: pass", "timeout": 1}, lambda r: r["limit"] == "timeout"),
                ("execute_code", {"code": 'package main\nimport "fmt"\nfunc main() { fmt.Println(6 * 7) }', "language": "go"},
                 lambda r: r["stdout"] == "42\n"),
                ("get_system_metrics", {}, lambda r: len(r["pools"]) >= 1),
                ("health", {}, lambda r: r["status"] == "ok"),
                ("list_templates", {}, lambda r: r["count"] >= 1),
            ]
            failed = 0
            for name, args, ok in checks:
                res = await session.call_tool(name, args)
                obj = json.loads(res.content[0].text)
                good = not res.is_error and ok(obj) and res.structured_content == obj
                failed += not good
                print(("ok  " if good else "FAIL"), name, json.dumps(args)[:60], "->", json.dumps(obj)[:160])
            # JavaScript instances start from one snapshot, yet each draws its own numbers.
            draws = []
            for _ in range(2):
                res = await session.call_tool("execute_code", {"code": "console.log(Math.random())", "language": "js"})
                draws.append(json.loads(res.content[0].text)["stdout"])
            good = draws[0] != draws[1]
            failed += not good
            print(("ok  " if good else "FAIL"), "two JS one-shots, Math.random ->", [d.strip() for d in draws])
            # A persistent sandbox, as an assistant uses one.
            created = json.loads((await session.call_tool("create_sandbox", {"template_id": "code-interpreter"})).content[0].text)
            sid = created["id"]
            print("ok  " if sid else "FAIL", "create_sandbox ->", sid)
            flow = [
                ("execute_code", {"mode": "persistent", "sandbox_id": sid, "code": "x = 41"}, lambda r: r["exit_code"] == 0),
                ("execute_code", {"mode": "persistent", "sandbox_id": sid, "code": "print(x + 1)"}, lambda r: r["stdout"] == "42\n"),
                ("file_write", {"sandbox_id": sid, "path": "d.csv", "content": "a\n1\n2\n"}, lambda r: r["size"] == 6),
                ("execute_code", {"mode": "persistent", "sandbox_id": sid, "code": "import pandas as pd; int(pd.read_csv('d.csv').a.sum())"},
                 lambda r: r["stdout"] == "3\n"),
                ("env_set", {"sandbox_id": sid, "env_vars": {"WHO": "sdk"}}, lambda r: r["status"] == "success"),
                ("execute_code", {"mode": "persistent", "sandbox_id": sid, "language": "javascript", "code": "process.env.WHO"},
                 lambda r: r["stdout"] == "'sdk'\n"),
                ("run_command", {"sandbox_id": sid, "command": "python -c 'print(2 + 2)'"}, lambda r: r["stdout"] == "4\n"),
                ("file_list", {"sandbox_id": sid}, lambda r: r["count"] == 1),
                ("file_read", {"sandbox_id": sid, "path": "../etc/passwd"}, lambda r: r["error"] == "Path not allowed"),
            ]
            for name, args, ok in flow:
                res = await session.call_tool(name, args)
                obj = json.loads(res.content[0].text)
                good = ok(obj)
                failed += not good
                print(("ok  " if good else "FAIL"), name, json.dumps(args)[:60], "->", json.dumps(obj)[:120])
            rich = await session.call_tool("execute_code", {"mode": "rich", "sandbox_id": sid,
                                                            "code": "import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()"})
            images = [c for c in rich.content if c.type == "image"]
            good = len(images) == 1 and images[0].mime_type == "image/png"
            failed += not good
            print(("ok  " if good else "FAIL"), "rich plot -> image blocks:", len(images))
            await session.call_tool("delete_sandbox", {"id": sid})
            gone = await session.call_tool("execute_code", {"mode": "persistent", "sandbox_id": sid, "code": "1"})
            good = gone.is_error and "Sandbox not found" in gone.content[0].text
            failed += not good
            print(("ok  " if good else "FAIL"), "deleted sandbox ->", gone.content[0].text.splitlines()[1:2])
            bad = await session.call_tool("execute_code", {"code": "1", "language": "cobol"})
            print(("ok  " if bad.is_error else "FAIL"), "unknown language ->", bad.content[0].text.splitlines()[1:3])
            failed += not bad.is_error
    print("passed" if not failed else f"{failed} failed")
    return 1 if failed else 0


sys.exit(asyncio.run(main()))
