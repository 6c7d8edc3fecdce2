"""Pure-Python packages with the official MCP Python SDK (a client we did not write) against
`wasmbox serve` over stdio, offline from a wheelhouse built here: install_packages resolves a
dependency by its version and marker and skips a bundled one, the live session imports the
package at once, the store is read-only, a compiled wheel and an unknown name are refused, and a
one-shot takes `packages`.

Usage: python scripts/mcp_packages.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import base64
import hashlib
import json
import os
import sys
import tempfile
import zipfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"

TINYPKG = "def hello():\n    import tinydep\n    return 'hi ' + tinydep.X\n"


def body(r):
    return r.structured_content or json.loads(r.content[0].text)


def wheel(folder, name, version, tag, requires, module_src):
    """A real wheel: the module, METADATA, WHEEL and a RECORD with each file's hash."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    purelib = "true" if tag.endswith("-none-any") else "false"
    files = {
        f"{dist}/__init__.py": module_src,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n",
    }
    record = ""
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(text.encode())}\n"
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    path = os.path.join(folder, f"{dist}-{version}-{tag}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name_in_zip, text in files.items():
            z.writestr(name_in_zip, text)
    return path


async def main():
    house = tempfile.mkdtemp()
    wheel(house, "tinypkg", "1.0", "py3-none-any",
          ["tinydep>=0.2", 'neverdep; sys_platform == "win32"', "six"], TINYPKG)
    wheel(house, "tinydep", "0.1", "py3-none-any", [], "X = 'from 0.1'\n")
    wheel(house, "tinydep", "0.2", "py2.py3-none-any", [], "X = 'from 0.2'\n")
    wheel(house, "fastc", "1.0", "cp315-cp315-wasi_0_0_0_wasm32", [], "X = 1\n")
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    env |= {"WASMBOX_WHEELHOUSE": house, "WASMBOX_OFFLINE": "1", "WASMBOX_DATA": "none"}
    params = StdioServerParameters(command=BIN, args=["serve"], env=env)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        tools = {t.name for t in (await s.list_tools()).tools}
        assert "install_packages" in tools, sorted(tools)
        sb = body(await s.call_tool("create_sandbox", {}))["id"]

        async def py(code):
            return body(await s.call_tool("execute_code", {
                "sandbox_id": sb, "mode": "persistent", "language": "python", "code": code}))

        before = await py("import tinypkg")
        assert "ModuleNotFoundError" in before["stderr"], before

        res = await s.call_tool("install_packages", {"sandbox_id": sb, "packages": ["tinypkg"]})
        assert not res.is_error, res
        got = body(res)
        print("installed:", [(p["name"], p["version"], p["source"]) for p in got["installed"]])
        assert {(p["name"], p["version"]) for p in got["installed"]} == {("tinypkg", "1.0"), ("tinydep", "0.2")}, got
        assert all(p["source"] == "wheelhouse" for p in got["installed"]), got
        for p in got["installed"]:
            with open(os.path.join(house, p["wheel"]), "rb") as f:
                assert p["sha256"] == hashlib.sha256(f.read()).hexdigest(), p
        assert "six" in {b["name"].lower() for b in got["bundled"]}, got

        after = await py("import tinypkg\nprint(tinypkg.hello())")
        assert after["stdout"] == "hi from 0.2\n", after
        write = await py("import tinypkg\ntry:\n    open(tinypkg.__file__, 'a')\n    print('wrote')\n"
                         "except OSError:\n    print('read-only')")
        assert write["stdout"] == "read-only\n", write

        for packages, words in [(["fastc"], ["compiled", "HOPX"]), (["nosuchpkg"], ["not found"])]:
            res = await s.call_tool("install_packages", {"sandbox_id": sb, "packages": packages})
            text = res.content[0].text
            assert res.is_error and all(word in text for word in words), (packages, res)
            print("refused:", packages[0], "->", text[:120])

        one = body(await s.call_tool("execute_code", {
            "language": "python", "code": "import tinypkg\nprint(tinypkg.hello())", "packages": ["tinypkg"]}))
        assert one["stdout"] == "hi from 0.2\n", one
    print("ok")


asyncio.run(main())
