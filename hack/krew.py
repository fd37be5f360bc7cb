#!/usr/bin/env python3
"""`make krew`: the krew plugin of a release into DIST/krew/ (default dist/krew/):
kubectl-unstick.tar.gz (the launcher hack/krew/kubectl-unstick, which makes a venv with
unstick from PyPI on first use, and LICENSE) and unstick.yaml, the krew manifest naming
that archive at the GitHub release of the version, with its sha256, for linux and darwin
on amd64 and arm64 (the same archive: the launcher is a shell script).

    hack/krew.py [DIST]
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASES = "https://github.com/unstick-dev/unstick/releases/download"
PLATFORMS = [(os_, arch) for os_ in ("linux", "darwin") for arch in ("amd64", "arm64")]


def version() -> str:
    match = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def archive(ver: str) -> bytes:
    """A reproducible tar.gz: fixed times, owners and order."""
    launcher = (ROOT / "hack" / "krew" / "kubectl-unstick").read_text().replace("@VERSION@", ver)
    members = [("kubectl-unstick", launcher.encode(), 0o755),
               ("LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644)]  # fmt: skip
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def manifest(ver: str, sha256: str) -> str:
    platforms = "".join(
        f"    - selector:\n        matchLabels:\n          os: {os_}\n          arch: {arch}\n"
        f"      uri: {RELEASES}/v{ver}/kubectl-unstick.tar.gz\n"
        f"      sha256: {sha256}\n      bin: kubectl-unstick\n"
        for os_, arch in PLATFORMS
    )
    text = (ROOT / "hack" / "krew" / "unstick.yaml").read_text()
    return text.replace("@VERSION@", ver).replace("@PLATFORMS@\n", platforms)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist").resolve() / "krew"
    out.mkdir(parents=True, exist_ok=True)
    ver = version()
    data = archive(ver)
    (out / "kubectl-unstick.tar.gz").write_bytes(data)
    (out / "unstick.yaml").write_text(manifest(ver, hashlib.sha256(data).hexdigest()))
    for name in ("kubectl-unstick.tar.gz", "unstick.yaml"):
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
