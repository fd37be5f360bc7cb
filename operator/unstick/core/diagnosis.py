"""Why is this pod stuck? DESIGN §1-2, evaluated in order; the first matching rule wins.

final-delete → node → containers → volumes → kubelet. Node-side rules (5-9) need a
fresh probe of the pod's node; without one only the API form of rule 4 can match and
everything else is Unknown: node state is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from unstick.core import safety
from unstick.core.durations import human
from unstick.core.facts import Facts, NodeFacts, Probe, VolumeDir
from unstick.core.node_facts import (
    RUNNING,
    PodMount,
    containers_on_node,
    mounts_of_pod,
    volume_dirs_of_pod,
)
from unstick.core.vocabulary import Cause


@dataclass(frozen=True, slots=True)
class DiagnosisSettings:
    slack_s: float = 60.0
    node_lost_after_s: float = 300.0
    probe_max_age_s: float = 120.0


@dataclass(frozen=True, slots=True)
class Evidence:
    kind: (
        str  # deletion | finalizer | node | probe | container | mount | holder | driver | volumeDir
    )
    message: str


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The cause plus everything the planner and the executors' re-checks need."""

    namespace: str
    name: str
    uid: str
    node: str | None
    now: datetime
    cause: Cause
    stuck: bool
    overdue_seconds: float | None  # None: no deletionTimestamp
    evidence: tuple[Evidence, ...]
    fenced: bool | None  # None: no Node object
    probe_fresh: bool  # a fresh probe of the pod's node was used
    kubelet_root: str | None  # from the fresh probe
    mounts: tuple[PodMount, ...] = ()  # deepest first
    volume_dirs: tuple[VolumeDir, ...] = ()  # deepest first
    running_containers: tuple[str, ...] = ()
    nothing_left: bool = False  # a fresh probe shows nothing of the pod on the node
    finalizers: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # When the pod's node, not Ready, will have been so for nodeLostAfter (rule 3 then
    # matches); None: the node is Ready, already lost, or unknown. Nothing changes about
    # the Node at that moment, so whoever re-diagnoses on changes must wake up then.
    node_lost_at: datetime | None = None

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _fresh_probe(facts: Facts, settings: DiagnosisSettings, ev: list[Evidence]) -> Probe | None:
    """The probe, when it is a fresh probe of the pod's node (safety invariant 1) and not
    of another pod (invariant 7)."""
    probe, node = facts.probe, facts.pod.node_name
    if probe is None:
        ev.append(Evidence("probe", "no node probe in the bundle: node-side state is unknown"))
        return None
    verdict = safety.fresh_probe(
        probe.node_name, probe.probed_at, node, facts.now, settings.probe_max_age_s
    )
    if not verdict:
        ev.append(Evidence("probe", f"probe ignored: {verdict.reason}"))
        return None
    if probe.pod_uid is not None and probe.pod_uid != facts.pod.uid:
        ev.append(
            Evidence(
                "probe",
                f"probe ignored: it is of pod uid {probe.pod_uid}, not of this pod {facts.pod.uid}",
            )
        )
        return None
    age = (facts.now - probe.probed_at).total_seconds()
    health = {True: "healthy", False: "NOT healthy", None: "of unknown health"}
    message = f"probe of node {node} from {human(age)} ago; kubelet {health[probe.kubelet_healthy]}"
    if probe.blind_spots:
        message += "; the agent could not see: " + "; ".join(probe.blind_spots)
    ev.append(Evidence("probe", message))
    return probe


def _node_lost(node: NodeFacts, facts: Facts, settings: DiagnosisSettings) -> tuple[bool, str]:
    """(is the node lost for >= nodeLostAfter, what to say about its Ready state)."""
    ready = node.ready
    if ready is not None and ready.status == "True":
        return False, ""
    since = (ready.last_transition if ready is not None else None) or node.created
    what = "no Ready condition"
    if ready is not None:
        what = f"Ready={ready.status}" + (f" ({ready.reason})" if ready.reason else "")
    if since is None:
        return False, f"node {node.name} has {what} since an unknown time: not counted as lost"
    lost = (facts.now - since).total_seconds()
    fenced = (
        "fenced: taint node.kubernetes.io/out-of-service is present"
        if node.fenced
        else "NOT fenced: no node.kubernetes.io/out-of-service taint"
    )
    message = f"node {node.name} has {what} for {human(lost)} (since {_iso(since)}); {fenced}"
    if lost >= settings.node_lost_after_s:
        return True, message
    return False, f"{message}; under nodeLostAfter {human(settings.node_lost_after_s)}"


def _node_lost_at(facts: Facts, settings: DiagnosisSettings) -> datetime | None:
    """When the pod's node will count as lost, if it is not Ready and not lost yet."""
    node = facts.node
    if node is None or (node.ready is not None and node.ready.status == "True"):
        return None
    since = (node.ready.last_transition if node.ready is not None else None) or node.created
    if since is None:
        return None
    at = since + timedelta(seconds=settings.node_lost_after_s)
    return at if at > facts.now else None


def _api_running(facts: Facts) -> tuple[str, ...]:
    """The running containers per pod.status: init, regular and ephemeral (`kubectl
    debug`) ones alike — a debug container still running keeps the pod's volumes in use."""
    return tuple(
        ("init container " if c.init else "ephemeral container " if c.ephemeral else "container ")
        + c.name
        for c in facts.pod.container_statuses
        if c.state == RUNNING
    )


@dataclass(frozen=True, slots=True)
class _NodeView:
    """What the node-side rules found (defaults: nothing known)."""

    probe_fresh: bool = False
    kubelet_root: str | None = None
    mounts: tuple[PodMount, ...] = ()
    volume_dirs: tuple[VolumeDir, ...] = ()
    running_containers: tuple[str, ...] = ()
    nothing_left: bool = False


def diagnose(facts: Facts, settings: DiagnosisSettings | None = None) -> Diagnosis:
    """Diagnose one pod; `facts.now` (the bundle's capturedAt) is "now"."""
    settings = settings or DiagnosisSettings()
    pod = facts.pod
    ev: list[Evidence] = []
    overdue: float | None = None
    if pod.deletion_timestamp is not None:
        overdue = (facts.now - pod.deletion_timestamp).total_seconds()
    stuck = overdue is not None and overdue > settings.slack_s
    cause, view = _decide(facts, settings, overdue, stuck, ev)
    return Diagnosis(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=pod.node_name,
        now=facts.now,
        cause=cause,
        stuck=stuck,
        overdue_seconds=overdue,
        evidence=tuple(ev),
        fenced=None if facts.node is None else facts.node.fenced,
        probe_fresh=view.probe_fresh,
        kubelet_root=view.kubelet_root,
        mounts=view.mounts,
        volume_dirs=view.volume_dirs,
        running_containers=view.running_containers,
        nothing_left=view.nothing_left,
        finalizers=pod.finalizers,
        annotations=pod.annotations,
        node_lost_at=_node_lost_at(facts, settings),
    )


def _decide(
    facts: Facts,
    settings: DiagnosisSettings,
    overdue: float | None,
    stuck: bool,
    ev: list[Evidence],
) -> tuple[Cause, _NodeView]:
    pod = facts.pod
    none = _NodeView()
    # 0. NotStuck
    if pod.deletion_timestamp is None or overdue is None:
        ev.append(Evidence("deletion", "pod has no deletionTimestamp: it is not being deleted"))
        return Cause.NotStuck, none
    when = f"{human(overdue)} ago" if overdue >= 0 else f"in {human(overdue)}"
    ev.append(
        Evidence(
            "deletion",
            f"deletionTimestamp {_iso(pod.deletion_timestamp)} (delete time + grace period) is "
            f"{when}; stuck after {human(settings.slack_s)} of slack",
        )
    )
    if not stuck:
        return Cause.NotStuck, none

    # 1. FinalizerBlocked
    finalizers = ", ".join(pod.finalizers)
    if pod.finalizers and pod.deletion_grace_period_seconds == 0:
        ev.append(
            Evidence(
                "finalizer",
                "deletionGracePeriodSeconds is 0 (the final delete was issued); "
                f"finalizers keep the object: {finalizers}",
            )
        )
        return Cause.FinalizerBlocked, none
    if pod.finalizers and pod.node_name is None:
        ev.append(
            Evidence("finalizer", f"pod is on no node; finalizers keep the object: {finalizers}")
        )
        return Cause.FinalizerBlocked, none

    # 2. NodeGone
    if pod.node_name is not None and facts.node is None:
        ev.append(Evidence("node", f"node {pod.node_name} does not exist (no Node object)"))
        return Cause.NodeGone, none

    # 3. NodeUnreachable
    if facts.node is not None:
        lost, message = _node_lost(facts.node, facts, settings)
        if message:
            ev.append(Evidence("node", message))
        if lost:
            return Cause.NodeUnreachable, none

    # 4. ContainersStillRunning (probe form, else API form)
    probe = _fresh_probe(facts, settings, ev) if pod.node_name else None
    on_node = containers_on_node(facts, probe) if probe is not None else None
    running = _running(probe, on_node, _api_running(facts), ev)
    if running:
        _runtime_evidence(facts, probe, ev)
        return Cause.ContainersStillRunning, _NodeView(
            probe_fresh=probe is not None,
            kubelet_root=probe.kubelet_root if probe else None,
            running_containers=running,
        )
    if probe is None:
        ev.append(Evidence("probe", "no fresh probe of the pod's node: node-side causes unknown"))
        return Cause.Unknown, none
    mounts = mounts_of_pod(facts, probe)
    dirs = volume_dirs_of_pod(facts, probe)
    cause = _node_side(probe, mounts, dirs, on_node, ev)
    return cause, _NodeView(
        probe_fresh=True,
        kubelet_root=probe.kubelet_root,
        mounts=mounts,
        volume_dirs=dirs,
        nothing_left=cause is Cause.KubeletNotProgressing,
    )


def _running(
    probe: Probe | None,
    on_node: tuple[tuple[str, str], ...] | None,
    api_running: tuple[str, ...],
    ev: list[Evidence],
) -> tuple[str, ...]:
    """Rule 4: the running containers, from the node where its runtime answered, else from
    the API (plus whatever the node saw running: a running container is a positive fact)."""
    if probe is None or on_node is None:
        running, source = api_running, "pod.status"
    else:
        seen = tuple(f"container {n}" for n, state in on_node if state == RUNNING)
        if probe.runtime_answered or (probe.runtime is None and not api_running):
            running, source = seen, "the node's container runtime"
            if api_running and not running:
                ev.append(
                    Evidence(
                        "container",
                        f"API status says {', '.join(api_running)} running, but the node's "
                        "runtime shows none running (the kubelet has not updated the status)",
                    )
                )
        else:
            names = {n for n, state in on_node if state == RUNNING}
            running = seen + tuple(c for c in api_running if c.rsplit(" ", 1)[-1] not in names)
            source = "the node and pod.status (the probe does not show that its runtime answered)"
    if running:
        ev.append(Evidence("container", f"{', '.join(running)} still running per {source}"))
    return running


def _runtime_evidence(facts: Facts, probe: Probe | None, ev: list[Evidence]) -> None:
    """What the runtime says of each running container and for how long it has outlived the
    deletion deadline (containerd#6080: a container StopContainer cannot kill)."""
    deadline = facts.pod.deletion_timestamp
    past = human((facts.now - deadline).total_seconds()) if deadline else None
    seen = [
        c
        for c in (probe.containers or () if probe is not None else ())
        if c.pod_uid == facts.pod.uid and c.state == RUNNING
    ]
    for c in seen[:5]:
        words = [f"container {c.name}: running"]
        if c.runtime_state:
            words.append(f"by its processes, though the runtime says {c.runtime_state}")
        if c.created_at is not None:
            words.append(f"(created {human((facts.now - c.created_at).total_seconds())} ago)")
        if past:
            words.append(f"— {past} past the deletion deadline: StopContainer has not ended it")
        ev.append(Evidence("runtime", " ".join(words)))
    if not seen and past:
        ev.append(Evidence("runtime", f"still running {past} past the deletion deadline"))


def _unheld_unknown(probe: Probe, ev: list[Evidence]) -> bool:
    """Mounts with no listed holder are not known to be unheld: the holder scan was
    incomplete, or no container source answered (rules 6-7 would plan an unmount)."""
    if probe.holder_scan_incomplete:
        ev.append(
            Evidence(
                "holder",
                "the holder scan was incomplete: a mount with no listed holder may still be held",
            )
        )
        return True
    if probe.runtime is not None and not probe.runtime_answered:
        ev.append(
            Evidence(
                "container",
                "the container runtime did not answer and the cgroup scan was incomplete: "
                "cannot tell whether a container of the pod still uses its mounts",
            )
        )
        return True
    return False


def _node_side(
    probe: Probe,
    mounts: tuple[PodMount, ...],
    dirs: tuple[VolumeDir, ...],
    on_node: tuple[tuple[str, str], ...] | None,
    ev: list[Evidence],
) -> Cause:
    """Rules 5-9, from a fresh probe of this pod."""
    for m in mounts:
        kind = f"{m.fstype} from {m.source}" if m.source else m.fstype
        driver = f", CSI driver {m.csi_driver}" if m.csi_driver else ""
        ev.append(Evidence("mount", f"{m.mount_point} is still mounted ({kind}{driver})"))

    # 5. MountBusy
    busy = [m for m in mounts if m.holders]
    if busy:
        for m in busy:
            for h in m.holders:
                ev.append(
                    Evidence("holder", f"pid {h.pid} ({h.comm}) holds {m.mount_point} via {h.via}")
                )
        return Cause.MountBusy

    if mounts and _unheld_unknown(probe, ev):
        return Cause.Unknown
    if mounts:
        # 6. CSIDriverMissing
        missing = [m for m in mounts if m.csi and m.csi_driver and m.driver_registered is False]
        for m in missing:
            ev.append(
                Evidence(
                    "driver",
                    f"CSI driver {m.csi_driver} of {m.mount_point} is registered neither in "
                    "CSINode.spec.drivers nor in the node's plugin registry",
                )
            )
        if missing:
            return Cause.CSIDriverMissing
        unknown = [m for m in mounts if m.csi is None or (m.csi and m.csi_driver is None)]
        for m in unknown:
            ev.append(
                Evidence(
                    "driver",
                    f"cannot tell which CSI driver serves {m.mount_point}: its PV/PVC or "
                    "volume is not in the bundle",
                )
            )
        if unknown:
            return Cause.Unknown
        # 7. OrphanedMount
        ev.append(
            Evidence(
                "mount",
                f"{len(mounts)} mount(s) of the pod remain with no holders and no running "
                "container: the volume teardown did not happen",
            )
        )
        return Cause.OrphanedMount

    # 8. StaleVolumeDirs
    if dirs:
        for d in dirs:
            state = "empty" if d.empty else "NOT empty (never deleted)"
            ev.append(Evidence("volumeDir", f"volume dir {d.path} remains, {state}"))
        return Cause.StaleVolumeDirs

    # 9. KubeletNotProgressing
    if on_node is None:
        ev.append(
            Evidence(
                "container",
                "the probe could not list the node's containers: cannot tell whether "
                "anything of the pod is left",
            )
        )
        return Cause.Unknown
    leftover = [f"{n} ({s})" for n, s in on_node if s == "unknown"]
    if leftover:
        ev.append(
            Evidence("container", f"containers in unknown state on the node: {', '.join(leftover)}")
        )
        return Cause.Unknown
    unseen = probe.unseen()
    if unseen:
        ev.append(
            Evidence(
                "probe",
                "the probe shows nothing of the pod, but cannot prove it could see: "
                + "; ".join(unseen),
            )
        )
        return Cause.Unknown
    ev.append(
        Evidence(
            "kubelet",
            "nothing of the pod is left on the node (no running containers, mounts or volume "
            "dirs), yet the pod is not finalised: the kubelet is not progressing",
        )
    )
    return Cause.KubeletNotProgressing
