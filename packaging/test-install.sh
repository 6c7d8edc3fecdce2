#!/usr/bin/env bash
# The installer, end to end, against a local release host: packaging/release.sh writes this
# machine's release into a temp folder, python3's http.server serves it on 127.0.0.1 (a free
# port), and install.sh, piped from that server into sh as the install docs say, installs into
# an empty HOME (a clean environment: no XDG or WASMBOX settings). Then the installed binary
# answers a pandas question from that HOME. Prints the time of each phase.
# Before that, two hostile releases must be refused with nothing installed: an archive altered
# after its .sha256 was written, and one whose .sha256 was rewritten to match but SHA256SUMS
# was not.
# Usage: packaging/test-install.sh [BINARY]   (default $WASMBOX_BIN, else target/release/wasmbox)
#   Needs the network for setup (~270 MB from PyPI and crates.io) and node for the bundle; the
#   first Python run builds its image (a few minutes on 2 cores). KEEP=1 keeps the temp folder.
#   QUICK=1 stops after the install (WASMBOX_SKIP_SETUP=1, then `wasmbox --version` from the
#   empty HOME): no network, about 30 s, for CI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=packaging/common.sh
. "$root/packaging/common.sh"
bin="${1:-${WASMBOX_BIN:-$root/target/release/wasmbox}}"
[ -x "$bin" ] || { echo "test-install.sh: no binary at $bin (cargo build --release)" >&2; exit 1; }
target="$(host_target)"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
say() { echo "== $*"; }
fail() { echo "test-install.sh: FAIL: $*" >&2; exit 1; }
ms() { date +%s%N | cut -b1-13; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }

# A clean user: an empty HOME and only the basic environment.
clean_env() { # HOME, then the command
  local home="$1"
  shift
  env -i HOME="$home" PATH="/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 USER="${USER:-root}" \
    TMPDIR="${TMPDIR:-/tmp}" "$@"
}

say "release for $target from $bin"
t=$(ms)
www="$work/www"
WASMBOX_BIN="$bin" "$root/packaging/release.sh" "$target" "$www/good"
release_s=$(secs "$t" "$(ms)")
archive="$(cd "$www/good" && ls wasmbox-*-"$target".tar.gz)"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$www" "$port" >"$work/http.log" 2>&1 &
server_pid=$!
for _ in $(seq 50); do
  curl -fs "http://127.0.0.1:$port/good/SHA256SUMS" >/dev/null && break
  sleep 0.2
done
curl -fs "http://127.0.0.1:$port/good/SHA256SUMS" >/dev/null || fail "the local server did not start"
say "serving $www at http://127.0.0.1:$port"

# Installs from URL into the empty HOME; the installer's output in $work/<label>.log.
install_from() { # LABEL URL HOME [VAR=VALUE ...]
  local label="$1" url="$2" home="$3"
  shift 3
  curl -fsSL "http://127.0.0.1:$port/good/install.sh" |
    clean_env "$home" env WASMBOX_RELEASE_URL="$url" "$@" sh >"$work/$label.log" 2>&1
}

refused_untouched() { # LABEL HOME WHAT
  local label="$1" home="$2" what="$3"
  sed 's/^/   | /' "$work/$label.log"
  grep -q "MISMATCH" "$work/$label.log" || fail "$what: no SHA-256 mismatch reported"
  grep -q "nothing installed" "$work/$label.log" || fail "$what: not told that nothing was installed"
  [ -z "$(find "$home" -mindepth 1 -print -quit)" ] || fail "$what: something was written into HOME: $(find "$home" -mindepth 1)"
  say "refused, HOME still empty: $what"
}

say "hostile 1: the archive altered after its .sha256 was written"
cp -r "$www/good" "$www/bad"
python3 - "$www/bad/$archive" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0xFF
open(p, "wb").write(bytes(b))
EOF
home="$work/home-bad"
mkdir "$home"
if install_from bad "http://127.0.0.1:$port/bad" "$home"; then fail "a tampered archive was installed"; fi
refused_untouched bad "$home" "archive altered"

say "hostile 2: the .sha256 rewritten to match the altered archive, SHA256SUMS not"
cp -r "$www/bad" "$www/bad2"
(cd "$www/bad2" && sha256sum "$archive" >"$archive.sha256")
home="$work/home-bad2"
mkdir "$home"
if install_from bad2 "http://127.0.0.1:$port/bad2" "$home"; then fail "an archive at odds with SHA256SUMS was installed"; fi
refused_untouched bad2 "$home" "SHA256SUMS disagrees"

say "install from the local release into an empty HOME (curl .../install.sh | sh)"
home="$work/home"
mkdir "$home"
t=$(ms)
quick=()
[ "${QUICK:-0}" != 1 ] || quick=(WASMBOX_SKIP_SETUP=1)
install_from good "http://127.0.0.1:$port/good" "$home" "${quick[@]}" || { sed 's/^/   | /' "$work/good.log"; fail "install.sh failed"; }
install_total_s=$(secs "$t" "$(ms)")
sed 's/^/   | /' "$work/good.log"
exe="$home/.local/bin/wasmbox"
[ -x "$exe" ] || fail "no $exe"
grep -q "claude mcp add wasmbox -- $exe serve" "$work/good.log" || fail "no Claude Code line with the installed path"
grep -q "\"command\": \"$exe\"" "$work/good.log" || fail "no JSON config line with the installed path"
grep -q "is not on your PATH" "$work/good.log" || fail "no note that $home/.local/bin is not on PATH"
if [ "${QUICK:-0}" = 1 ]; then
  version=$(cd "$home" && clean_env "$home" "$exe" --version) || fail "the installed binary does not run"
  [ "$archive" = "${version/ /-}-$target.tar.gz" ] || fail "the installed binary says '$version'"
  say "passed (QUICK: no setup, no answer): $archive installed into an empty HOME; tampered releases refused"
  printf '%-46s %8s s\n' "release.sh (archive, bundle, wheel)" "$release_s" "install.sh (download, check, install)" "$install_total_s"
  echo "test-install.sh: passed"
  exit 0
fi
runtimes="$home/.local/share/wasmbox/runtimes"
[ -f "$runtimes/.verified.json" ] || fail "setup left no $runtimes/.verified.json"
download_s=$(sed -n 's/.*installed .* in \([0-9]*\) s$/\1/p' "$work/good.log")
setup_s=$(sed -n 's/.*setup done in \([0-9]*\) s$/\1/p' "$work/good.log")
prepare_s=$(sed -n 's/.*prepare done in \([0-9]*\) s$/\1/p' "$work/good.log")
[ -n "$prepare_s" ] || fail "install.sh did not run wasmbox prepare"

say "first answer: pandas, from the empty HOME"
t=$(ms)
answer=$(cd "$home" && clean_env "$home" "$exe" run --language python \
  --code 'import pandas as pd; print(pd.DataFrame({"a":[1,2]}).a.sum())' 2>"$work/run.err") ||
  { cat "$work/run.err" >&2; fail "wasmbox run failed"; }
answer_s=$(secs "$t" "$(ms)")
[ "$answer" = 3 ] || { cat "$work/run.err" >&2; fail "the answer was '$answer', not 3"; }
t=$(ms)
again=$(cd "$home" && clean_env "$home" "$exe" run --language python \
  --code 'import pandas as pd; print(pd.DataFrame({"a":[1,2]}).a.sum())' 2>/dev/null)
again_s=$(secs "$t" "$(ms)")
[ "$again" = 3 ] || fail "the second answer was '$again', not 3"

say "passed: $archive from a local release host into an empty HOME; tampered releases refused"
printf '%-46s %8s s\n' \
  "release.sh (archive, bundle, wheel)" "$release_s" \
  "install.sh in all" "$install_total_s" \
  "  download, check, install" "${download_s:-?}" \
  "  wasmbox setup" "${setup_s:-?}" \
  "  wasmbox prepare (the Python image built)" "$prepare_s" \
  "first answer (pandas)" "$answer_s" \
  "second answer" "$again_s"
echo "test-install.sh: passed"
