"""The pod's containers on this node, from the container runtime (CRI) or, without a CRI
socket, from the processes whose cgroup names the pod.

Sources (reported in the probe as `containersSource`):
- `cri`: RuntimeService.ListContainers filtered by the label `io.kubernetes.pod.uid`;
  names and states are the runtime's.
- `proc-cgroup`: every process under `<host-proc>` whose `/proc/<pid>/cgroup` path has a
  component naming the pod (`pod<uid>` for the cgroupfs driver,
  `kubepods-…-pod<uid with _>.slice` for the systemd driver). The component below it is
  the container (its id, with `cri-containerd-`/`crio-`/`docker-` and `.scope` removed);
  such a container has live processes, so its state is `running`, and `name` is its id
  (the cgroup does not know the container's name). The sandbox (pause) container counts
  too. Exited containers have no processes and are not listed.
- `None` (containers null): neither source could be read — node state unknown.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import grpc

from unstick.agent.plugins import stub, unix_target
from unstick.agent.proto import cri_pb2, cri_pb2_grpc

POD_UID_LABEL = "io.kubernetes.pod.uid"
_STATES = {
    cri_pb2.CONTAINER_CREATED: "created",
    cri_pb2.CONTAINER_RUNNING: "running",
    cri_pb2.CONTAINER_EXITED: "exited",
    cri_pb2.CONTAINER_UNKNOWN: "unknown",
}
_PREFIXES = ("cri-containerd-", "crio-conmon-", "crio-", "docker-", "containerd-")


@dataclass(frozen=True, slots=True)
class Container:
    """One container of the pod."""

    pod_uid: str
    name: str
    id: str
    state: str

    def to_json(self) -> dict[str, object]:
        return {"podUID": self.pod_uid, "name": self.name, "id": self.id, "state": self.state}


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
        Container(uid, c.metadata.name, c.id, _STATES.get(c.state, "unknown"))
        for c in reply.containers
        if c.labels.get(POD_UID_LABEL, uid) == uid
    ]


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


def cgroup_containers(host_proc: str, uid: str) -> list[Container] | None:
    """Running containers of the pod from `<host_proc>/*/cgroup`; None if unreadable."""
    pattern = _pod_component(uid)
    try:
        pids = [n for n in os.listdir(host_proc) if n.isdigit()]
    except OSError:
        return None
    ids: set[str] = set()
    for pid in pids:
        try:
            with open(os.path.join(host_proc, pid, "cgroup"), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(":", 2)[-1].split("/")
            for i, part in enumerate(parts):
                if pattern.match(part):
                    below = parts[i + 1] if i + 1 < len(parts) else ""
                    ids.add(_container_id(below) if below else "")
    return [Container(uid, cid or "(pod)", cid, "running") for cid in sorted(ids)]


def pod_containers(
    host_proc: str, uid: str, cri_socket: str | None, timeout_s: float = 2.0
) -> tuple[list[Container] | None, str | None]:
    """(containers, source): CRI when its socket exists and answers, else proc-cgroup."""
    if cri_socket and os.path.exists(cri_socket):
        try:
            return cri_containers(cri_socket, uid, timeout_s), "cri"
        except grpc.RpcError:
            pass
    found = cgroup_containers(host_proc, uid)
    return found, ("proc-cgroup" if found is not None else None)
