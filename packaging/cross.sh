#!/usr/bin/env bash
# Checks or builds wasmbox for one target from this (Debian x86_64) machine, installing what the
# target needs: its Rust std (rustup), then a C compiler and linker for the C that build scripts
# compile (ring, zstd, wasmtime's helpers): Debian's cross gcc for Linux on ARM and mingw-w64 for
# Windows, zig (this machine's pinned `ziglang` wheel in runtimes/manifest.toml, [quickjs.zig])
# for macOS, whose SDK cannot be had here, so macOS is checked and linted, not linked.
#
# Usage: packaging/cross.sh TARGET check|clippy|build|env
#   check   cargo check of the library and binary
#   clippy  the same with clippy's lints as errors (a superset of check)
#   build   a release binary; its path is the last line printed
#   env     prints the exports the others use (`eval "$(packaging/cross.sh T env)"`)
# Targets: x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu aarch64-apple-darwin
#          x86_64-apple-darwin x86_64-pc-windows-gnu
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:?usage: cross.sh TARGET check|clippy|build|env}"
action="${2:?usage: cross.sh TARGET check|clippy|build|env}"
cd "$root"
say() { echo "cross.sh: $*" >&2; }
# shellcheck source=packaging/common.sh
. "$root/packaging/common.sh"

# zig from the same pinned wheel the JavaScript build uses (the manifest's, for this machine's
# platform as setup names it), unpacked under target/cross/.
zig_path() {
  local plat pins zv zwheel zsha zbin
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) plat=linux-x86_64 ;;
    Linux-aarch64 | Linux-arm64) plat=linux-aarch64 ;;
    *) say "zig: cross.sh runs on Linux x86_64 or aarch64, not $(uname -s) $(uname -m)"; exit 1 ;;
  esac
  pins=$(python3 -c '
import sys, tomllib
zig = tomllib.load(open(sys.argv[1], "rb"))["quickjs"]["zig"]
pin = zig["platforms"].get(sys.argv[2])
if pin is None:
    sys.exit("zig: no pinned toolchain for %s (pinned: %s)" % (sys.argv[2], ", ".join(zig["platforms"])))
print(zig["version"], pin["wheel"], pin["sha256"], pin["binary"])
' "$root/runtimes/manifest.toml" "$plat") || { say "zig: no pin read from runtimes/manifest.toml"; exit 1; }
  read -r zv zwheel zsha zbin <<<"$pins"
  local dir="$root/target/cross/ziglang-$zv"
  if [ ! -x "$dir/$zbin" ]; then
    mkdir -p "$dir"
    local whl="$dir/$zwheel"
    say "fetching zig $zv for $plat (PyPI ziglang)"
    local url
    local api="https://pypi.org/pypi/ziglang/json"
    # The index may answer with URLs relative to the API's (a mirror's), hence urljoin.
    url=$(curl -fsSL "$api" | python3 -c "import json,sys,urllib.parse as u; print(next(u.urljoin('$api', f['url']) for f in json.load(sys.stdin)['releases']['$zv'] if f['filename']=='$zwheel'))") ||
      { say "zig $zv: no $zwheel on PyPI"; exit 1; }
    curl -fsSL -o "$whl" "$url" || exit 1
    echo "$zsha  $whl" | sha256sum -c --quiet || { rm -f "$whl"; exit 1; }
    python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$whl" "$dir"
    chmod +x "$dir/$zbin"
    rm -f "$whl"
  fi
  echo "$dir/$zbin"
}

# A `cc` for zig's target triple (cc-rs wants one program, not `zig cc -target ...`).
zig_cc() {
  local zt="$1" zig w
  zig=$(zig_path)
  [ -x "$zig" ] || { say "no zig"; exit 1; }
  w="$root/target/cross/bin"
  mkdir -p "$w"
  # cc-rs also passes --target=arm64-apple-macosx, which zig spells its own way: ours wins.
  printf '#!/bin/sh\nfor a do shift; case "$a" in --target=*) ;; *) set -- "$@" "$a" ;; esac; done\nexec "%s" cc -target %s "$@"\n' "$zig" "$zt" > "$w/cc-$zt"
  printf '#!/bin/sh\nexec "%s" ar "$@"\n' "$zig" > "$w/ar-zig"
  chmod +x "$w/cc-$zt" "$w/ar-zig"
  echo "$w/cc-$zt"
}

exports=()
setup() {
  local t_upper=${target//-/_}
  t_upper=${t_upper^^}
  case "$target" in
    x86_64-unknown-linux-gnu) ;;
    aarch64-unknown-linux-gnu)
      apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
      exports+=("CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc"
        "AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar"
        "CARGO_TARGET_${t_upper}_LINKER=aarch64-linux-gnu-gcc") ;;
    x86_64-pc-windows-gnu)
      apt_install gcc-mingw-w64-x86-64
      exports+=("CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc"
        "AR_x86_64_pc_windows_gnu=x86_64-w64-mingw32-ar"
        "CARGO_TARGET_${t_upper}_LINKER=x86_64-w64-mingw32-gcc") ;;
    aarch64-apple-darwin | x86_64-apple-darwin)
      local zt=${target%%-*}-macos cc
      cc=$(zig_cc "$zt")
      exports+=("CC_${target//-/_}=$cc" "AR_${target//-/_}=$root/target/cross/bin/ar-zig"
        "CARGO_TARGET_${t_upper}_LINKER=$cc") ;;
    *) say "unknown target $target"; exit 2 ;;
  esac
  rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
}

setup
for e in "${exports[@]}"; do export "${e?}"; done
case "$action" in
  env) for e in "${exports[@]}"; do printf 'export %q\n' "$e"; done ;;
  check) cargo check --release --locked --target "$target" --lib --bins ;;
  clippy) cargo clippy --release --locked --target "$target" --lib --bins -- -D warnings ;;
  build)
    case "$target" in
      *-apple-darwin) say "build: linking for macOS needs Apple's SDK, which this machine cannot have; use check or clippy"; exit 2 ;;
    esac
    cargo build --release --locked --target "$target" --bin wasmbox >&2
    exe=""; [[ "$target" == *windows* ]] && exe=.exe
    echo "$root/target/$target/release/wasmbox$exe" ;;
  *) say "unknown action $action (check|clippy|build|env)"; exit 2 ;;
esac
