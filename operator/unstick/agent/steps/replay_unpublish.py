"""replay-unpublish for one CSI volume: what the kubelet would have done at teardown.

1. NodeUnpublishVolume(volume_id from the kubelet's vol_data.json, target_path).
2. Re-read the mount table. A driver that lost its state (e.g. csi-driver-host-path after a
   restart) answers OK without unmounting: that is reported as "driver answered OK but the
   mount is still there", the step still counts as succeeded, and the next step,
   `unmount`, removes the mount.
3. NodeUnstageVolume when the driver stages volumes, the staging mount exists, no other
   pod's mount uses it (same device and root), and no other pod on the node has a volume
   dir of the same PV or a vol_data.json naming the same driver and volume handle: the
   kubelet writes those right before its NodePublishVolume for a pod (a replacement on
   this node), and believes the volume staged until it unstages it itself — unstaged
   under it, the replacement's publish fails (`not staged`) for ever. Anything unreadable
   there counts as such a pod. The staging mount is then left to the kubelet.

Right before step 1 the step re-checks the mount as for a plain unmount, no task blocked
in a path lookup through it included: the driver's unpublish is a plain umount, and on a
hung mount it would hang in the driver, the agent's call with it.
"""

from __future__ import annotations

import os

import grpc

from unstick.agent.probe.plugins import Plugin
from unstick.agent.steps import csi_client
from unstick.agent.steps.checks import Checks, Refused
from unstick.agent.steps.vol_data import VOL_DATA
from unstick.core.model.kubelet_paths import classify
from unstick.core.model.mountinfo import Mount


def run(checks: Checks, uid: str, target: str, dry_run: bool) -> str:
    """NodeUnpublishVolume for the pod's mounted CSI volumes (then NodeUnstageVolume
    where the staging mount is used by no other pod), as the kubelet would."""
    table = checks.pod_table(uid)
    csi = [
        m
        for m in table.pod_mounts(checks.root, uid)
        if (c := classify(m.mount_point, checks.root, uid)) and c.csi_volume and c.rest == "mount"
    ]
    points = list(dict.fromkeys(m.mount_point for m in csi))
    selected = checks.select(uid, target, points, "CSI target paths", table=table, exists_ok=True)
    if not selected:
        return "no CSI volume of this pod is mounted"
    if dry_run or len(selected) > 1:  # else: the check right before its one call
        checks.check_pod(uid)
    plugins = checks.csi_drivers()
    messages = []
    for path in selected:
        planned = next(m for m in csi if m.mount_point == path)
        data = checks.read_vol_data(os.path.dirname(path))
        # at most one CSI call in flight per volume (the CSI spec's rule): the lock is
        # taken before the checks, so they stay right before the call
        with checks.volume_lock(data["driverName"], data["volumeHandle"]):
            mount = checks.recheck(uid, planned)  # each volume: the table as of now
            if mount is None:
                messages.append(f"{path}: not mounted any more (nothing to do)")
                continue
            checks.check_pod(uid)
            checks.check_mount(uid, mount)
            checks.check_no_waiters(mount)  # the driver's umount would hang on a hung mount
            if not dry_run:
                checks.acts.act(needs_holders=True)  # NodeUnpublishVolume, right after
            messages.append(replay_volume(checks, uid, mount, plugins, dry_run))
    return "; ".join(messages)


def _rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{getattr(code, 'name', code)}: {details}"


def _used_by_other_pods(mounts: list[Mount], root: str, uid: str, staging: Mount) -> bool:
    pods_prefix = root.rstrip("/") + "/pods/"
    own_prefix = f"{pods_prefix}{uid}/"
    for m in mounts:
        if not m.mount_point.startswith(pods_prefix) or m.mount_point.startswith(own_prefix):
            continue
        same_fs = (m.major, m.minor) == (staging.major, staging.minor)
        if same_fs and (
            m.root == staging.root or m.root.startswith(staging.root.rstrip("/") + "/")
        ):
            return True
    return False


def _published_for_other_pod(checks: Checks, uid: str, driver: str, handle: str, pv: str) -> str:
    """Why another pod on this node may have the volume published, or be about to (the
    kubelet writes the pod's volume dir and vol_data.json right before NodePublishVolume):
    '' when no other pod has a CSI volume dir of `pv` or one whose vol_data.json names
    `driver` and `handle`. Read without following symlinks; what cannot be read counts."""
    pods = os.path.join(checks.root, "pods")
    try:
        uids = sorted(e.name for e in os.scandir(pods) if e.is_dir(follow_symlinks=False))
    except OSError as exc:
        return f"cannot list {pods} ({exc}) to tell whether another pod publishes it"
    for other in uids:
        if other == uid:
            continue
        csi = os.path.join(pods, other, "volumes", "kubernetes.io~csi")
        try:
            names = sorted(e.name for e in os.scandir(csi) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot list {csi} ({exc}) to tell whether pod {other} publishes it"
        if pv in names:
            return f"pod {other} has a volume dir of {pv} (the kubelet publishes it there)"
        for name in names:
            volume_dir = os.path.join(csi, name)
            if not os.path.lexists(os.path.join(volume_dir, VOL_DATA)):
                continue
            try:
                data = checks.read_vol_data(volume_dir)
            except Refused as exc:
                return f"pod {other}'s {VOL_DATA} cannot be told ({exc})"
            if (data["driverName"], data["volumeHandle"]) == (driver, handle):
                return f"pod {other} has {handle} of {driver} at {volume_dir}"
    return ""


def replay_volume(
    checks: Checks, uid: str, mount: Mount, plugins: dict[str, Plugin], dry_run: bool
) -> str:
    """Replay the teardown of one mounted CSI volume of the pod; returns a message.
    Raises Refused or RuntimeError on a failed call."""
    info = classify(mount.mount_point, checks.root, uid)
    if info is None or info.csi_volume is None:
        raise Refused(f"{mount.mount_point} is not a CSI volume of pod {uid}")
    volume_dir = os.path.dirname(mount.mount_point)
    data = checks.read_vol_data(volume_dir)
    driver, handle = data["driverName"], data["volumeHandle"]
    plugin = plugins.get(driver)
    if plugin is None:
        raise Refused(f"CSI driver {driver} is not registered on this node: nothing to call")
    target = mount.mount_point
    timeout = checks.settings.grpc_timeout_s
    if dry_run:
        return f"would call {driver} NodeUnpublishVolume({handle}, {target})"
    try:
        csi_client.node_unpublish(plugin.endpoint, handle, target, timeout)
    except grpc.RpcError as exc:
        raise RuntimeError(f"{driver} NodeUnpublishVolume failed: {_rpc_error(exc)}") from None
    table = checks.table()
    if any(m.mount_id == mount.mount_id for m in table.mounts):
        return (
            f"{driver} NodeUnpublishVolume({handle}): driver answered OK but the mount is "
            "still there (the step's target); the unmount step removes it"
        )
    message = f"{driver} NodeUnpublishVolume({handle}): unmounted {target}"
    if not os.path.lexists(target):  # the driver removed its target, as the CSI spec asks
        # A driver that unpublishes now had not been asked by a TearDown that succeeded:
        # the kubelet still holds the volume, and its next retry (NodeUnpublishVolume is OK
        # again) removes vol_data.json and the dir itself — it needs the file for that.
        message += f" (the kubelet's {VOL_DATA} left for it)"
    return message + _unstage(
        checks, uid, plugin, handle=handle, pv=info.volume, mounts=table.mounts
    )


def _unstage(
    checks: Checks, uid: str, plugin: Plugin, *, handle: str, pv: str, mounts: tuple[Mount, ...]
) -> str:
    timeout = checks.settings.grpc_timeout_s
    by_point = {m.mount_point: m for m in mounts}
    staged = [
        by_point[p]
        for p in csi_client.staging_paths(checks.root, plugin.name, handle, pv)
        if p in by_point
    ]
    if not staged:
        return "; no staging mount"
    staging = staged[0]
    if _used_by_other_pods(list(mounts), checks.root, uid, staging):
        return f"; staging {staging.mount_point} is used by another pod: not unstaged"
    other = _published_for_other_pod(checks, uid, plugin.name, handle, pv)
    if other:
        return f"; staging {staging.mount_point} not unstaged: {other}"
    try:
        if not csi_client.supports_staging(plugin.endpoint, timeout):
            return "; driver does not stage volumes"
        csi_client.node_unstage(plugin.endpoint, handle, staging.mount_point, timeout)
    except grpc.RpcError as exc:
        return f"; NodeUnstageVolume failed ({_rpc_error(exc)}), staging mount left"
    return f"; NodeUnstageVolume({staging.mount_point})"
