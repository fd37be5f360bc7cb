"""The node probe: the facts of DESIGN §6 for one pod, and a node-wide summary for metrics.

`probe_pod` returns exactly the `probe` object of the snapshot bundle, plus one extra key,
`containersSource` (`cri`, `proc-cgroup`, or null), saying where `containers` came from.
Its `mountinfo` holds only the host mountinfo lines whose mount point is under
`<kubeletRoot>/pods/<uid>/` (the full host table would be large and would leak other
pods' paths into this pod's Remediation).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from unstick.agent.containers import pod_containers
from unstick.agent.holders import find_holders
from unstick.agent.kubelet_health import kubelet_healthy
from unstick.agent.mounts import MountTable, pod_lines, read_pod_table
from unstick.agent.plugins import Plugin, registered_plugins
from unstick.agent.settings import AgentSettings
from unstick.agent.volumedirs import volume_dirs
from unstick.core.kubelet_paths import is_pod_volume_path, normalise


def rfc3339(when: datetime) -> str:
    """`2026-11-20T10:00:00.123456Z` (UTC, microseconds, like the controller writes)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    containers, source = pod_containers(
        settings.host_proc, uid, settings.cri_socket, settings.grpc_timeout_s
    )
    return {
        "nodeName": settings.node_name,
        "probedAt": rfc3339(now or datetime.now(UTC)),
        "kubeletRoot": root,
        "kubeletHealthy": kubelet_healthy(settings.kubelet_healthz),
        "registeredPlugins": sorted(plugins),
        "mountinfo": pod_lines(table.text, root, uid),
        "volumeDirs": [d.to_json() for d in volume_dirs(root, uid, table.mount_points())],
        "holders": [h.to_json() for h in find_holders(settings.host_proc, mine)],
        "containers": None if containers is None else [c.to_json() for c in containers],
        "containersSource": source,
    }


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
