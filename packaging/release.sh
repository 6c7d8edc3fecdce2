#!/usr/bin/env bash
# Writes one target's release artifacts into OUTDIR, from a prebuilt binary or a cross build.
# Usage: packaging/release.sh TARGET OUTDIR
#   TARGET: x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu aarch64-apple-darwin
#           x86_64-apple-darwin x86_64-pc-windows-gnu
# Writes, with V the version and T the target:
#   wasmbox-V-T.tar.gz (.zip for Windows)  a folder wasmbox-V-T/ with the stripped binary,
#                                          LICENSE and README.md
#   wasmbox-V-T.mcpb                       the MCP bundle (packaging/mcpb/pack.sh, validated
#                                          with the official mcpb CLI; needs node)
#   wasmbox-V-py3-none-<platform>.whl      the PyPI wheel (packaging/wheel.py, no compiling)
#   <each of the three>.sha256             in sha256sum's format
#   install.sh, install.ps1                the installers, whose default release URL is REPO's
#   server.json                            the MCP registry entry: every bundle of version V in
#                                          OUTDIR, with its SHA-256, and the wheel
#   SHA256SUMS                             every file in OUTDIR (what the installers read to
#                                          find the newest version)
# Running it for each target into one OUTDIR makes the whole release.
# Environment:
#   WASMBOX_BIN           the binary for TARGET; unset: `packaging/cross.sh TARGET build` builds
#                         it (macOS cannot be linked on Linux: then this fails, saying so)
#   WASMBOX_VERSION       the version; default the binary's `--version` if it runs here, else
#                         Cargo.toml's
#   WASMBOX_GITHUB_REPO   owner/name of the GitHub repository releases are published from
#                         (default OWNER/wasmbox, a placeholder): server.json's name
#                         (io.github.<owner>/wasmbox), its URLs and the installers' default URL
#   WASMBOX_DOWNLOAD_URL  where this release's files will be downloadable (server.json's bundle
#                         URLs); default https://github.com/<repo>/releases/download/v<version>
#   SOURCE_DATE_EPOCH     the archives' file times (default: the last commit's), so that the
#                         same binary gives the same archive
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=packaging/common.sh
. "$root/packaging/common.sh"
say() { echo "release.sh: $*" >&2; }
die() { say "$*"; exit 1; }

target="${1:-}"
out="${2:-}"
if [ -z "$target" ] || [ -z "$out" ]; then die "usage: packaging/release.sh TARGET OUTDIR"; fi
known_target "$target" || die "unknown target $target (x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu aarch64-apple-darwin x86_64-apple-darwin x86_64-pc-windows-gnu)"
for tool in python3 sha256sum tar gzip node npx; do
  command -v "$tool" >/dev/null || die "needs $tool"
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

bin="${WASMBOX_BIN:-}"
if [ -z "$bin" ]; then
  say "no WASMBOX_BIN: building with packaging/cross.sh $target build"
  rc=0
  "$root/packaging/cross.sh" "$target" build >"$work/cross.out" || rc=$?
  if [ "$rc" -ne 0 ]; then
    case "$target" in
      *-apple-darwin)
        [ "$rc" -eq 2 ] || die "packaging/cross.sh $target build failed (exit $rc)"
        say "cannot build $target here: linking for macOS needs Apple's SDK, which this machine cannot have (packaging/cross.sh exited 2)."
        say "Build it on a Mac (cargo build --release --locked --target $target), then run again with WASMBOX_BIN=<that binary>."
        exit 2 ;;
      *) die "packaging/cross.sh $target build failed (exit $rc)" ;;
    esac
  fi
  bin="$(tail -n1 "$work/cross.out")"
fi
[ -f "$bin" ] || die "no binary at $bin"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
check_binary_format "$target" "$bin" || die "refusing to package it"

version="$(wasmbox_version "$bin" "$root")" || die "no version: the binary does not run here and Cargo.toml has none"
repo="${WASMBOX_GITHUB_REPO:-OWNER/wasmbox}"
[[ "$repo" =~ ^[A-Za-z0-9-]+/[A-Za-z0-9._-]+$ ]] || die "WASMBOX_GITHUB_REPO must be owner/name, not $repo"
download_url="${WASMBOX_DOWNLOAD_URL:-https://github.com/$repo/releases/download/v$version}"
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 1577836800)}"
name="wasmbox-$version-$target"
exe="$(target_exe "$target")"
say "$name from $bin"

# The folder the archive holds.
mkdir -p "$work/$name"
say "binary: $(strip_binary "$target" "$bin" "$work/$name/$exe")"
cp "$root/LICENSE" "$work/$name/LICENSE"
case "$target" in
  *windows*) run=".\\wasmbox.exe" ;;
  *) run="./wasmbox" ;;
esac
cat >"$work/$name/README.md" <<EOF
# wasmbox $version ($target)

A local, WebAssembly-based code-execution sandbox for AI assistants, served over MCP: Python
(numpy, pandas, scipy, scikit-learn, matplotlib), JavaScript and Go, offline and isolated.

Put \`$exe\` in a folder on your PATH, then:

    $run setup     # fetch the pinned runtimes (~270 MB, each checked by SHA-256)
    $run run --language python --code 'print(6*7)'
    $run serve     # MCP over stdio: point your assistant's client at it

Claude Code: \`claude mcp add wasmbox -- /absolute/path/to/$exe serve\`. Claude Desktop, Cursor
and VS Code take \`{"command": "/absolute/path/to/$exe", "args": ["serve"]}\`.
The installers (install.sh, install.ps1) do all of this and print the lines for each client.

Licensed under the Apache License 2.0 (LICENSE).
EOF
touch -d "@$epoch" "$work/$name" "$work/$name"/*

# The archive, and its .sha256.
case "$target" in
  *windows*)
    artifact="$name.zip"
    python3 - "$work" "$name" "$out/$artifact" "$epoch" <<'EOF'
import os, sys, time, zipfile
work, name, dest, epoch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
stamp = time.gmtime(max(epoch, 315532800))[:6]
with zipfile.ZipFile(dest + ".part", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    folder = zipfile.ZipInfo(name + "/", date_time=stamp)
    folder.external_attr = (0o40755 << 16) | 0x10  # a directory, rwxr-xr-x (and MS-DOS's flag)
    z.writestr(folder, b"")
    for f in sorted(os.listdir(os.path.join(work, name))):
        info = zipfile.ZipInfo(f"{name}/{f}", date_time=stamp)
        info.external_attr = (0o100755 if f.endswith(".exe") else 0o100644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(os.path.join(work, name, f), "rb") as src:
            z.writestr(info, src.read())
os.replace(dest + ".part", dest)
EOF
    ;;
  *)
    artifact="$name.tar.gz"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$work" -cf - "$name" |
      gzip -n -9 >"$out/$artifact.part"
    mv "$out/$artifact.part" "$out/$artifact" ;;
esac

# The MCP bundle, from the same stripped binary.
WASMBOX_VERSION="$version" "$root/packaging/mcpb/pack.sh" "$work/$name/$exe" "$out/$name.mcpb" "$target" >"$work/pack.log" 2>&1 ||
  { cat "$work/pack.log" >&2; die "packaging/mcpb/pack.sh failed"; }
grep -E "pack.sh:|Manifest|valid" "$work/pack.log" | sed 's/^/  /' >&2 || true

# The wheel.
plat="$(target_wheel_plat "$target" "$work/$name/$exe")"
wheel="$(python3 "$root/packaging/wheel.py" "$work/$name/$exe" "$version" "$plat" "$out" \
  --server-name "io.github.${repo%%/*}/wasmbox")"
wheel="$(basename "$wheel")"

(cd "$out" && for f in "$artifact" "$name.mcpb" "$wheel"; do sha256sum "$f" >"$f.sha256"; done)

# The installers, their default URL this repository's latest release.
sed "s|^WASMBOX_REPO_DEFAULT=.*|WASMBOX_REPO_DEFAULT=$repo|" "$root/packaging/install.sh" >"$out/install.sh"
sed "s|^\$DefaultRepo = .*|\$DefaultRepo = '$repo'|" "$root/packaging/install.ps1" >"$out/install.ps1"
chmod 755 "$out/install.sh"

# server.json for the registry: every bundle of this version in OUTDIR.
python3 "$root/packaging/server_json.py" release "$root/server.json" "$out" "$version" "$repo" "$download_url" >/dev/null

# SHA256SUMS: everything in OUTDIR.
(
  cd "$out"
  find . -maxdepth 1 -type f ! -name SHA256SUMS ! -name '*.part' | sed 's|^\./||' | LC_ALL=C sort |
    while read -r f; do sha256sum "$f"; done >SHA256SUMS.part
  mv SHA256SUMS.part SHA256SUMS
)

say "wrote into $out:"
(cd "$out" && for f in "$artifact" "$name.mcpb" "$wheel" server.json SHA256SUMS; do
  printf '  %-60s %s\n' "$f" "$(du -h "$f" | cut -f1)"
done) >&2
