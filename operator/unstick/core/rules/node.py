"""Rules 4-9 of docs/design.md §1-2: what the pod's node shows.

Rule 3a (ContainerFrozen) comes first: a fresh probe reports a cgroup of the pod
FROZEN or FREEZING — a running container the runtime cannot kill. Rule 4
(ContainersStillRunning) reads the node's containers from a fresh probe, else
pod.status; rules 5-9 (MountBusy, CSIDriverMissing, OrphanedMount, StaleVolumeDirs,
KubeletNotProgressing) need a fresh probe of the pod's node and are Unknown without one:
node state is never guessed. The API-only rules before them (final delete, node) and the
order are `unstick.core.rules.diagnosis`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from unstick.core import safety
from unstick.core.durations import human
from unstick.core.evidence import Evidence
from unstick.core.model.facts import Facts
from unstick.core.model.node_facts import (
    RUNNING,
    PodMount,
    containers_on_node,
    csi_dirs_waiting,
    mounts_of_pod,
    volume_dirs_of_pod,
)
from unstick.core.model.probe import FrozenCgroup, HungMount, Probe, VolumeDir
from unstick.core.rules.cni import failure_words, teardown_failure
from unstick.core.rules.hung_mounts import hung_of_pod, hung_words
from unstick.core.rules.pod_tasks import frozen_words
from unstick.core.rules.still_running import (
    api_running,
    left_tasks,
    running_containers,
    runtime_evidence,
    stuck_tasks,
)
from unstick.core.vocabulary import Cause


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the node-side rules found (defaults: nothing known)."""

    probe_fresh: bool = False
    kubelet_root: str | None = None
    mounts: tuple[PodMount, ...] = ()
    volume_dirs: tuple[VolumeDir, ...] = ()
    running_containers: tuple[str, ...] = ()
    nothing_left: bool = False
    frozen_cgroups: tuple[FrozenCgroup, ...] = ()
    hung_mounts: tuple[HungMount, ...] = ()
    holders_unknown: bool = False  # no listed holder is not known to mean no holder


def on_the_node(facts: Facts, max_age_s: float, ev: list[Evidence]) -> tuple[Cause, NodeView]:
    """Rules 4-9 for a pod that is stuck and not decided by the API-only rules 1-3."""
    pod = facts.pod
    none = NodeView()
    # 4. ContainersStillRunning (probe form, else API form)
    probe = _fresh_probe(facts, max_age_s, ev) if pod.node_name else None
    on_node = containers_on_node(facts, probe) if probe is not None else None
    # 3a. ContainerFrozen: a running container that no signal reaches until it is thawed
    if probe is not None and probe.frozen_cgroups:
        return Cause.ContainerFrozen, _frozen(facts, probe, on_node, ev)
    # 3b. HungMount: a network/FUSE mount of the pod whose server does not answer
    hung = hung_of_pod(probe, mounts_of_pod(facts, probe)) if probe is not None else ()
    if probe is not None and hung:
        return Cause.HungMount, _hung(facts, probe, on_node, hung, ev)
    before = len(ev)
    running = running_containers(probe, on_node, api_running(facts), ev) or left_tasks(probe, ev)
    if running:
        # what cannot be killed goes first: the Event message carries the first lines
        ev[before:before] = stuck_tasks(probe)
        runtime_evidence(facts, probe, ev)
        return Cause.ContainersStillRunning, NodeView(
            probe_fresh=probe is not None,
            kubelet_root=probe.kubelet_root if probe else None,
            running_containers=running,
        )
    # 4a. CNITeardownFailed: the kubelet's KillPodSandbox fails in the CNI plugin's DEL
    cni = teardown_failure(pod, facts.events)
    if cni is not None:
        ev.append(Evidence("network", failure_words(cni)))
        return Cause.CNITeardownFailed, NodeView(
            probe_fresh=probe is not None, kubelet_root=probe.kubelet_root if probe else None
        )
    if probe is None:
        ev.append(Evidence("probe", "no fresh probe of the pod's node: node-side causes unknown"))
        return Cause.Unknown, none
    mounts = mounts_of_pod(facts, probe)
    dirs = volume_dirs_of_pod(facts, probe)
    waiting = csi_dirs_waiting(facts, probe, dirs)
    cause = _node_side(probe, mounts, dirs, on_node, ev, waiting=waiting)
    seen = pod.kubelet_saw_delete_words()  # since 1.33: evidence only
    if cause is Cause.KubeletNotProgressing and seen is not None:
        ev.append(Evidence("kubelet", seen))
    return cause, NodeView(
        probe_fresh=True,
        kubelet_root=probe.kubelet_root,
        mounts=mounts,
        volume_dirs=dirs,
        nothing_left=cause is Cause.KubeletNotProgressing,
    )


def _fresh_probe(facts: Facts, max_age_s: float, ev: list[Evidence]) -> Probe | None:
    """The probe, when it is a fresh probe of the pod's node (safety invariant 1) and not
    of another pod (invariant 7)."""
    probe, node = facts.probe, facts.pod.node_name
    if probe is None:
        ev.append(Evidence("probe", "no node probe in the bundle: node-side state is unknown"))
        return None
    verdict = safety.fresh_probe(probe.node_name, probe.probed_at, node, facts.now, max_age_s)
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


def _frozen(
    facts: Facts, probe: Probe, on_node: tuple[tuple[str, str], ...] | None, ev: list[Evidence]
) -> NodeView:
    """Rule 3a's evidence and view: each frozen cgroup, the pod's tasks in D state."""
    for c in probe.frozen_cgroups:
        ev.append(Evidence("freezer", frozen_words(c)))
    ev.extend(stuck_tasks(probe))
    seen = tuple(f"container {n}" for n, state in on_node or () if state == RUNNING)
    frozen = tuple(f"container {c.container}" for c in probe.frozen_cgroups if c.container)
    running = tuple(dict.fromkeys(seen + frozen)) or ("the pod's frozen cgroup",)
    runtime_evidence(facts, probe, ev)
    return NodeView(
        probe_fresh=True,
        kubelet_root=probe.kubelet_root,
        running_containers=running,
        frozen_cgroups=probe.frozen_cgroups,
    )


def _hung(
    facts: Facts,
    probe: Probe,
    on_node: tuple[tuple[str, str], ...] | None,
    hung: tuple[HungMount, ...],
    ev: list[Evidence],
) -> NodeView:
    """Rule 3b's evidence and view: each hung mount and its server, what holds it, what of
    the pod still runs (a lazy unmount waits for both to be gone)."""
    ev.extend(Evidence("mount", hung_words(h)) for h in hung)
    mounts = mounts_of_pod(facts, probe)
    for m in mounts:
        for h in m.holders:
            ev.append(
                Evidence("holder", f"pid {h.pid} ({h.comm}) holds {m.mount_point} via {h.via}")
            )
    ev.extend(stuck_tasks(probe))
    running = running_containers(probe, on_node, api_running(facts), ev) or left_tasks(probe, ev)
    return NodeView(
        probe_fresh=True,
        kubelet_root=probe.kubelet_root,
        mounts=mounts,
        running_containers=running,
        hung_mounts=hung,
        holders_unknown=_unheld_unknown(probe, ev),
    )


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
    *,
    waiting: tuple[tuple[str, str], ...] = (),
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

    # 6, once unmounted: the kubelet's vol_data.json kept while the driver is missing
    for path, driver in waiting:
        ev.append(
            Evidence(
                "driver",
                f"volume dir {path} keeps the kubelet's vol_data.json: CSI driver {driver} is "
                "registered neither in CSINode.spec.drivers nor in the node's plugin registry, "
                "so the kubelet still holds the volume; it tears it down once the driver is back",
            )
        )
    if waiting:
        return Cause.CSIDriverMissing

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
    if probe.kubelet_pods is not None:  # its own word, from its /metrics: evidence only
        ev.append(Evidence("kubelet", probe.kubelet_pods.words()))
    return Cause.KubeletNotProgressing
