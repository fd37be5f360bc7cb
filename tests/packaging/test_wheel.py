"""`pip install` of the wheel gives a working CLI outside the repo: the wheel is built from
a copy of the sources, installed (with its dependencies) into a fresh venv in a temporary
directory, and its console scripts run from there — `unstick --help`, `unstick --version`,
`kubectl-unstick --help`, and an offline `unstick diagnose` of a scenario bundle. The
package data (CRDs, protos) is in the wheel and readable when installed; the dev harness
(devcluster, demo) is not in it, and `unstick demo` says where the demo runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from unstick import __version__

ROOT = Path(__file__).parents[2]
PACKAGE_DATA = (
    "unstick/crds/remediations.yaml",
    "unstick/crds/remediationpolicies.yaml",
    "unstick/agent/proto/csi.proto",
    "unstick/agent/proto/cri.proto",
    "unstick/agent/proto/pluginregistration.proto",
    "unstick/py.typed",
)


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the sources (nothing written into the repo), with the build
    backend of the project's venv (no download for the build itself)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "operator", src / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # fmt: skip
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(dist), str(src)], cwd=src)  # fmt: skip
    (whl,) = dist.glob("unstick-*.whl")
    return whl


def test_the_wheel_holds_the_package_data_and_both_entry_points(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in PACKAGE_DATA if p not in names]
    assert missing == []
    harness = sorted(n for n in names if n.startswith(("devcluster/", "devcluster/demo/")))
    assert harness == []
    entry_points = (
        zipfile.ZipFile(wheel).read(f"unstick-{__version__}.dist-info/entry_points.txt").decode()
    )
    assert "unstick = unstick.cli:main" in entry_points
    assert "kubectl-unstick = unstick.cli:kubectl_main" in entry_points


def test_installed_in_a_fresh_venv_the_cli_works(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q",
          "--disable-pip-version-check", str(wheel)], cwd=tmp_path)  # fmt: skip
    outside = tmp_path  # not the repo: nothing can come from the source tree
    helped = _run([str(bin_dir / "unstick"), "--help"], cwd=outside)
    assert "diagnose" in helped.stdout and "why" in helped.stdout
    version = _run([str(bin_dir / "unstick"), "--version"], cwd=outside)
    assert version.stdout.strip() == f"unstick {__version__}"
    plugin = _run([str(bin_dir / "kubectl-unstick"), "--help"], cwd=outside)
    assert plugin.stdout.startswith("usage: kubectl unstick")
    scenario = ROOT / "tests" / "scenarios" / "node-gone-with-allowlisted-finalizer.json"
    shutil.copy2(scenario, outside / "bundle.json")
    report = _run([str(bin_dir / "unstick"), "diagnose", "--snapshot", "bundle.json",
                   "--output", "json"], cwd=outside)  # fmt: skip
    assert '"cause": "NodeGone"' in report.stdout
    code = (
        "import unstick, importlib.resources as r; print(unstick.__file__); "
        "crd = r.files('unstick').joinpath('crds/remediations.yaml').read_text(); "
        "print(crd.count('kind: CustomResourceDefinition'))"
    )
    where = _run([str(bin_dir / "python"), "-c", code], cwd=outside)
    assert str(env_dir) in where.stdout.splitlines()[0]
    assert where.stdout.splitlines()[1] == "1"
    demo = subprocess.run(
        [str(bin_dir / "unstick"), "demo"], cwd=outside, capture_output=True, text=True
    )
    assert demo.returncode == 2, demo.stderr
    assert "make demo" in demo.stderr and "Traceback" not in demo.stderr
