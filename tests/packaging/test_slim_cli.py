"""`pip install unstick` is the CLI alone: the wheel installed into a fresh venv brings
kubernetes, tenacity and PyYAML but not Kopf, gRPC, protobuf or prometheus-client (the
`server` extra, which the image installs); the user's commands work without them, and
`unstick controller` / `unstick agent` say in one line what to install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from unstick import __version__

ROOT = Path(__file__).parents[2]
SERVER_ONLY = ("kopf", "grpc", "google.protobuf", "prometheus_client", "pythonjsonlogger")


@pytest.fixture(scope="module")
def slim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, str(ROOT / "hack" / "build-dist.py"), str(dist)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    out = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return env_dir / "bin"


def run(bin_dir: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=cwd, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_the_server_libraries_are_not_installed(slim: Path, tmp_path: Path) -> None:
    for module in SERVER_ONLY:
        found = run(slim, tmp_path, "python", "-c", f"import {module}")
        assert found.returncode != 0, f"{module} is installed by pip install unstick"
    deps = run(slim, tmp_path, "python", "-c", "import kubernetes, tenacity, yaml")
    assert deps.returncode == 0, deps.stderr


def test_the_users_commands_work(slim: Path, tmp_path: Path) -> None:
    shutil.copy2(ROOT / "tests/scenarios/node-gone-with-allowlisted-finalizer.json",
                 tmp_path / "bundle.json")  # fmt: skip
    report = run(slim, tmp_path, "unstick", "diagnose", "--snapshot", "bundle.json", "-o", "json")
    assert report.returncode == 0 and '"cause": "NodeGone"' in report.stdout, report.stderr
    helped = run(slim, tmp_path, "kubectl-unstick", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: kubectl unstick")
    broken = run(slim, tmp_path, "unstick", "status", "--kubeconfig", "nope.yaml")
    assert broken.returncode == 2 and len(broken.stderr.splitlines()) == 1, broken.stderr
    assert run(slim, tmp_path, "unstick", "--version").stdout.strip() == f"unstick {__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ("unstick", "controller", "--kubeconfig", "kubeconfig", "--standalone"),
        ("unstick", "agent", "--node-name", "n1", "--mountinfo", "/proc/self/mountinfo"),
    ],
    ids=["controller", "agent"],
)
def test_the_server_commands_say_what_to_install(
    slim: Path, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    out = run(slim, tmp_path, *argv)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"unstick {argv[1]}: needs the server parts of unstick (missing: ")
    assert line.endswith("pip install 'unstick[server]'")
