"""Issue #31's attacks, made with the official MCP Python SDK (a client we did not write) against
`wasmbox serve` over stdio and streamable HTTP: each limit must hold and the server keep serving.

- copies: a background job swaps a file for a symlink to /proc/self/environ while the client
  forks in a loop; no child may hold the server's environment;
- disk by identity: rename onto itself and link/append/unlink loops under a 50 MiB quota, in a
  sandbox and in a one-shot;
- real cost: a sandbox of 500 empty directories snapshotted until refused under a 10 MiB
  snapshot quota; what the snapshots take on disk stays near the quota;
- answers: a forged missing-module line of 900,000 control characters fits the answer budget;
- fair shares: over HTTP, token A spins twice as many one-shots as there are CPU slots, and
  token B's plain one-shot still answers; token A starts spinning background jobs until refused,
  and token B's background job still runs to its end.

Usage: python scripts/mcp_limits.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
MB = 1 << 20
CANARY = "canary-" + secrets.token_hex(8)
failed = 0


def check(good, what, detail=""):
    global failed
    failed += not good
    print(("ok  " if good else "FAIL"), what, str(detail)[:300])


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    env["WASMBOX_TEST_HOST_SECRET"] = CANARY
    env.update(extra)
    return env


async def call(s, tool, **args):
    r = await s.call_tool(tool, args)
    return r, json.loads(r.content[0].text)


def held(path):
    """Apparent bytes and entries under `path`, every inode's bytes once."""
    seen, total, entries = set(), 0, 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            entries += 1
            st = os.lstat(os.path.join(root, name))
            if not os.path.isdir(os.path.join(root, name)) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total, entries


def blocks(path):
    """What `path` takes on disk: allocated blocks of every inode once."""
    seen, total = set(), 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


RENAME_SELF = (
    "import os\nos.chdir('/workspace')\n"
    "for i in range(20):\n"
    "    with open('a', 'ab') as f:\n"
    "        f.write(b'x' * (16 << 20))\n"
    "    os.rename('a', 'a')\n"
    "print('wrote 320 MiB')"
)
LINK_LOOP = (
    "import os\nos.chdir('/workspace')\nopen('a', 'wb').close()\n"
    "for i in range(20):\n"
    "    os.link('a', 'b')\n"
    "    with open('b', 'ab') as f:\n"
    "        f.write(b'x' * (16 << 20))\n"
    "    os.unlink('b')\n"
    "print('wrote 320 MiB')"
)
TOGGLE = (
    "import os, time\nos.chdir('/workspace/d')\n"
    "end = time.time() + {secs}\n"
    "while time.time() < end:\n"
    "    try:\n        os.remove('f')\n    except OSError:\n        pass\n"
    "    os.symlink('../' * 40 + 'proc/self/environ', 'f')\n"
    "    os.remove('f')\n"
    "    open('f', 'w').write('plain')\n"
)


async def stdio_checks():
    data = tempfile.mkdtemp(prefix="wasmbox-limits-")
    env = base_env(
        WASMBOX_DATA=data,
        WASMBOX_SANDBOX_DISK_MB="50",
        WASMBOX_ONESHOT_DISK_MB="50",
        WASMBOX_SNAPSHOT_DISK_MB="10",
    )
    params = StdioServerParameters(command=BIN, args=["serve"], env=env)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()

        # Disk accounting by identity.
        for name, code in (("rename onto itself", RENAME_SELF), ("link, append, unlink", LINK_LOOP)):
            _, sb = await call(s, "create_sandbox", template_id="code-interpreter")
            root = os.path.join(data, "sandboxes", sb["id"])
            _, v = await call(s, "execute_code", sandbox_id=sb["id"], code=code, timeout=60)
            got = held(os.path.join(root, "workspace"))[0] + held(os.path.join(root, "tmp"))[0]
            check(v.get("limit") == "disk" and got <= 55 * MB,
                  f"{name} under a 50 MiB quota: limit {v.get('limit')}, {got / MB:.1f} MiB held")
            _, v = await call(s, "execute_code", code=code, timeout=60)
            check(v.get("limit") == "disk", f"{name} in a one-shot under 50 MiB: limit {v.get('limit')}")
            await call(s, "delete_sandbox", id=sb["id"])

        # Answers within the budget.
        forged = "import sys\nsys.stderr.write(\"ModuleNotFoundError: No module named '\" + '\\x01' * 900000)\nraise SystemExit(1)"
        r, v = await call(s, "execute_code", code=forged)
        size = len(r.content[0].text)
        check(size <= 200_000, f"a forged 900,000-character module name: a {size:,}-byte text block")

        # Copies cannot be steered: a job swaps f for a link out while the client forks.
        _, sb = await call(s, "create_sandbox", template_id="code-interpreter")
        await call(s, "execute_code", sandbox_id=sb["id"], timeout=60,
                   code="import os\nos.makedirs('/workspace/d')\nfor i in range(3000):\n    open(f'/workspace/d/{i}', 'w').close()")
        await call(s, "execute_code", sandbox_id=sb["id"], mode="background", code=TOGGLE.format(secs=40), timeout=60)
        leaked, forks = 0, 0
        t = time.monotonic()
        while time.monotonic() - t < 30:
            r, fk = await call(s, "fork_sandbox", sandbox_id=sb["id"])
            if r.is_error:
                continue
            forks += 1
            child = os.path.join(data, "sandboxes", fk["id"], "workspace", "d", "f")
            try:
                with open(child, "rb") as f:
                    leaked += CANARY.encode() in f.read(1 << 20)
            except OSError:
                pass  # a link, or gone: nothing read
            await call(s, "delete_sandbox", id=fk["id"])
        check(forks > 0 and leaked == 0, f"{forks} forks while a job swaps f for a link out: {leaked} children hold the server's environment")
        await call(s, "delete_sandbox", id=sb["id"])

        # Snapshots are charged what they take.
        _, sb = await call(s, "create_sandbox", template_id="code-interpreter")
        await call(s, "execute_code", sandbox_id=sb["id"], timeout=60,
                   code="import os\nfor i in range(500):\n    os.mkdir(f'/workspace/d{i}')")
        taken = 0
        for _ in range(30):
            r, _ = await call(s, "snapshot_sandbox", sandbox_id=sb["id"])
            if r.is_error:
                break
            taken += 1
        on_disk = blocks(os.path.join(data, "snapshots")) if os.path.isdir(os.path.join(data, "snapshots")) else 0
        check(taken < 30 and on_disk <= 14 * MB,
              f"500 empty directories under a 10 MiB snapshot quota: {taken} snapshots, {on_disk / MB:.1f} MiB on disk")
        r, v = await call(s, "list_snapshots")
        check(not r.is_error and len(r.content[0].text) <= 200_000, f"list_snapshots: {len(r.content[0].text):,} bytes")

        _, v = await call(s, "execute_code", code="print('alive')")
        check(v.get("stdout") == "alive\n", "the server still serves")


async def http_checks():
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    a, b = "tok-a-" + secrets.token_hex(12), "tok-b-" + secrets.token_hex(12)
    proc = subprocess.Popen([BIN, "serve", "--http", "127.0.0.1:0"],
                            env=base_env(WASMBOX_TOKEN=f"{a},{b}", WASMBOX_DATA="none"),
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            if line.startswith("wasmbox: listening on "):
                url = line.split()[-1]
                break
        assert url, "the server did not start"

        async def session(token, work):
            async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as client:
                async with streamable_http_client(url, http_client=client) as (r, w, *_):
                    async with ClientSession(r, w) as s:
                        await s.initialize()
                        return await work(s)

        async def slots(s):
            _, m = await call(s, "get_system_metrics")
            return m

        total = (await session(a, slots))["cpu_slots"]["total"]

        async def spin(s):
            return await asyncio.gather(*(s.call_tool("execute_code", {"code": "while True: pass", "timeout": 20})
                                          for _ in range(2 * total)), return_exceptions=True)

        async def alive(s):
            await asyncio.sleep(2)
            t = time.monotonic()
            r, v = await call(s, "execute_code", code="print('alive')")
            return r.is_error, v, time.monotonic() - t

        spinner = asyncio.create_task(session(a, spin))
        is_error, v, took = await session(b, alive)
        check(not is_error and v.get("stdout") == "alive\n" and took < 8,
              f"token B's one-shot while token A spins {2 * total} one-shots: {took:.1f} s", v if is_error else "")
        spinner.cancel()

        async def spin_jobs(s):
            _, box = await call(s, "create_sandbox")
            started, refusal = 0, None
            while started < 64:
                r, v = await call(s, "execute_code_background", sandbox_id=box["id"],
                                  code="while True: pass", timeout=60)
                if r.is_error:
                    refusal = v
                    break
                started += 1
            return started, refusal

        async def job_alive(s):
            _, box = await call(s, "create_sandbox")
            r, job = await call(s, "execute_code_background", sandbox_id=box["id"],
                                code="print('alive')", timeout=60)
            if r.is_error:
                return job, None
            t = time.monotonic()
            while time.monotonic() - t < 20:
                _, lst = await call(s, "execute_list_processes", sandbox_id=box["id"])
                p = next(p for p in lst["processes"] if p["process_id"] == job["process_id"])
                if p["status"] != "running":
                    return p, time.monotonic() - t
                await asyncio.sleep(0.1)
            return p, None

        started, refusal = await session(a, spin_jobs)
        p, took = await session(b, job_alive)
        check(took is not None and p.get("stdout") == "alive\n",
              f"token B's background job while token A holds {started} spinning jobs "
              f"(then refused: {str(refusal)[:80]}): " + (f"{took:.1f} s" if took else "never ran"), p)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def main():
    await stdio_checks()
    await http_checks()
    return 1 if failed else 0


sys.exit(asyncio.run(main()))
