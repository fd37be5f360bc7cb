"""The release and CI pipelines (.github/workflows/) cannot run here; what they run can:
actionlint (bin/actionlint, built by `make tools`) passes on them, every `make` target a
step calls exists and the release's steps build with the make targets tested here, and
`make krew` writes a krew manifest whose archive (a launcher) runs the installed plugin."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from unstick import __version__

ROOT = Path(__file__).parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
VENV_BIN = ROOT / ".venv" / "bin"


def steps(path: Path) -> list[dict[str, object]]:
    jobs = yaml.safe_load(path.read_text())["jobs"]
    return [step for job in jobs.values() for step in job["steps"]]


def test_actionlint_passes() -> None:
    actionlint = ROOT / "bin" / "actionlint"
    if not actionlint.exists():
        pytest.skip("bin/actionlint missing: run `make tools`")
    out = subprocess.run([str(actionlint), "-no-color", *map(str, WORKFLOWS)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_make_target_a_step_calls_exists() -> None:
    targets = set()
    for path in WORKFLOWS:
        for step in steps(path):
            targets |= set(re.findall(r"\bmake (?:-s )?([a-z][a-z-]*)", str(step.get("run", ""))))
    assert {"lint", "test-fast", "test-chart", "chart", "image", "dist", "krew", "version",
            "release-notes", "test"} <= targets  # fmt: skip
    for target in targets:
        dry = subprocess.run(["make", "-n", "-C", str(ROOT), target, "VERSION=v0.0.0"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "No rule to make target" not in dry.stderr, target


def test_the_release_publishes_what_make_builds() -> None:
    release = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
    assert release[True]["push"]["tags"] == ["v*.*.*"]  # `on:` is YAML 1.1's True
    runs = {name: "\n".join(str(s.get("run", "")) for s in job["steps"])
            for name, job in release["jobs"].items()}  # fmt: skip
    uses = {name: [str(s.get("uses", "")) for s in job["steps"]]
            for name, job in release["jobs"].items()}  # fmt: skip
    assert 'make image ARCHES="amd64 arm64" REQUIRE_ALL_ARCHES=1' in runs["image"]
    assert "skopeo copy --all" in runs["image"]
    assert {"anchore/sbom-action@v0", "actions/attest-sbom@v2",
            "actions/attest-build-provenance@v2"} <= set(uses["image"])  # fmt: skip
    assert "make chart" in runs["chart"] and "helm push" in runs["chart"]
    assert "helm/chart-releaser-action@v1" in uses["chart"]
    assert "make dist" in runs["pypi"]
    assert "pypa/gh-action-pypi-publish@release/v1" in uses["pypi"]
    assert "make krew" in runs["github-release"]
    assert "--notes-file release-notes.md" in runs["github-release"]
    assert "make -s release-notes" in runs["check"]


def test_make_krew_writes_a_manifest_whose_launcher_runs_the_plugin(tmp_path: Path) -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT), "krew", f"DIST={tmp_path}"], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    archive = tmp_path / "krew" / "kubectl-unstick.tar.gz"
    plugin = yaml.safe_load((tmp_path / "krew" / "unstick.yaml").read_text())
    assert plugin["kind"] == "Plugin" and plugin["metadata"]["name"] == "unstick"
    assert plugin["spec"]["version"] == f"v{__version__}"
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    for platform in plugin["spec"]["platforms"]:
        assert platform["sha256"] == sha
        assert platform["uri"].endswith(f"/v{__version__}/kubectl-unstick.tar.gz")
        assert platform["bin"] == "kubectl-unstick"
    labels = {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
              for p in plugin["spec"]["platforms"]}  # fmt: skip
    assert labels == {(o, a) for o in ("linux", "darwin") for a in ("amd64", "arm64")}
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["LICENSE", "kubectl-unstick"]
        tar.extractall(tmp_path / "x", filter="data")
    launcher = tmp_path / "x" / "kubectl-unstick"
    assert os.access(launcher, os.X_OK)
    # a venv that already holds the plugin (this one): the launcher only execs it
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "kubectl-unstick").symlink_to(VENV_BIN / "kubectl-unstick")
    env = {**os.environ, "KUBECTL_UNSTICK_VENV": str(venv)}
    out = subprocess.run([str(launcher), "--version"], capture_output=True, text=True,
                         env=env, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == f"unstick {__version__}", out.stderr
    # no venv yet and no Python to make one: one line, exit 2
    env = {**os.environ, "KUBECTL_UNSTICK_VENV": str(tmp_path / "none"), "PYTHON": "no-python"}
    out = subprocess.run([str(launcher), "status"], capture_output=True, text=True, env=env,
                         timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "kubectl unstick: needs no-python (Python >= 3.11) on PATH, or PYTHON=/path/to/python3"
    ]
