"""A plain JSON-RPC client for packaging/smoke.sh: starts `wasmbox serve` (behind a runner such as
qemu-user or wine) over stdio and runs the checks a new platform must pass. Standard library only,
so it runs wherever the smoke does; scripts/mcp_smoke.py does the same with the official SDK.

Usage: python3 smoke_client.py CHECKS -- RUNNER... BINARY serve
CHECKS: comma-separated of python,javascript,go,fork. Prints one line a check, with its time.
"""

import json
import subprocess
import sys
import time

checks = sys.argv[1].split(",")
cmd = sys.argv[sys.argv.index("--") + 1 :]
proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
next_id = 0


def call(method, params=None, timeout=1800):
    global next_id
    next_id += 1
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params or {}}) + "\n")
    proc.stdin.flush()
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the server closed its stdout during {method}")
        msg = json.loads(line)
        if msg.get("id") == next_id:
            if "error" in msg:
                raise SystemExit(f"{method}: {msg['error']}")
            return msg["result"]
    raise SystemExit(f"{method}: no answer in {timeout} s")


def tool(name, args):
    res = call("tools/call", {"name": name, "arguments": args})
    return res.get("isError", False), json.loads(res["content"][0]["text"])


call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "smoke", "version": "1"}})
proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
proc.stdin.flush()

GO = 'package main\nimport "fmt"\nfunc main() { fmt.Println(6 * 7) }'
one_shots = {
    "python": ({"code": "import pandas as pd; print(int(pd.DataFrame({'a': [1, 2, 39]}).a.sum()))"}, "42\n"),
    "javascript": ({"code": "console.log([1, 2].map(x => x * 21).join(' '))", "language": "javascript"}, "21 42\n"),
    "go": ({"code": GO, "language": "go"}, "42\n"),
}
failed = 0


def report(name, good, t, detail):
    global failed
    failed += not good
    print(f"{'ok  ' if good else 'FAIL'} {name} ({time.time() - t:.1f} s) -> {json.dumps(detail)[:200]}", flush=True)


for c in checks:
    t = time.time()
    if c in one_shots:
        args, want = one_shots[c]
        err, r = tool("execute_code", args)
        report(f"{c} one-shot", not err and r.get("stdout") == want, t, r)
    elif c == "fork":
        _, made = tool("create_sandbox", {"template_id": "code-interpreter"})
        sid = made["id"]
        tool("execute_code", {"mode": "persistent", "sandbox_id": sid, "code": "x = 41"})
        tool("file_write", {"sandbox_id": sid, "path": "f.txt", "content": "kept"})
        err, fork = tool("fork_sandbox", {"sandbox_id": sid})
        fid = fork.get("id")
        _, r = tool("execute_code", {"mode": "persistent", "sandbox_id": fid,
                                     "code": "print(x + 1, open('f.txt').read())"})
        _, src = tool("execute_code", {"mode": "persistent", "sandbox_id": sid, "code": "x = 0; print(x)"})
        _, again = tool("execute_code", {"mode": "persistent", "sandbox_id": fid, "code": "print(x)"})
        good = not err and r.get("stdout") == "42 kept\n" and src.get("stdout") == "0\n" and again.get("stdout") == "41\n"
        report("fork keeps variables and files, independent after", good, t, [r.get("stdout"), again.get("stdout")])
    else:
        raise SystemExit(f"unknown check {c}")

proc.stdin.close()
proc.wait(timeout=60)
print("passed" if not failed else f"{failed} failed", flush=True)
sys.exit(1 if failed else 0)
