"""A pod that changed between the decision and the DELETE, on the real API server.

- The pod watch keeps the newest resourceVersion it is given, also when only fields it
  does not compare changed (a label, a condition): a DELETE decided from its record is
  not refused for a version the watch already delivered.
- The incident path: a DELETE decided from an older version (the watch not caught up
  yet) is refused (409), the pod is read again, decided again and deleted — after one
  refresh, and the refusal takes no slot of the budget (one force-delete per node per
  minute, and the pod still goes at once).
- The per-pod path (issue #22 finding 3): the DELETE carries the resourceVersion of its
  fresh read, so an opt-out written while the Node is read stops it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    Objects,
    controller_delete_codes,
)
from tests.support.reconciler import InProcess, overdue_record, pod_record
from unstick.controller.records import writer as records
from unstick.kube.client import Kube
from unstick.kube.podwatch import PodWatcher, TerminatingPod, WatchSettings

pytestmark = pytest.mark.envtest

OPT_OUT = {"metadata": {"annotations": {"unstick.dev/remediate": "false"}}}


@pytest.fixture
def in_process(kube: Kube) -> Iterator[InProcess]:
    """The controller's reconciler in this process (its incident writer running), with
    one force-delete per node per minute."""
    ctl = InProcess(kube, rateLimits={"clusterPerMinute": 10, "nodePerMinute": 1})
    ctl.incidents.start()
    try:
        yield ctl
    finally:
        ctl.close()


def test_the_pod_watch_keeps_the_newest_resource_version(
    kube: Kube, objects: Objects, namespace: str, make_node: Any
) -> None:
    pod = objects.stuck_pod(
        namespace, make_node(kubelet=False), remediate="true"
    )  # no kubelet: it stays
    changes: list[TerminatingPod | None] = []
    seen = threading.Event()

    def on_change(uid: str, record: TerminatingPod | None) -> None:
        changes.append(record)
        seen.set()

    watcher = PodWatcher(kube, WatchSettings(namespace=namespace), on_change)
    watcher.start()
    try:
        wait_until(
            lambda: pod["uid"] in watcher.pods, timeout=30, what="the terminating pod listed"
        )
        labelled = objects.core.patch_namespaced_pod(
            pod["name"], namespace, {"metadata": {"labels": {"team": "b"}}}
        )
        version = labelled.metadata.resource_version
        wait_until(
            lambda: watcher.pods[pod["uid"]].resource_version == version,
            timeout=30,
            what="the watch to keep the relabelled pod's resourceVersion",
        )
        assert changes[-1] is not None and changes[-1].resource_version == version
    finally:
        watcher.stop()


def test_a_relabelled_pod_is_deleted_after_one_refresh_and_its_conflict_takes_no_budget(
    control_plane: ControlPlane,
    kube: Kube,
    objects: Objects,
    in_process: InProcess,
    namespace: str,
    make_node: Any,
) -> None:
    node = make_node(kubelet=False)
    pod = objects.stuck_pod(namespace, node, remediate="true", node_gone=True)
    stale = overdue_record(kube, namespace, pod["name"])  # what the watch delivered ...
    objects.core.patch_namespaced_pod(  # ... before someone relabelled the pod
        pod["name"], namespace, {"metadata": {"labels": {"team": "b"}}}
    )
    in_process.reconciler.reconcile(stale)  # the DELETE goes out from a sender thread

    objects.pod_gone(namespace, pod, timeout=30, what="the pod deleted")
    in_process.reconciler.incident_path.stop()  # its sender done
    assert controller_delete_codes(control_plane, namespace, pod["name"]) == [409, 200]
    in_process.incidents.stop()  # writes what it holds
    entry = objects.incident_entry(namespace, pod)
    assert (entry.get("action"), entry.get("result")) == ("force-delete", "succeeded"), entry


def test_a_per_pod_force_delete_is_stopped_by_an_opt_out_written_while_it_reads_the_node(
    control_plane: ControlPlane,
    kube: Kube,
    objects: Objects,
    in_process: InProcess,
    namespace: str,
    make_node: Any,
) -> None:
    node = make_node(kubelet=False)
    pod = objects.stuck_pod(namespace, node, remediate="true", node_gone=True)
    # the pod has its own record already: the per-pod path (a fresh read before acting)
    records.create_remediation(kube, namespace, pod["name"], pod["uid"], node=node, dry_run=False)
    in_process.has_remediation.add(pod["uid"])
    opted_out = threading.Event()

    def opt_out() -> None:  # the owner opts out between the pod's read and the DELETE
        if not opted_out.is_set():
            opted_out.set()
            objects.core.patch_namespaced_pod(pod["name"], namespace, OPT_OUT)

    in_process.on_node_read = opt_out
    in_process.reconciler.reconcile(overdue_record(kube, namespace, pod["name"]))

    assert opted_out.is_set()
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_delete_codes(control_plane, namespace, pod["name"]) == [409]
    # decided again from the pod as it is now: not opted in, observed only
    in_process.reconciler.reconcile(pod_record(kube, namespace, pod["name"]))
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_delete_codes(control_plane, namespace, pod["name"]) == [409]
    status = objects.status(namespace, pod)
    assert not [a for a in status.get("actions") or [] if a.get("action") == "force-delete"]


def test_a_per_pod_force_delete_is_refused_when_the_finalizers_change_while_it_reads_the_node(
    control_plane: ControlPlane,
    kube: Kube,
    objects: Objects,
    in_process: InProcess,
    namespace: str,
    make_node: Any,
) -> None:
    """The API server lets no finalizer be added to a pod being deleted ("no new finalizers
    can be added if the object is being deleted", tried here first), but one may be
    removed: the DELETE decided from the older list is refused."""
    node = make_node(kubelet=False)
    both = ["example.com/a", "example.com/b"]
    pod = objects.pod(namespace, node, remediate="true", finalizers=both)
    objects.core.delete_node(node)
    objects.core.delete_namespaced_pod(pod["name"], namespace)
    records.create_remediation(kube, namespace, pod["name"], pod["uid"], node=node, dry_run=False)
    in_process.has_remediation.add(pod["uid"])
    add = [{"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/c"}]
    with pytest.raises(ApiException) as refused:
        objects.core.patch_namespaced_pod(pod["name"], namespace, add)
    assert refused.value.status == 422 and "no new finalizers" in str(refused.value.body)
    swapped = threading.Event()
    drop = [
        {"op": "test", "path": "/metadata/finalizers", "value": both},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]

    def swap_finalizer() -> None:  # its owner's controller lets go of one
        if not swapped.is_set():
            swapped.set()
            objects.core.patch_namespaced_pod(pod["name"], namespace, drop)

    in_process.on_node_read = swap_finalizer
    in_process.reconciler.reconcile(overdue_record(kube, namespace, pod["name"]))

    assert swapped.is_set()
    assert controller_delete_codes(control_plane, namespace, pod["name"]) == [409]
    left = objects.read_pod(namespace, pod["name"])
    assert left is not None and left.metadata.deletion_grace_period_seconds != 0
    assert left.metadata.finalizers == ["example.com/a"]
