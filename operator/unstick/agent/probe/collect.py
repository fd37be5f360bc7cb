"""The node probe: the facts of design.md §6 for one pod, and a node-wide summary for metrics.

`probe_pod` returns the `probe` object of the snapshot bundle. Its `mountinfo` holds only
the host mountinfo lines whose mount point is under `<kubeletRoot>/pods/<uid>/` (the full
host table would be large and would leak other pods' paths into this pod's Remediation).

Besides the facts it says which pod it is of and what the agent could see (design.md §3
invariant 8: "nothing of the pod left" is only believed from a probe that could see):

- `podUID`: the pod UID probed (the controller ignores a probe of another UID).
- `podDirExists`: `<kubeletRoot>/pods/<podUID>` is a directory (lstat, no symlink followed).
- `podDirsSeen`: how many pod directories `<kubeletRoot>/pods/` holds (lstat each entry;
  0 when it cannot be listed). At least 1 proves the root is a kubelet root: on a node the
  agent's own pod has one, and the agent refuses to start on a root whose pod dirs do not
  match the host mount table (`unstick.core.model.kubelet_paths.check_kubelet_root`). A pod dir
  that is gone after a real cleanup is normal; a root with no pod dirs at all is a wrong root.
- `runtime`: which container sources answered completely — `cri+cgroup`, `cri`, `cgroup`
  or `unanswered` (`unstick.agent.probe.containers`). `containers` is their union; it is null
  only when neither answered and nothing was seen running.
- `holderScan`: `complete` or `incomplete` — whether the holder scan saw every process
  (`unstick.agent.holders.scan.scan_holders`). With no mount of the pod there is nothing to
  hold and the scan is complete.
- `blindSpots`: what could not be seen, in words (at most a few short lines), for the
  evidence.
- `containersSource` (kept for older readers): `cri`, `proc-cgroup`, `cri+proc-cgroup`, or
  null.
- `dTasks`: the pod's processes in uninterruptible sleep (state D) — pid, comm, container,
  wchan, stack — and `frozenCgroups`: the pod's cgroups whose freezer state is FROZEN or
  FREEZING (`unstick.agent.probe.pod_tasks`). Evidence; an older probe has neither.
- `hungMounts`: the pod's network/FUSE mounts something waits on — FUSE requests the daemon
  has not read, processes holding the mount or of the pod waiting in its filesystem
  (`unstick.agent.probe.hung_mounts`), found without touching the mount.
- `waitersUnknown`: the pod's network/FUSE mount points a task blocked in a path lookup
  may wait on, its path unread (a blind spot says why): no plain unmount is planned there.
- `cgroupLayout` and `cgroupDriver`: the freezer the agent saw (`v2`, `hybrid`, `v1`,
  `none`) and how the pod's cgroups are named (`systemd`, `cgroupfs`); null when no process
  of the pod was seen (`unstick.agent.probe.pod_tasks`).
- `kubeletPods`: the kubelet's own pod-worker counts from its /metrics, or why they were
  not read (`unstick.agent.probe.kubelet_metrics`). Evidence only.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from unstick.agent.holders.scan import scan_holders
from unstick.agent.probe.containers import pod_component, runtime_answer
from unstick.agent.probe.hung_mounts import HungScan, hung_mounts
from unstick.agent.probe.kubelet_health import kubelet_healthy
from unstick.agent.probe.kubelet_metrics import read_kubelet_pods
from unstick.agent.probe.mount_file import MountTable, pod_lines, read_pod_table
from unstick.agent.probe.plugins import Plugin, registered_plugins
from unstick.agent.probe.pod_tasks import (
    cgroup_driver,
    cgroup_layout,
    cgroup_mounts,
    d_tasks,
    frozen_cgroups,
)
from unstick.agent.probe.volume_dirs import volume_dirs
from unstick.agent.settings import AgentSettings
from unstick.core.model.kubelet_paths import is_pod_volume_path, normalise, pod_dir
from unstick.core.model.probe import HOLDER_SCAN_COMPLETE, HOLDER_SCAN_INCOMPLETE, Probe

_MAX_BLIND_SPOTS = 6
_MAX_BLIND_SPOT_CHARS = 300


def is_real_dir(path: str) -> bool:
    """`path` is a directory itself (lstat: a symlink to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def pod_dirs_seen(kubelet_root: str, blind: list[str]) -> int:
    """How many directories `<root>/pods/` holds (entries not followed if symlinks)."""
    pods = os.path.join(kubelet_root, "pods")
    try:
        with os.scandir(pods) as entries:
            return sum(1 for e in entries if e.is_dir(follow_symlinks=False))
    except OSError as exc:
        blind.append(f"cannot list {pods}: {exc.strerror or exc}")
        return 0


def probe_pod(
    settings: AgentSettings,
    uid: str,
    now: datetime | None = None,
    plugins: dict[str, Plugin] | None = None,
    table: MountTable | None = None,
) -> dict[str, Any]:
    """Probe this node for one pod UID. Raises OSError/MountinfoError if the mount table
    cannot be read (without it nothing about the node is known)."""
    root = normalise(settings.kubelet_root) or settings.kubelet_root
    table = table or read_pod_table(settings.mountinfo, root, uid)
    mine = table.pod_mounts(root, uid)
    if plugins is None:
        plugins = registered_plugins(settings.registry_dir, settings.grpc_timeout_s)
    answer = runtime_answer(settings.host_proc, uid, settings.cri_socket, settings.grpc_timeout_s)
    holders = scan_holders(settings.host_proc, mine, kubelet_root=root)
    blind = list(answer.gaps)
    tasks = d_tasks(settings.host_proc, answer.members)
    mounts = cgroup_mounts(settings.host_proc) if answer.members else []
    pod = pod_component(uid)
    frozen, unread = frozen_cgroups(answer.members, pod, mounts)
    pids = [m.pid for m in answer.members]
    hung = hung_mounts(settings.host_proc, mine, holders.holders, pids) if mine else HungScan([])
    blind.extend(unread[:2])
    if holders.unknown:
        blind.append(f"holder scan incomplete: {holders.unknown}")
    if hung.unsure:
        blind.append(hung.blind_spot())
    seen = pod_dirs_seen(root, blind)
    containers = answer.containers if answer.answered or answer.containers else None
    probe = Probe(
        node_name=settings.node_name,
        pod_uid=uid,
        probed_at=now or datetime.now(UTC),
        kubelet_root=root,
        kubelet_healthy=kubelet_healthy(settings.kubelet_healthz),
        registered_plugins=tuple(sorted(plugins)),
        mountinfo=pod_lines(table.text, root, uid),
        volume_dirs=tuple(volume_dirs(root, uid, table.mount_points())),
        holders=tuple(holders.holders),
        containers=None if containers is None else tuple(containers),
        pod_dir_exists=is_real_dir(pod_dir(root, uid)),
        pod_dirs_seen=seen,
        runtime=answer.runtime,
        holder_scan=HOLDER_SCAN_INCOMPLETE if holders.unknown else HOLDER_SCAN_COMPLETE,
        blind_spots=tuple(b[:_MAX_BLIND_SPOT_CHARS] for b in blind[:_MAX_BLIND_SPOTS]),
        containers_source=answer.source,
        d_tasks=tuple(tasks),
        frozen_cgroups=tuple(frozen),
        hung_mounts=tuple(hung.mounts),
        waiters_unknown=hung.unsure,
        cgroup_layout=cgroup_layout(mounts) if answer.members else None,
        cgroup_driver=cgroup_driver(answer.members, pod),
        kubelet_pods=read_kubelet_pods(settings.kubelet_metrics_url),
    )
    return probe.to_json()


def pod_mount_counts(table: MountTable, kubelet_root: str) -> Counter[str]:
    """Pod UID → number of its volume/subpath mounts, over the whole host table."""
    prefix = (normalise(kubelet_root) or kubelet_root).rstrip("/") + "/pods/"
    counts: Counter[str] = Counter()
    for mount in table.mounts:
        if not mount.mount_point.startswith(prefix):
            continue
        uid = mount.mount_point[len(prefix) :].split("/", 1)[0]
        if is_pod_volume_path(mount.mount_point, kubelet_root, uid):
            counts[uid] += 1
    return counts


def orphaned_mounts(
    table: MountTable,
    kubelet_root: str,
    stuck_uids: Collection[str],
    live_uids: Collection[str] | None,
) -> int:
    """Node-wide count of orphaned mounts, for `unstick_node_orphaned_mounts`.

    An orphaned mount is a volume or subpath mount under `<root>/pods/<uid>/` whose pod is
    stuck (a Remediation for this node names the UID) or unknown (no pod with that UID is
    bound to this node in the API). `live_uids` None (the pod list could not be read)
    counts only the stuck pods' mounts.
    """
    total = 0
    for uid, count in pod_mount_counts(table, kubelet_root).items():
        if uid in stuck_uids or (live_uids is not None and uid not in live_uids):
            total += count
    return total
