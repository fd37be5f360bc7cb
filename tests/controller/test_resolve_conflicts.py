"""A pod gone while its Remediation is being written by others, on the real API server.

When the kubelet removes a pod right after the agent's node steps, three writers meet on
its Remediation at once: the agent's answer, the controller's last pass, and the
controller's Resolved mark. The mark is guarded by the resourceVersion of the copy it was
decided from, so each of the others' writes turns it into a 409. It used to give up after
two: the record stayed `Remediating` for good, for a pod that was gone (seen on the real
node: tests/node/test_seed_csi_orphaned_mount.py). Now it reads the record again and
writes again, and when the record keeps changing it says so and the runtime tries again
later (controller/runtime.py RESOLVE_RETRY_S).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.controller import Objects
from tests.support.pods import remembered_pod
from unstick.controller import metrics
from unstick.controller.agent_channel.trust import ProbeRequests
from unstick.controller.records import writer as records
from unstick.controller.records.pod_record import RESOLVE_ATTEMPTS, PodRecords
from unstick.controller.records.writer import RecordWriter
from unstick.core.remediation import rfc3339
from unstick.kube.client import JSON, ClientSettings, Kube
from unstick.kube.podwatch import TerminatingPod

pytestmark = pytest.mark.envtest

NODE = "node-a"


class Meddling(Kube):
    """The controller's client, with another writer of the record (the agent's late
    answer) writing it right before each of the controller's guarded status writes, for
    the first `times` of them: each of those writes meets a newer version (409)."""

    def __init__(self, settings: ClientSettings, times: int) -> None:
        super().__init__(settings)
        self.times = times
        self.met = 0  # guarded status writes that met another writer's write first
        self.guarded = 0  # guarded status writes sent

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        body = kwargs.get("body") or {}
        guarded = bool((body.get("metadata") or {}).get("resourceVersion"))
        if method == "PATCH" and path.endswith("/status") and guarded:
            self.guarded += 1
            if self.met < self.times:
                self.met += 1
                done_at = rfc3339(time.time() + self.met / 1000)  # a new value each time
                super().request(
                    "PATCH",
                    path,
                    body={"status": {"nodeStepsDoneAt": done_at}},
                    content_type="application/merge-patch+json",
                )
        return super().request(method, path, **kwargs)


def _gone_pod(namespace: str) -> TerminatingPod:
    uid = str(uuid.uuid4())
    return remembered_pod(namespace, "app", uid, NODE, deleted_at=time.time() - 60, running=False)


ANSWER = {  # the agent's answer to node steps, which no pass has recorded yet
    "nodeActions": [
        {"action": "unmount", "target": "/var/lib/kubelet/pods/x/volumes/v", "result": "succeeded"}
    ],
    "nodeStepsDoneAt": rfc3339(time.time() - 1),
}


def _remediating(kube: Kube, pod: TerminatingPod) -> tuple[PodRecords, JSON]:
    """The pod's Remediation as a pass left it (Remediating, known to this process, its
    copy kept) with the agent's answer to its node steps not yet recorded by a pass, and
    the PodRecords that will resolve it."""
    rem = records.create_remediation(
        kube, pod.namespace, pod.name, pod.uid, node=pod.node, dry_run=False
    )
    status = RecordWriter(kube)
    status.patch(rem, {"phase": "Remediating", "cause": "OrphanedMount", **ANSWER})
    name = rem["metadata"]["name"]
    status.known[pod.uid] = (pod.namespace, name, "Remediating")
    status.copies.offer(rem)
    requests = ProbeRequests()
    requests.asked(pod.uid, time.time() - 5)  # node steps were asked of the agent
    pod_records = PodRecords(
        time.time, writer=status, requests=requests, has_remediation=lambda uid: True
    )
    return pod_records, rem


def _status(kube: Kube, rem: JSON) -> JSON:
    meta = rem["metadata"]
    fresh = records.get_remediation(kube, meta["namespace"], meta["name"]) or {}
    return dict(fresh.get("status") or {})


def _phase(kube: Kube, rem: JSON) -> str:
    return str(_status(kube, rem).get("phase"))


def _unmounts_counted() -> float:
    """unstick_remediations_total for the agent's answer above (this process's registry)."""
    return float(metrics.REMEDIATIONS.labels("unmount", "OrphanedMount", "succeeded")._value.get())


@pytest.fixture
def kube(objects: Objects, control_plane: ControlPlane) -> Iterator[Meddling]:
    """The controller's client; the other writer idle until a test sets `times`."""
    client = Meddling(ClientSettings(kubeconfig=str(control_plane.kubeconfig)), times=0)
    try:
        yield client
    finally:
        client.close()


def test_a_gone_pod_is_resolved_though_its_record_changes_under_the_first_writes(
    kube: Meddling, namespace: str
) -> None:
    pod = _gone_pod(namespace)
    pod_records, rem = _remediating(kube, pod)
    kube.times, kube.guarded = 3, 0  # three writes of others, each right before one of ours
    counted = _unmounts_counted()
    done = pod_records.resolve(pod, time.time())
    assert _phase(kube, rem) == "Resolved"
    assert kube.met == 3 and kube.guarded == 4, (kube.met, kube.guarded)
    assert done is True
    # the agent's answer recorded with the mark, and counted once, not once per write
    recorded = [(a["action"], a["by"]) for a in _status(kube, rem).get("actions") or []]
    assert recorded == [("unmount", "agent")], recorded
    assert _unmounts_counted() == counted + 1


def test_a_record_that_keeps_changing_is_resolved_by_a_later_call(
    kube: Meddling, namespace: str
) -> None:
    pod = _gone_pod(namespace)
    pod_records, rem = _remediating(kube, pod)
    kube.times, kube.guarded = RESOLVE_ATTEMPTS, 0  # each write of this call meets one
    assert pod_records.resolve(pod, time.time()) is False  # the caller tries again
    assert kube.guarded == RESOLVE_ATTEMPTS
    assert _phase(kube, rem) == "Remediating"  # nothing half-written
    # the runtime's later call: nothing of the pod is remembered any more (its copy and
    # requests are forgotten), the record is found by the pod's names and marked
    assert pod_records.resolve(pod, time.time()) is True
    assert _phase(kube, rem) == "Resolved"


class TimesOutOnce(Meddling):
    """The controller's client whose first status PATCH is not answered (as a read timeout
    behind an overloaded API server): raised before it is sent."""

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "PATCH" and path.endswith("/status") and self.times > self.met:
            self.met += 1
            raise TimeoutError(f"{method} {path}: no answer (test)")
        return super().request(method, path, **kwargs)


def test_a_late_answer_whose_write_fails_is_recorded_at_the_next_try(
    control_plane: ControlPlane, namespace: str
) -> None:
    """The agent's answer lands after the pod is gone (record_late_answer): a write of it
    that fails leaves the pod awaited, so the record's next event records it. The pod used
    to be forgotten before the write, and the answer was then never recorded."""
    kube = TimesOutOnce(ClientSettings(kubeconfig=str(control_plane.kubeconfig)), times=0)
    try:
        pod = _gone_pod(namespace)
        pod_records, rem = _remediating(kube, pod)
        pod_records.awaiting_agent[pod.uid] = (pod.namespace, pod.name)
        name = rem["metadata"]["name"]
        kube.times = 1
        with pytest.raises(TimeoutError):
            pod_records.record_late_answer(pod.uid, pod.namespace, name)
        assert not _status(kube, rem).get("actions")
        assert pod.uid in pod_records.awaiting_agent  # still awaited: tried again
        pod_records.record_late_answer(pod.uid, pod.namespace, name)
        recorded = [(a["action"], a["by"]) for a in _status(kube, rem).get("actions") or []]
        assert recorded == [("unmount", "agent")], recorded
        assert pod.uid not in pod_records.awaiting_agent
    finally:
        kube.close()
