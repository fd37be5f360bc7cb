"""What is known about one pod: the API objects of a snapshot bundle and the node probe.

Only the parts the diagnosis needs, already type-checked by `unstick.core.model.snapshot`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from unstick.core.model.mountinfo import Mount

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


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

    @property
    def fenced(self) -> bool:
        """Taint `node.kubernetes.io/out-of-service` present: the node is known to be down."""
        return OUT_OF_SERVICE_TAINT in self.taints


@dataclass(frozen=True, slots=True)
class VolumeDir:
    path: str
    empty: bool


@dataclass(frozen=True, slots=True)
class Holder:
    """A process keeping a mount busy."""

    mount_point: str
    pid: int
    comm: str
    via: str  # cwd | root | fd | maps | mountns


@dataclass(frozen=True, slots=True)
class Container:
    """A container as the node's container runtime reports it."""

    pod_uid: str
    name: str
    id: str
    state: str  # running | exited | created | unknown
    created_at: datetime | None = None  # the runtime's creation time (CRI), when known
    runtime_state: str = ""  # the runtime's own state word when its processes contradict it


@dataclass(frozen=True, slots=True)
class DTask:
    """A process of the pod in uninterruptible sleep (state D): no signal reaches it."""

    pid: int
    comm: str
    container: str  # the container id its cgroup names ("" for the pod's own cgroup)
    wchan: str  # the kernel function it waits in ("" when not readable)
    stack: tuple[str, ...] = ()  # the first lines of /proc/<pid>/stack, where readable


FREEZER_STATES = ("FROZEN", "FREEZING")


@dataclass(frozen=True, slots=True)
class FrozenCgroup:
    """A cgroup of the pod whose freezer holds its processes (cgroup v1 freezer or v2)."""

    path: str  # the cgroup path, as /proc/<pid>/cgroup names it
    state: str  # FROZEN | FREEZING
    version: str  # v1 | v2
    container: str  # the container id ("" for the pod's own cgroup)
    self_frozen: bool | None = None  # frozen itself, not only through its parent


@dataclass(frozen=True, slots=True)
class BlockedTask:
    """A process waiting inside a network or FUSE filesystem for its server (issue #25)."""

    pid: int
    comm: str
    state: str  # the /proc stat state letter: D (uninterruptible) or S (e.g. FUSE's wait)
    wchan: str  # the kernel function it waits in ("" when not readable)
    via: str  # how it is tied to the mount: cwd | root | fd | maps | mountns (holder) | pod
    # | path (outside the pod, holding nothing: its blocked system call's path is the mount's)
    path: str = ""  # the path its blocked system call looks up ("" when not read)


@dataclass(frozen=True, slots=True)
class HungMount:
    """A mount of the pod on a network or FUSE filesystem whose server does not answer, as
    the agent saw it without touching the mount (mountinfo, /proc, the FUSE connection)."""

    mount_point: str
    fstype: str
    source: str
    waiting: int | None  # FUSE: requests waiting for the daemon (None: not FUSE / unread)
    blocked: tuple[BlockedTask, ...] = ()


RUNTIME_ANSWERED = ("cri+cgroup", "cri", "cgroup")  # `runtime` values: a source answered
RUNTIME_UNANSWERED = "unanswered"
HOLDER_SCAN_COMPLETE, HOLDER_SCAN_INCOMPLETE = "complete", "incomplete"


@dataclass(frozen=True, slots=True)
class Probe:
    """The agent's report from the node (design.md §6 `probe`).

    The visibility fields (design.md §3 invariant 8, §5) say which pod was probed and what the
    agent could see; None where an older probe does not say (it then counts as blind for
    "nothing left", see `sighted`).
    """

    node_name: str
    probed_at: datetime
    kubelet_root: str
    kubelet_healthy: bool | None
    registered_plugins: tuple[str, ...]
    mounts: tuple[Mount, ...]
    volume_dirs: tuple[VolumeDir, ...]
    holders: tuple[Holder, ...]
    containers: tuple[Container, ...] | None  # None: the runtime could not be asked
    pod_uid: str | None = None  # the pod UID probed
    pod_dir_exists: bool | None = None  # <root>/pods/<uid> is a directory
    pod_dirs_seen: int | None = None  # pod dirs under <root>/pods (>= 1: a kubelet root)
    runtime: str | None = None  # one of RUNTIME_ANSWERED, or RUNTIME_UNANSWERED
    holder_scan: str | None = None  # HOLDER_SCAN_COMPLETE | HOLDER_SCAN_INCOMPLETE
    blind_spots: tuple[str, ...] = ()  # what the agent could not see, in words
    d_tasks: tuple[DTask, ...] = ()  # the pod's processes in state D (older probes: none)
    frozen_cgroups: tuple[FrozenCgroup, ...] = ()  # the pod's frozen cgroups (older: none)
    hung_mounts: tuple[HungMount, ...] = ()  # the pod's hung network/FUSE mounts (older: none)
    # the pod's network/FUSE mount points a blocked task may wait on, unread (older: none)
    waiters_unknown: tuple[str, ...] = ()

    @property
    def runtime_answered(self) -> bool:
        """The container runtime (CRI, or a complete cgroup scan) answered."""
        return self.runtime in RUNTIME_ANSWERED

    @property
    def holder_scan_incomplete(self) -> bool:
        """The probe says its holder scan missed processes (absent: not said)."""
        return self.holder_scan == HOLDER_SCAN_INCOMPLETE

    def unseen(self) -> tuple[str, ...]:
        """Why this probe cannot prove that nothing of its pod is left (empty: it can)."""
        out = []
        if self.pod_uid is None:
            out.append("the probe does not say which pod UID it probed")
        if self.pod_dir_exists is None or self.pod_dirs_seen is None:
            out.append("the probe does not say whether the kubelet root holds pod dirs")
        elif self.pod_dirs_seen < 1:
            out.append(f"the kubelet root {self.kubelet_root} holds no pod dirs (wrong root?)")
        if self.runtime is None:
            out.append("the probe does not say whether the container runtime answered")
        elif not self.runtime_answered:
            out.append("the container runtime did not answer and the cgroup scan was incomplete")
        if self.holder_scan is None:
            out.append("the probe does not say whether its holder scan was complete")
        elif self.holder_scan != HOLDER_SCAN_COMPLETE:
            out.append("the holder scan was incomplete")
        return tuple(out)


@dataclass(frozen=True, slots=True)
class PodEvent:
    """An Event about the pod, from the bundle's `events` (issue #25: CNI teardown)."""

    reason: str
    message: str
    count: int = 1
    last: datetime | None = None


@dataclass(frozen=True, slots=True)
class LeaseFacts:
    """A coordination.k8s.io Lease from the bundle's `leases` (issue #25: finalizer owners)."""

    holder: str
    renewed: datetime | None
    duration_s: float


@dataclass(frozen=True, slots=True)
class DeploymentFacts:
    """An apps/v1 Deployment from the bundle's `deployments` (issue #25: a policy-mapped
    finalizer owner). `unavailable_since`: the Available condition's lastTransitionTime
    while it is False (None otherwise)."""

    replicas: int
    available: int
    unavailable_since: datetime | None = None


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
