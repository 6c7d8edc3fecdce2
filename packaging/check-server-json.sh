#!/usr/bin/env bash
# Validates server.json (or the files named) against the MCP registry's published schema, kept
# at packaging/server.schema.json, with Python's jsonschema in a venv of its own (made once,
# ~5 s; WASMBOX_JSONSCHEMA_VENV says where, default under TMPDIR), and the registry's rules the
# schema does not carry (packaging/server_json.py check).
# Usage: packaging/check-server-json.sh [server.json ...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${WASMBOX_JSONSCHEMA_VENV:-${TMPDIR:-/tmp}/wasmbox-jsonschema-venv}"
if ! "$venv/bin/python" -c 'import jsonschema, rfc3987' 2>/dev/null; then
  python3 -m venv "$venv"
  # rfc3987 lets the format checker check "uri" fields too.
  "$venv/bin/pip" install -q --disable-pip-version-check 'jsonschema>=4.18,<5' 'rfc3987==1.3.8'
fi
[ $# -gt 0 ] || set -- "$root/server.json"
exec "$venv/bin/python" "$root/packaging/server_json.py" check "$@"
