#!/usr/bin/env python3
"""`make dist`: the sdist and the wheel of unstick into DIST (default dist/), what the
release workflow uploads to PyPI. Built with setuptools' own PEP 517 hooks in a copy of
the sources (nothing is written into the work tree but DIST), without build isolation:
the venv's setuptools is the backend, so nothing is downloaded. The wheel is then built
again from the sdist and must hold the same files: an sdist that misses a file fails here,
not on a user's machine.

    hack/build-dist.py [DIST]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "operator")
HOOKS = "import sys; from setuptools import build_meta as b; f = getattr(b, sys.argv[1])\n"
HOOKS += "print(f(sys.argv[2]))"


def hook(src: Path, name: str, out: Path) -> Path:
    """Run one PEP 517 hook of the backend in `src`; the file it wrote in `out`."""
    proc = subprocess.run(
        [sys.executable, "-c", HOOKS, name, str(out)],
        cwd=src, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"make dist: {name} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return out / proc.stdout.strip().splitlines()[-1]


def main() -> int:
    dist = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist").resolve()
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unstick-dist-") as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        src.mkdir()
        out.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in SOURCES:
            path = ROOT / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=ignore)
            else:
                shutil.copy2(path, src / name)
        sdist = hook(src, "build_sdist", out)
        wheel = hook(src, "build_wheel", out)
        # the same wheel again, from the unpacked sdist
        again = Path(tmp) / "again"
        again.mkdir()
        with tarfile.open(sdist) as tar:
            tar.extractall(again, filter="data")
        (unpacked,) = again.iterdir()
        rebuilt_dir = Path(tmp) / "rebuilt"
        rebuilt_dir.mkdir()
        rebuilt = hook(unpacked, "build_wheel", rebuilt_dir)
        first, second = (sorted(zipfile.ZipFile(w).namelist()) for w in (wheel, rebuilt))
        if first != second:
            missing = sorted(set(first) ^ set(second))
            sys.exit(f"make dist: the wheel built from the sdist differs: {missing[:20]}")
        for built in (sdist, wheel):
            shutil.copy2(built, dist / built.name)
            print(dist / built.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
