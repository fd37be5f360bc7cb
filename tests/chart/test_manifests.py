"""The generated files match their single sources: charts/unstick/crds/ and
manifests/crds.yaml are operator/unstick/crds/, manifests/unstick.yaml is the chart
rendered with default values. Run `make manifests` after changing either."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from .render import REPO, template


def _check(helm: str, root: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM": helm}
    return subprocess.run(
        ["bash", str(root / "hack" / "render-manifests.sh"), "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_generated_files_are_up_to_date(helm: str) -> None:
    proc = _check(helm)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_notices_drift(helm: str, tmp_path: Path) -> None:
    # The check must be able to fail: a copy of the sources with one generated file
    # edited (the working tree is left alone).
    for part in ("hack", "charts", "manifests", "operator/unstick/crds"):
        shutil.copytree(REPO / part, tmp_path / part)
    assert _check(helm, tmp_path).returncode == 0
    target = tmp_path / "manifests" / "unstick.yaml"
    target.write_text(target.read_text().replace("replicas: 2", "replicas: 3", 1))
    proc = _check(helm, tmp_path)
    assert proc.returncode == 1
    assert "replicas: 3" in proc.stdout
    assert "make manifests" in proc.stderr


def test_check_notices_a_crd_changed_at_its_source(helm: str, tmp_path: Path) -> None:
    for part in ("hack", "charts", "manifests", "operator/unstick/crds"):
        shutil.copytree(REPO / part, tmp_path / part)
    source = tmp_path / "operator/unstick/crds/remediations.yaml"
    source.write_text(source.read_text() + "# changed at the source\n")
    proc = _check(helm, tmp_path)
    assert proc.returncode == 1
    assert "+# changed at the source" in proc.stdout
    assert "charts/unstick/crds" in proc.stdout and "manifests/crds.yaml" in proc.stdout


def test_chart_crds_are_the_operator_crds() -> None:
    source = sorted(p.name for p in (REPO / "operator" / "unstick" / "crds").glob("*.yaml"))
    copied = sorted(p.name for p in (REPO / "charts" / "unstick" / "crds").iterdir())
    assert source == copied
    for name in source:
        assert (REPO / "charts/unstick/crds" / name).read_bytes() == (
            REPO / "operator/unstick/crds" / name
        ).read_bytes(), name


def test_manifests_hold_every_crd_and_the_default_install(helm: str) -> None:
    crds = [d for d in yaml.safe_load_all((REPO / "manifests/crds.yaml").read_text()) if d]
    assert {d["metadata"]["name"] for d in crds} >= {
        "remediations.unstick.dev",
        "remediationpolicies.unstick.dev",
    }
    assert {d["kind"] for d in crds} == {"CustomResourceDefinition"}
    docs = [d for d in yaml.safe_load_all((REPO / "manifests/unstick.yaml").read_text()) if d]
    assert docs[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "unstick",
            "labels": {
                "app.kubernetes.io/name": "unstick",
                "app.kubernetes.io/part-of": "unstick",
                "pod-security.kubernetes.io/enforce": "privileged",
            },
        },
    }
    assert docs[1:] == template(helm)
