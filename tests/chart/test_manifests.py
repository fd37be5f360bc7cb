"""The generated files match their single sources: charts/unstick/crds/ and
manifests/crds.yaml are operator/unstick/crds/, manifests/unstick.yaml is the chart
rendered with default values. Run `make manifests` after changing either."""

from __future__ import annotations

import os
import subprocess

import yaml

from .render import REPO, template

SCRIPT = REPO / "hack" / "render-manifests.sh"


def _check(helm: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM": helm}
    return subprocess.run(
        ["bash", str(SCRIPT), "--check"], capture_output=True, text=True, env=env, timeout=120
    )


def test_generated_files_are_up_to_date(helm: str) -> None:
    proc = _check(helm)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_notices_drift(helm: str) -> None:
    # The check must be able to fail: edit a generated file, check, put it back.
    target = REPO / "manifests" / "unstick.yaml"
    original = target.read_bytes()
    try:
        target.write_bytes(original.replace(b"replicas: 1", b"replicas: 3", 1))
        proc = _check(helm)
    finally:
        target.write_bytes(original)
    assert proc.returncode == 1
    assert "replicas: 3" in proc.stdout
    assert "make manifests" in proc.stderr


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
        "clusterkopfpeerings.kopf.dev",
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
