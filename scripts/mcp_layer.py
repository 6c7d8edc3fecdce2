"""The MCP layer as the official MCP Python SDK sees it (a client we did not write): titles,
annotations and output schemas in tools/list, every tool's answer validated by the SDK against
its output schema, arguments as strings, HOPX's prompt, and the protocol version.

Usage: python scripts/mcp_layer.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
failed = 0


def report(good, what, detail=""):
    global failed
    failed += not good
    print(("ok  " if good else "FAIL"), what, str(detail)[:160])


async def call(session, name, args):
    """A tool call; the SDK validates structuredContent against the tool's outputSchema."""
    try:
        res = await session.call_tool(name, args)
    except Exception as e:  # the SDK's validation error
        report(False, name, f"{type(e).__name__}: {e}")
        return None, None
    obj = json.loads(res.content[0].text)
    return res, obj


async def main() -> int:
    env = {k: v for k, v in os.environ.items() if k.startswith("WASMBOX_") or k in ("HOME", "PATH")}
    params = StdioServerParameters(command=BIN, args=["serve"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            report(True, "protocol version", init.protocol_version)
            tools = (await session.list_tools()).tools
            untitled = [t.name for t in tools if not t.title]
            report(not untitled, f"{len(tools)} tools, all titled", untitled)
            bare = [t.name for t in tools if t.annotations is None]
            report(not bare, "all annotated", bare)
            typed = [t.name for t in tools if t.output_schema]
            report(len(typed) == len(tools) - 2, f"{len(typed)} with output schemas")
            by = {t.name: t for t in tools}
            report(by["file_read"].annotations.read_only_hint is True, "file_read is read-only")
            langs = by["execute_code"].input_schema["properties"]["language"].get("enum", [])
            report("javascript" in langs and "js" in langs, "language enum", langs)

            sid = None
            plan = [
                ("execute_code", {"code": "print(6 * 7)"}, lambda r: r["stdout"] == "42\n"),
                ("execute_code_isolated", {"code": "console.log(1)", "language": "js"}, lambda r: r["exit_code"] == 0),
                ("create_sandbox", {}, lambda r: r["id"]),
            ]
            for name, args, ok in plan:
                res, obj = await call(session, name, args)
                if obj is not None:
                    report(not res.is_error and ok(obj), name, obj)
                    if name == "create_sandbox":
                        sid = obj["id"]
            s = lambda **kw: {"sandbox_id": sid, **kw}
            flow = [
                ("execute_code_persistent", s(code="x = 41")),
                ("execute_code", s(code="x + 1", mode="persistent")),
                ("execute_code_rich", s(code="x")),
                ("execute_code_background", s(code="import time; time.sleep(30)")),
                ("execute_list_processes", s()),
                ("list_processes", s()),
                ("run_command", s(command="python -c 'print(1)'")),
                ("run_command_background", s(command="python -c 'print(1)'")),
                ("execute_code_async", s(code="1", callback_url="http://127.0.0.1:9/cb")),
                ("file_write", s(path="a.txt", content="hi")),
                ("file_upload", s(path="b.bin", content_base64="AAE=")),
                ("file_read", s(path="a.txt")),
                ("file_download", s(path="b.bin")),
                ("file_list", s()),
                ("file_exists", s(path="a.txt")),
                ("file_mkdir", s(path="d")),
                ("file_remove", s(path="d")),
                ("env_set", s(env_vars={"K": "v"})),
                ("env_get", s()),
                ("env_clear", s()),
                ("ping_vm", s()),
                ("get_vm_info", s()),
                ("get_system_metrics", s()),
                ("list_sandboxes", {}),
                ("get_sandbox", {"id": sid}),
                ("update_sandbox_timeout", {"id": sid, "timeout_seconds": 120}),
                ("pause_sandbox", {"id": sid}),
                ("resume_sandbox", {"id": sid}),
                ("health", {}),
                ("cache_stats", {}),
                ("cache_clear", {}),
                ("list_templates", {}),
                ("get_template", {"name": "code-interpreter"}),
                ("fork_sandbox", s()),
                ("snapshot_sandbox", s()),
                ("list_snapshots", {}),
                ("delete_sandbox", {"id": sid}),
            ]
            for name, args in flow:
                res, obj = await call(session, name, args)
                if obj is not None:
                    report(not res.is_error, name, obj)

            # As the Inspector CLI sends them: every value a string.
            res, obj = await call(session, "execute_code", {"code": "7 * 6", "timeout": "2", "echo": "true"})
            report(obj is not None and obj.get("stdout") == "42\n", "string arguments", obj)
            res, obj = await call(session, "execute_code", {"code": "1", "language": "cobol"})
            report(res is not None and res.is_error, "unknown language is a tool error", obj)
            res, obj = await call(session, "no_such_tool", {})
            report(res is not None and res.is_error, "unknown tool is a tool error", obj)

            prompts = (await session.list_prompts()).prompts
            report([p.name for p in prompts] == ["quick_code_execution"], "prompts", [p.name for p in prompts])
            p = await session.get_prompt("quick_code_execution")
            report("execute_code" in p.messages[0].content.text, "prompt text", p.messages[0].content.text[:80])
    print("passed" if not failed else f"{failed} failed")
    return 1 if failed else 0


sys.exit(asyncio.run(main()))
