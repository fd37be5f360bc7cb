"""What is known about one pod: the API objects of a snapshot bundle and the node probe
(whose facts are `unstick.core.model.probe`'s).

Only the parts the diagnosis needs, already type-checked by `unstick.core.model.snapshot`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from unstick.core.model.probe import Probe

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
#: set by the cloud node lifecycle controller (k8s.io/cloud-provider) while the provider
#: says the instance is shut down (docs/fencing.md)
CLOUD_SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"
LEASE, DEPLOYMENT = "Lease", "Deployment"  # the kinds of a finalizer's owner


@dataclass(frozen=True, slots=True)
class PodVolume:
    """One entry of pod.spec.volumes: its name and what backs it."""

    name: str
    claim_name: str | None = None  # persistentVolumeClaim.claimName
    csi_driver: str | None = None  # inline CSI volume: csi.driver


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    """One entry of pod.status.containerStatuses / initContainerStatuses /
    ephemeralContainerStatuses (`kubectl debug` containers are containers of the pod)."""

    name: str
    state: str  # running | waiting | terminated | unknown (the key of `state`)
    init: bool = False
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class Disruption:
    """The pod's condition `DisruptionTarget` while True: who set out to delete it, in
    Kubernetes' own words (its reason: DeletionByTaintManager, DeletionByPodGC,
    TerminationByKubelet, PreemptionByScheduler, EvictionByEvictionAPI,
    DeletionByDeviceTaintManager, ...; docs/compatibility.md). Evidence only."""

    reason: str
    message: str = ""

    def words(self) -> str:
        said = f": {self.message}" if self.message else ""
        return f"condition DisruptionTarget, reason {self.reason}{said}"


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    uid: str
    node_name: str | None
    deletion_timestamp: datetime | None
    deletion_grace_period_seconds: int | None
    finalizers: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[PodVolume, ...] = ()
    container_statuses: tuple[ContainerStatus, ...] = ()
    # metadata.generation: 1 at create and +1 at the first graceful delete since 1.33 (none
    # before); status.observedGeneration: the generation the kubelet's last status write
    # was computed from (PodObservedGenerationTracking: beta, on, in 1.34; GA in 1.35).
    # None: not in the object.
    generation: int | None = None
    observed_generation: int | None = None
    disruption: Disruption | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def kubelet_saw_delete(self) -> bool | None:
        """Has the kubelet written the pod's status since it saw the delete? The API server
        raises metadata.generation at the delete (when it has one), so a status written
        from the current generation was written by a kubelet that had the deleted pod (it
        writes one as it starts terminating a pod: kubelet.go SyncTerminatingPod). False:
        it writes generations, but its last write came from before the delete. None: no
        generation or no observedGeneration (before 1.33, the gate off, an older kubelet)."""
        if self.deletion_timestamp is None or not self.generation or not self.observed_generation:
            return None
        return self.observed_generation >= self.generation

    def kubelet_saw_delete_words(self) -> str | None:
        """The evidence line for `kubelet_saw_delete`, or None when it is unknown."""
        seen = self.kubelet_saw_delete
        if seen is None:
            return None
        numbers = (
            f"status.observedGeneration {self.observed_generation}, "
            f"metadata.generation {self.generation}"
        )
        if seen:
            return (
                f"the kubelet saw the delete ({numbers}): it wrote the pod's status after "
                "the delete reached it"
            )
        return (
            f"the kubelet has not written the pod's status since the delete ({numbers}): "
            "the delete has not reached it, or it never began terminating the pod, or its "
            "status writes do not reach the API server"
        )


@dataclass(frozen=True, slots=True)
class ReadyCondition:
    status: str  # "True" | "False" | "Unknown"
    last_transition: datetime | None
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    created: datetime | None
    ready: ReadyCondition | None  # None: the node has no Ready condition at all
    taints: tuple[str, ...] = ()  # taint keys
    taints_added: Mapping[str, datetime] = field(default_factory=dict)  # key → timeAdded

    @property
    def fenced(self) -> bool:
        """Taint `node.kubernetes.io/out-of-service` present (whether the policy trusts it,
        and the other proofs, are `unstick.core.rules.fencing`'s)."""
        return OUT_OF_SERVICE_TAINT in self.taints

    @property
    def last_ready_transition(self) -> datetime | None:
        """When the Ready condition last changed (for a node not Ready: when it stopped
        being Ready); a node with no Ready condition counts from its creation."""
        return (self.ready.last_transition if self.ready is not None else None) or self.created


@dataclass(frozen=True, slots=True)
class PodEvent:
    """An Event about the pod, from the bundle's `events` (read for a failing CNI teardown)."""

    reason: str
    message: str
    count: int = 1
    last: datetime | None = None


@dataclass(frozen=True, slots=True)
class LeaseFacts:
    """A coordination.k8s.io Lease from the bundle's `leases` (a finalizer's owner), with
    the reader's memory of it from the bundle's `leasesObserved`: since when (the reader's
    clock) its (renewTime, resourceVersion) has been as read, and whether the reader saw it
    change (False: only ever read as it is now). Without that memory: read once, at `now`."""

    holder: str
    renewed: datetime | None  # by the holder's clock: never compared with the reader's
    duration_s: float
    unchanged_since: datetime | None = None  # None: read once, at the bundle's capturedAt
    change_seen: bool = False


@dataclass(frozen=True, slots=True)
class DeploymentFacts:
    """An apps/v1 Deployment from the bundle's `deployments` (a policy-mapped
    finalizer owner). `unavailable_since`: the Available condition's lastTransitionTime
    while it is False (None otherwise)."""

    replicas: int
    available: int
    unavailable_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class FenceAgentsRemediationFacts:
    """A medik8s FenceAgentsRemediation (v1alpha1) from the bundle's
    `fenceAgentsRemediations`. `node`: the annotation `remediation.medik8s.io/node-name`,
    else the object's name (FAR's GetNodeName). `fence_succeeded_at`: the
    lastTransitionTime of its condition `FenceAgentActionSucceeded` while that is True
    (None otherwise)."""

    namespace: str
    name: str
    node: str
    fence_succeeded_at: datetime | None = None
    reason: str | None = None  # the condition's reason (FenceAgentSucceeded)


@dataclass(frozen=True, slots=True)
class SelfNodeRemediationFacts:
    """A medik8s SelfNodeRemediation (v1alpha1) from the bundle's `selfNodeRemediations`.
    `node`: the annotation `remediation.medik8s.io/node-name`, else the object's name;
    None when a Machine owns it (and no NodeHealthCheck does): its node is the Machine's,
    not known from the object. `assumed_rebooted`: `status.timeAssumedRebooted`."""

    namespace: str
    name: str
    node: str | None
    assumed_rebooted: datetime | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything one diagnosis looks at; `now` is the bundle's capturedAt."""

    now: datetime
    pod: PodFacts
    node: NodeFacts | None  # None: the Node object does not exist
    csi_node_drivers: tuple[str, ...] | None  # CSINode.spec.drivers[].name; None: no CSINode
    claims: Mapping[str, str | None] = field(default_factory=dict)  # PVC name → PV name
    pv_drivers: Mapping[str, str | None] = field(default_factory=dict)  # PV name → CSI driver
    probe: Probe | None = None
    events: tuple[PodEvent, ...] = ()  # Events about the pod (optional in a bundle)
    leases: Mapping[tuple[str, str], LeaseFacts] = field(default_factory=dict)  # (ns, name)
    deployments: Mapping[tuple[str, str], DeploymentFacts] = field(default_factory=dict)
    # bundle's `ownersGoneSince`: (kind, ns, name) → seen gone (missing, 0 available) since
    owners_gone_since: Mapping[tuple[str, str, str], datetime] = field(default_factory=dict)
    # fencing records of medik8s' operators (optional in a bundle; docs/fencing.md)
    fence_agents_remediations: tuple[FenceAgentsRemediationFacts, ...] = ()
    self_node_remediations: tuple[SelfNodeRemediationFacts, ...] = ()
