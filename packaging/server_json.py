#!/usr/bin/env python3
"""server.json, the entry for the official MCP registry (registry.modelcontextprotocol.io).

  server_json.py check FILE...
      Validates each FILE against packaging/server.schema.json (the registry's published schema,
      a copy: docs/install.md says where from) with `jsonschema`, plus the registry's own rules
      that the schema does not carry: $schema names the copy's $id, an MCP bundle is an https
      URL containing "mcp" with its fileSha256, and no package version is "latest".
  server_json.py release TEMPLATE OUTDIR VERSION REPO DOWNLOAD_URL
      Writes OUTDIR/server.json for a release: TEMPLATE (the repo's server.json) with the
      version, name and repository for REPO (owner/name on GitHub), one "mcpb" package for each
      wasmbox-VERSION-*.mcpb in OUTDIR (DOWNLOAD_URL/<file>, its SHA-256), the others (the PyPI
      wheel) at VERSION. Standard library only.
"""

import copy
import glob
import hashlib
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "server.schema.json")


def pep440(version):
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:-(alpha|beta|rc)\.?(\d+))?", version)
    if not m:
        return version
    base, pre, n = m.groups()
    return base + ({"alpha": "a", "beta": "b", "rc": "rc"}[pre] + n if pre else "")


def check(paths):
    import jsonschema  # from the venv packaging/check-server-json.sh makes

    with open(SCHEMA) as f:
        schema = json.load(f)
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    failed = False
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        problems = [
            f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        ]
        if doc.get("$schema") != schema["$id"]:
            problems.append(f"$schema is {doc.get('$schema')!r}, the schema kept here is {schema['$id']}")
        for i, pkg in enumerate(doc.get("packages", [])):
            where = f"packages/{i}"
            if pkg.get("version") == "latest":
                problems.append(f"{where}: version 'latest' is reserved")
            if pkg.get("registryType") == "mcpb":
                ident = pkg.get("identifier", "")
                if not ident.startswith("https://"):
                    problems.append(f"{where}: an MCP bundle's identifier must be an https URL")
                if "mcp" not in ident.lower():
                    problems.append(f"{where}: an MCP bundle's URL must contain 'mcp'")
                if "fileSha256" not in pkg:
                    problems.append(f"{where}: an MCP bundle needs its fileSha256")
        if problems:
            failed = True
            print(f"{path}: INVALID against {schema['$id']}")
            for p in problems:
                print(f"  {p}")
        else:
            print(f"{path}: valid against {schema['$id']} ({len(doc.get('packages', []))} packages)")
    return 1 if failed else 0


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release(template, outdir, version, repo, download_url):
    with open(template) as f:
        doc = json.load(f)
    owner = repo.split("/")[0]
    doc["name"] = f"io.github.{owner}/{doc['name'].split('/', 1)[1]}"
    doc["repository"]["url"] = f"https://github.com/{repo}"
    doc["version"] = version
    mcpb_template = next(p for p in doc["packages"] if p["registryType"] == "mcpb")
    packages = []
    for bundle in sorted(glob.glob(os.path.join(outdir, f"wasmbox-{version}-*.mcpb"))):
        pkg = copy.deepcopy(mcpb_template)
        pkg["identifier"] = f"{download_url.rstrip('/')}/{os.path.basename(bundle)}"
        pkg["version"] = version
        pkg["fileSha256"] = sha256(bundle)
        packages.append(pkg)
    for pkg in doc["packages"]:
        if pkg["registryType"] == "mcpb":
            continue
        pkg = copy.deepcopy(pkg)
        pkg["version"] = pep440(version) if pkg["registryType"] == "pypi" else version
        packages.append(pkg)
    doc["packages"] = packages
    out = os.path.join(outdir, "server.json")
    with open(out + ".part", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(out + ".part", out)
    print(out)
    return 0


def main(argv):
    if argv[:1] == ["check"] and len(argv) > 1:
        return check(argv[1:])
    if argv[:1] == ["release"] and len(argv) == 6:
        return release(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
