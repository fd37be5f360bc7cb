"""The pod's containers on this node: the union of what the container runtime (CRI) says
and what the host's cgroups show, and whether that answer is complete.

Sources:
- CRI: RuntimeService.ListContainers filtered by the label `io.kubernetes.pod.uid`;
  names and states are the runtime's. It *answers* when the socket exists and the call
  succeeds.
- cgroup scan: every process under `<host-proc>` whose `/proc/<pid>/cgroup` path has a
  component naming the pod (`pod<uid>` for the cgroupfs driver,
  `kubepods-…-pod<uid with _>.slice` for the systemd driver). The component below it is
  the container (its id, with `cri-containerd-`/`crio-`/`docker-` and `.scope` removed);
  such a container has live processes, so its state is `running`, and `name` is its id
  (the cgroup does not know the container's name). The sandbox (pause) container counts
  too. Exited containers have no processes and are not listed. The scan is *complete*
  only when `<host-proc>` lists processes, shows pid 1 (not hidden by `hidepid`) and the
  agent's own (`self`: the host's PID namespace), and every process's cgroup file could
  be read (a process that exited meanwhile is not a gap; a permission error is).
  The files are read by one pass over `<host-proc>` shared by every pod whose check asks
  at the same moment (the probes' and each act's container check on the worker threads):
  a caller joins the next pass to start, never one already running, so its answer was
  read after it asked — as fresh as a scan of its own (`scan_group.NextPass`). Each pod's
  own pattern then picks its processes from the pass.

The answer is the union: a container running per either source is running (a CRI entry
whose id the cgroup scan saw with live processes becomes `running`; cgroup-only ids are
added). `runtime` says which sources answered completely — `cri+cgroup`, `cri`, `cgroup`,
or `unanswered` — and only an answered runtime may be read as "no container runs".
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import grpc

from unstick.agent.holders.scan_group import NextPass
from unstick.agent.probe.plugins import stub, unix_target
from unstick.agent.proto import cri_pb2, cri_pb2_grpc
from unstick.core.model.probe import Container

POD_UID_LABEL = "io.kubernetes.pod.uid"
_STATES = {
    cri_pb2.CONTAINER_CREATED: "created",
    cri_pb2.CONTAINER_RUNNING: "running",
    cri_pb2.CONTAINER_EXITED: "exited",
    cri_pb2.CONTAINER_UNKNOWN: "unknown",
}
_POD_LIKE = ("pod", "kubepods-")  # the components a pod's pattern can match
_PREFIXES = ("cri-containerd-", "crio-conmon-", "crio-", "docker-", "containerd-")
_MAX_GAPS = 3
UNANSWERED = "unanswered"


def _ns_time(nanoseconds: int) -> datetime | None:
    """The runtime's creation time (CRI: nanoseconds since the epoch); None when not set."""
    if nanoseconds <= 0:
        return None
    return datetime.fromtimestamp(nanoseconds / 1e9, UTC)


@dataclass(frozen=True, slots=True)
class Member:
    """One process of the pod, as the cgroup scan saw it."""

    pid: int
    container: str  # the container id its cgroup names ("" for the pod-level cgroup)
    cgroups: tuple[str, ...]  # its /proc/<pid>/cgroup lines


@dataclass(frozen=True, slots=True)
class CgroupScan:
    """Running containers seen in the host's cgroups, and why the scan is incomplete."""

    containers: list[Container]
    gap: str | None = None  # None: every process was seen
    members: tuple[Member, ...] = ()  # the pod's processes (for the D-state and freezer scans)


@dataclass(frozen=True, slots=True)
class RuntimeAnswer:
    """The union of both sources (see the module docstring)."""

    containers: list[Container]
    cri_answered: bool
    cgroup_complete: bool
    gaps: tuple[str, ...] = ()
    members: tuple[Member, ...] = ()  # the pod's processes seen by the cgroup scan

    @property
    def runtime(self) -> str:
        """`cri+cgroup`, `cri`, `cgroup` or `unanswered`: which sources answered completely."""
        parts = [
            n for n, ok in (("cri", self.cri_answered), ("cgroup", self.cgroup_complete)) if ok
        ]
        return "+".join(parts) or UNANSWERED

    @property
    def answered(self) -> bool:
        return self.cri_answered or self.cgroup_complete

    @property
    def source(self) -> str | None:
        """The older `containersSource` word: `cri`, `proc-cgroup`, `cri+proc-cgroup`, None."""
        if not self.answered:
            return None
        return self.runtime.replace("cgroup", "proc-cgroup")


def cri_containers(socket_path: str, uid: str, timeout_s: float) -> list[Container]:
    """ListContainers for one pod over the CRI socket. Raises grpc.RpcError."""
    request = cri_pb2.ListContainersRequest(
        filter=cri_pb2.ContainerFilter(label_selector={POD_UID_LABEL: uid})
    )
    with grpc.insecure_channel(unix_target(socket_path)) as channel:
        reply = stub(cri_pb2_grpc.RuntimeServiceStub, channel).ListContainers(
            request, timeout=timeout_s
        )
    return [
        Container(
            uid,
            c.metadata.name,
            c.id,
            _STATES.get(c.state, "unknown"),
            created_at=_ns_time(c.created_at),
        )
        for c in reply.containers
        if c.labels.get(POD_UID_LABEL, uid) == uid
    ]


def answers_cri(socket_path: str, timeout_s: float) -> str | None:
    """None when `socket_path` is a socket whose server answers the CRI RuntimeService
    (ListContainers for a pod UID no pod has), else why not."""
    try:
        if not stat.S_ISSOCK(os.stat(socket_path).st_mode):
            return f"{socket_path} is not a socket"
    except OSError as exc:
        return f"{socket_path}: {exc.strerror or exc}"
    try:
        cri_containers(socket_path, "unstick-discovery", timeout_s)
    except grpc.RpcError as exc:
        detail = exc.code() if isinstance(exc, grpc.Call) else exc
        return f"{socket_path} did not answer the CRI ({detail})"
    return None


def find_cri_socket(
    root: str, candidates: Iterable[tuple[str, str]], timeout_s: float
) -> tuple[str | None, list[str]]:
    """The first of `candidates` (host paths, with who uses them) whose socket under the
    host's root `root` answers the CRI: (its path as the agent reaches it, what was
    seen); (None, what was seen) when none does — the containers then come from the
    cgroup scan alone."""
    seen: list[str] = []
    for path, who in candidates:
        where = root.rstrip("/") + path
        if not os.path.lexists(where):
            continue
        why = answers_cri(where, timeout_s)
        if why is None:
            return where, [*seen, f"{path} ({who}) answers the CRI"]
        seen.append(why)
    return None, seen


def pod_component(uid: str) -> re.Pattern[str]:
    """The cgroup path component naming the pod (cgroupfs or systemd driver)."""
    return _pod_component(uid)


def _pod_component(uid: str) -> re.Pattern[str]:
    dashed = re.escape(uid)
    underscored = re.escape(uid.replace("-", "_"))
    return re.compile(rf"^(pod{dashed}|kubepods(-[a-z]+)?-pod{underscored}\.slice)$")


def _container_id(component: str) -> str:
    name = component.removesuffix(".scope")
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _proc_pids(host_proc: str) -> tuple[list[str], str | None]:
    """The pids under `host_proc`, or why they cannot be all of the host's processes."""
    try:
        pids = [n for n in os.listdir(host_proc) if n.isdigit()]
    except OSError as exc:
        return [], f"cannot list {host_proc}: {exc.strerror}"
    if not pids:
        return [], f"{host_proc} lists no process (not a mounted /proc?)"
    if "1" not in pids:
        return pids, f"{host_proc} does not show pid 1 (mounted with hidepid?)"
    if not os.path.lexists(os.path.join(host_proc, "self")):
        return pids, (
            f"{host_proc} does not show the agent's own process: it is the /proc of another "
            "PID namespace (run the agent with hostPID)"
        )
    return pids, None


def _join_gaps(gaps: list[str]) -> str | None:
    if len(gaps) > _MAX_GAPS:
        gaps = [*gaps[:_MAX_GAPS], f"and {len(gaps) - _MAX_GAPS} more"]
    return "; ".join(gaps) if gaps else None


@dataclass(frozen=True, slots=True)
class _Pass:
    """Every process's cgroup file, read once: the pod-like path components (`pod…`,
    `kubepods-…`: the only ones a pod's pattern can match) with, for each, the processes
    whose cgroup path has it and the container id below it."""

    lines: dict[int, tuple[str, ...]]  # pid -> its cgroup lines (processes of some pod)
    by_component: dict[str, list[tuple[int, str]]]
    gaps: tuple[str, ...]


def _read_cgroup(path: str) -> str:
    """The file's text (OSError as `open` raises it)."""
    handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(handle, 65536)]
        while chunks[-1]:
            chunks.append(os.read(handle, 65536))
    finally:
        os.close(handle)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def _read_pass(host_proc: str) -> _Pass:
    pids, unusable = _proc_pids(host_proc)
    gaps = [unusable] if unusable else []
    lines_of: dict[int, tuple[str, ...]] = {}
    by_component: dict[str, list[tuple[int, str]]] = {}
    for pid in pids:
        path = f"{host_proc}/{pid}/cgroup"
        try:
            text = _read_cgroup(path)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process exited meanwhile: nothing of it is missed
        except OSError as exc:
            gaps.append(f"cannot read {path}: {exc.strerror or exc}")
            continue
        if "pod" not in text:
            continue  # no component starting with "pod" or "kubepods-": no pod's process
        lines = text.splitlines()
        found = False
        for line in lines:
            if "pod" not in line:
                continue
            parts = line.split(":", 2)[-1].split("/")
            for i, part in enumerate(parts):
                if part.startswith(_POD_LIKE):
                    below = parts[i + 1] if i + 1 < len(parts) else ""
                    hit = (int(pid), _container_id(below) if below else "")
                    by_component.setdefault(part, []).append(hit)
                    found = True
        if found:
            lines_of[int(pid)] = tuple(lines)
    return _Pass(lines_of, by_component, tuple(gaps))


# One pass over the host's processes for every pod whose check asks at the same moment
# (the probes and each act's container check on the agent's worker threads): each caller
# gets a pass that started after it asked (scan_group.NextPass), as fresh as its own.
_PASSES: NextPass[_Pass] = NextPass()


def scan_cgroups(host_proc: str, uid: str) -> CgroupScan:
    """Running containers of the pod from `<host_proc>/*/cgroup`, and whether every
    process could be seen. The files are read by a pass shared with the callers asking at
    the same time (for any pod), one that started after this call."""
    scanned = _PASSES.run(host_proc, lambda: _read_pass(host_proc))
    pattern = _pod_component(uid)
    mine: dict[int, set[str]] = {}
    for component, hits in scanned.by_component.items():
        if pattern.match(component):
            for pid, cid in hits:
                mine.setdefault(pid, set()).add(cid)
    ids = set().union(*mine.values()) if mine else set()
    members = [  # in the order /proc listed them; "" (the pod-level cgroup) sorts last
        Member(pid, max(mine[pid]), lines) for pid, lines in scanned.lines.items() if pid in mine
    ]
    found = [Container(uid, cid or "(pod)", cid, "running") for cid in sorted(ids)]
    return CgroupScan(found, _join_gaps(list(scanned.gaps)), tuple(members))


def cgroup_containers(host_proc: str, uid: str) -> list[Container] | None:
    """Running containers of the pod from the cgroup scan; None unless it was complete."""
    scan = scan_cgroups(host_proc, uid)
    return scan.containers if scan.gap is None else None


def _same(cri_id: str, cgroup_id: str) -> bool:
    return bool(cri_id and cgroup_id) and (
        cri_id.startswith(cgroup_id) or cgroup_id.startswith(cri_id)
    )


def union(cri: list[Container], seen: list[Container]) -> list[Container]:
    """CRI's containers, `running` where the cgroup scan saw them live, plus the
    cgroup-only ones (running)."""
    out = []
    for c in cri:
        live = any(_same(c.id, s.id) for s in seen)
        if live and c.state != "running":  # the runtime lost track of a live container
            out.append(replace(c, state="running", runtime_state=c.state))
        else:
            out.append(c)
    out.extend(s for s in seen if not any(_same(c.id, s.id) for c in cri))
    return out


def runtime_answer(
    host_proc: str, uid: str, cri_socket: str | None, timeout_s: float = 2.0
) -> RuntimeAnswer:
    """Ask both sources; see the module docstring."""
    gaps: list[str] = []
    cri: list[Container] = []
    cri_answered = False
    if cri_socket and not os.path.exists(cri_socket):
        gaps.append(f"no CRI socket at {cri_socket}")
    elif cri_socket:
        try:
            cri, cri_answered = cri_containers(cri_socket, uid, timeout_s), True
        except grpc.RpcError as exc:
            detail = exc.code() if isinstance(exc, grpc.Call) else exc
            gaps.append(f"the CRI socket {cri_socket} did not answer ({detail})")
    scan = scan_cgroups(host_proc, uid)
    if scan.gap:
        gaps.append(f"cgroup scan incomplete: {scan.gap}")
    return RuntimeAnswer(
        union(cri, scan.containers), cri_answered, scan.gap is None, tuple(gaps), scan.members
    )


def pod_containers(
    host_proc: str, uid: str, cri_socket: str | None, timeout_s: float = 2.0
) -> tuple[list[Container] | None, str | None]:
    """(containers, source) for the executor's re-check: the union of both sources, or
    (None, None) when neither answered completely — "cannot tell", never "none"."""
    answer = runtime_answer(host_proc, uid, cri_socket, timeout_s)
    if not answer.answered:
        return None, None
    return answer.containers, answer.source


def still_running(
    host_proc: str, uid: str, cri_socket: str | None, timeout_s: float = 2.0
) -> str | None:
    """Why nothing may be done to the pod's paths now — a container of it runs (ephemeral
    `kubectl debug` containers included: they run in the pod's sandbox and cgroup), or
    neither source answered completely ("cannot tell" is never "none") — or None when an
    answered runtime shows none running. The check of every node step and of the orphan
    pass, right before each act."""
    containers, source = pod_containers(host_proc, uid, cri_socket, timeout_s)
    if containers is None:
        return "cannot tell whether containers of the pod still run"
    running = [c.id or c.name for c in containers if c.state == "running"]
    if running:
        return f"containers of the pod still run ({source}): {', '.join(running)}"
    return None
