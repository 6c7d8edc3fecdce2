#!/usr/bin/env bash
# What the MCP path costs over the library, in one run (see mcp_path.py); needs `pip install mcp`.
# Usage: benches/mcp_path.sh [rounds] [baseline binary, run in the same sitting]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
cargo bench -q --no-run --bench oneshot 2>/dev/null
./target/release/wasmbox prepare >/dev/null
python3 benches/mcp_path.py target/release/wasmbox "${1:-200}" ${2:-}
