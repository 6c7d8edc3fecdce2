"""Host bounds, checked with the official MCP Python SDK (a client we did not write) against
`wasmbox serve` over stdio: disk limits hold on the write path (sandbox /workspace and /tmp, a
one-shot's scratch dirs, sparse files, unlinked open files), a sparse 1 TiB file is read in a
window, rich output forged by guest code stays bounded, and the server keeps serving.

Usage: python scripts/mcp_bounds.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
MB = 1 << 20


def result(r):
    return json.loads(r.content[0].text)


async def call(s, tool, **args):
    return result(await s.call_tool(tool, args))


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        check.failed = True


check.failed = False


def held(sandbox_root):
    """Apparent bytes under a sandbox's host /workspace and /tmp."""
    total = 0
    for d in ("workspace", "tmp"):
        total += walked(os.path.join(sandbox_root, d))
    return total


def walked(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


WRITE_200MB = "f = open({path!r}, 'wb')\nfor i in range(200):\n    f.write(b'x' * (1 << 20))\n    f.flush()\nprint('wrote it all')"


async def main():
    data = tempfile.mkdtemp(prefix="wasmbox-bounds-")
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    env.update(WASMBOX_DATA=data, WASMBOX_SANDBOX_DISK_MB="50", WASMBOX_ONESHOT_DISK_MB="20")
    params = StdioServerParameters(command=BIN, args=["serve"], env=env)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        sb = (await call(s, "create_sandbox", template_id="code-interpreter"))["id"]
        root = os.path.join(data, "sandboxes", sb)

        for where in ("/tmp/big", "/workspace/big"):
            t = time.monotonic()
            v = await call(s, "execute_code", sandbox_id=sb, code=WRITE_200MB.format(path=where), timeout=60)
            on_disk = held(root)
            check(
                v.get("limit") == "disk" and on_disk <= 55 * MB,
                f"200 MB to {where} under a 50 MB quota: limit {v.get('limit')}, {on_disk / MB:.1f} MB on disk, {time.monotonic() - t:.2f} s",
            )
            await call(s, "execute_code", sandbox_id=sb, code=f"import os\nos.remove({where!r})")

        v = await call(s, "execute_code", sandbox_id=sb, code="open('/workspace/sparse', 'wb').truncate(1 << 40)")
        check(v.get("limit") == "disk" and held(root) <= 55 * MB, f"truncate(1 << 40): limit {v.get('limit')}")

        code = "import os\nf = open('/tmp/gone', 'wb')\nos.unlink('/tmp/gone')\nfor i in range(200):\n    f.write(b'x' * (1 << 20))\n    f.flush()"
        v = await call(s, "execute_code", sandbox_id=sb, code=code, timeout=60)
        check(v.get("limit") == "disk", f"200 MB to an unlinked open file: limit {v.get('limit')}")

        v = await call(s, "execute_code", code=WRITE_200MB.format(path="/tmp/big"), timeout=60)
        check(v.get("limit") == "disk", f"one-shot writes 200 MB under WASMBOX_ONESHOT_DISK_MB=20: limit {v.get('limit')}")

        for lang, code in {
            "javascript": "const f = std.open('/workspace/js', 'w'); const b = new ArrayBuffer(1 << 20);\nfor (let i = 0; i < 200; i++) { f.write(b, 0, b.byteLength); f.flush(); }",
            "go": 'package main\nimport "os"\nfunc main() {\n f, _ := os.Create("/workspace/go")\n b := make([]byte, 1<<20)\n for i := 0; i < 200; i++ { if _, err := f.Write(b); err != nil { panic(err) } }\n}',
        }.items():
            v = await call(s, "execute_code", sandbox_id=sb, code=code, language=lang, timeout=120)
            on_disk = held(root)
            check(v.get("limit") == "disk" and on_disk <= 55 * MB, f"{lang} writes 200 MB: limit {v.get('limit')}, {on_disk / MB:.1f} MB on disk")
            await call(s, "execute_code", sandbox_id=sb, code="import os\nfor f in os.listdir('/workspace'): os.remove('/workspace/' + f)")

        # Eight concurrent 10 MB file_write calls against 50 MB: at most five pass.
        body = "y" * (10 * MB)
        rs = await asyncio.gather(*(s.call_tool("file_write", {"sandbox_id": sb, "path": f"w{i}", "content": body}) for i in range(8)))
        passed = sum(1 for x in rs if not x.is_error)
        check(passed <= 5 and held(root) <= 50 * MB, f"8 concurrent 10 MB file_write under 50 MB: {passed} passed, {held(root) / MB:.1f} MB")

        # A sparse 1 TiB file (made on the host) read by the file tools: a window.
        await call(s, "execute_code", sandbox_id=sb, code="import os\nfor f in os.listdir('/workspace'): os.remove('/workspace/' + f)")
        with open(os.path.join(root, "workspace", "sparse"), "wb") as f:
            f.truncate(1 << 40)
        t = time.monotonic()
        v = await call(s, "file_read", sandbox_id=sb, path="/workspace/sparse")
        check(
            v.get("size_bytes") == 1 << 40 and v.get("truncated") is True and len(json.dumps(v)) < 100_000,
            f"file_read of a sparse 1 TiB file: a window of {len(v.get('content', ''))} characters, {time.monotonic() - t:.2f} s",
        )
        v = await call(s, "file_download", sandbox_id=sb, path="/workspace/sparse")
        check(v.get("truncated") is True and len(json.dumps(v)) < 8 * MB, f"file_download of it: {len(json.dumps(v)) / MB:.1f} MB answer")

        # Errors name guest paths, never the data directory or the temp directory.
        texts = []
        for tool, args in [
            ("file_read", {"path": "/workspace/missing"}),
            ("file_read", {"path": "/workspace"}),
            ("run_command", {"command": "python /workspace/missing.py"}),
        ]:
            r = await s.call_tool(tool, {"sandbox_id": sb, **args})
            texts.append(r.content[0].text)
        leaked = [t for t in texts if data in t or tempfile.gettempdir() + "/wasmbox" in t]
        check(not leaked, f"no host path in {len(texts)} errors")

        # Guest code replaces the rich hook and prints 300,000 outputs: the reply stays bounded.
        flood = (
            "import _wasmbox, json\n"
            "def flood(*a):\n"
            "    print(json.dumps({'outputs': [{'type': 'image/png', 'data': 'iVBORw0KGgo='}] * 300000, 'notes': ['n' * 10000] * 1000}))\n"
            "_wasmbox.rich = flood"
        )
        await call(s, "execute_code", sandbox_id=sb, code=flood)
        t = time.monotonic()
        r = await s.call_tool("execute_code", {"sandbox_id": sb, "mode": "rich", "code": "print('cell')"})
        check(len(r.content) <= 20 and time.monotonic() - t < 10, f"a forged rich flood: {len(r.content)} content blocks, {time.monotonic() - t:.2f} s")

        v = await call(s, "execute_code", code="print(1)")
        check(v.get("stdout") == "1\n", "the server still serves")

    # A corrupt meta.json at the next start is quarantined, listed to the local user, deletable.
    with open(os.path.join(data, "sandboxes", sb, "meta.json"), "w") as f:
        f.write('{"id": "torn')
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        v = await call(s, "list_sandboxes")
        q = [x for x in v.get("data", []) if x.get("status") == "quarantined"]
        check(len(q) == 1, f"a corrupt meta.json is quarantined and listed: {[x.get('reason') for x in q]}")
        if q:
            r = await s.call_tool("delete_sandbox", {"id": q[0]["sandbox_id"]})
            v = await call(s, "list_sandboxes")
            check(not r.is_error and not any(x.get("status") == "quarantined" for x in v.get("data", [])), "delete_sandbox removes it")
    if check.failed:
        sys.exit(1)


asyncio.run(main())
