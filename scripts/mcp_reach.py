"""Guest HTTP to allowed hosts (#33), checked with the official MCP Python SDK (a client we did
not write) against `wasmbox serve` over stdio, and a plain Python HTTP server on 127.0.0.1 as
the host the guests reach: allowed GET and POST from Python and JavaScript, a host off the list,
a loopback address without WASMBOX_ALLOW_PRIVATE_HOSTS, an allow_hosts wider than the server's,
a slow answer past the deadline, a sandbox's allow_hosts, a secret lent with WASMBOX_SECRETS.

Usage: python scripts/mcp_reach.py [path/to/wasmbox]   (needs `pip install mcp`)
"""

import asyncio
import http.server
import json
import os
import sys
import threading
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/wasmbox"
FAILED = []
SEEN = []
SECRET = "s3cr3t-for-the-check"


class Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(20)
        body = b"a,b\n1,2\n3,4\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/csv")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        # Echoes the Authorization header it got (a secret's host that gives it back).
        SEEN.append(self.headers.get("Authorization", ""))
        body = self.headers.get("Authorization", "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = json.dumps({"got": self.rfile.read(n).decode()}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILED.append(what)


async def session(env, body):
    params = StdioServerParameters(command=BIN, args=["serve"], env={**os.environ, **env})
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await body(s)


async def run(s, code, language="python", **extra):
    r = await s.call_tool("execute_code", {"code": code, "language": language, **extra})
    return r


async def main():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    base = f"http://127.0.0.1:{port}"

    async def allowed(s):
        r = await run(s, f"import pandas as pd, urllib.request, json\nprint(pd.read_csv('{base}/d.csv').b.sum())\n"
                         f"print(json.loads(urllib.request.urlopen('{base}/p', data=b'x=1').read()))")
        out = r.structured_content
        check(not r.is_error and out["stdout"] == "6\n{'got': 'x=1'}\n", f"python GET and POST: {out}")
        r = await run(s, f"const r = await fetch('{base}/d.csv'); console.log(r.status, (await r.text()).length)\n"
                         f"const p = await fetch('{base}/p', {{method: 'POST', body: 'y'}}); console.log(p.status, JSON.stringify(await p.json()))",
                      language="javascript")
        out = r.structured_content
        check(not r.is_error and out["stdout"] == '200 12\n201 {"got":"y"}\n', f"javascript fetch GET and POST: {out}")
        r = await run(s, "import urllib.request\ntry:\n    urllib.request.urlopen('https://example.com/')\nexcept OSError as e:\n    print(type(e).__name__, e)")
        out = r.structured_content["stdout"]
        check(out.startswith("ConnectionRefusedError example.com:443 is not an allowed host") and "WASMBOX_ALLOW_HOSTS" in out,
              f"host off the list refused: {out!r}")
        r = await run(s, "print(1)", allow_hosts=["example.com"])
        check(r.is_error and "allow_hosts may only narrow" in r.content[0].text, "a wider allow_hosts refused")
        t = time.monotonic()
        r = await run(s, f"import urllib.request\nurllib.request.urlopen('{base}/slow')", timeout=2)
        out = r.structured_content
        check(out["exit_code"] == 124 and out["limit"] == "timeout" and time.monotonic() - t < 6,
              f"a slow answer stops at the deadline: {out['exit_code']} {out['limit']}")

        sb = await s.call_tool("create_sandbox", {"allow_hosts": [f"127.0.0.1:{port}"]})
        sid = sb.structured_content["id"]
        info = (await s.call_tool("get_sandbox", {"id": sid})).structured_content
        check(info.get("allow_hosts") == [f"127.0.0.1:{port}"], f"get_sandbox lists allow_hosts: {info.get('allow_hosts')}")
        r = await run(s, f"import urllib.request\nprint(urllib.request.urlopen('{base}/d.csv').status)", mode="persistent", sandbox_id=sid)
        check(r.structured_content["stdout"] == "200\n", f"a sandbox run reaches its host: {r.structured_content['stdout']!r}")
        r = await s.call_tool("create_sandbox", {"allow_hosts": ["example.com"]})
        check(r.is_error, "a sandbox wider than the server refused")
        code = ("import os, urllib.request\nt = os.environ['TOKEN']\n"
                f"r = urllib.request.urlopen(urllib.request.Request('{base}/s', method='PUT', headers={{'Authorization': t}}))\n"
                "print(t.startswith('WASMBOX_SECRET_TOKEN_'), r.read().decode() == t)")
        r = await run(s, code)
        out = r.structured_content
        check(out["stdout"] == "True True\n" and SECRET not in json.dumps(out) and SEEN[-1:] == [SECRET],
              f"a secret reaches its host only as its value, the guest only as a placeholder: {out['stdout']!r} {SEEN}")

    await session({"WASMBOX_ALLOW_HOSTS": f"127.0.0.1:{port}", "WASMBOX_ALLOW_PRIVATE_HOSTS": "1",
                   "WASMBOX_SECRETS": f"TOKEN@127.0.0.1:{port}", "TOKEN": SECRET}, allowed)

    async def private(s):
        r = await run(s, f"import urllib.request\ntry:\n    urllib.request.urlopen('http://localhost:{port}/d.csv')\nexcept OSError as e:\n    print(e)")
        out = r.structured_content["stdout"]
        check("loopback" in out and "WASMBOX_ALLOW_PRIVATE_HOSTS=1" in out, f"loopback refused without the flag: {out!r}")

    await session({"WASMBOX_ALLOW_HOSTS": f"localhost:{port}"}, private)
    srv.shutdown()
    print("FAILED: " + "; ".join(FAILED) if FAILED else "all ok")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
