"""The retention against a real API server (controller/retention.sweep): an old
Resolved record is deleted; a recent one and one of a pod still Terminating stay; nothing
is deleted while this replica does not lead, nor by a DELETE whose write guard (the
leader Lease) refuses; a record written since the list stays (resourceVersion
precondition)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.pods import pod_body
from unstick.controller import retention
from unstick.controller.leader import NotLeading
from unstick.core.remediation import new_remediation, rfc3339
from unstick.kube.client import Kube, remediation_path

pytestmark = pytest.mark.envtest

WEEK = 7 * 86_400.0


@pytest.fixture(scope="module", autouse=True)
def crds(control_plane: ControlPlane) -> None:
    control_plane.install_crds()


def resolved(kube: Kube, namespace: str, pod: str, uid: str, at: float) -> dict[str, Any]:
    """A Remediation of pod `pod` marked Resolved at `at`."""
    name = f"{pod}-{uuid.uuid4().hex[:5]}"
    body = new_remediation(namespace, name, pod, uid, node="n1", dry_run=False)
    kube.request("POST", remediation_path(namespace), body=body)
    return kube.request(
        "PATCH",
        remediation_path(namespace, name) + "/status",
        body={"status": {"phase": "Resolved", "resolvedAt": rfc3339(at)}},
        content_type="application/merge-patch+json",
    )


def names(kube: Kube, namespace: str) -> set[str]:
    return {r["metadata"]["name"] for r in kube.list_all(remediation_path(namespace))}


def sweep(kube: Kube, namespace: str, now: float, *, leading: bool = True) -> int:
    return retention.sweep(
        kube, (namespace,), WEEK, now, terminating=lambda _uid: False, gate=lambda: leading
    )


def test_old_records_go_recent_and_terminating_ones_stay(
    kube: Kube, core_api: Any, namespace: str
) -> None:
    import time

    real_now = time.time()
    later = real_now + 8 * 86_400  # the sweep's clock: a week and a day on
    old = resolved(kube, namespace, "gone-long-ago", str(uuid.uuid4()), real_now)
    recent = resolved(kube, namespace, "gone-lately", str(uuid.uuid4()), later - 3600)
    # a pod still Terminating (a finalizer holds it), its record Resolved long ago: the pod
    # watch does not know it (terminating=False above); the fresh GET before the DELETE does
    pod = core_api.create_namespaced_pod(
        namespace, pod_body("still-here", None, finalizers=["example.com/hold"])
    )
    core_api.delete_namespaced_pod("still-here", namespace)
    held = resolved(kube, namespace, "still-here", pod.metadata.uid, real_now)

    # not leading: nothing is deleted
    assert sweep(kube, namespace, later, leading=False) == 0
    everything = {r["metadata"]["name"] for r in (old, recent, held)}
    assert names(kube, namespace) == everything

    # leading, but the Lease is lost at the DELETE (the client's write guard): none goes
    def refuse(method: str, path: str) -> None:
        raise NotLeading(f"not the leader: {method} {path} not sent")

    kube.write_guard = refuse
    try:
        with pytest.raises(NotLeading):
            sweep(kube, namespace, later)
    finally:
        kube.write_guard = None
    assert names(kube, namespace) == everything

    assert sweep(kube, namespace, later) == 1
    assert names(kube, namespace) == everything - {old["metadata"]["name"]}
    # the per-sweep cap: two more past their retention, one sweep of one takes one
    more = {resolved(kube, namespace, f"gone-{i}", str(uuid.uuid4()), real_now)["metadata"]["name"]
            for i in range(2)}  # fmt: skip
    capped = retention.sweep(kube, (namespace,), WEEK, later, terminating=lambda _uid: False,
                             gate=lambda: True, limit=1)  # fmt: skip
    assert capped == 1 and len(names(kube, namespace) & more) == 1
    assert sweep(kube, namespace, later) == 1
    assert names(kube, namespace) == everything - {old["metadata"]["name"]}


def test_a_record_written_since_the_list_stays(kube: Kube, namespace: str) -> None:
    import time

    real_now = time.time()
    listed = resolved(kube, namespace, "gone", str(uuid.uuid4()), real_now)
    # written meanwhile (e.g. a late answer of the agent): the listed version is stale
    kube.request(
        "PATCH",
        remediation_path(namespace, listed["metadata"]["name"]) + "/status",
        body={"status": {"nodeStepsDoneAt": rfc3339(real_now)}},
        content_type="application/merge-patch+json",
    )
    assert retention.delete(kube, listed) is False
    assert names(kube, namespace) == {listed["metadata"]["name"]}
    fresh = kube.get(remediation_path(namespace, listed["metadata"]["name"]))
    assert fresh is not None and retention.delete(kube, fresh) is True
    assert names(kube, namespace) == set()
