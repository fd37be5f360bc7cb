"""A controller Detector (controller/deciding/detector.py) in the test's process, for pods
whose Node is gone (NodeGone): no API request is made, the policies are given."""

from __future__ import annotations

from typing import Any

from unstick.controller.deciding.caches import ObjectCache
from unstick.controller.deciding.detector import Detector
from unstick.controller.deciding.policies import NamespaceLabels, PolicyBook
from unstick.kube.server_clock import ServerClock


def node_gone_detector(
    policies: dict[str, dict[str, Any]],
    namespace_labels: dict[str, str] | None = None,
    server_clock: ServerClock | None = None,
) -> Detector:
    """A Detector with `policies` (name → spec), every namespace labelled
    `namespace_labels`, every Node gone, and `server_clock` (none: no correction)."""
    book = PolicyBook()
    for name, spec in policies.items():
        assert book.update(name, {"spec": spec}) is None, name
    gone = ObjectCache(lambda name: None)  # the pod's Node is gone: NodeGone
    return Detector(
        None,  # type: ignore[arg-type]  # no PVCs: the decision makes no API request
        book,
        NamespaceLabels(lambda ns: dict(namespace_labels or {})),
        nodes=gone,
        csi_nodes=gone,
        has_remediation=lambda uid: False,
        server_clock=server_clock,
    )
