"""The Remediation CRD's schema (DESIGN §5, docs/admission.md): identity immutable, the
words of the vocabulary, status typed and bounded. What the API server does with it is
tests/envtest/test_remediation_integrity.py."""

from __future__ import annotations

import re
from typing import Any

import yaml

from unstick.core.remediation import Phase
from unstick.core.vocabulary import NODE_ACTIONS, Cause

from .render import CHART, REPO

CRD = CHART / "crds" / "remediations.yaml"
CONTROLLER = REPO / "operator" / "unstick" / "controller"


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]  # type: ignore[no-any-return]


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        found += _walk(sub, f"{path}.{name}")
    if "items" in schema:
        found += _walk(schema["items"], f"{path}[]")
    return found


def test_identity_is_immutable() -> None:
    spec = _schema()["spec"]
    for field in ("podName", "podUID", "nodeName"):
        rules = spec["properties"][field]["x-kubernetes-validations"]
        assert {"rule": "self == oldSelf"}.items() <= rules[0].items()
        assert f"spec.{field} is immutable" in rules[0]["message"]
    assert any("has(oldSelf.nodeName)" in r["rule"] for r in spec["x-kubernetes-validations"])


def test_requests_to_the_agent_stay_writable() -> None:
    spec = _schema()["spec"]["properties"]
    for field in ("probeRequestedAt", "nodeSteps", "nodeStepsRequestedAt", "dryRun", "lazyUnmount"):
        assert "x-kubernetes-validations" not in spec[field], field


def test_vocabulary_is_the_core_vocabulary() -> None:
    schema = _schema()
    assert set(schema["status"]["properties"]["cause"]["enum"]) == {str(c) for c in Cause}
    step = schema["spec"]["properties"]["nodeSteps"]["items"]["properties"]["action"]
    assert set(step["enum"]) == {str(a) for a in NODE_ACTIONS}


def test_the_phases_are_the_schemas_words() -> None:
    phases = _schema()["status"]["properties"]["phase"]["enum"]
    assert sorted(phases) == sorted(str(phase) for phase in Phase)


def test_the_controller_spells_no_phase_of_its_own() -> None:
    """Every phase the controller writes is a `Phase` (core/remediation.py), none a word."""
    words = "|".join(str(phase) for phase in Phase)
    for path in CONTROLLER.rglob("*.py"):
        text = path.read_text()
        assert not re.findall(rf'write\(\s*p,\s*"({words})"', text), path
        assert not re.findall(rf'"phase":\s*"({words})"', text), path


def test_status_is_structural_and_bounded() -> None:
    status = _schema()["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status
    for path, node in _walk(status, "status"):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path}: a string without maxLength"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: a list without maxItems"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert path.startswith("status.probe"), f"{path}: unknown fields outside the probe"
            assert "maxProperties" in node, f"{path}: unknown fields without maxProperties"


def test_a_forged_probe_of_1_5_mb_does_not_fit() -> None:
    probe = _schema()["status"]["properties"]["probe"]["properties"]
    assert probe["mountinfo"]["maxLength"] < 1_500_000
