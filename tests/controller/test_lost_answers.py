"""A lost answer does not erase the act (issue 33 finding 1). The real controller talks to
the real API server through a proxy (tests/support/lost_answers.py) that forwards the
controller's DELETE (or finalizer PATCH) of a pod — the API server carries it out — and
then closes the controller's connection instead of answering: what a read timeout, a 5xx
or a reset does behind an overloaded API server.

The act was carried out once, so: it is sent once (the audit log holds one request, not a
retry answered 404/409/422), it stays on record (settled by looking: the pod was gone),
and its budget slot stays taken — the next pod on that node, under `nodePerMinute: 1`,
waits for the rate limit instead of being acted on in the same minute. On the node
incident path, the per-pod force-delete path and the per-pod finalizer removal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.audit_log import requests, status_code
from tests.support.controller import (
    USER_AGENT_PREFIX,
    Controller,
    Objects,
    controller_delete_codes,
    node_ready,
    policy_spec,
    running_controller,
)
from tests.support.lost_answers import LostAnswers
from unstick.controller.deciding.decision import RATE_LIMITED
from unstick.core.remediation import INTENTS
from unstick.kube.client import pod_path

pytestmark = pytest.mark.envtest

POLICY = "t-lost-answer"
KEEP = "example.com/keep"


@pytest.fixture(scope="module")
def setup(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Controller, Objects, LostAnswers]]:
    proxy = LostAnswers(control_plane)
    folder = tmp_path_factory.mktemp("lost")
    # No node actions: a stuck pod's record asks its node for a probe only. A mandate (the
    # round trip, design.md §11) would take the node's one slot of nodePerMinute: 1 for the
    # agent (kept while unanswered), and the per-pod force-delete would wait for it.
    spec = policy_spec(
        actions=["observe", "force-delete", "remove-finalizer"],
        rateLimits={"clusterPerMinute": 1000, "nodePerMinute": 1},
        finalizerAllowlist=[KEEP],
    )
    kubeconfig = proxy.kubeconfig(folder / "kubeconfig")
    try:
        with running_controller(
            control_plane, folder, {POLICY: spec}, extra_args=("--kubeconfig", str(kubeconfig))
        ) as (controller, objects):
            yield controller, objects, proxy
    finally:
        proxy.close()


def _stuck(objects: Objects, namespace: str, node: str | None, **pod: Any) -> dict[str, Any]:
    return objects.stuck_pod(namespace, node, remediate=POLICY, **pod)


def _answered(entry: dict[str, Any]) -> bool:
    return bool(entry.get("result")) and entry.get("result") not in INTENTS


def _settled(objects: Objects, namespace: str, pod: dict[str, Any], action: str, what: str) -> Any:
    """Wait until the pod's record holds `action` with an answer; those entries."""
    return wait_until(
        lambda: [
            a
            for a in objects.status(namespace, pod).get("actions") or []
            if a.get("action") == action and _answered(a)
        ],
        timeout=30,
        what=what,
    )


def _waiting_for_the_rate_limit(objects: Objects, namespace: str, pod: dict[str, Any]) -> Any:
    """Wait until the pod is listed in its node incident and the incident waits for the
    rate limit; that incident."""
    return objects.remediation_when(
        namespace,
        pod,
        lambda _r: objects.incident_entry(namespace, pod),
        incident=True,
        timeout=30,
        what="the second pod waiting for the rate limit",
        waitingFor=RATE_LIMITED,
    )


def test_an_incident_force_delete_whose_answer_is_lost_stays_on_record(
    setup: tuple[Controller, Objects, LostAnswers],
    control_plane: ControlPlane,
    namespace: str,
    make_node: Any,
) -> None:
    _controller, objects, proxy = setup
    node = make_node(kubelet=False)
    objects.core.delete_node(node)  # NodeGone: the pods go the node incident's way
    first = objects.pod(namespace, node, remediate=POLICY)
    proxy.lose_answer("DELETE", [pod_path(namespace, first["name"])])
    objects.core.delete_namespaced_pod(first["name"], namespace)

    objects.pod_gone(namespace, first, timeout=60, what="the first pod force-deleted")
    entry = wait_until(
        lambda: (e := objects.incident_entry(namespace, first)).get("goneAt") and e,
        timeout=30,
        what="the first pod noted gone in its incident",
    )
    assert [(m, c) for m, _p, c in proxy.lost] == [("DELETE", 200)]
    assert controller_delete_codes(control_plane, namespace, first["name"]) == [200]  # once
    # The act is on record, settled by looking (its answer never came): not erased.
    assert entry.get("action") == "force-delete", entry
    assert entry.get("result") == "gone", entry

    # Its slot stays taken: the next pod of the node waits for the rate limit.
    second = _stuck(objects, namespace, node)
    assert _waiting_for_the_rate_limit(objects, namespace, second) is not None
    assert objects.read_pod(namespace, second["name"]) is not None
    assert not objects.incident_entry(namespace, second).get("action")


def test_a_per_pod_force_delete_whose_answer_is_lost_stays_on_record(
    setup: tuple[Controller, Objects, LostAnswers],
    control_plane: ControlPlane,
    namespace: str,
    make_node: Any,
) -> None:
    _controller, objects, proxy = setup
    node = make_node(kubelet=False)
    node_ready(objects, node)
    first = _stuck(objects, namespace, node)
    # Its own record first (cause Unknown: no probe), so the force-delete is a per-pod one.
    objects.remediation_when(namespace, first, timeout=60, what="the first pod's own record")
    proxy.lose_answer("DELETE", [pod_path(namespace, first["name"])])
    objects.core.delete_node(node)  # NodeGone: force-delete

    objects.pod_gone(namespace, first, timeout=60, what="the first pod force-deleted")
    actions = _settled(
        objects, namespace, first, "force-delete", "the force-delete settled on record"
    )
    assert [(m, c) for m, _p, c in proxy.lost] == [("DELETE", 200)]
    assert controller_delete_codes(control_plane, namespace, first["name"]) == [200]
    assert [(a["result"], a["by"]) for a in actions] == [("gone", "controller")], actions

    second = _stuck(objects, namespace, node)  # no record of its own: the incident path
    _waiting_for_the_rate_limit(objects, namespace, second)
    assert objects.read_pod(namespace, second["name"]) is not None


def test_a_finalizer_removal_whose_answer_is_lost_stays_on_record(
    setup: tuple[Controller, Objects, LostAnswers], control_plane: ControlPlane, namespace: str
) -> None:
    """Unscheduled pods (no node): deleted at once but for their allowlisted finalizer. The
    PATCH that removes it is carried out (the pod goes with it), its answer lost; retried, it
    would have been answered 404 (or 422 by the `test` op) and taken for "nothing done"."""
    _controller, objects, proxy = setup
    first = _stuck(objects, namespace, None, finalizers=[KEEP])
    proxy.lose_answer("PATCH", [pod_path(namespace, first["name"])])

    objects.pod_gone(namespace, first, timeout=90, what="the first pod's finalizer removed")
    actions = _settled(
        objects, namespace, first, "remove-finalizer", "the finalizer removal settled on record"
    )
    patches = requests(
        control_plane,
        by=USER_AGENT_PREFIX,
        verbs={"patch"},
        resource="pods",
        namespace=namespace,
        name=first["name"],
    )
    assert [(m, c) for m, _p, c in proxy.lost] == [("PATCH", 200)]
    assert [status_code(e) for e in patches] == [200]  # sent once
    assert [a["result"] for a in actions] == ["gone"], actions

    second = _stuck(objects, namespace, None, finalizers=[KEEP])
    try:
        wait_until(
            lambda: objects.status(namespace, second).get("waitingFor") == RATE_LIMITED,
            timeout=30,
            what="the second pod waiting for the rate limit",
        )
        left = objects.read_pod(namespace, second["name"])
        assert left is not None and left.metadata.finalizers == [KEEP]
    finally:
        if objects.read_pod(namespace, second["name"]) is not None:
            patch = {"metadata": {"finalizers": []}}
            objects.core.patch_namespaced_pod(second["name"], namespace, patch)
