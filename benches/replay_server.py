"""A stdio MCP server that answers as `wasmbox serve` does, at no cost: the client's own floor.

Each request is passed once to a real `wasmbox serve` child and its answer kept; the same
request again (same method and parameters) is answered from what was kept, with the new id.
So a client sees wasmbox's own answers (the same sizes and shapes to parse and check), while the
server's work per call is one dictionary lookup and one write, the same for `ping` as for a
one-shot. What a call costs here over `ping` is the client's own work for that answer.

Usage (as a server command): python3 benches/replay_server.py path/to/wasmbox
"""

from __future__ import annotations

import json
import subprocess
import sys

CACHED = {"ping", "tools/call", "tools/list"}


def main() -> int:
    child = subprocess.Popen(
        [sys.argv[1], "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    assert child.stdin and child.stdout
    kept: dict[str, dict] = {}
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:  # a notification or a response
            child.stdin.write(line)
            continue
        params = dict(msg.get("params") or {})
        params.pop("_meta", None)
        key = msg["method"] + json.dumps(params, sort_keys=True)
        answer = kept.get(key)
        if answer is None:
            child.stdin.write(line)
            while True:
                got = json.loads(child.stdout.readline())
                if got.get("id") == msg["id"] and "method" not in got:
                    answer = {k: v for k, v in got.items() if k != "id"}
                    break
                out.write(json.dumps(got).encode() + b"\n")  # the child's own notifications
            if msg["method"] in CACHED:
                kept[key] = answer
        out.write(json.dumps({"id": msg["id"], **answer}).encode() + b"\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
