"""The `mountns` kind of holder (`unstick.agent.holders.scan`): a mount namespace that has a
copy of the mount at a path that does not go away with the unmount.

A copy is the same device with a root equal to or under the mount's root. Exempt are
only the mount's propagated copy (the same place on a propagation peer or slave of the
mount's parent, itself a peer or slave, nothing mounted on it, in a namespace of the
host's user namespace) and the propagated copies of the kubelet's own copies in the home
namespace — the one the mounts were read from — under `kubelet_root` (a CSI volume's
staging mount, `globalmount`, which every pod mounting the kubelet root with
Bidirectional/HostToContainer propagation shows at its own path). A namespace of another
user namespace has its copies locked (a propagated unmount may leave them): none is
exempt there. In the home namespace the kubelet's own copies are not holders; without a
`kubelet_root` that namespace is not searched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from unstick.agent.holders.proc import Namespace
from unstick.core.model.mount_identity import MountTable, Target, holding_copies, is_copy, under


def namespace_copies(
    namespaces: Mapping[str, Namespace],
    home: str | None,
    targets: Sequence[Target],
    kubelet_root: str | None,
    agent_user: str | None,
) -> Iterator[tuple[Target, Namespace]]:
    """(target, namespace) for each namespace holding a copy of the target. `agent_user`:
    the agent's own user namespace (None: unknown, no namespace trusted)."""
    home_info = namespaces.get(home) if home is not None else None
    home_table = home_info.table if home_info is not None else None
    exempts = [_kubelet_copies(home_table, target, kubelet_root) for target in targets]
    for ns, info in namespaces.items():
        if info.table is None or (ns == home and kubelet_root is None):
            continue
        trusted = info.user_ns is not None and info.user_ns == agent_user
        for target, kubelet_copies in zip(targets, exempts, strict=True):
            exempt = kubelet_copies if trusted else []
            root = (kubelet_root or "/") if ns == home else None
            if _copy_holds(info.table, target, exempt, home_root=root, trusted=trusted):
                yield target, info


def _kubelet_copies(
    home: MountTable | None, target: Target, kubelet_root: str | None
) -> list[Target]:
    """The copies of `target` in the home namespace that are not holders (the kubelet's
    own, under `kubelet_root`: the volume's staging mount, ...), with their parents:
    their propagated copies elsewhere go with them, as the target's go with it."""
    if home is None or kubelet_root is None or target.parent is None:
        return []
    return [
        Target(c, home.by_id.get(c.parent_id))
        for c in home.mounts
        if c.mount_id != target.mount.mount_id
        and is_copy(c, target.mount)
        and under(c.mount_point, kubelet_root)
    ]


def _copy_holds(
    table: MountTable,
    target: Target,
    exempt: Sequence[Target],
    *,
    home_root: str | None,
    trusted: bool,
) -> bool:
    """`home_root`: in the home namespace, the root under which copies are the kubelet's
    own (None: another namespace)."""
    copies = (
        holding_copies(table, target, exempt)
        if trusted
        else holding_copies(table, Target(target.mount, None))
    )
    if home_root is not None:
        copies = [c for c in copies if c.mount_id != target.mount.mount_id]
        copies = [c for c in copies if not under(c.mount_point, home_root)]
    return bool(copies)
