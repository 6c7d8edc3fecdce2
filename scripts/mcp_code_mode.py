"""Code mode (#33), checked with the official MCP Python SDK on both sides: a downstream server
made with the SDK's MCPServer (FastMCP in 1.x), started by `wasmbox serve` from an mcpServers
file, and the SDK's ClientSession driving wasmbox over stdio, with and without an elicitation
callback. Checks: list_code_tools; a read tool from Python and JavaScript with structured
results; a tool outside `allow` hidden; a destructive tool asked about and run, declined, and
refused for a client that cannot be asked.

Usage: python scripts/mcp_code_mode.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox")
FAILED = []

DOWNSTREAM = '''
import json, os, sys
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
server = MCPServer("inventory")
LOG = sys.argv[1]

@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def stock(item: str) -> dict:
    """How many of an item are in stock."""
    return {"item": item, "count": len(item) * 7}

@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def discard(item: str) -> str:
    """Throws an item away."""
    with open(LOG, "a") as f:
        f.write(item + "\\n")
    return "discarded " + item

@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def secret_count() -> int:
    """Not in allow."""
    return 1

server.run()
'''


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILED.append(what)


async def session(env, body, elicit=None):
    params = StdioServerParameters(command=BIN, args=["serve"], env={**os.environ, **env})
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, elicitation_callback=elicit) as s:
            await s.initialize()
            await body(s)


async def run(s, code, language="python"):
    r = await s.call_tool("execute_code", {"code": code, "language": language})
    return r.structured_content


async def main():
    tmp = tempfile.mkdtemp()
    server_py = os.path.join(tmp, "inventory.py")
    log = os.path.join(tmp, "discarded.txt")
    with open(server_py, "w") as f:
        f.write(DOWNSTREAM)
    cfg = os.path.join(tmp, "mcp.json")
    with open(cfg, "w") as f:
        json.dump({"mcpServers": {"inventory": {"command": sys.executable, "args": [server_py, log],
                                                "allow": ["stock", "discard"]}}}, f)
    env = {"WASMBOX_MCP_CONFIG": cfg, "WASMBOX_DATA": "none"}
    asked = []

    async def yes(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def no(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    async def consenting(s):
        listed = (await s.call_tool("list_code_tools", {})).structured_content
        sigs = [t["signature"] for t in listed["tools"]]
        check("inventory.stock(item: string)" in sigs and not any("secret_count" in x for x in sigs),
              f"list_code_tools: {sigs}")
        out = await run(s, "from wasmbox import tools\nr = tools.inventory.stock(item='apple')\nprint(r['count'], type(r).__name__)")
        check(out["stdout"] == "35 dict\n", f"a read tool from Python: {out['stdout']!r} {out['stderr'][-300:]!r}")
        out = await run(s, "const r = await tools.inventory.stock({item: 'kiwi'}); console.log(r.count)", "javascript")
        check(out["stdout"] == "28\n", f"a read tool from JavaScript: {out['stdout']!r} {out['stderr'][-300:]!r}")
        # The SDK wraps a str result as structuredContent {"result": ...}, which code gets as is.
        out = await run(s, "from wasmbox import tools\nprint(tools.inventory.discard(item='pear'))")
        check(out["stdout"] == "{'result': 'discarded pear'}\n" and len(asked) == 1 and "inventory.discard" in asked[0],
              f"a destructive tool asks first, then runs: {out['stdout']!r} {asked}")

    await session(env, consenting, yes)

    async def declining(s):
        out = await run(s, "from wasmbox import tools, ToolDenied\ntry:\n    tools.inventory.discard(item='plum')\nexcept ToolDenied as e:\n    print(e.kind)")
        check(out["stdout"] == "denied\n" and len(asked) == 2, f"declined: {out['stdout']!r}")

    await session(env, declining, no)

    async def unaskable(s):
        out = await run(s, "from wasmbox import tools, ToolError\ntry:\n    tools.inventory.discard(item='fig')\nexcept ToolError as e:\n    print(e.kind, e)")
        check(out["stdout"].startswith("denied") and "confirm" in out["stdout"], f"no elicitation: {out['stdout']!r}")

    await session(env, unaskable)
    with open(log) as f:
        got = f.read().split()
    check(got == ["pear"], f"only the consented call reached the server: {got}")
    print("FAILED: " + "; ".join(FAILED) if FAILED else "all ok")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
