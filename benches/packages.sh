#!/usr/bin/env bash
# install_packages of a package the store holds already (a wheelhouse wheel unpacked before: its
# bytes read and hashed, metadata read, nothing unpacked), over stdio MCP with the official
# Python SDK, against `health` in the same run as the floor of a tool call (issue #34's goal:
# <= 50 ms). Also the first import of an installed package against a bundled one.
# Usage: benches/packages.sh [path/to/wasmbox] [calls]   (needs `pip install mcp`)
set -euo pipefail
bin=${1:-target/release/wasmbox}
calls=${2:-50}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$bin" "$calls" "$dir" <<'PY'
import asyncio, base64, hashlib, json, os, statistics, sys, time, zipfile
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

bin, calls, house = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def wheel(name, version, requires, src):
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": src,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
             + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b.encode()).digest()).rstrip(b'=').decode()},{len(b)}\n"
                  for p, b in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(house, f"{name}-{version}-py3-none-any.whl"), "w") as z:
        for p, b in {**files, f"{info}/RECORD": rec}.items():
            z.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), b)

wheel("benchdep", "1.0", [], "X = 1\n")
wheel("benchpkg", "1.0", ["benchdep>=1", "six"], "import benchdep\n" + "".join(f"def f{i}(): return {i}\n" for i in range(1000)))

def body(r):
    return r.structured_content or json.loads(r.content[0].text)

async def main():
    env = {**os.environ, "WASMBOX_WHEELHOUSE": house, "WASMBOX_OFFLINE": "1", "WASMBOX_DATA": "none"}
    async with stdio_client(StdioServerParameters(command=bin, args=["serve"], env=env)) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            sb = body(await s.call_tool("create_sandbox", {}))["id"]
            first = body(await s.call_tool("install_packages", {"sandbox_id": sb, "packages": ["benchpkg"]}))
            assert first.get("success"), first
            inst, floor = [], []
            for _ in range(calls):
                t = time.perf_counter()
                await s.call_tool("health", {})
                floor.append(time.perf_counter() - t)
                t = time.perf_counter()
                res = await s.call_tool("install_packages", {"sandbox_id": sb, "packages": ["benchpkg"]})
                inst.append(time.perf_counter() - t)
                assert not res.is_error and all(p["cached"] for p in body(res)["installed"]), res
            ms = lambda v: statistics.median(v) * 1000
            print(f"install_packages, cached (2 packages): p50 {ms(inst):.2f} ms; health p50 {ms(floor):.2f} ms; {calls} calls")
            code = ("import time, sys\nt = time.perf_counter(); import {m}; a = time.perf_counter() - t\n"
                    "print(round(a * 1000, 2))")
            for m in ("benchpkg", "tabulate"):
                r = body(await s.call_tool("execute_code", {"language": "python", "code": code.format(m=m),
                                                            "packages": ["benchpkg"] if m == "benchpkg" else []}))
                print(f"first import of {m} in a one-shot: {r['stdout'].strip()} ms")

asyncio.run(main())
PY
