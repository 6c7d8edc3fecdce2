"""Lent folders (#34) with the official MCP Python SDK (a client we did not write) against
`wasmbox serve` over stdio: a CSV read by pandas at /data, an rw folder written by code and the
file tools up to its room, and the refusals (read-only, escapes, crossing renames, symlinks).

Usage: python scripts/mcp_mounts.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"


def body(r):
    return r.structured_content or json.loads(r.content[0].text)


async def main():
    data, out = tempfile.mkdtemp(), tempfile.mkdtemp()
    with open(os.path.join(data, "q.csv"), "w") as f:
        f.write("region,amount\nnorth,3\nsouth,4\n")
    os.symlink("/etc", os.path.join(data, "etc"))
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    env |= {"WASMBOX_MOUNTS": f"{data}:/data/sales,{out}:/mnt/out:rw", "WASMBOX_MOUNT_DISK_MB": "1"}
    params = StdioServerParameters(command=BIN, args=["serve"], env=env)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        health = body(await s.call_tool("health", {}))
        assert [m["path"] for m in health["mounts"]] == ["/data/sales", "/mnt/out"], health
        run = body(await s.call_tool("execute_code", {"language": "python", "code": """
import errno, os, shutil, pandas as pd
total = pd.read_csv('/data/sales/q.csv')['amount'].sum()
pd.DataFrame({'total': [total]}).to_csv('/mnt/out/total.csv', index=False)
tries = {}
for name, t in [('write ro', lambda: open('/data/sales/x', 'w')),
                ('escape', lambda: open('/data/sales/etc/passwd').read()),
                ('climb', lambda: open('/data/sales/../../etc/passwd').read()),
                ('cross', lambda: os.rename('/mnt/out/total.csv', '/workspace/t.csv')),
                ('symlink', lambda: os.symlink('/etc/passwd', '/mnt/out/l'))]:
    try:
        t(); tries[name] = 'did it'
    except OSError as e:
        tries[name] = errno.errorcode.get(e.errno, e.errno)
print(total, tries, flush=True)
try:
    open('/mnt/out/big', 'wb').write(b'z' * (2 << 20))
except OSError as e:
    print('big', e)
"""}))
        print("python:", run["stdout"].strip(), run.get("limit"))
        assert run["stdout"].startswith("7 "), run
        assert "did it" not in run["stdout"], run
        assert "EXDEV" in run["stdout"] and "EPERM" in run["stdout"], run
        assert run.get("limit") == "disk" and "lent folder /mnt/out is full" in json.dumps(run), run
        with open(os.path.join(out, "total.csv")) as f:
            assert f.read() == "total\n7\n"
        sb = body(await s.call_tool("create_sandbox", {}))["id"]
        ok = await s.call_tool("file_write", {"sandbox_id": sb, "path": "/mnt/out/n.txt", "content": "hi"})
        assert not ok.is_error, ok
        for tool, args in [("file_write", {"path": "/data/sales/n.txt", "content": "no"}),
                           ("file_read", {"path": "/data/sales/etc/passwd"}),
                           ("file_read", {"path": "/data/sales/../../etc/passwd"}),
                           ("file_write", {"path": "/mnt/out/big.txt", "content": "y" * 1_100_000})]:
            r = await s.call_tool(tool, {"sandbox_id": sb, **args})
            assert r.is_error, (tool, args, r)
            print("refused:", tool, args["path"], "->", r.content[0].text[:110])
        listing = body(await s.call_tool("file_list", {"sandbox_id": sb, "path": "/data"}))
        assert [f["path"] for f in listing["files"]] == ["/data/sales"], listing
        # The refused write created its file and wrote nothing into it.
        assert sorted(os.listdir(out)) == ["big", "n.txt", "total.csv"], os.listdir(out)
        assert os.path.getsize(os.path.join(out, "big")) == 0
    print("mounts: ok")


asyncio.run(main())
