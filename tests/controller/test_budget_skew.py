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
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.controller import GROUP, VERSION, Objects, policies_in_place
from unstick.controller.acting.budget_rebuild import (
    ACT_WITHIN_S,
    rebuild_from_remediations,
    recent_grants,
    stored_at,
)
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

    def rebuild_budget(
        self, remediations: list[JSON], now: float, local_at: Callable[[float], float]
    ) -> int:
        return self.grants.rebuild(remediations, now, lambda _name: None, local_at)


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


def test_a_grant_recorded_behind_counts_from_when_the_api_server_stored_it() -> None:
    """Issue #31: a leader 20 s behind records a grant made at `now - 2` as made 22 s ago;
    the API server stored the write at `now - 2` on its clock (whole seconds), and this
    replica's clock is 3 s ahead of the API server's. The grant counts from the stored
    time on this clock (rounded up: never earlier), not from the time on record — and a
    give-back of the recorded time finds it."""
    now = 1_800_000_000.0
    made = now - 2.0
    server = made - 3.0  # the API server's clock when it stored the write
    recorded = made - SKEW_S
    found = [
        {
            "metadata": {
                "managedFields": [
                    {"manager": "unstick-agent", "time": rfc3339(server - 30)},
                    {"manager": "unstick-controller", "time": rfc3339(int(server))},
                ]
            },
            "spec": {"nodeName": "n1", "incident": "NodeGone"},
            "status": {
                "pods": [
                    {"name": "b", "uid": "u", "action": "force-delete", "result": "deleting"}
                    | {"time": rfc3339(recorded)}
                ]
            },
        }
    ]
    (grant,) = recent_grants(found, now, local_at=lambda t: t + 3.0)
    assert made + ACT_WITHIN_S <= grant.at <= made + ACT_WITHIN_S + 1.0
    assert grant.recorded == recorded
    grants = Grants(cluster_cap=60, node_cap=10)
    assert grants.rebuild(found, now, lambda _name: None, lambda t: t + 3.0) == 1
    assert grants.wait(ONE_PER_NODE, "n1", made + ACT_WITHIN_S + 60 - 0.1) > 0
    assert grants.wait(ONE_PER_NODE, "n1", made + ACT_WITHIN_S + 61.1) == 0
    grants.give_back("n1", recorded)
    assert grants.wait(ONE_PER_NODE, "n1", now + 1) == 0
    # without managedFields (not from an API server) the time on record is all there is
    bare = [{**found[0], "metadata": {}}]
    assert [g.at for g in recent_grants(bare, now)] == [recorded + ACT_WITHIN_S]


def test_stored_at_is_the_latest_managed_fields_time_rounded_up() -> None:
    entries = [{"time": "2026-11-28T07:00:00Z"}, {"time": "2026-11-28T07:00:09Z"}, {}]
    assert stored_at({"metadata": {"managedFields": entries}}) == 1795849210.0
    assert stored_at({"metadata": {"managedFields": [{"time": "garbage"}]}}) is None
    assert stored_at({}) is None
