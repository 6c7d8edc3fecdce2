# Usage: python scripts/mcp_bundle.py path/to/unpacked/server/wasmbox EMPTY_HOME   (needs `pip install mcp`)
# Drives an unpacked MCP bundle's server as Claude Desktop would (official SDK, stdio), with a
# fresh HOME: the server must set itself up and then run Python and JavaScript.
import asyncio, json, os, sys, time
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
cmd, home = sys.argv[1], sys.argv[2]
# The user's runtimes folder, chosen even when the binary's build checkout has runtimes of its own.
os.makedirs(os.path.join(home, ".local/share/wasmbox/runtimes"), exist_ok=True)
stamps = os.path.join(home, ".local/share/wasmbox/runtimes/.verified.json")
if not os.path.exists(stamps):
    open(stamps, "w").write("{}")
def body(r):
    return r.structured_content or json.loads(r.content[0].text)
async def main():
    env = {"HOME": home, "PATH": "/usr/bin:/bin", "HOPX_API_KEY": "", "WASMBOX_DATA": "", "WASMBOX_MOUNTS": "", "WASMBOX_ALLOW_HOSTS": ""}
    t0 = time.time()
    async with stdio_client(StdioServerParameters(command=cmd, args=["serve"], env=env)) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            print(f"initialized in {time.time()-t0:.1f} s")
            first = await s.call_tool("execute_code", {"language": "python", "code": "print(1)"})
            print("first python call (runtimes may not be there yet):", first.is_error, str(body(first))[:400])
            for wait in (3, 10):
                await asyncio.sleep(wait)
                r = await s.call_tool("execute_code", {"language": "python", "code": "print(1)"})
                print(f"python call after {time.time()-t0:.1f} s:", r.is_error, str(body(r))[:400])
            for i in range(60):
                r = await s.call_tool("execute_code", {"language": "javascript", "code": "console.log(6*7)"})
                b = body(r)
                if not r.is_error and b.get("stdout") == "42\n":
                    print(f"javascript ok after {time.time()-t0:.1f} s")
                    break
                await asyncio.sleep(5)
            r = await s.call_tool("execute_code", {"language": "python", "code": "import pandas as pd; print(pd.__version__)", "timeout": 300})
            print(f"python after {time.time()-t0:.1f} s:", r.is_error, str(body(r))[:300])
asyncio.run(main())
