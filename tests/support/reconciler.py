"""The controller's reconciler in the test's own process, for the envtests that must say
what the controller's memory holds (an older copy of a record, a pod record made before
someone else changed the pod): no watch feeds it; the test hands it pod records."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from devcluster.process import wait_until
from tests.support.controller import policy_spec
from unstick.controller.deciding.caches import ObjectCache, csi_node_path, node_path
from unstick.controller.deciding.detector import Detector
from unstick.controller.deciding.inputs import NodeInputs
from unstick.controller.deciding.policies import NamespaceLabels, PolicyBook
from unstick.controller.incidents.registry import Incidents
from unstick.controller.reconciler import ActionInputs, Reconciler, ReconcileSettings
from unstick.controller.records.events import EventQueue
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod, terminating_record


class InProcess:
    """A Reconciler on `kube` with one policy, `default` (it serves every namespace): the
    policy_spec with no slack and these overrides (`rateLimits=...`). The namespace's
    labels and the Node are read from the API server; `on_node_read` runs when the Node
    is read fresh right before an action; `has_remediation` holds the UIDs of the pods
    whose Remediation the test says exists; `round_trip=False`: the controller's
    --no-node-round-trip. `close()` stops what it started."""

    def __init__(self, kube: Kube, *, round_trip: bool = True, **policy: Any) -> None:
        self.kube = kube
        self.on_node_read: Callable[[], None] = lambda: None
        self.events = EventQueue(kube)
        self.incidents = Incidents(kube, self.events, time.time)
        book = PolicyBook()
        spec = policy_spec(**{"slackSeconds": 0, **policy})
        assert book.update("default", {"metadata": {"name": "default"}, "spec": spec}) is None
        csi_nodes = ObjectCache(lambda n: kube.get(csi_node_path(n)))
        self.has_remediation: set[str] = set()
        detector = Detector(
            kube,
            book,
            NamespaceLabels(self._labels),
            nodes=ObjectCache(lambda n: kube.get(node_path(n))),
            csi_nodes=csi_nodes,
            has_remediation=self.has_remediation.__contains__,
        )
        inputs = ActionInputs(
            has_remediation=self.has_remediation.__contains__,
            events=self.events,
            fresh=NodeInputs(node=self._fresh_node, csi_node=csi_nodes.get),
            incidents=self.incidents,
        )
        settings = ReconcileSettings(node_round_trip=round_trip)  # False: --no-node-round-trip
        self.reconciler = Reconciler(kube, detector, settings, time.time, inputs)

    def _labels(self, ns: str) -> dict[str, str]:
        found = self.kube.get(f"/api/v1/namespaces/{ns}") or {}
        return dict((found.get("metadata") or {}).get("labels") or {})

    def _fresh_node(self, name: str) -> JSON | None:
        self.on_node_read()
        return self.kube.get(node_path(name))

    def close(self) -> None:
        self.reconciler.incident_path.stop()
        self.incidents.stop()  # writes what it holds, if it was started
        self.events.close()


def pod_record(kube: Kube, namespace: str, name: str) -> TerminatingPod:
    """The pod's record as the pod watch makes it (the pod is Terminating)."""
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    record = terminating_record(pod or {})
    assert record is not None, pod
    return record


def overdue_record(kube: Kube, namespace: str, name: str) -> TerminatingPod:
    """The pod's record once it is past its deletionTimestamp (with no slack: stuck)."""
    record = pod_record(kube, namespace, name)
    wait_until(
        lambda: time.time() > record.deletion_timestamp, timeout=10, what="the pod to be overdue"
    )
    return record
