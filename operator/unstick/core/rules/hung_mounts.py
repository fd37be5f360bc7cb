"""A mount of the pod whose server is gone: a hard NFS mount of a dead server,
a FUSE filesystem whose daemon stopped answering. Everything that touches such a mount
hangs — the container's processes, the kubelet's own check of the mount point — so the
pod never finishes terminating.

The agent finds it without touching the mount (`unstick.agent.probe.hung_mounts`) and reports
it in the probe's optional key `hungMounts` (an older probe has none: read as before):

    [{mountPoint, fstype, source, waiting?, blocked: [{pid, comm, state, wchan, via}]}]

and, optional too, `waitersUnknown: [mountPoint]`: mounts a task blocked in a path lookup
may wait on whose path the agent could not read.

Both are read by `unstick.core.model.probe`. This module decides which of the pod's
mounts are hung (rule 3b, cause
`HungMount`), says so in words that name the server, and gives the one node step's safety
predicate: `lazy-unmount` (MNT_DETACH), only for a hung mount of the pod with no holder and
no running container of the pod — never a plain umount, which can wait on the dead server
for ever, and never MNT_FORCE, which aborts in-flight writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from unstick.core import safety
from unstick.core.model.node_facts import PodMount
from unstick.core.model.probe import HungMount, Probe
from unstick.core.verdict import SAFE, Verdict, refuse

#: fstype (or its prefix before the first dot, for `fuse.<name>`) → filesystem family.
FAMILIES: Mapping[str, str] = {
    "nfs": "nfs",
    "nfs4": "nfs",
    "fuse": "fuse",
    "fuseblk": "fuse",
    "cifs": "cifs",
    "smb3": "cifs",
    "ceph": "ceph",
    "9p": "9p",
    "glusterfs": "fuse",
}
MAX_NAMED = 3


def family(fstype: str) -> str | None:
    """The filesystem family of a mount's fstype (`fuse.sshfs` → fuse), None when it is not
    a network or FUSE filesystem (such a mount cannot hang on a server)."""
    return FAMILIES.get(fstype) or FAMILIES.get(fstype.split(".", 1)[0])


def waiters_told(target: str, mounts: tuple[PodMount, ...]) -> Verdict:
    """A plain unmount of `target` (or its CSI driver's unpublish, a plain umount too) only
    when the probe could tell whether a blocked task waits on it: one whose path it could
    not read may be on it, and the umount would hang with it (the agent re-checks too)."""
    if any(m.waiters_unknown for m in mounts if m.mount_point == target):
        return refuse(
            f"cannot tell whether a blocked task waits on {target} (the probe could not read "
            "its path): a plain unmount could hang, not unmounting"
        )
    return SAFE


def is_hung(h: HungMount) -> bool:
    """Hung: a process waits on the mount — one tied to it waiting inside its filesystem,
    or any blocked in a system call on a path through it (whatever the filesystem: its
    plain umount would hang as well) — or (FUSE) requests wait for a daemon that has not
    read them; on a pod already past its deletion slack."""
    return bool(h.blocked) or (family(h.fstype) is not None and (h.waiting or 0) > 0)


def hung_of_pod(probe: Probe, mounts: tuple[PodMount, ...]) -> tuple[HungMount, ...]:
    """The probe's hung mounts that are mounts of this pod (per its own mountinfo), deepest
    first as the pod's mounts are."""
    out: dict[str, HungMount] = {}
    for m in mounts:
        h = next((h for h in probe.hung_mounts if h.mount_point == m.mount_point), None)
        if h is None or m.mount_point in out:
            continue
        # what the mount is comes from the pod's mountinfo, not from the report's words
        h = replace(h, fstype=m.fstype, source=m.source)
        if is_hung(h):
            out[m.mount_point] = h
    return tuple(out.values())


def server_words(fstype: str, source: str) -> str:
    """Who should answer: `NFS server 10.0.0.5 (10.0.0.5:/export)`, `the FUSE daemon of
    sshfs#host:`, ..."""
    fam = family(fstype)
    if fam == "nfs" and ":" in source:
        return f"NFS server {source.rsplit(':', 1)[0].strip('[]')} ({source})"
    if fam == "cifs" and source.startswith("//"):
        return f"SMB server {source[2:].split('/', 1)[0]} ({source})"
    if fam == "fuse":
        return f"the FUSE daemon serving {source or fstype} ({fstype})"
    if fam is None:
        return f"the device or server behind {source or '(no source)'} ({fstype})"
    return f"the {fam} server of {source or '(no source)'} ({fstype})"


def hung_words(h: HungMount) -> str:
    """The evidence sentence for one hung mount."""
    said = [f"{h.mount_point} hangs: {server_words(h.fstype, h.source)} does not answer"]
    if h.waiting:
        said.append(f"{h.waiting} request(s) wait for the FUSE daemon, unread")
    tasks = [
        f"pid {t.pid} ({t.comm}, {_via(t.via)}) waits in `{t.wchan or 'the filesystem'}`"
        + (f" on {t.path}" if t.path else "")
        for t in h.blocked[:MAX_NAMED]
    ]
    if len(h.blocked) > MAX_NAMED:
        tasks.append(f"and {len(h.blocked) - MAX_NAMED} more")
    if tasks:
        said.append("; ".join(tasks))
    said.append("found from mountinfo and /proc only: the mount itself was never touched")
    return "; ".join(said)


def _via(via: str) -> str:
    if via == "pod":
        return "a process of the pod"
    if via == "path":  # a waiter, never a holder: holders are found by mount identity
        return "outside the pod, holding nothing"
    return f"holds it via {via}"


def lazy_unmount_safe(
    target: str,
    kubelet_root: str,
    uid: str,
    hung: tuple[HungMount, ...],
    *,
    holders: int,
    containers_running: bool,
) -> Verdict:
    """`lazy-unmount`: only a mount of this pod the fresh probe saw hung, with no holder and
    no running container of the pod (invariant 2's conditions, lazily)."""
    found = next((h for h in hung if h.mount_point == target), None)
    if found is None:
        return refuse(f"{target} is not among the pod's hung mounts")
    if family(found.fstype) is None:  # the agent detaches only network/FUSE mounts
        return refuse(f"{target} ({found.fstype}) is no network or FUSE mount")
    return safety.unmount_safe(
        target, kubelet_root, uid, holders, containers_running=containers_running
    )
