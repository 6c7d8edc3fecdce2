#!/bin/sh
# Installs wasmbox from a release: downloads the archive for this machine, checks its SHA-256,
# puts the binary in ~/.local/bin, runs `wasmbox setup` and `wasmbox prepare` and prints the
# lines that point an assistant's client at it.
#
#   curl -fsSL https://github.com/OWNER/wasmbox/releases/latest/download/install.sh | sh
#
# Linux (glibc) and macOS, on x86_64 and arm64/aarch64. Windows: install.ps1.
#
# Settings (environment):
#   WASMBOX_RELEASE_URL  the folder of release files (default: the GitHub release,
#                        https://github.com/<repo>/releases/latest/download, or
#                        .../releases/download/v<version> when WASMBOX_VERSION is set)
#   WASMBOX_VERSION      the version to install (default: the newest in SHA256SUMS there)
#   WASMBOX_INSTALL_DIR  where the binary goes (default: $HOME/.local/bin)
#   WASMBOX_SKIP_SETUP=1 do not run `wasmbox setup` (a server sets itself up on first start)
#   WASMBOX_SETUP_ONLY   runtimes for setup to fetch now, e.g. python (setup's --only)
#   WASMBOX_SKIP_PREPARE=1 do not compile the runtimes now (the Python image: ~2 min on 2 cores;
#                        a server then builds it on first start, and clients give up on a call
#                        after 60 s)
#
# The release URL is a plain folder of files, which any static file server can serve (this is
# packaging/release.sh's OUTDIR): SHA256SUMS, and for each target
# wasmbox-<version>-<target>.tar.gz with its .sha256. Without WASMBOX_VERSION the version is
# read from SHA256SUMS's line for this target. The archive must match both its .sha256 and
# SHA256SUMS; on a mismatch nothing is installed.
set -eu

# The GitHub repository releases come from (packaging/release.sh writes it in).
WASMBOX_REPO_DEFAULT=OWNER/wasmbox

say() { printf 'wasmbox install: %s\n' "$*" >&2; }
die() {
  say "$*"
  exit 1
}
now() { date +%s; }

detect_target() {
  os=$(uname -s)
  arch=$(uname -m)
  case "$arch" in
    x86_64 | amd64) arch=x86_64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *) die "no wasmbox build for the $arch architecture (x86_64 and aarch64/arm64 only)" ;;
  esac
  case "$os" in
    Linux)
      if ldd --version 2>&1 | grep -qi musl; then
        die "this Linux uses musl libc; the wasmbox builds need glibc (build from source: cargo install)"
      fi
      echo "$arch-unknown-linux-gnu" ;;
    Darwin)
      # An x86_64 shell under Rosetta on Apple silicon: take the native build.
      if [ "$arch" = x86_64 ] && [ "$(sysctl -n sysctl.proc_translated 2>/dev/null || echo 0)" = 1 ]; then
        arch=aarch64
      fi
      echo "$arch-apple-darwin" ;;
    MINGW* | MSYS* | CYGWIN* | Windows_NT)
      die "on Windows, use PowerShell: irm <release URL>/install.ps1 | iex" ;;
    *) die "no wasmbox build for $os" ;;
  esac
}

download() { # URL FILE
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 2 -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q -O "$2" "$1"
  else
    die "needs curl or wget"
  fi
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  elif command -v openssl >/dev/null 2>&1; then
    openssl dgst -sha256 "$1" | sed 's/^.*= *//'
  else
    die "needs sha256sum, shasum or openssl to check the download"
  fi
}

# The newest version in SHA256SUMS for this target (numeric, field by field).
newest_version() { # SUMS TARGET
  sed -n "s/^[0-9a-f]\{64\}  \{0,1\}\*\{0,1\}wasmbox-\(.*\)-$2\.tar\.gz\$/\1/p" "$1" |
    awk '
      function newer(a, b,   x, y, n, m, i) {
        n = split(a, x, /[.-]/); m = split(b, y, /[.-]/)
        for (i = 1; i <= n || i <= m; i++) {
          if (x[i] == y[i]) continue
          if (x[i] ~ /^[0-9]+$/ && y[i] ~ /^[0-9]+$/) return x[i] + 0 > y[i] + 0
          return x[i] > y[i]
        }
        return 0
      }
      { if (best == "" || newer($0, best)) best = $0 }
      END { print best }'
}

main() {
  target=$(detect_target)
  if [ -n "${WASMBOX_VERSION:-}" ]; then WASMBOX_VERSION=${WASMBOX_VERSION#v}; fi
  if [ -n "${WASMBOX_RELEASE_URL:-}" ]; then
    url=${WASMBOX_RELEASE_URL%/}
  else
    case "$WASMBOX_REPO_DEFAULT" in
      OWNER/*) die "this install.sh names no release host (its repository is the placeholder $WASMBOX_REPO_DEFAULT): set WASMBOX_RELEASE_URL" ;;
    esac
    if [ -n "${WASMBOX_VERSION:-}" ]; then
      url="https://github.com/$WASMBOX_REPO_DEFAULT/releases/download/v$WASMBOX_VERSION"
    else
      url="https://github.com/$WASMBOX_REPO_DEFAULT/releases/latest/download"
    fi
  fi
  case "$url" in
    https://* | http://127.0.0.1[:/]* | http://localhost[:/]* | http://\[::1\][:/]*) ;;
    *) say "warning: $url is not https: the SHA-256 files come the same way, so they guard against a broken download, not a changed one" ;;
  esac
  dir=${WASMBOX_INSTALL_DIR:-${HOME:?HOME is not set}/.local/bin}
  tmp=$(mktemp -d 2>/dev/null || mktemp -d -t wasmbox)
  trap 'rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM
  t0=$(now)

  sums_sha=""
  if download "$url/SHA256SUMS" "$tmp/SHA256SUMS" 2>/dev/null; then
    version=${WASMBOX_VERSION:-$(newest_version "$tmp/SHA256SUMS" "$target")}
  else
    [ -n "${WASMBOX_VERSION:-}" ] || die "cannot read $url/SHA256SUMS to find the newest version (or set WASMBOX_VERSION)"
    version=$WASMBOX_VERSION
  fi
  [ -n "$version" ] || die "no build for $target at $url (SHA256SUMS lists none)"
  name="wasmbox-$version-$target"
  archive="$name.tar.gz"
  if [ -f "$tmp/SHA256SUMS" ]; then
    sums_sha=$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1; exit }' "$tmp/SHA256SUMS")
  fi

  say "downloading $archive from $url"
  download "$url/$archive" "$tmp/$archive" || die "cannot download $url/$archive"
  download "$url/$archive.sha256" "$tmp/$archive.sha256" || die "cannot download $url/$archive.sha256"
  want=$(awk 'NR == 1 { print $1 }' "$tmp/$archive.sha256")
  got=$(sha256_of "$tmp/$archive")
  case "$want" in
    [0-9a-f]*) [ ${#want} -eq 64 ] || die "$archive.sha256 holds no SHA-256; nothing installed" ;;
    *) die "$archive.sha256 holds no SHA-256; nothing installed" ;;
  esac
  if [ "$got" != "$want" ]; then
    die "SHA-256 MISMATCH for $archive: expected $want (its .sha256), got $got. The download is corrupt or was tampered with; nothing installed."
  fi
  if [ -n "$sums_sha" ] && [ "$sums_sha" != "$got" ]; then
    die "SHA-256 MISMATCH for $archive: SHA256SUMS says $sums_sha, the file is $got; nothing installed."
  fi
  say "SHA-256 checked: $got"

  mkdir "$tmp/x"
  tar -xzf "$tmp/$archive" -C "$tmp/x"
  new="$tmp/x/$name/wasmbox"
  [ -f "$new" ] || die "$archive holds no $name/wasmbox; nothing installed"
  chmod 755 "$new"
  ran=$("$new" --version 2>&1) || die "the downloaded binary does not run on this machine ($ran); nothing installed"
  case "$ran" in
    "wasmbox $version") ;;
    *) die "the downloaded binary says '$ran', not 'wasmbox $version'; nothing installed" ;;
  esac

  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # Beside it first, then renamed over any old one (a running server keeps its old file).
  cp "$new" "$dir/.wasmbox.new.$$"
  mv -f "$dir/.wasmbox.new.$$" "$dir/wasmbox"
  exe="$dir/wasmbox"
  say "installed $exe ($version) in $(($(now) - t0)) s"

  if [ "${WASMBOX_SKIP_SETUP:-0}" = 1 ]; then
    say "setup skipped (WASMBOX_SKIP_SETUP=1): a server fetches its runtimes on first start, or run: $exe setup"
  else
    t1=$(now)
    say "running wasmbox setup (the pinned runtimes, ~270 MB, each checked by SHA-256)"
    # From the install folder: in a wasmbox checkout, setup would fill the checkout's runtimes.
    if [ -n "${WASMBOX_SETUP_ONLY:-}" ]; then
      (cd "$dir" && "$exe" setup --only "$WASMBOX_SETUP_ONLY") || die "wasmbox setup failed; wasmbox is installed, run again: $exe setup"
    else
      (cd "$dir" && "$exe" setup) || die "wasmbox setup failed; wasmbox is installed, run again: $exe setup"
    fi
    say "setup done in $(($(now) - t1)) s"
    if [ "${WASMBOX_SKIP_PREPARE:-0}" = 1 ]; then
      say "prepare skipped (WASMBOX_SKIP_PREPARE=1): the first start builds the Python image"
    else
      t2=$(now)
      say "compiling the runtimes once (the Python image: about 2 minutes on 2 cores), so an assistant's first call answers at once"
      if (cd "$dir" && "$exe" prepare); then
        prepared=1
        say "prepare done in $(($(now) - t2)) s"
      else
        say "wasmbox prepare failed; the first start will try again, or run: $exe prepare"
      fi
    fi
  fi

  cat <<EOF

wasmbox $version is installed at $exe

Point your assistant at it:

  Claude Code:
    claude mcp add wasmbox -- $exe serve

  Claude Desktop (claude_desktop_config.json), Cursor (~/.cursor/mcp.json):
    { "mcpServers": { "wasmbox": { "command": "$exe", "args": ["serve"] } } }

  VS Code (.vscode/mcp.json):
    { "servers": { "wasmbox": { "type": "stdio", "command": "$exe", "args": ["serve"] } } }

Try it:  $exe run --language python --code 'import pandas as pd; print(pd.__version__)'
EOF
  [ "${prepared:-0}" = 1 ] || echo "(the first Python run prepares its image once: about 2 minutes on 2 cores)"
  case ":${PATH:-}:" in
    *":$dir:"*) ;;
    *)
      cat <<EOF

Note: $dir is not on your PATH. To run plain \`wasmbox\`, add to your shell's profile:
  export PATH="$dir:\$PATH"
EOF
      ;;
  esac
}

main "$@"
