"""The agent finds the kubelet root and the CRI socket of the common distributions, on real
files and sockets under a temporary host root (reached, as on a node, through
`<host-proc>/1/root`: here a directory whose `1/root` links to it and whose `1/mountinfo` is
the host mount table):

- k3s: a real containerd (this machine's /usr/bin/containerd, its CRI plugin) listening on
  /run/k3s/containerd/containerd.sock; the kubelet root /var/lib/kubelet.
- RKE2: the same socket path and root (RKE2's containerd is k3s's).
- k0s: /var/lib/k0s/kubelet and /run/k0s/containerd.sock; MicroK8s:
  /var/snap/microk8s/common/var/lib/kubelet and /var/snap/microk8s/common/run/containerd.sock;
  CRI-O: /var/run/crio/crio.sock. Their runtimes cannot run here: each socket is answered by
  a CRI server speaking the real gRPC API (runtime.v1.RuntimeService/ListContainers).

Decoys on the way: a dead socket (a socket file nobody listens on) at the plain containerd
path, and a kubelet root left behind by another distribution. With neither a kubelet root
nor a CRI socket the agent does not start, and says what it tried."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from devcluster.process import wait_until
from unstick.agent.probe.containers import answers_cri, find_cri_socket, runtime_answer
from unstick.agent.proto import cri_pb2, cri_pb2_grpc
from unstick.agent.settings import KNOWN_CRI_SOCKETS, AgentSettings, find_kubelet_root
from unstick.commands import agent as agent_command
from unstick.commands.agent import find_host_paths, kubelet_root_problem
from unstick.core.model.mountinfo import parse_mountinfo

UID = "d15c0e7e-3737-4737-8737-d15c0e7ed15c"
LAYOUTS = {  # distribution: (kubelet root, CRI socket) as their documentation gives them
    "k3s": ("/var/lib/kubelet", "/run/k3s/containerd/containerd.sock"),
    "rke2": ("/var/lib/kubelet", "/run/k3s/containerd/containerd.sock"),
    "k0s": ("/var/lib/k0s/kubelet", "/run/k0s/containerd.sock"),
    "microk8s": (
        "/var/snap/microk8s/common/var/lib/kubelet",
        "/var/snap/microk8s/common/run/containerd.sock",
    ),
    "cri-o": ("/var/lib/kubelet", "/var/run/crio/crio.sock"),
}
CONTAINERD = shutil.which("containerd")


class _Runtime(cri_pb2_grpc.RuntimeServiceServicer):
    """A CRI RuntimeService that knows one running container of pod UID."""

    def ListContainers(self, request: Any, context: Any) -> Any:
        app = cri_pb2.Container(
            id="c0ffee",
            metadata=cri_pb2.ContainerMetadata(name="app"),
            state=cri_pb2.CONTAINER_RUNNING,
            labels={"io.kubernetes.pod.uid": UID},
        )
        wanted = dict(request.filter.label_selector)
        mine = all(app.labels.get(k) == v for k, v in wanted.items())
        return cri_pb2.ListContainersResponse(containers=[app] if mine else [])


class Host:
    """A temporary host root `root` and the agent's view of it, `proc` (`proc/1/root` links
    to `root`; `proc/1/mountinfo` is the host mount table). Everything it starts is stopped
    (servers) or killed by pid (containerd), and the directory removed."""

    def __init__(self) -> None:
        self.top = Path(tempfile.mkdtemp(prefix="ul-", dir="/tmp"))  # short: socket paths
        self.root = self.top / "h"
        self.proc = self.top / "p"
        (self.proc / "1").mkdir(parents=True)
        self.root.mkdir()
        (self.proc / "1" / "root").symlink_to(self.root)
        self.mountinfo("")
        self.servers: list[grpc.Server] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def mountinfo(self, text: str) -> None:
        (self.proc / "1" / "mountinfo").write_text(text)

    def kubelet_root(self, root: str) -> None:
        (self.path(root) / "pods" / UID).mkdir(parents=True, exist_ok=True)

    def cri_server(self, host_path: str) -> None:
        path = self.path(host_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        cri_pb2_grpc.add_RuntimeServiceServicer_to_server(_Runtime(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self.servers.append(server)

    def dead_socket(self, host_path: str) -> None:
        """A socket file with no listener (a runtime that died without removing it)."""
        path = self.path(host_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))

    def containerd(self, host_path: str) -> None:
        """A real containerd (CRI plugin) on `host_path`; all its state under the host root."""
        sock = self.path(host_path)
        sock.parent.mkdir(parents=True, exist_ok=True)
        state = self.top / "containerd"
        config = self.top / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{state}/root"
state = "{state}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{state}/opt"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{state}/cni/bin"
  conf_dir = "{state}/cni/net.d"
"""
        )
        log = open(self.top / "containerd.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([str(CONTAINERD), "--config", str(config)], stdout=log, stderr=log)
        log.close()
        self.procs.append(proc)
        wait_until(
            lambda: proc.poll() is None and answers_cri(str(sock), 2.0) is None,
            timeout=60,
            what=f"containerd answering the CRI on {sock}",
        )

    def close(self) -> None:
        for server in self.servers:
            server.stop(0)
        for proc in self.procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(self.top)

    def settings(self, **overrides: Any) -> AgentSettings:
        values: dict[str, Any] = {
            "node_name": "node-1",
            "kubelet_root": "auto",
            "host_proc": str(self.proc),
            "cri_socket": "auto",
            "grpc_timeout_s": 2.0,
        }
        return AgentSettings(**{**values, **overrides})


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    h = Host()
    # The agent's own view of a kubelet root (what its container has mounted at that path)
    # is an empty directory of the test's, not this machine's own /var/lib/kubelet, which
    # a real node or kind cluster on this machine may have made (or not).
    view = h.top / "agent-view"
    view.mkdir()
    real_view = agent_command.root_view
    monkeypatch.setattr(
        agent_command,
        "root_view",
        lambda root: dataclasses.replace(real_view(str(view / root.lstrip("/"))), root=root),
    )
    try:
        yield h
    finally:
        h.close()


def _volume_line(root: str) -> str:
    """A host mountinfo line of a pod volume under `root` (the kubelet mounted it)."""
    where = f"{root}/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount"
    return f"901 29 0:52 / {where} rw,relatime - nfs4 10.0.0.5:/x rw\n"


@pytest.mark.parametrize("distribution", sorted(LAYOUTS))
def test_the_agent_finds_each_distributions_kubelet_root_and_cri_socket(
    host: Host, distribution: str, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet_root, cri_socket = LAYOUTS[distribution]
    host.kubelet_root(kubelet_root)
    host.dead_socket("/run/containerd/containerd.sock")  # tried first, answers nothing
    if distribution == "k3s":
        if CONTAINERD is None:
            pytest.skip("needs containerd")
        host.containerd(cri_socket)
    else:
        host.cri_server(cri_socket)
    # nothing mounted yet: the known root holding pods/ on the host
    found, how = find_kubelet_root(str(host.proc / "1" / "root"), [])
    assert (found, how.split(" ")[0]) == (kubelet_root, f"{kubelet_root}/pods")
    sock, seen = find_cri_socket(str(host.proc / "1" / "root"), KNOWN_CRI_SOCKETS, 2.0)
    assert sock == str(host.proc / "1" / "root") + cri_socket
    assert seen[0].endswith("/run/containerd/containerd.sock did not answer the CRI "
                            "(StatusCode.UNAVAILABLE)")  # fmt: skip
    assert seen[-1].startswith(f"{cri_socket} (")
    # the command's resolution: both found, and logged with how
    with caplog.at_level(logging.INFO, logger="unstick.agent"):
        settings, problem = find_host_paths(host.settings())
    assert problem is None
    assert (settings.kubelet_root, settings.cri_socket) == (kubelet_root, sock)
    assert f"kubelet root {kubelet_root}: {kubelet_root}/pods exists on the host" in caplog.text
    assert f"CRI socket {sock}: {cri_socket} (" in caplog.text
    # the probe asks that runtime: answered, and (from the test's server) the pod's container
    answer = runtime_answer("/proc", UID, settings.cri_socket, 2.0)
    assert answer.cri_answered and answer.runtime == "cri+cgroup", answer.gaps
    expected = [] if distribution == "k3s" else ["c0ffee"]  # the real containerd runs none
    assert [c.id for c in answer.containers] == expected
    # the agent's own view must hold that root at the same path (the chart mounts it there):
    # here it does not, and the start-up check says which root to mount and how
    problem = kubelet_root_problem(settings) or ""
    assert problem.startswith(f"--kubelet-root {kubelet_root}: no such directory")
    assert f"{kubelet_root} is the host's kubelet root" in problem
    assert "the chart's agent.kubeletRoot" in problem


def test_the_mount_table_decides_between_kubelet_roots(host: Host) -> None:
    """A k0s node with a /var/lib/kubelet left behind: two roots hold pods/, no answer —
    until the host mount table shows the pod volumes under one of them."""
    host.kubelet_root("/var/lib/kubelet")
    host.kubelet_root("/var/lib/k0s/kubelet")
    root = str(host.proc / "1" / "root")
    found, how = find_kubelet_root(root, [])
    assert found is None and how.startswith("several kubelet roots hold pods/ on the host")
    mounts = parse_mountinfo(_volume_line("/var/lib/k0s/kubelet"))
    assert find_kubelet_root(root, mounts) == (
        "/var/lib/k0s/kubelet",
        "the host mount table has 1 pod volume mounts under /var/lib/k0s/kubelet/pods/",
    )
    # a custom --root-dir no list knows is found by its mounts alone
    mounts = parse_mountinfo(_volume_line("/data/kubelet"))
    assert find_kubelet_root(root, mounts)[0] == "/data/kubelet"
    # an explicit root that is wrong is named with the host's
    host.mountinfo(_volume_line("/var/lib/k0s/kubelet"))
    settings = host.settings(kubelet_root="/var/lib/kubelet", cri_socket=None)
    problem = kubelet_root_problem(settings) or ""
    assert problem.startswith("--kubelet-root /var/lib/kubelet: no such directory")
    assert "/var/lib/k0s/kubelet" in problem


def test_with_neither_the_agent_does_not_start_and_says_what_it_tried(host: Host) -> None:
    """No kubelet root and no CRI socket on the host: `unstick agent` exits 2 naming the
    roots it looked for, before it talks to any API server (invariant 8: it never runs on
    a root it could not see); an explicit --cri-socket none is no socket at all."""
    host.dead_socket("/run/crio/crio.sock")
    assert find_cri_socket(str(host.proc / "1" / "root"), KNOWN_CRI_SOCKETS, 2.0) == (
        None,
        [f"{host.proc}/1/root/run/crio/crio.sock did not answer the CRI (StatusCode.UNAVAILABLE)"],
    )
    argv = [sys.executable, "-m", "unstick", "agent", "--node-name", "n", "--host-proc",
            str(host.proc), "--kubeconfig", str(host.top / "no-such-kubeconfig")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "cannot find the kubelet root: none of /var/lib/kubelet, /var/lib/k0s/kubelet, " in (
        done.stderr
    )
    assert "pass --kubelet-root (the chart's agent.kubeletRoot)" in done.stderr
    settings, problem = find_host_paths(host.settings(kubelet_root="/x", cri_socket="none"))
    assert problem is None and settings.cri_socket is None
