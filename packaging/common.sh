# Helpers shared by the packaging scripts (sourced, bash).
# Nothing here builds: each takes a binary that exists.

# The five release targets and what each is called elsewhere.
#   target_os TARGET        linux | darwin | win32 (an MCP bundle's compatibility.platforms)
#   target_exe TARGET       the binary's name inside archives and bundles
#   target_wheel_plat TARGET BIN   a wheel's platform tag (manylinux from the binary's glibc needs)
target_os() {
  case "$1" in
    *-unknown-linux-gnu) echo linux ;;
    *-apple-darwin) echo darwin ;;
    *-pc-windows-gnu | *-pc-windows-msvc) echo win32 ;;
    *) return 1 ;;
  esac
}

known_target() {
  case "$1" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu | aarch64-apple-darwin | \
      x86_64-apple-darwin | x86_64-pc-windows-gnu) return 0 ;;
    *) return 1 ;;
  esac
}

target_exe() {
  case "$1" in
    *windows*) echo wasmbox.exe ;;
    *) echo wasmbox ;;
  esac
}

# This machine's target, for callers that name none.
host_target() {
  local arch
  arch=$(uname -m)
  case "$arch" in arm64) arch=aarch64 ;; esac
  case "$(uname -s)" in
    Linux) echo "$arch-unknown-linux-gnu" ;;
    Darwin) echo "$arch-apple-darwin" ;;
    MINGW* | MSYS* | CYGWIN*) echo "$arch-pc-windows-gnu" ;;
    *) return 1 ;;
  esac
}

# The highest GLIBC_2.N the ELF binary asks for (readelf reads any ELF, whatever its machine).
# Prints N; nothing if it asks for none.
glibc_minor_needed() {
  readelf -W -V "$1" 2>/dev/null | grep -oE 'GLIBC_2\.[0-9]+' | sed 's/GLIBC_2\.//' | sort -n | tail -n1
}

# A wheel's platform tag. Linux: manylinux_2_N for the newest glibc symbol the binary uses, and
# 2_17 at least (Rust's own floor); macOS: the Rust targets' default deployment targets
# (arm64 11.0, x86_64 10.12); Windows: win_amd64.
target_wheel_plat() {
  local target="$1" bin="$2" minor
  case "$target" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu)
      minor=$(glibc_minor_needed "$bin")
      if [ -z "$minor" ] || [ "$minor" -lt 17 ]; then minor=17; fi
      echo "manylinux_2_${minor}_${target%%-*}" ;;
    aarch64-apple-darwin) echo macosx_11_0_arm64 ;;
    x86_64-apple-darwin) echo macosx_10_12_x86_64 ;;
    x86_64-pc-windows-gnu | x86_64-pc-windows-msvc) echo win_amd64 ;;
    *) return 1 ;;
  esac
}

# The version: WASMBOX_VERSION if set, else the binary's `--version` (2nd field) when it runs
# here, else Cargo.toml's [package] version.
wasmbox_version() {
  local bin="$1" root="$2" v=""
  if [ -n "${WASMBOX_VERSION:-}" ]; then echo "$WASMBOX_VERSION"; return; fi
  if v=$(timeout 30 "$bin" --version 2>/dev/null) && [[ "$v" =~ ^wasmbox\ ([0-9][0-9A-Za-z.+-]*)$ ]]; then
    echo "${BASH_REMATCH[1]}"
    return
  fi
  v=$(awk -F'"' '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { print $2; exit }' "$root/Cargo.toml")
  [ -n "$v" ] || return 1
  echo "$v"
}

# The strip program for TARGET's object format, or nothing (then the binary is copied as is).
# macOS binaries are not stripped: Apple silicon runs only signed code, and the linker's ad-hoc
# signature would no longer match; rustc keeps macOS debug info outside the binary anyway.
strip_tool() {
  local target="$1" host
  host=$(host_target 2>/dev/null || true)
  case "$target" in
    *-apple-darwin) return 0 ;;
    x86_64-pc-windows-gnu) for t in x86_64-w64-mingw32-strip llvm-strip; do command -v "$t" && return 0; done ;;
    aarch64-unknown-linux-gnu) for t in aarch64-linux-gnu-strip llvm-strip; do command -v "$t" && return 0; done ;;
    *) ;;
  esac
  if [ "$target" = "$host" ]; then
    for t in strip llvm-strip; do command -v "$t" && return 0; done
  elif [[ "$target" == *linux* ]]; then
    command -v llvm-strip && return 0
  fi
  return 0
}

# Copies BIN to OUT without its debug sections when a strip for TARGET is at hand; says which.
strip_binary() {
  local target="$1" bin="$2" out="$3" tool
  tool=$(strip_tool "$target")
  if [ -n "$tool" ] && "$tool" -o "$out" "$bin" 2>/dev/null; then
    echo "stripped with $(basename "$tool")"
  else
    cp "$bin" "$out"
    case "$target" in
      *-apple-darwin) echo "not stripped (macOS: keeps the linker's code signature)" ;;
      *) if [ -n "$tool" ]; then echo "NOT stripped ($(basename "$tool") failed)"; else echo "NOT stripped (no strip for $target here)"; fi ;;
    esac
  fi
  chmod 755 "$out"
}

# Fails unless BIN is an executable for TARGET's OS and CPU (ELF, PE or Mach-O header), so that
# a release never ships one target's binary under another's name.
check_binary_format() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
target, path = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    head = f.read(4096)
want = {"x86_64-unknown-linux-gnu": ("ELF", "x86_64"), "aarch64-unknown-linux-gnu": ("ELF", "aarch64"),
        "x86_64-apple-darwin": ("Mach-O", "x86_64"), "aarch64-apple-darwin": ("Mach-O", "aarch64"),
        "x86_64-pc-windows-gnu": ("PE", "x86_64")}[target]
got = ("unknown", "unknown")
if head[:4] == b"\x7fELF" and len(head) >= 20:
    machine = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)[0]
    got = ("ELF", {62: "x86_64", 183: "aarch64"}.get(machine, f"machine {machine}"))
elif head[:4] == b"\xcf\xfa\xed\xfe":
    cpu = struct.unpack_from("<I", head, 4)[0]
    got = ("Mach-O", {0x01000007: "x86_64", 0x0100000C: "aarch64"}.get(cpu, f"cputype {cpu:#x}"))
elif head[:2] == b"MZ" and len(head) >= 64:
    off = struct.unpack_from("<I", head, 60)[0]
    if head[off:off + 4] == b"PE\0\0":
        machine = struct.unpack_from("<H", head, off + 4)[0]
        got = ("PE", {0x8664: "x86_64", 0xAA64: "aarch64"}.get(machine, f"machine {machine:#x}"))
if got != want:
    sys.exit(f"{path} is {got[0]} for {got[1]}, not {want[0]} for {want[1]} ({target})")
PY
}

# Installs the Debian packages not yet installed (sudo when not root); the caller's `say` reports.
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]} (Debian)"
  local sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}
