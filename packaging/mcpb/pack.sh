#!/usr/bin/env bash
# Packs an MCP bundle (.mcpb, Claude Desktop's one-click install) from a built binary, after
# validating its manifest with the official CLI (@anthropic-ai/mcpb, from npm).
# Usage: packaging/mcpb/pack.sh [path/to/wasmbox] [out.mcpb] [TARGET]   (needs node and npx)
#   TARGET (default: this machine's) sets compatibility.platforms (linux, darwin or win32) and
#   the entry point (server/wasmbox, or server/wasmbox.exe for Windows). The version is
#   WASMBOX_VERSION, else the binary's `--version` when it runs here, else Cargo.toml's.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=packaging/common.sh
. "$root/packaging/common.sh"
bin="${1:-$root/target/release/wasmbox}"
out="${2:-$root/target/wasmbox.mcpb}"
target="${3:-$(host_target)}"
mcpb=(npx -y @anthropic-ai/mcpb@2)
[ -f "$bin" ] || { echo "pack.sh: no binary at $bin (cargo build --release)" >&2; exit 1; }
platform=$(target_os "$target") || { echo "pack.sh: unknown target $target" >&2; exit 2; }
exe=$(target_exe "$target")
version=$(wasmbox_version "$bin" "$root")
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/server"
# The manifest's version, platform and entry point for this binary (node is there for npx).
# shellcheck disable=SC2016 # JavaScript, and ${__dirname} is the bundle's own placeholder
node -e '
  const fs = require("fs");
  const [src, dst, version, platform, exe] = process.argv.slice(1);
  const m = JSON.parse(fs.readFileSync(src, "utf8"));
  m.version = version;
  m.compatibility = Object.assign({}, m.compatibility, { platforms: [platform] });
  m.server.entry_point = "server/" + exe;
  m.server.mcp_config.command = "${__dirname}/server/" + exe;
  fs.writeFileSync(dst, JSON.stringify(m, null, 2) + "\n");
' "$root/packaging/mcpb/manifest.json" "$stage/manifest.json" "$version" "$platform" "$exe"
# Without its debug line tables (~270 MB with them, ~40 MB without).
echo "pack.sh: $target ($platform), version $version, $(strip_binary "$target" "$bin" "$stage/server/$exe")" >&2
cp "$root/LICENSE" "$stage/LICENSE"
"${mcpb[@]}" validate "$stage/manifest.json"
"${mcpb[@]}" pack "$stage" "$out"
"${mcpb[@]}" info "$out"
