#!/usr/bin/env bash
# wasmbox's library one-shot against eryx's pooled one, in the same run (see vs_eryx.py).
# Usage: benches/vs_eryx.sh [calls] [rounds]
# pyeryx's wheels are abi3 for CPython >= 3.12 (its sdist needs eryx's own pre-compiled
# runtime), so the venv is made with python3.13 or python3.12 when python3 is older.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${WASMBOX_ERYX_VENV:-${TMPDIR:-/tmp}/wasmbox-eryx-venv}"
if [ ! -x "$venv/bin/python" ]; then
  py=python3
  for p in python3.13 python3.12; do
    if command -v "$p" >/dev/null && "$p" -c 'import sys' 2>/dev/null; then py=$p; break; fi
  done
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: \
    "pyeryx==${ERYX_VERSION:-0.11.0}"
fi
cargo bench -q --no-run --bench oneshot 2>/dev/null
PYTHONPATH=benches "$venv/bin/python" benches/vs_eryx.py "${1:-1000}" "${2:-2}"
