"""The controller's parts and how they are wired: the watch-fed Node and CSINode caches,
the claims and volumes (watched, else read on demand), the Remediation index (fed by the
Remediation watch), the Event queue, the node incidents, the detector and the reconciler
with its inputs. The runtime (controller/runtime.py) builds them once with `wire` and
drives them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from unstick.controller.deciding.caches import (
    CLAIMS,
    VOLUMES,
    BoundVolumes,
    FreshNodes,
    ObjectCache,
    WatchedVolumes,
    csi_node_path,
    node_path,
)
from unstick.controller.deciding.detector import Detector
from unstick.controller.deciding.fencing_records import FencingRecords
from unstick.controller.deciding.inputs import NodeInputs
from unstick.controller.deciding.kill_events import KillPodEvents
from unstick.controller.deciding.owner_leases import MAX_GAP_S, OwnerLeases
from unstick.controller.deciding.policies import NamespaceLabels, PolicyBook
from unstick.controller.incidents.registry import Incidents
from unstick.controller.reconciler import ActionInputs, Reconciler, ReconcileSettings
from unstick.controller.records.events import EventQueue
from unstick.kube.client import Kube


@dataclass(frozen=True, slots=True)
class Parts:
    nodes: ObjectCache  # Nodes, fed by the lean Node watch
    csi_nodes: ObjectCache  # CSINodes, fed by the lean CSINode watch
    remediations: set[str]  # pod uids with a Remediation (the Remediation watch)
    events: EventQueue  # Events, posted off the action path
    incidents: Incidents  # node incidents and their writer thread
    detector: Detector
    reconciler: Reconciler
    kill_events: KillPodEvents  # the kubelet's FailedKillPod Events per pod (CNI teardown)
    volume_watches: tuple[WatchedVolumes, ...]  # bound claims and volumes (caches.py)


def wire(
    kube: Kube, policies: PolicyBook, settings: ReconcileSettings, clock: Callable[[], float]
) -> Parts:
    def namespace_labels(namespace: str) -> dict[str, str]:
        ns = kube.get(f"/api/v1/namespaces/{namespace}")
        return dict(((ns or {}).get("metadata") or {}).get("labels") or {})

    nodes = ObjectCache(lambda name: kube.get(node_path(name)))
    csi_nodes = ObjectCache(lambda name: kube.get(csi_node_path(name)))
    claims = WatchedVolumes(kube, CLAIMS, "claim watch")
    volumes = WatchedVolumes(kube, VOLUMES, "volume watch")
    bound = BoundVolumes(  # a stuck pod's claims and volumes: watched, else kept, else GET
        kube.get, watched=lambda path: claims.peek(path) or volumes.peek(path)
    )
    remediations: set[str] = set()
    events = EventQueue(kube)
    incidents = Incidents(kube, events, clock)
    kill_events = KillPodEvents(kube, clock)
    # finalizer triage: whose finalizer, is its controller (lease, policy-mapped Deployment) alive
    leases = OwnerLeases(  # a gap of 3 re-checks without a read breaks a "gone since" run
        kube,
        policies.finalizer_owners,
        # its times go into the bundle, judged against server time (deciding/detector.py)
        wall=lambda: kube.server_clock.server_latest(time.time()),
        max_gap_s=max(MAX_GAP_S, 3 * settings.recheck_s),
    )
    # fencing evidence: the node's FARs/SNRs when the pod's policy trusts them (docs/fencing.md)
    fencing = FencingRecords(kube)
    detector = Detector(
        kube,
        policies,
        NamespaceLabels(namespace_labels),
        nodes=nodes,
        csi_nodes=csi_nodes,
        has_remediation=remediations.__contains__,
        volumes=bound.get,
        kept_volumes=bound.peek,
        events=kill_events.events_of,
        leases=leases.for_pod,
        fencing=fencing.read,
        server_clock=kube.server_clock,
    )
    reconciler = Reconciler(
        kube,
        detector,
        settings,
        clock,
        ActionInputs(
            has_remediation=remediations.__contains__,
            events=events,
            # Before acting: the Node from a GET at most 1 s old, shared by its pods.
            fresh=NodeInputs(
                node=FreshNodes(lambda name: kube.get(node_path(name))).get,
                csi_node=csi_nodes.get,
                get=bound.get,
                events=kill_events.events_of,
                leases=leases.for_pod,
                # and the node's fencing records as read at most 1 s before
                fencing=fencing.read,
            ),
            incidents=incidents,
        ),
    )
    return Parts(
        nodes,
        csi_nodes,
        remediations,
        events,
        incidents,
        detector,
        reconciler,
        kill_events,
        (claims, volumes),
    )
