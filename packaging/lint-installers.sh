#!/usr/bin/env bash
# Lints the release scripts without running them: shellcheck (Debian's, installed when missing)
# on install.sh as POSIX sh and on the bash scripts, and a parse of install.ps1 with the
# tree-sitter PowerShell grammar (PyPI, in a venv: no PowerShell runs on this machine), which
# fails on any syntax error.
# Usage: packaging/lint-installers.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! command -v shellcheck >/dev/null; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq shellcheck >/dev/null
fi
shellcheck -s sh packaging/install.sh
shellcheck -x -s bash packaging/release.sh packaging/common.sh packaging/mcpb/pack.sh \
  packaging/check-server-json.sh packaging/test-install.sh packaging/lint-installers.sh
echo "shellcheck: clean (install.sh as POSIX sh, the rest as bash)"

venv="${WASMBOX_PSPARSE_VENV:-${TMPDIR:-/tmp}/wasmbox-psparse-venv}"
if ! "$venv/bin/python" -c 'import tree_sitter, tree_sitter_powershell' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'tree-sitter>=0.23,<1' 'tree-sitter-powershell==0.26.4'
fi
"$venv/bin/python" - packaging/install.ps1 <<'EOF'
import sys
import tree_sitter
import tree_sitter_powershell

parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))
path = sys.argv[1]
src = open(path, "rb").read()
lines = src.split(b"\n")
errors = []


def walk(node):
    if node.type == "ERROR" or node.is_missing:
        row, col = node.start_point
        what = f"missing {node.type}" if node.is_missing else "syntax error"
        errors.append(f"{path}:{row + 1}:{col + 1}: {what}: {lines[row].decode().strip()[:100]}")
    for child in node.children:
        walk(child)


walk(parser.parse(src).root_node)
print("\n".join(errors) if errors else f"{path}: parses (tree-sitter PowerShell grammar)")
sys.exit(1 if errors else 0)
EOF
