#!/usr/bin/env python3
"""Writes a wheel around a prebuilt wasmbox binary, the way maturin's `bindings = "bin"` lays
one out (the binary in <name>-<v>.data/scripts/, so pip puts it on the environment's PATH), but
without compiling: maturin always runs cargo itself.

Usage: packaging/wheel.py BINARY VERSION PLATFORM_TAG OUTDIR [--server-name NAME]
  PLATFORM_TAG e.g. manylinux_2_17_x86_64, macosx_11_0_arm64, win_amd64.
Prints the wheel's path. Standard library only.
"""

import base64
import hashlib
import os
import re
import sys
import zipfile

NAME = "wasmbox"
SUMMARY = "Local WebAssembly code sandbox for AI assistants (MCP server)"
# The zip entries' time: fixed, so that the same inputs give the same wheel.
EPOCH = (2020, 1, 1, 0, 0, 0)


def pep440(version):
    """Cargo's semver as PEP 440: 1.2.3 stays, 1.2.3-alpha.1 becomes 1.2.3a1 (rc, beta alike)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:-(alpha|beta|rc)\.?(\d+))?", version)
    if not m:
        sys.exit(f"wheel.py: cannot express version {version!r} in PEP 440")
    base, pre, n = m.groups()
    return base + ({"alpha": "a", "beta": "b", "rc": "rc"}[pre] + n if pre else "")


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def metadata(version, platform, server_name):
    os_classifier = {
        "manylinux": "Operating System :: POSIX :: Linux",
        "macosx": "Operating System :: MacOS",
        "win": "Operating System :: Microsoft :: Windows",
    }[next(k for k in ("manylinux", "macosx", "win") if platform.startswith(k))]
    # The official MCP registry checks a PyPI package's ownership by finding
    # "mcp-name: <server name>" in its description.
    description = f"""# wasmbox

A local, WebAssembly-based code-execution sandbox for AI assistants, served over MCP: Python
(numpy, pandas, scipy, scikit-learn, matplotlib), JavaScript and Go, run offline in wasmtime
with no network, no host environment and only its own `/workspace`.

This wheel carries the prebuilt `wasmbox` binary. With uv: `uvx wasmbox serve` (MCP over
stdio). The binary fetches its pinned runtimes on first use (`wasmbox setup`, about 270 MB,
each checked by SHA-256).

<!-- mcp-name: {server_name} -->
"""
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {version}\n"
        f"Summary: {SUMMARY}\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.8\n"
        "Classifier: Programming Language :: Rust\n"
        f"Classifier: {os_classifier}\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + description
    )


def main(argv):
    args = list(argv)
    server_name = "io.github.OWNER/wasmbox"
    if "--server-name" in args:
        i = args.index("--server-name")
        server_name = args[i + 1]
        del args[i : i + 2]
    if len(args) != 4:
        sys.exit(__doc__)
    binary, version, platform, outdir = args
    version = pep440(version)
    exe = "wasmbox.exe" if platform.startswith("win") else "wasmbox"
    tag = f"py3-none-{platform}"
    dist_info = f"{NAME}-{version}.dist-info"
    wheel_text = (
        "Wheel-Version: 1.0\n"
        "Generator: wasmbox packaging/wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    )
    license_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "LICENSE")
    with open(binary, "rb") as f:
        binary_bytes = f.read()
    with open(license_path, "rb") as f:
        license_bytes = f.read()
    files = [
        (f"{NAME}-{version}.data/scripts/{exe}", binary_bytes, 0o755),
        (f"{dist_info}/METADATA", metadata(version, platform, server_name).encode(), 0o644),
        (f"{dist_info}/WHEEL", wheel_text.encode(), 0o644),
        (f"{dist_info}/LICENSE", license_bytes, 0o644),
    ]
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data, _ in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode(), 0o644))

    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"{NAME}-{version}-{tag}.whl")
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, path)
    print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
