"""Agent parts that need no mounts: kubelet health over real HTTP, plugin registration over
real gRPC unix sockets, path checks, holder matching rules, restart-kubelet rate limit,
Remediation validation, and containers from a real cgroup."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from concurrent import futures
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.agent.policy_sources import opted_in
from tests.support.processes import PIDS_CGROUP, pod_container_cgroup, process_in
from unstick.agent.handler import Handler
from unstick.agent.probe.containers import cgroup_containers, pod_containers
from unstick.agent.probe.kubelet_health import kubelet_healthy
from unstick.agent.probe.plugins import registered_plugins
from unstick.agent.proto import (
    cri_pb2,
    cri_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor
from unstick.agent.steps.safepath import UnsafePath, check_path
from unstick.core.model.mount_identity import MountTable, Target, holding_copies, is_copy
from unstick.core.model.mountinfo import parse_mountinfo

UID = "cccccccc-3333-4333-8333-cccccccccccc"


# --- kubelet health ------------------------------------------------------------------


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 500)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        return


def test_kubelet_health_true_false_and_unknown() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert kubelet_healthy(f"http://127.0.0.1:{port}/healthz") is True
        assert kubelet_healthy(f"http://127.0.0.1:{port}/broken") is False
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert kubelet_healthy(f"http://127.0.0.1:{free}/healthz", timeout_s=2) is None


# --- plugin registration ---------------------------------------------------------------


class _Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, kind: str, name: str, endpoint: str) -> None:
        self.info = pluginregistration_pb2.PluginInfo(
            type=kind, name=name, endpoint=endpoint, supported_versions=["1.0.0"]
        )

    def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info


def test_registered_plugins_over_real_registration_sockets(short_tmp: Path) -> None:
    registry = short_tmp / "plugins_registry"
    registry.mkdir()
    servers = []
    for kind, name in (("CSIPlugin", "a.csi.example.com"), ("DRAPlugin", "gpu.example.com")):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
            _Registration(kind, name, f"/plugins/{name}/csi.sock"), server
        )
        server.add_insecure_port(f"unix://{registry}/{name}-reg.sock")
        server.start()
        servers.append(server)
    stale = socket.socket(socket.AF_UNIX)  # a socket file whose driver is gone
    stale.bind(str(registry / "dead.csi.example.com-reg.sock"))
    stale.close()
    (registry / "notes.sock").write_text("not a socket")
    try:
        plugins = registered_plugins(str(registry), timeout_s=2)
    finally:
        for server in servers:
            server.stop(0)
    assert list(plugins) == ["a.csi.example.com"]
    assert plugins["a.csi.example.com"].endpoint == "/plugins/a.csi.example.com/csi.sock"


# --- paths and holders -----------------------------------------------------------------


def test_check_path_refuses_any_symlink_component(tmp_path: Path) -> None:
    real = tmp_path / "pods" / UID / "volumes" / "p" / "v"
    real.mkdir(parents=True)
    check_path(str(real), is_mount_point=False)
    (tmp_path / "link").symlink_to(tmp_path / "pods")
    with pytest.raises(UnsafePath):
        check_path(str(tmp_path / "link" / UID / "volumes" / "p" / "v"), is_mount_point=True)
    (real / "evil").symlink_to("/etc")
    with pytest.raises(UnsafePath):
        check_path(str(real / "evil"), is_mount_point=False)
    with pytest.raises(UnsafePath):
        check_path(str(real / ".." / "v"), is_mount_point=False)


def _mount(line: str) -> Any:
    return parse_mountinfo(line)[0]


def test_a_copy_in_another_namespace_holds_unless_it_is_the_propagated_copy() -> None:
    """Invariant 9: a peer or slave is exempt only at the propagated place (on a peer or
    slave of the target's parent, at the same directory); at any other path it holds."""
    parent = _mount("90 22 8:1 / /k rw shared:3 - ext4 /dev/sda1 rw")
    pod = _mount("100 90 8:1 /data/x /k/pods/u/volumes/p/v rw shared:7 - ext4 /dev/sda1 rw")
    private = _mount("300 290 8:1 /data/x /data rw - ext4 /dev/sda1 rw")
    below = _mount("301 290 8:1 /data/x/sub /data rw - ext4 /dev/sda1 rw")
    other_dev = _mount("304 290 8:2 /data/x /data rw - ext4 /dev/sdb1 rw")
    above = _mount("305 290 8:1 /data /data rw - ext4 /dev/sda1 rw")
    assert is_copy(private, pod) and is_copy(below, pod)
    assert not is_copy(other_dev, pod) and not is_copy(above, pod)
    ns_parent = _mount("390 290 8:1 / /k rw master:3 - ext4 /dev/sda1 rw")
    host_pods = _mount("391 290 8:1 /pods /host_pods rw master:3 - ext4 /dev/sda1 rw")
    for kind in ("shared:7", "master:7"):
        same_place = _mount(f"302 390 8:1 /data/x /k/pods/u/volumes/p/v rw {kind} - ext4 x rw")
        moved = _mount(f"303 391 8:1 /data/x /host_pods/u/volumes/p/v rw {kind} - ext4 x rw")
        elsewhere = _mount(f"306 290 8:1 /data/x /backup rw {kind} - ext4 x rw")
        table = MountTable.of([ns_parent, host_pods, same_place, moved, elsewhere])
        assert holding_copies(table, Target(pod, parent)) == [elsewhere]
        assert holding_copies(table, Target(pod, None)) == [same_place, moved, elsewhere]


# --- restart-kubelet -------------------------------------------------------------------


def test_restart_kubelet_at_most_once_per_hour(tmp_path: Path) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    settings = AgentSettings(
        node_name=node, state_dir=str(tmp_path / "state"), restart_kubelet_command=("true",)
    )

    def run(at: datetime, dry: bool = False) -> str:
        ex = Executor(settings, clock=lambda: at)
        return ex.run_step(UID, "restart-kubelet", "", dry_run=dry, lazy_unmount=False).result

    assert run(now, dry=True) == "dry_run"
    other = Executor(settings, clock=lambda: now).run_step(
        UID, "restart-kubelet", "another-node", dry_run=False, lazy_unmount=False
    )
    assert other.result == "refused"
    assert run(now) == "succeeded"
    assert run(now + timedelta(minutes=59)) == "refused"
    assert (tmp_path / "state" / "last-kubelet-restart").exists()
    assert run(now + timedelta(minutes=61)) == "succeeded"
    failing = AgentSettings(
        node_name=node + "-f", state_dir=str(tmp_path / "s2"), restart_kubelet_command=("false",)
    )
    result = Executor(failing, clock=lambda: now).run_step(
        UID, "restart-kubelet", dry_run=False, lazy_unmount=False
    )
    assert result.result == "failed" and "exited 1" in result.message


# --- Remediation handling --------------------------------------------------------------


def _handler(tmp_path: Path, mountinfo: str = "") -> tuple[Handler, list[dict[str, Any]]]:
    (tmp_path / "mountinfo").write_text(mountinfo)
    proc = tmp_path / "proc"  # a /proc with one process (no fds, no mounts) that is "self"
    (proc / "1").mkdir(parents=True, exist_ok=True)
    if not (proc / "self").is_symlink():
        (proc / "self").symlink_to("1")
    settings = AgentSettings(
        node_name="node-1",
        kubelet_root=str(tmp_path / "kubelet"),
        host_proc=str(tmp_path / "proc"),
        mountinfo_path=str(tmp_path / "mountinfo"),
        kubelet_healthz="http://127.0.0.1:9/healthz",
        plugins_registry=str(tmp_path / "registry"),
    )
    patches: list[dict[str, Any]] = []
    handler = Handler(
        settings,
        Executor(settings),
        lambda ns, n, p: patches.append(p),
        lambda ns, name: {
            "metadata": {"name": name, "uid": UID, "deletionTimestamp": "2025-12-31T23:00:00Z"},
            "spec": {"nodeName": "node-1"},
        },
        policies=opted_in(),
        clock=lambda: datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC),  # requests below are fresh
    )
    return handler, patches


def _rem(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    base = {"podName": "web-0", "podUID": UID, "nodeName": "node-1"}
    return {
        "metadata": {"namespace": "default", "name": "web-0-cccccccc", "uid": "r1"},
        "spec": {**base, **spec},
        "status": status or {},
    }


def test_probe_is_served_once_per_request(tmp_path: Path) -> None:
    pods = f"{tmp_path}/kubelet/pods"
    line = f"50 22 0:40 / {pods}/{UID}/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw\n"
    decoy = f"51 22 0:41 / {pods}/other/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw\n"
    handler, patches = _handler(tmp_path, line + decoy)
    rem = _rem({"probeRequestedAt": "2026-01-01T00:00:00Z"})
    handler.handle(rem)
    handler.handle(rem)
    assert len(patches) == 1
    probe = patches[0]["probe"]
    assert probe["mountinfo"] == line and probe["nodeName"] == "node-1"
    assert probe["containers"] == [] and probe["registeredPlugins"] == []
    answered = _rem({"probeRequestedAt": "2026-01-01T00:00:00Z"}, {"probe": probe})
    handler.served_probes.clear()  # e.g. after an agent restart: probedAt already newer
    handler.handle(answered)
    assert len(patches) == 1


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([{"action": "force-delete"}], "spec.nodeSteps[0].action"),
        ([{"action": "unmount", "target": 7}], "spec.nodeSteps[0].target"),
        ("unmount", "spec.nodeSteps"),
    ],
)
def test_bad_node_steps_are_refused_naming_the_field(
    tmp_path: Path, steps: Any, field: str
) -> None:
    handler, patches = _handler(tmp_path)
    handler.handle(_rem({"nodeSteps": steps, "nodeStepsRequestedAt": "2026-01-01T00:00:00Z"}))
    (patch,) = patches
    (action,) = patch["nodeActions"]
    assert action["result"] == "refused" and action["message"].startswith(field)
    assert patch["nodeStepsDoneAt"] >= "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    "spec",
    [
        {"podUID": "../etc"},
        {"nodeName": "another-node"},
        {"probeRequestedAt": "yesterday"},
    ],
)
def test_bad_remediations_cause_nothing(tmp_path: Path, spec: dict[str, Any]) -> None:
    handler, patches = _handler(tmp_path)
    handler.handle(_rem({"probeRequestedAt": "2026-01-01T00:00:00Z", **spec}))
    assert patches == []


def test_target_text_from_the_cr_is_never_used_as_a_path(tmp_path: Path) -> None:
    mount = f"{tmp_path}/kubelet/pods/{UID}/volumes/kubernetes.io~projected/t"
    Path(mount).mkdir(parents=True)  # (nothing is mounted there: the table is a text file)
    handler, _ = _handler(tmp_path, f"50 22 0:40 / {mount} rw - tmpfs tmpfs rw\n")
    ex = handler.executor
    for target in ("/etc", f"{mount}/../../../../../../etc", f"{tmp_path}/kubelet/pods/x"):
        result = ex.run_step(UID, "unmount", target, dry_run=False, lazy_unmount=False)
        assert result.result == "refused", (target, result)
    dry = ex.run_step(UID, "unmount", mount + "/", dry_run=True, lazy_unmount=False)
    assert dry.result == "dry_run" and mount in dry.message


# --- containers from a real cgroup -----------------------------------------------------


@pytest.mark.mountns
@pytest.mark.skipif(not os.access(PIDS_CGROUP, os.W_OK), reason="needs a writable pids cgroup")
def test_running_container_found_from_its_cgroup_blocks_unmount(tmp_path: Path) -> None:
    with pod_container_cgroup(UID, "abc123") as container, process_in(container):
        found = cgroup_containers("/proc", UID)
        assert found is not None
        assert [(c.id, c.state) for c in found] == [("abc123", "running")]
        mount = f"{tmp_path}/kubelet/pods/{UID}/volumes/kubernetes.io~projected/t"
        handler, _ = _handler(tmp_path, f"50 22 0:40 / {mount} rw - tmpfs tmpfs rw\n")
        subprocess.run(["rm", "-r", str(tmp_path / "proc")], check=True)
        (tmp_path / "proc").symlink_to("/proc")
        result = handler.executor.run_step(UID, "unmount", "", dry_run=False, lazy_unmount=False)
        assert result.result == "refused" and "still run" in result.message


# --- containers from the CRI -----------------------------------------------------------


class _FakeRuntime(cri_pb2_grpc.RuntimeServiceServicer):
    """A stand-in for containerd/CRI-O's RuntimeService (no container runtime can run in
    this test environment): answers ListContainers from a fixed list, applying the label
    selector like a runtime does."""

    def __init__(self, containers: list[Any]) -> None:
        self.containers = containers
        self.requests: list[Any] = []

    def ListContainers(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        wanted = dict(request.filter.label_selector)
        return cri_pb2.ListContainersResponse(
            containers=[
                c for c in self.containers if all(c.labels.get(k) == v for k, v in wanted.items())
            ]
        )


def test_containers_from_the_cri_socket(short_tmp: Path) -> None:
    def container(cid: str, name: str, uid: str, state: int) -> Any:
        return cri_pb2.Container(
            id=cid,
            metadata=cri_pb2.ContainerMetadata(name=name),
            state=state,
            labels={"io.kubernetes.pod.uid": uid},
        )

    runtime = _FakeRuntime(
        [
            container("c1", "app", UID, cri_pb2.CONTAINER_RUNNING),
            container("c2", "init", UID, cri_pb2.CONTAINER_EXITED),
            container("c3", "other", "another-pod", cri_pb2.CONTAINER_RUNNING),
        ]
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    cri_pb2_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
    sock = short_tmp / "cri.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        found, source = pod_containers("/nonexistent", UID, str(sock))
    finally:
        server.stop(0)
    assert source == "cri"
    assert found is not None
    assert [c.to_json() for c in found] == [
        {"podUID": UID, "name": "app", "id": "c1", "state": "running"},
        {"podUID": UID, "name": "init", "id": "c2", "state": "exited"},
    ]
    (request,) = runtime.requests
    assert dict(request.filter.label_selector) == {"io.kubernetes.pod.uid": UID}
    # no runtime socket and an unreadable proc: unknown, not "no containers"
    assert pod_containers("/nonexistent", UID, str(short_tmp / "missing.sock")) == (None, None)


# --- the command -----------------------------------------------------------------------


def test_agent_command_explains_a_missing_mount_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unstick", "agent", "--node-name", "n1",
         "--host-proc", str(tmp_path / "no-proc"), "--kubeconfig", str(tmp_path / "kc")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "cannot read the mount table" in done.stderr and "--host-proc" in done.stderr
    assert "Traceback" not in done.stderr
    relative = subprocess.run(
        [sys.executable, "-m", "unstick", "agent", "--node-name", "n1", "--kubelet-root", "var"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert relative.returncode == 2 and "--kubelet-root" in relative.stderr


def test_planned_targets_already_done_are_nothing_to_do(tmp_path: Path) -> None:
    pod = tmp_path / "kubelet" / "pods" / UID
    plain = pod / "volumes" / "kubernetes.io~projected" / "t"
    plain.mkdir(parents=True)
    data = pod / "volumes" / "kubernetes.io~empty-dir" / "d" / "user-dir"
    data.mkdir(parents=True)
    handler, _ = _handler(tmp_path)  # empty mount table: nothing is mounted
    ex = handler.executor

    def run(action: str, target: Path) -> Any:
        return ex.run_step(UID, action, str(target), dry_run=False, lazy_unmount=False)

    assert run("unmount", plain).result == "succeeded"  # not mounted: nothing to do
    assert run("unmount", pod / "volumes" / "gone" / "x").result == "succeeded"
    assert run("rmdir-stale", pod / "volumes" / "gone" / "x").result == "succeeded"
    # an existing dir the agent does not list (user data inside a volume) is not removed
    assert run("rmdir-stale", data).result == "refused"
    assert data.is_dir()
    assert run("rmdir-stale", plain).result == "succeeded"
    assert not plain.exists()
