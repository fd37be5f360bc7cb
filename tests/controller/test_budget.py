"""The action budget against a real API server (design.md §3 invariant 6):

- it survives a restart: a fresh controller process rebuilds it from the actions recorded
  in the Remediations and grants no more than what is left of the minute;
- only an action carried out takes a slot: a step skipped at the last re-check ("changed
  before acting") leaves the budget to the next pod (it used to hold a finalizer removal
  back for a full minute).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import Objects, first_and_next, policy_spec
from tests.support.reconciler import InProcess, pod_record
from unstick.controller.deciding.decision import RATE_LIMITED
from unstick.kube.client import Kube

pytestmark = pytest.mark.envtest


@pytest.fixture
def default_policy(objects: Objects) -> Iterator[None]:
    """The `default` policy (it serves every namespace) at 3 actions per node per minute."""
    before = objects.replace_policy(
        "default", policy_spec(rateLimits={"clusterPerMinute": 1000, "nodePerMinute": 3})
    )
    try:
        yield
    finally:
        objects.replace_policy("default", before)


def _stuck_pods(objects: Objects, namespace: str, node: str, count: int) -> list[dict[str, Any]]:
    pods = [objects.pod(namespace, node, remediate="true") for _ in range(count)]
    for pod in pods:
        objects.core.delete_namespaced_pod(pod["name"], namespace)
    return pods


def _gone(objects: Objects, namespace: str, pods: list[dict[str, Any]]) -> list[str]:
    return [p["name"] for p in pods if objects.read_pod(namespace, p["name"]) is None]


def test_a_restarted_controller_grants_only_what_is_left_of_the_minute(
    control_plane: ControlPlane,
    objects: Objects,
    default_policy: None,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    node = make_node(kubelet=False)
    with first_and_next(control_plane, tmp_path) as (first, second):
        first.start()
        wait_until(
            lambda: objects.policy_valid("default") == "True",
            timeout=30,
            what="policy default valid",
        )
        objects.core.delete_node(node)  # NodeGone: force-delete, one slot per pod
        earlier = _stuck_pods(objects, namespace, node, 2)
        wait_until(
            lambda: len(_gone(objects, namespace, earlier)) == 2,
            timeout=60,
            what="two force-deletes",
        )
        first.stop()

        later = _stuck_pods(objects, namespace, node, 3)
        second.start()

        def rate_limited() -> list[dict[str, Any]]:
            # pods of a deleted node: their node incident waits for the budget
            return [
                p
                for p in later
                if ((objects.incident(namespace, p) or {}).get("status") or {}).get("waitingFor")
                == RATE_LIMITED
                and objects.incident_entry(namespace, p)
            ]

        # 3 per node per minute, 2 used by the first process in this minute: 1 left.
        wait_until(
            lambda: len(_gone(objects, namespace, later)) >= 1 and len(rate_limited()) >= 2,
            timeout=60,
            what="one force-delete and two pods waiting for the budget",
        )
        assert len(_gone(objects, namespace, later)) == 1
        # at least the first process's 2 (the control plane is shared with other modules,
        # whose recent actions are rebuilt too: they are on other nodes)
        rebuilt = re.search(
            r"action budget rebuilt: (\d+) actions of the last minute", second.log()
        )
        assert rebuilt is not None and int(rebuilt.group(1)) >= 2, second.log()[-2000:]


def test_a_step_skipped_at_the_re_check_takes_no_slot(
    kube: Kube, objects: Objects, namespace: str
) -> None:
    """One action per minute. Pod A's finalizer is removed by someone else after the
    controller saw it: the controller's step is skipped at the re-check. Pod B's finalizer
    removal must then happen at once, not a minute later."""
    ctl = InProcess(
        kube,
        finalizerAllowlist=["example.com/keep"],
        rateLimits={"clusterPerMinute": 1, "nodePerMinute": 1},
    )
    try:
        reconciler = ctl.reconciler
        keep, other = "example.com/keep", "example.com/other"
        a = objects.pod(namespace, None, remediate="true", finalizers=[keep, other])
        b = objects.pod(namespace, None, remediate="true", finalizers=[keep])
        for pod in (a, b):
            objects.core.delete_namespaced_pod(pod["name"], namespace)
        record_a, record_b = (pod_record(kube, namespace, p["name"]) for p in (a, b))
        # Someone else removes `keep` from A: the controller's memory of A is now stale.
        remove_keep = [
            {"op": "test", "path": "/metadata/finalizers/0", "value": keep},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]
        objects.core.patch_namespaced_pod(a["name"], namespace, remove_keep)

        reconciler.reconcile(record_a)
        assert not any(
            x.get("action") == "remove-finalizer"
            for x in objects.status(namespace, a).get("actions") or []
        )
        reconciler.reconcile(record_b)
        assert objects.read_pod(namespace, b["name"]) is None, objects.status(namespace, b)
        status = objects.status(namespace, b)
        assert status.get("waitingFor") != RATE_LIMITED
        assert [x["result"] for x in status["actions"] if x["action"] == "remove-finalizer"] == [
            "succeeded"
        ]
    finally:
        ctl.close()
