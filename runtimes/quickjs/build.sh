#!/usr/bin/env bash
# Build qjs.wasm: QuickJS-NG as a WASI preview-1 *reactor* with the wasmbox
# entry points (wasmbox_qjs.c + prelude.js). See README.md.
#
#   runtimes/quickjs/build.sh OUT_DIR        -> OUT_DIR/qjs.wasm (+ qjs.wasm.stamp)
#
# Inputs, all pinned in pins.env and checked by SHA-256:
#   - zig (PyPI wheel "ziglang"), fetched with pip download
#   - QuickJS-NG sources from the crates.io crate rquickjs-sys, fetched with cargo fetch
# Downloads and extracted toolchains live in ${WASMBOX_CACHE:-$HOME/.cache/wasmbox}.
# If OUT_DIR/qjs.wasm and its stamp match the current inputs, nothing is done
# (no network, well under a second).
set -euo pipefail

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$1"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# shellcheck source=pins.env
. "$HERE/pins.env"
: "${ZIGLANG_VERSION:?}" "${ZIGLANG_WHEEL:?}" "${ZIGLANG_WHEEL_SHA256:?}"
: "${RQUICKJS_SYS_VERSION:?}" "${RQUICKJS_SYS_CRATE_SHA256:?}"
: "${WB_STACK_SIZE:?}" "${WB_JS_STACK_SIZE:?}"

PY="${PYTHON:-python3}"
sha256() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------- stamp check
# The stamp covers the pinned input hashes and our own sources.
STAMP_INPUTS="ziglang=$ZIGLANG_VERSION:$ZIGLANG_WHEEL_SHA256
rquickjs-sys=$RQUICKJS_SYS_VERSION:$RQUICKJS_SYS_CRATE_SHA256
pins.env=$(sha256 "$HERE/pins.env")
build.sh=$(sha256 "$HERE/build.sh")
wasmbox_qjs.c=$(sha256 "$HERE/wasmbox_qjs.c")
prelude.js=$(sha256 "$HERE/prelude.js")"
WASM="$OUT/qjs.wasm"
STAMP="$OUT/qjs.wasm.stamp"
if [ -f "$WASM" ] && [ -f "$STAMP" ]; then
    want="$STAMP_INPUTS
qjs.wasm=$(sha256 "$WASM")"
    if [ "$want" = "$(cat "$STAMP")" ]; then
        log "up to date: $WASM"
        exit 0
    fi
fi

CACHE="${WASMBOX_CACHE:-$HOME/.cache/wasmbox}"
mkdir -p "$CACHE/downloads"
export ZIG_GLOBAL_CACHE_DIR="$CACHE/zig"
export ZIG_LOCAL_CACHE_DIR="$CACHE/zig-local"

check_sha() { # file expected
    local got
    got="$(sha256 "$1")"
    [ "$got" = "$2" ] || die "SHA-256 mismatch for $1: got $got, pinned $2 (delete the file to fetch it again)"
}

# ---------------------------------------------------------------- zig
ZIG_DIR="$CACHE/ziglang-$ZIGLANG_VERSION-${ZIGLANG_WHEEL_SHA256:0:12}"
if [ ! -f "$ZIG_DIR/.ok" ]; then
    whl="$CACHE/downloads/$ZIGLANG_WHEEL"
    if [ ! -f "$whl" ]; then
        log "downloading ziglang==$ZIGLANG_VERSION from PyPI"
        tmpd="$(mktemp -d "$CACHE/downloads/pip.XXXXXX")"
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
            --dest "$tmpd" "ziglang==$ZIGLANG_VERSION" \
            || die "pip download ziglang==$ZIGLANG_VERSION failed"
        [ -f "$tmpd/$ZIGLANG_WHEEL" ] || die "pip fetched $(ls "$tmpd"), expected $ZIGLANG_WHEEL (only x86_64 Linux is pinned)"
        mv "$tmpd/$ZIGLANG_WHEEL" "$whl"
        rm -rf "$tmpd"
    fi
    check_sha "$whl" "$ZIGLANG_WHEEL_SHA256"
    log "extracting $ZIGLANG_WHEEL"
    rm -rf "$ZIG_DIR" "$ZIG_DIR.tmp"
    mkdir -p "$ZIG_DIR.tmp"
    "$PY" - "$whl" "$ZIG_DIR.tmp" <<'EOF'
import os, stat, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        path = z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
EOF
    touch "$ZIG_DIR.tmp/.ok"
    mv "$ZIG_DIR.tmp" "$ZIG_DIR"
fi
zigcc() { PYTHONPATH="$ZIG_DIR" "$PY" -m ziglang cc "$@"; }

# ---------------------------------------------------------------- QuickJS-NG sources
QJS_DIR="$CACHE/rquickjs-sys-$RQUICKJS_SYS_VERSION-${RQUICKJS_SYS_CRATE_SHA256:0:12}"
if [ ! -f "$QJS_DIR/.ok" ]; then
    CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
    find_crate() { ls "$CARGO_HOME"/registry/cache/*/"rquickjs-sys-$RQUICKJS_SYS_VERSION.crate" 2>/dev/null | head -n1; }
    crate="$(find_crate || true)"
    if [ -z "$crate" ]; then
        log "fetching rquickjs-sys $RQUICKJS_SYS_VERSION with cargo fetch"
        proj="$(mktemp -d)"
        mkdir -p "$proj/src"
        printf '[package]\nname = "wasmbox-qjs-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nrquickjs-sys = "=%s"\n' \
            "$RQUICKJS_SYS_VERSION" > "$proj/Cargo.toml"
        echo 'fn main() {}' > "$proj/src/main.rs"
        (cd "$proj" && CARGO_HOME="$CARGO_HOME" cargo fetch --quiet) || die "cargo fetch of rquickjs-sys failed"
        rm -rf "$proj"
        crate="$(find_crate || true)"
        [ -n "$crate" ] || die "rquickjs-sys-$RQUICKJS_SYS_VERSION.crate not found under $CARGO_HOME/registry/cache"
    fi
    check_sha "$crate" "$RQUICKJS_SYS_CRATE_SHA256"
    log "extracting $(basename "$crate")"
    rm -rf "$QJS_DIR" "$QJS_DIR.tmp"
    mkdir -p "$QJS_DIR.tmp"
    tar -xzf "$crate" -C "$QJS_DIR.tmp" --strip-components=1 "rquickjs-sys-$RQUICKJS_SYS_VERSION/quickjs"
    touch "$QJS_DIR.tmp/.ok"
    mv "$QJS_DIR.tmp" "$QJS_DIR"
fi
[ -f "$QJS_DIR/quickjs/quickjs.c" ] || die "bad source dir $QJS_DIR"

# ---------------------------------------------------------------- build
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
cp "$QJS_DIR"/quickjs/*.c "$QJS_DIR"/quickjs/*.h "$BUILD"/
cp "$HERE/wasmbox_qjs.c" "$BUILD"/

# QuickJS-NG disables its native stack-overflow check on WASI
# (update_stack_limit: "#if defined(__wasi__) stack_limit = 0"), so deep JS
# recursion would run off the shadow stack and trap. Re-enable it: our stack
# size is known (WB_STACK_SIZE) and wb_init sets JS_SetMaxStackSize.
"$PY" - "$BUILD/quickjs.c" <<'EOF'
import sys
p = sys.argv[1]
s = open(p, encoding="utf-8").read()
old = "static void update_stack_limit(JSRuntime *rt)\n{\n#if defined(__wasi__)\n"
new = "static void update_stack_limit(JSRuntime *rt)\n{\n#if 0 /* wasmbox: stack limit enabled on WASI */\n"
if s.count(old) != 1:
    sys.exit("build.sh: error: quickjs.c stack-limit patch does not apply")
open(p, "w", encoding="utf-8").write(s.replace(old, new))
EOF

# prelude.js -> C string
"$PY" - "$HERE/prelude.js" "$BUILD/wasmbox_prelude.h" <<'EOF'
import sys
src = open(sys.argv[1], "rb").read()
src.decode("utf-8")  # must be UTF-8
lines = []
for i in range(0, len(src), 64):
    chunk = src[i:i + 64]
    lines.append('"' + "".join("\\%03o" % b if (b < 32 or b > 126 or b in b'"\\?') else chr(b) for b in chunk) + '"')
with open(sys.argv[2], "w") as f:
    f.write("/* generated by build.sh from prelude.js */\nstatic const char wb_prelude_js[] =\n")
    f.write("\n".join(lines) if lines else '""')
    f.write(";\n")
EOF

log "compiling (zig $ZIGLANG_VERSION, QuickJS-NG from rquickjs-sys $RQUICKJS_SYS_VERSION)"
start=$(date +%s)
(
    cd "$BUILD"
    # relative file names keep __FILE__ (assert messages) free of the temp path
    zigcc -target wasm32-wasi -mexec-model=reactor -O2 -s \
        -D_GNU_SOURCE -DQJS_BUILD_LIBC \
        -D_WASI_EMULATED_PROCESS_CLOCKS -D_WASI_EMULATED_SIGNAL \
        -DWB_JS_STACK_SIZE="$WB_JS_STACK_SIZE" \
        -I. \
        dtoa.c libregexp.c libunicode.c quickjs.c quickjs-libc.c wasmbox_qjs.c \
        -lwasi-emulated-process-clocks -lwasi-emulated-signal \
        -Wl,-z,stack-size="$WB_STACK_SIZE" \
        -o qjs.wasm
)
log "compiled in $(( $(date +%s) - start )) s: $(stat -c %s "$BUILD/qjs.wasm") bytes"

cp "$BUILD/qjs.wasm" "$WASM.tmp"
mv "$WASM.tmp" "$WASM"
printf '%s\nqjs.wasm=%s\n' "$STAMP_INPUTS" "$(sha256 "$WASM")" > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "wrote $WASM (sha256 $(sha256 "$WASM"))"
