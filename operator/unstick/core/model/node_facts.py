"""Node-side facts of one pod, derived from a fresh probe: its mounts (with holders and
CSI drivers), its volume dirs, its containers. Pure; used by the diagnosis."""

from __future__ import annotations

from dataclasses import dataclass

from unstick.core.model.facts import Facts
from unstick.core.model.kubelet_paths import (
    PodVolumePath,
    classify,
    depth,
    is_pod_volume_path,
    normalise,
    pod_mounts,
)
from unstick.core.model.probe import Holder, Probe, VolumeDir

RUNNING = "running"


@dataclass(frozen=True, slots=True)
class PodMount:
    """A mount under the pod's volume dirs, as the node sees it."""

    mount_point: str
    mount_id: int
    fstype: str
    source: str
    volume: PodVolumePath | None
    csi: bool | None  # None: cannot tell whether a CSI volume is behind it
    csi_driver: str | None  # known only when csi is True and the driver could be resolved
    driver_registered: bool | None  # None unless csi and csi_driver are known
    holders: tuple[Holder, ...] = ()
    waiters_unknown: bool = False  # a blocked task may wait on it, its path unread

    @property
    def replayable(self) -> bool:
        """A CSI volume's publish target (`volumes/kubernetes.io~csi/<vol>/mount`)."""
        return (
            self.csi is True
            and self.volume is not None
            and self.volume.kind == "volume"
            and self.volume.csi_volume is not None
        )


def _csi_of(c: PodVolumePath | None, facts: Facts) -> tuple[bool | None, str | None]:
    """(is it a CSI volume, its driver) for a classified path; None where not knowable."""
    if c is None:
        return None, None
    pod_volumes = {v.name: v for v in facts.pod.volumes}
    if c.kind == "volume":
        if c.csi_volume is None:
            return False, None
        if c.volume in facts.pv_drivers:
            return True, facts.pv_drivers[c.volume]
        inline = pod_volumes.get(c.volume)
        return True, inline.csi_driver if inline is not None else None
    vol = pod_volumes.get(c.volume)
    if vol is None:
        return None, None
    if vol.csi_driver is not None:
        return True, vol.csi_driver
    if vol.claim_name is None:
        return False, None
    pv = facts.claims.get(vol.claim_name)
    if pv is None or pv not in facts.pv_drivers:
        return None, None
    driver = facts.pv_drivers[pv]
    return driver is not None, driver


def registered_drivers(facts: Facts, probe: Probe) -> frozenset[str]:
    """CSI drivers registered on the node: CSINode.spec.drivers + probe.registeredPlugins."""
    return frozenset(facts.csi_node_drivers or ()) | frozenset(probe.registered_plugins)


def mounts_of_pod(facts: Facts, probe: Probe) -> tuple[PodMount, ...]:
    """The pod's volume/subpath mounts on the node, deepest first, with holders."""
    uid, root = facts.pod.uid, probe.kubelet_root
    registered = registered_drivers(facts, probe)
    unsure = {normalise(p) or p for p in probe.waiters_unknown}
    out = []
    for m in pod_mounts(probe.mounts, root, uid):
        point = normalise(m.mount_point) or m.mount_point
        holders = tuple(h for h in probe.holders if normalise(h.mount_point) == point)
        volume = classify(point, root, uid)
        csi, driver = _csi_of(volume, facts)
        out.append(
            PodMount(
                mount_point=point,
                mount_id=m.mount_id,
                fstype=m.fstype,
                source=m.source,
                volume=volume,
                csi=csi,
                csi_driver=driver if csi else None,
                driver_registered=(driver in registered) if csi and driver else None,
                holders=holders,
                waiters_unknown=point in unsure,
            )
        )
    return tuple(out)


def volume_dirs_of_pod(facts: Facts, probe: Probe) -> tuple[VolumeDir, ...]:
    """The probe's volume dirs that are strictly under this pod's volume dirs, deepest first."""
    seen: dict[str, VolumeDir] = {}
    for d in probe.volume_dirs:
        path = normalise(d.path)
        if path and is_pod_volume_path(path, probe.kubelet_root, facts.pod.uid):
            seen[path] = VolumeDir(path=path, empty=d.empty)
    return tuple(sorted(seen.values(), key=lambda d: (-depth(d.path), d.path)))


def csi_dirs_waiting(
    facts: Facts, probe: Probe, dirs: tuple[VolumeDir, ...]
) -> tuple[tuple[str, str], ...]:
    """(dir, driver) of each non-empty CSI volume dir `volumes/kubernetes.io~csi/<vol>` whose
    driver is registered neither in CSINode nor with the kubelet: the kubelet's own
    vol_data.json the agent keeps there (docs/csi.md) — the kubelet has not torn the volume
    down, holds it, and does so once the driver is back."""
    registered = registered_drivers(facts, probe)
    out = []
    for d in dirs:
        c = classify(d.path, probe.kubelet_root, facts.pod.uid)
        if d.empty or c is None or c.csi_volume is None or c.rest:
            continue
        _, driver = _csi_of(c, facts)
        if driver and driver not in registered:
            out.append((d.path, driver))
    return tuple(out)


def containers_on_node(facts: Facts, probe: Probe) -> tuple[tuple[str, str], ...] | None:
    """(name, state) of this pod's containers per the node's runtime; None if unknown."""
    if probe.containers is None:
        return None
    return tuple((c.name, c.state) for c in probe.containers if c.pod_uid == facts.pod.uid)
