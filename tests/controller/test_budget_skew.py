"""Grants recorded by a replica whose clock ran ahead are not dropped (issue 33 finding 2).

A standby whose clock is 20 s behind takes over: the grants the other replica recorded in
the last seconds carry times 20 s in this replica's future. The budget is rebuilt from the
real API server's Remediations (the start-up's LIST, acting/budget_rebuild.py) and must
count them — as made now, the stricter guess — and say that the clocks disagree. Before,
only grants at or before now were counted: the other's recent acts vanished and the
budget was fresh."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.controller import GROUP, VERSION, Objects, policies_in_place
from unstick.controller.acting.budget_rebuild import ACT_WITHIN_S, rebuild_from_remediations
from unstick.controller.acting.grants import Grants
from unstick.controller.deciding.policies import BUILTIN
from unstick.core.remediation import rfc3339
from unstick.kube.client import JSON, ClientSettings, Kube

SKEW_S = 20.0
ONE_PER_NODE = replace(BUILTIN, name="one", cluster_per_minute=1000, node_per_minute=1)


@pytest.fixture(scope="module")
def objects(control_plane: ControlPlane) -> Iterator[Objects]:
    with policies_in_place(control_plane, {}) as objs:
        yield objs


class _Rebuilt:
    """The reconciler's side of the rebuild (Reconciler.rebuild_budget): its Grants."""

    def __init__(self) -> None:
        self.grants = Grants(cluster_cap=60, node_cap=10)

    def rebuild_budget(self, remediations: list[JSON], now: float) -> int:
        return self.grants.rebuild(remediations, now, lambda _name: None)


def _record(objects: Objects, namespace: str, name: str, spec: Any, status: Any) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Remediation", "metadata": {"name": name}}
    objects.record(namespace, {**body, "spec": spec}, status)


@pytest.mark.envtest
def test_grants_recorded_ahead_of_this_clock_are_counted(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As the replica with the fast clock wrote them, a moment ago by its clock.
    ahead = rfc3339(time.time() + SKEW_S)
    _record(
        objects,
        namespace,
        "per-pod",
        {"podName": "a", "podUID": "uid-a", "nodeName": "n1", "dryRun": False},
        {
            "phase": "Remediating",
            "actions": [
                {
                    "action": "force-delete",
                    "target": "",
                    "result": "succeeded",
                    "message": "deleted",
                    "time": ahead,
                    "by": "controller",
                }
            ],
        },
    )
    _record(
        objects,
        namespace,
        "incident",
        {"nodeName": "n2", "incident": "NodeGone", "dryRun": False},
        {
            "phase": "Remediating",
            "pods": [
                {
                    "name": "b",
                    "uid": "uid-b",
                    "action": "force-delete",
                    "result": "deleting",
                    "message": "decided",
                    "time": ahead,
                }
            ],
        },
    )
    _record(
        objects,
        namespace,
        "handed-over",
        {
            "podName": "c",
            "podUID": "uid-c",
            "nodeName": "n3",
            "dryRun": False,
            "nodeStepsRequestedAt": ahead,
        },
        {"phase": "Remediating"},
    )

    rebuilt = _Rebuilt()
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    try:
        with caplog.at_level(logging.WARNING, logger="unstick.controller.acting.grants"):
            asyncio.run(rebuild_from_remediations(kube, rebuilt, (namespace,), time.time))
    finally:
        kube.close()

    now = time.time()
    for node in ("n1", "n2", "n3"):  # one per node per minute: each node's slot is taken
        assert rebuilt.grants.wait(ONE_PER_NODE, node, now) > 0, node
    assert rebuilt.grants.wait(ONE_PER_NODE, "n4", now) == 0
    assert any("ahead of this replica's clock" in r.getMessage() for r in caplog.records)


def test_a_grant_recorded_ahead_counts_from_now_and_can_be_given_back() -> None:
    now = 1_800_000_000.0
    recorded = now + SKEW_S
    found = [
        {
            "spec": {"nodeName": "n1", "incident": "NodeGone"},
            "status": {
                "pods": [
                    {"name": "b", "uid": "u", "action": "force-delete", "result": "deleting"}
                    | {"time": rfc3339(recorded)}
                ]
            },
        }
    ]
    grants = Grants(cluster_cap=60, node_cap=10)
    assert grants.rebuild(found, now, lambda _name: None) == 1
    # counted as made now: free again a window after now (+ ACT_WITHIN_S), not after
    # the future time on record
    assert grants.wait(ONE_PER_NODE, "n1", now + 1) > 0
    assert grants.wait(ONE_PER_NODE, "n1", now + ACT_WITHIN_S + 60 + 0.1) == 0
    # adoption gives back an intent not carried out by its recorded time (startup.py)
    grants.give_back("n1", recorded)
    assert grants.wait(ONE_PER_NODE, "n1", now + 1) == 0
