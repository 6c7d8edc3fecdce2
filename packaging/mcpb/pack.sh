#!/usr/bin/env bash
# Packs wasmbox.mcpb (an MCP bundle for Claude Desktop's one-click install) from a release build,
# after validating its manifest with the official CLI (@anthropic-ai/mcpb, from npm).
# Usage: packaging/mcpb/pack.sh [path/to/wasmbox] [out.mcpb]   (needs node and npx)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$root/target/release/wasmbox}"
out="${2:-$root/target/wasmbox.mcpb}"
mcpb=(npx -y @anthropic-ai/mcpb@2)
[ -x "$bin" ] || { echo "pack.sh: no binary at $bin (cargo build --release)" >&2; exit 1; }
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/server"
# The bundle's version is the binary's.
version="$("$bin" --version | awk '{print $2}')"
sed "s/\"version\": \"0.1.0\"/\"version\": \"$version\"/" "$root/packaging/mcpb/manifest.json" > "$stage/manifest.json"
# Without its debug line tables (~270 MB with them, ~40 MB without).
if command -v strip >/dev/null; then strip -o "$stage/server/wasmbox" "$bin"; else cp "$bin" "$stage/server/wasmbox"; fi
cp "$root/LICENSE" "$stage/LICENSE"
"${mcpb[@]}" validate "$stage/manifest.json"
"${mcpb[@]}" pack "$stage" "$out"
"${mcpb[@]}" info "$out"
