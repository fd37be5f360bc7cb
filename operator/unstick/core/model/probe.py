"""The node probe (design.md §6 `probe`): the agent's report of what it saw of one pod on
its node, its facts and their readers.

The readers take the `probe` object as JSON; errors name the field. Only `nodeName`,
`probedAt`, `kubeletRoot` and `mountinfo` are required: every other key is optional, and
absent in an older probe reads as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from unstick.core import fields as f
from unstick.core.model.mountinfo import Mount, MountinfoError, parse_mountinfo
from unstick.core.remediation import NODE_NAME, POD_UID, PROBED_AT

CONTAINER_STATES = ("running", "exited", "created", "unknown")
HOLDER_VIA = ("cwd", "root", "fd", "maps", "mountns")
CGROUP_VERSIONS = ("v1", "v2")
BLOCKED_STATES = ("D", "S")


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


def parse_d_tasks(p: Mapping[str, object]) -> tuple[DTask, ...]:
    """`probe.dTasks`: [{pid, comm, container?, wchan?, stack?}]."""
    out = []
    for i, raw in enumerate(f.opt_list(p, "dTasks", "probe")):
        where = f"probe.dTasks[{i}]"
        t = f.as_object(raw, where)
        pid = f.opt_int(t, "pid", where)
        if pid is None or pid < 1:
            raise f.FieldError(f"{where}.pid", "missing or not a positive integer")
        out.append(
            DTask(
                pid=pid,
                comm=f.string(t, "comm", where, nonempty=False),
                container=f.opt_string(t, "container", where) or "",
                wchan=f.opt_string(t, "wchan", where) or "",
                stack=f.string_list(t, "stack", where),
            )
        )
    return tuple(out)


def parse_frozen_cgroups(p: Mapping[str, object]) -> tuple[FrozenCgroup, ...]:
    """`probe.frozenCgroups`: [{path, state, version, container?, selfFrozen?}]."""
    out = []
    for i, raw in enumerate(f.opt_list(p, "frozenCgroups", "probe")):
        where = f"probe.frozenCgroups[{i}]"
        c = f.as_object(raw, where)
        path = f.string(c, "path", where)
        if not path.startswith("/"):
            raise f.FieldError(f"{where}.path", f"{path!r} must be an absolute cgroup path")
        state = f.string(c, "state", where)
        if state not in FREEZER_STATES:
            raise f.FieldError(
                f"{where}.state", f"{state!r} is not one of {', '.join(FREEZER_STATES)}"
            )
        version = f.string(c, "version", where)
        if version not in CGROUP_VERSIONS:
            raise f.FieldError(
                f"{where}.version", f"{version!r} is not one of {', '.join(CGROUP_VERSIONS)}"
            )
        out.append(
            FrozenCgroup(
                path=path,
                state=state,
                version=version,
                container=f.opt_string(c, "container", where) or "",
                self_frozen=f.opt_bool(c, "selfFrozen", where),
            )
        )
    return tuple(out)


def parse_hung_mounts(p: Mapping[str, object]) -> tuple[HungMount, ...]:
    """`probe.hungMounts` (optional)."""
    out = []
    for i, raw in enumerate(f.opt_list(p, "hungMounts", "probe")):
        where = f"probe.hungMounts[{i}]"
        m = f.as_object(raw, where)
        point = f.string(m, "mountPoint", where)
        if not point.startswith("/"):
            raise f.FieldError(f"{where}.mountPoint", f"{point!r} must be an absolute path")
        waiting = f.opt_int(m, "waiting", where)
        if waiting is not None and waiting < 0:
            raise f.FieldError(f"{where}.waiting", "must not be negative")
        out.append(
            HungMount(
                mount_point=point,
                fstype=f.string(m, "fstype", where),
                source=f.string(m, "source", where, nonempty=False),
                waiting=waiting,
                blocked=_blocked(m, where),
            )
        )
    return tuple(out)


def _blocked(m: Mapping[str, object], where: str) -> tuple[BlockedTask, ...]:
    out = []
    for j, raw in enumerate(f.opt_list(m, "blocked", where)):
        at = f"{where}.blocked[{j}]"
        t = f.as_object(raw, at)
        pid = f.opt_int(t, "pid", at)
        if pid is None or pid < 1:
            raise f.FieldError(f"{at}.pid", "missing or not a positive integer")
        state = f.string(t, "state", at)
        if state not in BLOCKED_STATES:
            raise f.FieldError(
                f"{at}.state", f"{state!r} is not one of {', '.join(BLOCKED_STATES)}"
            )
        out.append(
            BlockedTask(
                pid=pid,
                comm=f.string(t, "comm", at, nonempty=False),
                state=state,
                wchan=f.opt_string(t, "wchan", at) or "",
                via=f.string(t, "via", at),
                path=f.opt_string(t, "path", at) or "",
            )
        )
    return tuple(out)


def parse_waiters_unknown(p: Mapping[str, object]) -> tuple[str, ...]:
    """`probe.waitersUnknown` (optional): absolute mount points."""
    points = f.string_list(p, "waitersUnknown", "probe")
    for i, point in enumerate(points):
        if not point.startswith("/"):
            raise f.FieldError(f"probe.waitersUnknown[{i}]", f"{point!r} must be an absolute path")
    return points


def _volume_dirs(p: Mapping[str, object]) -> tuple[VolumeDir, ...]:
    dirs = []
    for i, raw in enumerate(f.opt_list(p, "volumeDirs", "probe")):
        where = f"probe.volumeDirs[{i}]"
        d = f.as_object(raw, where)
        empty = f.opt_bool(d, "empty", where)
        if empty is None:
            raise f.FieldError(f"{where}.empty", "missing")
        dirs.append(VolumeDir(path=f.string(d, "path", where), empty=empty))
    return tuple(dirs)


def _holders(p: Mapping[str, object]) -> tuple[Holder, ...]:
    holders = []
    for i, raw in enumerate(f.opt_list(p, "holders", "probe")):
        where = f"probe.holders[{i}]"
        h = f.as_object(raw, where)
        pid = f.opt_int(h, "pid", where)
        if pid is None:
            raise f.FieldError(f"{where}.pid", "missing")
        via = f.string(h, "via", where)
        if via not in HOLDER_VIA:
            raise f.FieldError(f"{where}.via", f"{via!r} is not one of {', '.join(HOLDER_VIA)}")
        holders.append(
            Holder(
                mount_point=f.string(h, "mountPoint", where),
                pid=pid,
                comm=f.string(h, "comm", where, nonempty=False),
                via=via,
            )
        )
    return tuple(holders)


def _containers(p: Mapping[str, object]) -> tuple[Container, ...] | None:
    if p.get("containers") is None:
        return None
    containers = []
    for i, raw in enumerate(f.opt_list(p, "containers", "probe")):
        where = f"probe.containers[{i}]"
        c = f.as_object(raw, where)
        state = f.string(c, "state", where)
        if state not in CONTAINER_STATES:
            raise f.FieldError(
                f"{where}.state", f"{state!r} is not one of {', '.join(CONTAINER_STATES)}"
            )
        containers.append(
            Container(
                pod_uid=f.string(c, "podUID", where),
                name=f.string(c, "name", where),
                id=f.string(c, "id", where, nonempty=False),
                state=state,
                created_at=f.opt_time(c, "createdAt", where),
                runtime_state=f.opt_string(c, "runtimeState", where) or "",
            )
        )
    return tuple(containers)


def _one_of(p: Mapping[str, object], key: str, allowed: tuple[str, ...]) -> str | None:
    value = p.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise f.FieldError(f"probe.{key}", f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _with_visibility(probe: Probe, p: Mapping[str, object]) -> Probe:
    """`probe` plus the optional keys saying which pod was probed and what was seen."""
    if p.get(POD_UID) is not None:
        f.string(p, POD_UID, "probe")  # present: a non-empty string
    seen = f.opt_int(p, "podDirsSeen", "probe")
    if seen is not None and seen < 0:
        raise f.FieldError("probe.podDirsSeen", f"{seen} must be >= 0")
    return replace(
        probe,
        pod_uid=f.opt_string(p, POD_UID, "probe"),
        pod_dir_exists=f.opt_bool(p, "podDirExists", "probe"),
        pod_dirs_seen=seen,
        runtime=_one_of(p, "runtime", (*RUNTIME_ANSWERED, RUNTIME_UNANSWERED)),
        holder_scan=_one_of(p, "holderScan", (HOLDER_SCAN_COMPLETE, HOLDER_SCAN_INCOMPLETE)),
        blind_spots=f.string_list(p, "blindSpots", "probe"),
        d_tasks=parse_d_tasks(p),
        frozen_cgroups=parse_frozen_cgroups(p),
        hung_mounts=parse_hung_mounts(p),
        waiters_unknown=parse_waiters_unknown(p),
    )


def probe_from_json(obj: object) -> Probe:
    p = f.as_object(obj, "probe")
    kubelet_root = f.string(p, "kubeletRoot", "probe")
    if not kubelet_root.startswith("/"):
        raise f.FieldError("probe.kubeletRoot", f"{kubelet_root!r} must be an absolute path")
    try:
        mounts = parse_mountinfo(f.string(p, "mountinfo", "probe", nonempty=False))
    except MountinfoError as err:
        raise f.FieldError("probe.mountinfo", str(err)) from None
    probe = Probe(
        node_name=f.string(p, NODE_NAME, "probe"),
        probed_at=f.parse_time(f.get(p, PROBED_AT, "probe"), f"probe.{PROBED_AT}"),
        kubelet_root=kubelet_root,
        kubelet_healthy=f.opt_bool(p, "kubeletHealthy", "probe"),
        registered_plugins=f.string_list(p, "registeredPlugins", "probe"),
        mounts=tuple(mounts),
        volume_dirs=_volume_dirs(p),
        holders=_holders(p),
        containers=_containers(p),
    )
    return _with_visibility(probe, p)
