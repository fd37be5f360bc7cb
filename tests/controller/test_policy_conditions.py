"""A RemediationPolicy's status.conditions are in the metav1.Condition shape (type, status,
reason, message, lastTransitionTime, observedGeneration), written by the running controller
against a real API server: observedGeneration follows every spec change, and
lastTransitionTime moves only when the condition's status does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    GROUP,
    VERSION,
    Controller,
    Objects,
    policy_spec,
    running_controller,
)

pytestmark = pytest.mark.envtest

NAME = f"conditions-{uuid.uuid4().hex[:6]}"
KEYS = {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
INVALID = {"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In",
                                                       "values": []}]}}  # fmt: skip


@pytest.fixture(scope="module")
def running(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Controller, Objects]]:
    with running_controller(
        control_plane, tmp_path_factory.mktemp("cond"), {NAME: policy_spec()}
    ) as r:
        yield r


def valid(objects: Objects) -> tuple[dict[str, Any], int]:
    obj = objects.custom.get_cluster_custom_object(GROUP, VERSION, "remediationpolicies", NAME)
    (cond,) = [c for c in obj["status"]["conditions"] if c["type"] == "Valid"]
    return cond, obj["metadata"]["generation"]


def settled(objects: Objects, status: str) -> dict[str, Any] | None:
    cond, generation = valid(objects)
    ok = cond["status"] == status and cond.get("observedGeneration") == generation
    return cond if ok else None


def test_the_valid_condition_has_the_metav1_shape(running: tuple[Controller, Objects]) -> None:
    _, objects = running
    first = wait_until(
        lambda: settled(objects, "True"), timeout=30, what="Valid=True at this generation"
    )
    assert set(first) == KEYS
    assert first["reason"] == "Validated" and first["lastTransitionTime"].endswith("Z")

    objects.replace_policy(NAME, {**policy_spec(), **INVALID})
    broken = wait_until(
        lambda: settled(objects, "False"), timeout=30, what="Valid=False at the new generation"
    )
    assert broken["reason"] == "InvalidSpec"
    assert "spec.namespaceSelector.matchExpressions[0].values" in broken["message"]
    assert broken["lastTransitionTime"] > first["lastTransitionTime"]

    # still invalid, another spec change: a new observedGeneration, the same transition time
    objects.replace_policy(NAME, {**policy_spec(), **INVALID, "slackSeconds": 7})
    again = wait_until(
        lambda: settled(objects, "False"), timeout=30, what="Valid=False at the next generation"
    )
    assert again["observedGeneration"] > broken["observedGeneration"]
    assert again["lastTransitionTime"] == broken["lastTransitionTime"]
