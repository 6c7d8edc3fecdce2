#!/usr/bin/env bash
# Runs a target's binary where this (Debian x86_64) machine can, as a user would: setup from the
# real package index (or WASMBOX_PACKAGE_INDEX / WASMBOX_CRATES_URL's fixtures where it cannot be
# reached), then one-shots over MCP stdio (packaging/smoke_client.py) and a fork.
#   x86_64-unknown-linux-gnu   natively: setup, Python with pandas, JavaScript, Go, a fork
#   aarch64-unknown-linux-gnu  under qemu-user: the same
#   x86_64-pc-windows-gnu      under wine: --version, setup, a Python one-shot, and what else wine
#                              runs (each step reported; a step wine cannot run is named, not hidden)
#   *-apple-darwin             check and clippy only (no Mac here)
# The binary comes from WASMBOX_BIN, else `packaging/cross.sh TARGET build`. Runtimes, caches and
# HOME live under target/smoke/TARGET (kept between runs; SMOKE_FRESH=1 starts from nothing).
# Usage: packaging/smoke.sh TARGET
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:?usage: smoke.sh TARGET}"
cd "$root"
start=$(date +%s)
step() { echo "== smoke $target: $* ($(( $(date +%s) - start )) s)"; }
say() { echo "smoke.sh: $*" >&2; }
# shellcheck source=packaging/common.sh
. "$root/packaging/common.sh"

case "$target" in
  *-apple-darwin)
    step "check"; packaging/cross.sh "$target" check
    step "clippy"; packaging/cross.sh "$target" clippy
    step "done (macOS: checked and linted; running it needs a Mac)"; exit 0 ;;
esac

step "binary"
bin="${WASMBOX_BIN:-}"
[ -n "$bin" ] || bin=$(packaging/cross.sh "$target" build | tail -n 1)
[ -f "$bin" ] || { say "no binary at $bin"; exit 1; }
work="$root/target/smoke/$target"
[ "${SMOKE_FRESH:-0}" = 1 ] && rm -rf "$work"
mkdir -p "$work/home"
runner=()
path() { printf '%s' "$1"; }
case "$target" in
  x86_64-unknown-linux-gnu) ;;
  aarch64-unknown-linux-gnu)
    apt_install qemu-user-static libc6-arm64-cross
    # Go and zig start programs of their own (compile, link, zig's own children): the kernel
    # must hand aarch64 programs to qemu too (binfmt_misc, which a container may lack).
    binfmt=/proc/sys/fs/binfmt_misc
    [ -e "$binfmt/register" ] || mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
    if [ -e "$binfmt/register" ] && [ ! -e "$binfmt/qemu-aarch64" ]; then
      sed 's|:[^:]*:[^:]*$|:/usr/bin/qemu-aarch64-static:F|' /usr/lib/binfmt.d/qemu-aarch64.conf > "$binfmt/register" ||
        say "could not register qemu for aarch64 programs: Go and JavaScript setup will fail"
    fi
    export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
    runner=(qemu-aarch64-static) ;;
  x86_64-pc-windows-gnu)
    apt_install wine64 wine gcc-mingw-w64-x86-64
    export WINEPREFIX="$work/wine" WINEDEBUG=-all
    runner=(wine)
    # Wine 8 lacks bcryptprimitives.dll (Rust's std imports its ProcessPrng): a stand-in of
    # packaging/wine/, in this prefix only.
    sys32="$WINEPREFIX/drive_c/windows/system32"
    if [ ! -f "$sys32/bcryptprimitives.dll" ]; then
      wineboot -i >/dev/null 2>&1 || true
      x86_64-w64-mingw32-gcc -O2 -shared -o "$sys32/bcryptprimitives.dll" \
        packaging/wine/bcryptprimitives.c packaging/wine/bcryptprimitives.def -ladvapi32
    fi
    path() { winepath -w "$1" 2>/dev/null; } ;;
  *) say "unknown target $target"; exit 2 ;;
esac
# Nothing of the host user's: an empty HOME, the runtimes and caches here.
export HOME="$work/home" XDG_DATA_HOME="$work/home/.local/share" XDG_CACHE_HOME="$work/home/.cache"
export WASMBOX_CACHE WASMBOX_RUNTIMES WASMBOX_DATA
WASMBOX_CACHE=$(path "$work/cache")
WASMBOX_RUNTIMES=$(path "$work/runtimes")
WASMBOX_DATA=$(path "$work/data")
wb() { "${runner[@]}" "$bin" "$@"; }

step "--version"
wb --version

case "$target" in
  x86_64-pc-windows-gnu)
    # Wine runs Windows programs on Linux's kernel: what it lacks shows as a failed step here,
    # recorded in docs/platforms.md, rather than stopping the rest.
    fails=0
    step "setup"
    wb setup --runtimes "$WASMBOX_RUNTIMES" || { say "setup failed under wine"; fails=$((fails + 1)); }
    step "Python one-shot (run)"
    out=$(wb run --language python --code 'import pandas as pd; print(int(pd.DataFrame({"a": [1, 2, 39]}).a.sum()))' 2>"$work/run.err") || true
    if [ "$out" = 42 ]; then echo "ok   python one-shot -> 42"; else echo "FAIL python one-shot -> $out"; tail -5 "$work/run.err"; fails=$((fails + 1)); fi
    step "MCP over stdio: JavaScript, Go, fork"
    python3 "$root/packaging/smoke_client.py" python,javascript,go,fork -- "${runner[@]}" "$bin" serve || fails=$((fails + 1))
    step "done: $fails step(s) failed under wine"
    exit $(( fails > 0 )) ;;
esac

step "setup"
wb setup --runtimes "$WASMBOX_RUNTIMES"
step "Python one-shot (run, first: builds the image)"
out=$(wb run --language python --code 'import pandas as pd; print(int(pd.DataFrame({"a": [1, 2, 39]}).a.sum()))')
[ "$out" = 42 ] || { say "python one-shot printed: $out"; exit 1; }
echo "ok   python one-shot -> 42"
step "MCP over stdio: Python, JavaScript, Go, fork"
python3 "$root/packaging/smoke_client.py" python,javascript,go,fork -- "${runner[@]}" "$bin" serve
step "done"
