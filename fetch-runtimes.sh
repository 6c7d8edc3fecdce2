#!/usr/bin/env bash
# Downloads the pinned WebAssembly runtimes into runtimes/ and verifies their SHA-256, with the
# wasmbox binary's own `setup` (built here first if needed; no Python or pip required).
# Idempotent: with everything present and unchanged it does no network I/O.
# Usage: ./fetch-runtimes.sh [--verify] [--only python,quickjs,go]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
start=$(date +%s)
echo "fetch-runtimes: building wasmbox (cargo build --release; first time: several minutes)" >&2
cargo build --release --locked --bin wasmbox
echo "fetch-runtimes: built in $(( $(date +%s) - start )) s" >&2
exec target/release/wasmbox setup --runtimes "$here/runtimes" "$@"
