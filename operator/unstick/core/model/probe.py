"""The node probe (design.md §6 `probe`): what the agent saw of one pod on its node — the
one home of its schema. Each fact is a dataclass with its JSON: the agent builds them and
writes `Probe.to_json()` into the Remediation's `status.probe`; the controller and
`unstick diagnose` read it back with `Probe.from_json` (through
`unstick.core.model.snapshot`), whose errors name the field (`probe.holders[0].via: ...`).

Only `nodeName`, `probedAt`, `kubeletRoot` and `mountinfo` are required: every other key
is optional, and a probe of an older agent without it reads as before.

A new probe field: its key below, a field on its dataclass, a line in that class's
`to_json` and one in its `from_json` (optional: older probes lack it) — all in this file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from unstick.core import fields as f
from unstick.core.model.kubelet_pods import KubeletPods
from unstick.core.model.mountinfo import Mount, MountinfoError, parse_mountinfo
from unstick.core.remediation import NODE_NAME, POD_UID, PROBED_AT, rfc3339

JSON = dict[str, object]
T = TypeVar("T")

# --- the keys -----------------------------------------------------------------------------
# The probe's stamp is named as in the Remediation's spec: NODE_NAME (`nodeName`), POD_UID
# (`podUID`), PROBED_AT (`probedAt`), from `unstick.core.remediation`.
KUBELET_ROOT = "kubeletRoot"
KUBELET_HEALTHY = "kubeletHealthy"
REGISTERED_PLUGINS = "registeredPlugins"
MOUNTINFO = "mountinfo"
VOLUME_DIRS = "volumeDirs"
HOLDERS = "holders"
CONTAINERS = "containers"
POD_DIR_EXISTS = "podDirExists"
POD_DIRS_SEEN = "podDirsSeen"
RUNTIME = "runtime"
HOLDER_SCAN = "holderScan"
BLIND_SPOTS = "blindSpots"
CONTAINERS_SOURCE = "containersSource"  # kept for older readers; not read
D_TASKS = "dTasks"
FROZEN_CGROUPS = "frozenCgroups"
HUNG_MOUNTS = "hungMounts"
WAITERS_UNKNOWN = "waitersUnknown"
CGROUP_LAYOUT = "cgroupLayout"
CGROUP_DRIVER = "cgroupDriver"
KUBELET_PODS = "kubeletPods"  # the kubelet's own pod-worker counts (core/model/kubelet_pods.py)
# ... and inside the objects of its lists
PATH = "path"
EMPTY = "empty"
MOUNT_POINT = "mountPoint"
PID = "pid"
COMM = "comm"
VIA = "via"
NAME = "name"
ID = "id"
STATE = "state"
CREATED_AT = "createdAt"
RUNTIME_STATE = "runtimeState"
CONTAINER = "container"
WCHAN = "wchan"
STACK = "stack"
VERSION = "version"
SELF_FROZEN = "selfFrozen"
FSTYPE = "fstype"
SOURCE = "source"
WAITING = "waiting"
BLOCKED = "blocked"

# --- the words its values may be ------------------------------------------------------------
CONTAINER_STATES = ("running", "exited", "created", "unknown")
HOLDER_VIA = ("cwd", "root", "fd", "maps", "mountns")
CGROUP_VERSIONS = ("v1", "v2")
#: `cgroupLayout`: the freezer the agent saw — cgroup2 only, the v1 freezer and cgroup2, the
#: v1 freezer, neither (every freezer state a blind spot)
CGROUP_LAYOUTS = ("v2", "hybrid", "v1", "none")
CGROUP_DRIVERS = ("systemd", "cgroupfs")  # `cgroupDriver`: how the pod's cgroups are named
FREEZER_STATES = ("FROZEN", "FREEZING")
BLOCKED_STATES = ("D", "S")
RUNTIME_ANSWERED = ("cri+cgroup", "cri", "cgroup")  # `runtime` values: a source answered
RUNTIME_UNANSWERED = "unanswered"
HOLDER_SCAN_COMPLETE, HOLDER_SCAN_INCOMPLETE = "complete", "incomplete"
#: A blocked task's `path` on the wire: at most this many characters (the Remediation CRD's
#: bound), a longer one cut with a trailing "…".
MAX_PATH = 512


def _each(
    obj: Mapping[str, object], key: str, where: str, read: Callable[[object, str], T]
) -> tuple[T, ...]:
    """The optional list `obj[key]` (absent or null: empty), each item read by `read`."""
    return tuple(
        read(raw, f"{where}.{key}[{i}]") for i, raw in enumerate(f.opt_list(obj, key, where))
    )


def _one_of(obj: Mapping[str, object], key: str, where: str, allowed: tuple[str, ...]) -> str:
    value = f.string(obj, key, where)
    if value not in allowed:
        raise f.FieldError(f"{where}.{key}", f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _opt_one_of(
    obj: Mapping[str, object], key: str, where: str, allowed: tuple[str, ...]
) -> str | None:
    """An optional word: absent or null → None, else one of `allowed`."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise f.FieldError(f"{where}.{key}", f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _positive_pid(obj: Mapping[str, object], where: str) -> int:
    pid = f.opt_int(obj, PID, where)
    if pid is None or pid < 1:
        raise f.FieldError(f"{where}.{PID}", "missing or not a positive integer")
    return pid


@dataclass(frozen=True, slots=True)
class VolumeDir:
    """A volume directory of the pod (`probe.volumeDirs[]`)."""

    path: str
    empty: bool

    def to_json(self) -> JSON:
        return {PATH: self.path, EMPTY: self.empty}

    @classmethod
    def from_json(cls, raw: object, where: str) -> VolumeDir:
        d = f.as_object(raw, where)
        empty = f.opt_bool(d, EMPTY, where)
        if empty is None:
            raise f.FieldError(f"{where}.{EMPTY}", "missing")
        return cls(path=f.string(d, PATH, where), empty=empty)


@dataclass(frozen=True, slots=True)
class Holder:
    """A process keeping a mount busy (`probe.holders[]`)."""

    mount_point: str
    pid: int
    comm: str
    via: str  # cwd | root | fd | maps | mountns

    def to_json(self) -> JSON:
        return {MOUNT_POINT: self.mount_point, PID: self.pid, COMM: self.comm, VIA: self.via}

    @classmethod
    def from_json(cls, raw: object, where: str) -> Holder:
        h = f.as_object(raw, where)
        pid = f.opt_int(h, PID, where)
        if pid is None:
            raise f.FieldError(f"{where}.{PID}", "missing")
        return cls(
            pid=pid,
            via=_one_of(h, VIA, where, HOLDER_VIA),
            mount_point=f.string(h, MOUNT_POINT, where),
            comm=f.string(h, COMM, where, nonempty=False),
        )


@dataclass(frozen=True, slots=True)
class Container:
    """A container of the pod as the node's container runtime reports it (`probe.containers[]`)."""

    pod_uid: str
    name: str
    id: str
    state: str  # running | exited | created | unknown
    created_at: datetime | None = None  # the runtime's creation time (CRI), when known
    runtime_state: str = ""  # the runtime's own state word when its processes contradict it

    def to_json(self) -> JSON:
        out: JSON = {POD_UID: self.pod_uid, NAME: self.name, ID: self.id, STATE: self.state}
        if self.created_at is not None:
            out[CREATED_AT] = rfc3339(self.created_at)
        if self.runtime_state:
            out[RUNTIME_STATE] = self.runtime_state
        return out

    @classmethod
    def from_json(cls, raw: object, where: str) -> Container:
        c = f.as_object(raw, where)
        return cls(
            state=_one_of(c, STATE, where, CONTAINER_STATES),
            pod_uid=f.string(c, POD_UID, where),
            name=f.string(c, NAME, where),
            id=f.string(c, ID, where, nonempty=False),
            created_at=f.opt_time(c, CREATED_AT, where),
            runtime_state=f.opt_string(c, RUNTIME_STATE, where) or "",
        )


@dataclass(frozen=True, slots=True)
class DTask:
    """A process of the pod in uninterruptible sleep (state D): no signal reaches it
    (`probe.dTasks[]`)."""

    pid: int
    comm: str
    container: str  # the container id its cgroup names ("" for the pod's own cgroup)
    wchan: str  # the kernel function it waits in ("" when not readable)
    stack: tuple[str, ...] = ()  # the first lines of /proc/<pid>/stack, where readable

    def to_json(self) -> JSON:
        out: JSON = {PID: self.pid, COMM: self.comm, CONTAINER: self.container, WCHAN: self.wchan}
        if self.stack:
            out[STACK] = list(self.stack)
        return out

    @classmethod
    def from_json(cls, raw: object, where: str) -> DTask:
        t = f.as_object(raw, where)
        return cls(
            pid=_positive_pid(t, where),
            comm=f.string(t, COMM, where, nonempty=False),
            container=f.opt_string(t, CONTAINER, where) or "",
            wchan=f.opt_string(t, WCHAN, where) or "",
            stack=f.string_list(t, STACK, where),
        )


@dataclass(frozen=True, slots=True)
class FrozenCgroup:
    """A cgroup of the pod whose freezer holds its processes, cgroup v1 freezer or v2
    (`probe.frozenCgroups[]`)."""

    path: str  # the cgroup path, as /proc/<pid>/cgroup names it
    state: str  # FROZEN | FREEZING
    version: str  # v1 | v2
    container: str  # the container id ("" for the pod's own cgroup)
    self_frozen: bool | None = None  # frozen itself, not only through its parent

    def to_json(self) -> JSON:
        return {
            PATH: self.path,
            STATE: self.state,
            VERSION: self.version,
            CONTAINER: self.container,
            SELF_FROZEN: self.self_frozen,
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> FrozenCgroup:
        c = f.as_object(raw, where)
        path = f.string(c, PATH, where)
        if not path.startswith("/"):
            raise f.FieldError(f"{where}.{PATH}", f"{path!r} must be an absolute cgroup path")
        return cls(
            path=path,
            state=_one_of(c, STATE, where, FREEZER_STATES),
            version=_one_of(c, VERSION, where, CGROUP_VERSIONS),
            container=f.opt_string(c, CONTAINER, where) or "",
            self_frozen=f.opt_bool(c, SELF_FROZEN, where),
        )


@dataclass(frozen=True, slots=True)
class BlockedTask:
    """A process waiting inside a network or FUSE filesystem for its server
    (`probe.hungMounts[].blocked[]`)."""

    pid: int
    comm: str
    state: str  # the /proc stat state letter: D (uninterruptible) or S (e.g. FUSE's wait)
    wchan: str  # the kernel function it waits in ("" when not readable)
    via: str  # how it is tied to the mount: cwd | root | fd | maps | mountns (holder) | pod
    # | path (outside the pod, holding nothing: its blocked system call's path is the mount's)
    path: str = ""  # the path its blocked system call looks up ("" when not read)

    def to_json(self) -> JSON:
        out: JSON = {
            PID: self.pid,
            COMM: self.comm,
            STATE: self.state,
            WCHAN: self.wchan,
            VIA: self.via,
        }
        if self.path:
            cut = len(self.path) > MAX_PATH
            out[PATH] = self.path[: MAX_PATH - 1] + "…" if cut else self.path
        return out

    @classmethod
    def from_json(cls, raw: object, where: str) -> BlockedTask:
        t = f.as_object(raw, where)
        pid = _positive_pid(t, where)
        state = _one_of(t, STATE, where, BLOCKED_STATES)
        return cls(
            pid=pid,
            comm=f.string(t, COMM, where, nonempty=False),
            state=state,
            wchan=f.opt_string(t, WCHAN, where) or "",
            via=f.string(t, VIA, where),
            path=f.opt_string(t, PATH, where) or "",
        )


@dataclass(frozen=True, slots=True)
class HungMount:
    """A mount of the pod on a network or FUSE filesystem whose server does not answer, as
    the agent saw it without touching the mount: mountinfo, /proc, the FUSE connection
    (`probe.hungMounts[]`)."""

    mount_point: str
    fstype: str
    source: str
    waiting: int | None  # FUSE: requests waiting for the daemon (None: not FUSE / unread)
    blocked: tuple[BlockedTask, ...] = ()

    def to_json(self) -> JSON:
        return {
            MOUNT_POINT: self.mount_point,
            FSTYPE: self.fstype,
            SOURCE: self.source,
            WAITING: self.waiting,
            BLOCKED: [b.to_json() for b in self.blocked],
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> HungMount:
        m = f.as_object(raw, where)
        point = f.string(m, MOUNT_POINT, where)
        if not point.startswith("/"):
            raise f.FieldError(f"{where}.{MOUNT_POINT}", f"{point!r} must be an absolute path")
        waiting = f.opt_int(m, WAITING, where)
        if waiting is not None and waiting < 0:
            raise f.FieldError(f"{where}.{WAITING}", "must not be negative")
        return cls(
            mount_point=point,
            fstype=f.string(m, FSTYPE, where),
            source=f.string(m, SOURCE, where, nonempty=False),
            waiting=waiting,
            blocked=_each(m, BLOCKED, where, BlockedTask.from_json),
        )


def parse_waiters_unknown(p: Mapping[str, object], where: str = "probe") -> tuple[str, ...]:
    """`probe.waitersUnknown` (optional): absolute mount points."""
    points = f.string_list(p, WAITERS_UNKNOWN, where)
    for i, point in enumerate(points):
        if not point.startswith("/"):
            raise f.FieldError(
                f"{where}.{WAITERS_UNKNOWN}[{i}]", f"{point!r} must be an absolute path"
            )
    return points


def _kubelet_pods(p: Mapping[str, object], where: str) -> KubeletPods | None:
    raw = p.get(KUBELET_PODS)
    return None if raw is None else KubeletPods.from_json(raw, f"{where}.{KUBELET_PODS}")


@dataclass(frozen=True, slots=True)
class Probe:
    """The agent's report from the node (design.md §6 `probe`).

    The visibility fields (design.md §3 invariant 8, §5) say which pod was probed and what the
    agent could see; None where an older probe does not say (it then counts as blind for
    "nothing left", see `unseen`). `mounts` is `mountinfo` parsed.
    """

    node_name: str
    probed_at: datetime
    kubelet_root: str
    kubelet_healthy: bool | None
    registered_plugins: tuple[str, ...]
    mountinfo: str  # the host mountinfo lines under <kubeletRoot>/pods/<podUID>/
    volume_dirs: tuple[VolumeDir, ...]
    holders: tuple[Holder, ...]
    containers: tuple[Container, ...] | None  # None: the runtime could not be asked
    pod_uid: str | None = None  # the pod UID probed
    pod_dir_exists: bool | None = None  # <root>/pods/<uid> is a directory
    pod_dirs_seen: int | None = None  # pod dirs under <root>/pods (>= 1: a kubelet root)
    runtime: str | None = None  # one of RUNTIME_ANSWERED, or RUNTIME_UNANSWERED
    holder_scan: str | None = None  # HOLDER_SCAN_COMPLETE | HOLDER_SCAN_INCOMPLETE
    blind_spots: tuple[str, ...] = ()  # what the agent could not see, in words
    containers_source: str | None = None  # the older word for `runtime`, kept on the wire
    d_tasks: tuple[DTask, ...] = ()  # the pod's processes in state D (older probes: none)
    frozen_cgroups: tuple[FrozenCgroup, ...] = ()  # the pod's frozen cgroups (older: none)
    hung_mounts: tuple[HungMount, ...] = ()  # the pod's hung network/FUSE mounts (older: none)
    # the pod's network/FUSE mount points a blocked task may wait on, unread (older: none)
    waiters_unknown: tuple[str, ...] = ()
    # the cgroup layout and driver the agent saw (None: no process of the pod, or older)
    cgroup_layout: str | None = None
    cgroup_driver: str | None = None
    # what the kubelet's /metrics says of its pod workers (None: an older agent)
    kubelet_pods: KubeletPods | None = None
    mounts: tuple[Mount, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Parse `mountinfo` (MountinfoError if it is not mountinfo)."""
        object.__setattr__(self, "mounts", tuple(parse_mountinfo(self.mountinfo)))

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

    def to_json(self) -> JSON:
        """The `probe` object, every key present (null where not known)."""
        return {
            NODE_NAME: self.node_name,
            POD_UID: self.pod_uid,
            PROBED_AT: rfc3339(self.probed_at),
            KUBELET_ROOT: self.kubelet_root,
            KUBELET_HEALTHY: self.kubelet_healthy,
            REGISTERED_PLUGINS: list(self.registered_plugins),
            MOUNTINFO: self.mountinfo,
            VOLUME_DIRS: [d.to_json() for d in self.volume_dirs],
            HOLDERS: [h.to_json() for h in self.holders],
            CONTAINERS: None if self.containers is None else [c.to_json() for c in self.containers],
            POD_DIR_EXISTS: self.pod_dir_exists,
            POD_DIRS_SEEN: self.pod_dirs_seen,
            RUNTIME: self.runtime,
            HOLDER_SCAN: self.holder_scan,
            BLIND_SPOTS: list(self.blind_spots),
            CONTAINERS_SOURCE: self.containers_source,
            D_TASKS: [t.to_json() for t in self.d_tasks],
            FROZEN_CGROUPS: [c.to_json() for c in self.frozen_cgroups],
            HUNG_MOUNTS: [h.to_json() for h in self.hung_mounts],
            WAITERS_UNKNOWN: list(self.waiters_unknown),
            CGROUP_LAYOUT: self.cgroup_layout,
            CGROUP_DRIVER: self.cgroup_driver,
            KUBELET_PODS: None if self.kubelet_pods is None else self.kubelet_pods.to_json(),
        }

    @classmethod
    def from_json(cls, raw: object, where: str = "probe") -> Probe:
        """Read a `probe` object; raises `unstick.core.fields.FieldError` naming the field."""
        p = f.as_object(raw, where)
        kubelet_root = f.string(p, KUBELET_ROOT, where)
        if not kubelet_root.startswith("/"):
            raise f.FieldError(
                f"{where}.{KUBELET_ROOT}", f"{kubelet_root!r} must be an absolute path"
            )
        mountinfo = f.string(p, MOUNTINFO, where, nonempty=False)
        node_name = f.string(p, NODE_NAME, where)
        probed_at = f.parse_time(f.get(p, PROBED_AT, where), f"{where}.{PROBED_AT}")
        kubelet_healthy = f.opt_bool(p, KUBELET_HEALTHY, where)
        registered_plugins = f.string_list(p, REGISTERED_PLUGINS, where)
        volume_dirs = _each(p, VOLUME_DIRS, where, VolumeDir.from_json)
        holders = _each(p, HOLDERS, where, Holder.from_json)
        containers = None
        if p.get(CONTAINERS) is not None:
            containers = _each(p, CONTAINERS, where, Container.from_json)
        pod_uid = None if p.get(POD_UID) is None else f.string(p, POD_UID, where)
        seen = f.opt_int(p, POD_DIRS_SEEN, where)
        if seen is not None and seen < 0:
            raise f.FieldError(f"{where}.{POD_DIRS_SEEN}", f"{seen} must be >= 0")
        source = p.get(CONTAINERS_SOURCE)
        try:
            return cls(
                node_name=node_name,
                probed_at=probed_at,
                kubelet_root=kubelet_root,
                kubelet_healthy=kubelet_healthy,
                registered_plugins=registered_plugins,
                mountinfo=mountinfo,
                volume_dirs=volume_dirs,
                holders=holders,
                containers=containers,
                pod_uid=pod_uid,
                pod_dir_exists=f.opt_bool(p, POD_DIR_EXISTS, where),
                pod_dirs_seen=seen,
                runtime=_opt_one_of(p, RUNTIME, where, (*RUNTIME_ANSWERED, RUNTIME_UNANSWERED)),
                holder_scan=_opt_one_of(
                    p, HOLDER_SCAN, where, (HOLDER_SCAN_COMPLETE, HOLDER_SCAN_INCOMPLETE)
                ),
                blind_spots=f.string_list(p, BLIND_SPOTS, where),
                containers_source=source if isinstance(source, str) else None,
                d_tasks=_each(p, D_TASKS, where, DTask.from_json),
                frozen_cgroups=_each(p, FROZEN_CGROUPS, where, FrozenCgroup.from_json),
                hung_mounts=_each(p, HUNG_MOUNTS, where, HungMount.from_json),
                waiters_unknown=parse_waiters_unknown(p, where),
                cgroup_layout=_opt_one_of(p, CGROUP_LAYOUT, where, CGROUP_LAYOUTS),
                cgroup_driver=_opt_one_of(p, CGROUP_DRIVER, where, CGROUP_DRIVERS),
                kubelet_pods=_kubelet_pods(p, where),
            )
        except MountinfoError as err:
            raise f.FieldError(f"{where}.{MOUNTINFO}", str(err)) from None
