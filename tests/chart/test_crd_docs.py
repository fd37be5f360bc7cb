"""`kubectl explain` works on unstick's kinds: every field of the Remediation and
RemediationPolicy schemas has a description (the CRDs' single source,
operator/unstick/crds/), and the API server serves them (kubectl explain against the test
API server). And the CRD upgrade step of docs/upgrading.md: `kubectl apply --server-side
--force-conflicts` of the chart's crds/ over CRDs an older version put there (the test API
server's, changed) brings them to the chart's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import crds_installed

from .render import CHART, REPO

SOURCES = sorted((REPO / "operator" / "unstick" / "crds").glob("remediation*.yaml"))


def undescribed(node: dict[str, Any], path: str) -> list[str]:
    missing = [] if node.get("description") else [path]
    for key, child in (node.get("properties") or {}).items():
        missing += undescribed(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        missing += undescribed(node["items"], f"{path}[]")
    return missing


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_field_has_a_description(source: Path) -> None:
    for crd in yaml.safe_load_all(source.read_text()):
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert undescribed(schema, crd["spec"]["names"]["kind"]) == []


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> Iterator[None]:
    with crds_installed(control_plane):
        yield


@pytest.mark.envtest
@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("remediation", "One stuck pod (or one node incident)"),
        ("remediation.spec.podUID", "The stuck pod's UID"),
        ("remediation.status.probe.holders.via", "How it holds it"),
        ("remediation.status.actions.result", "deleting / removing: an intent"),
        ("remediationpolicy.spec.rateLimits.nodePerMinute", "Actions per minute on one node"),
        ("remediationpolicy.spec.namespaceSelector.matchExpressions.operator", "In, NotIn"),
    ],
)
def test_kubectl_explain(control_plane: ControlPlane, crds: None, field: str, says: str) -> None:
    text = explained(control_plane, field, says)
    assert says in text


def explained(cp: ControlPlane, field: str, says: str) -> str:
    """`kubectl explain FIELD` once it says `says`: the API server publishes a CRD's
    OpenAPI a moment after the CRD changes."""

    def ready() -> str | None:
        out = cp.kubectl("explain", field, check=False)
        text = " ".join(out.stdout.split())
        return text if out.returncode == 0 and says in text else None

    return wait_until(ready, timeout=60, what=f"kubectl explain {field} to say {says!r}")


@pytest.mark.envtest
def test_the_documented_crd_upgrade_applies_over_an_older_crd(
    control_plane: ControlPlane, crds: None
) -> None:
    """An older CRD (here: the same one without the description of spec.podUID and with a
    field fewer) is brought to the chart's by the command of docs/upgrading.md."""
    upgrading = (REPO / "docs" / "upgrading.md").read_text()
    assert "kubectl apply --server-side --force-conflicts -f unstick/crds/" in upgrading
    name = "remediations.unstick.dev"
    current = json.loads(control_plane.kubectl("get", "crd", name, "-o", "json").stdout)
    older = yaml.safe_load((CHART / "crds" / "remediations.yaml").read_text())
    spec = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    del spec["properties"]["podUID"]["description"]
    del spec["properties"]["lazyUnmount"]
    control_plane.kubectl("apply", "--server-side", "--force-conflicts",
                          "--field-manager=older-version", "-f", "-",
                          input=yaml.safe_dump(older))  # fmt: skip
    try:
        installed = json.loads(control_plane.kubectl("get", "crd", name, "-o", "json").stdout)
        props = installed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        assert "lazyUnmount" not in props["spec"]["properties"]
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                              str(CHART / "crds"))  # fmt: skip
        after = json.loads(control_plane.kubectl("get", "crd", name, "-o", "json").stdout)
        assert after["spec"]["versions"] == current["spec"]["versions"]
        explained(control_plane, "remediation.spec.lazyUnmount", "lazy unmount (MNT_DETACH)")
    finally:
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                              str(CHART / "crds"))  # fmt: skip
