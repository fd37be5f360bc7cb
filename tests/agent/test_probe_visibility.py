"""Invariant 8 at the agent: the probe says what it could see, and a blind probe is never
"nothing left". Real files, a real /proc, a real pids cgroup, a real gRPC CRI socket and,
for the start-up check, real mounts in a private mount namespace and the real command."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.bundles import diagnose_probe, overdue_pod
from tests.support.processes import PIDS_CGROUP, pod_container_cgroup, process_in
from unstick.agent.probe.collect import probe_pod
from unstick.agent.probe.containers import runtime_answer, scan_cgroups
from unstick.agent.proto import cri_pb2, cri_pb2_grpc
from unstick.agent.settings import AgentSettings
from unstick.commands.agent import kubelet_root_problem
from unstick.core.vocabulary import Cause

UID = "dddddddd-4444-4444-8444-dddddddddddd"
NOW = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)


def _pod() -> dict[str, Any]:
    return overdue_pod(UID, "terminated")


def _diagnose(probe: dict[str, Any], pod: dict[str, Any] | None = None) -> Any:
    return diagnose_probe(probe, pod or _pod())


def _node(tmp: Path, *, root: str = "kubelet", proc: str = "/proc", **kw: Any) -> AgentSettings:
    """A kubelet root with this pod's dir and two others; an empty host mount table."""
    for uid in (UID, "other-1", "other-2"):
        (tmp / "kubelet" / "pods" / uid).mkdir(parents=True, exist_ok=True)
    (tmp / "mountinfo").write_text(kw.pop("mountinfo", ""))
    return AgentSettings(
        node_name="node-1",
        kubelet_root=str(tmp / root),
        host_proc=proc,
        mountinfo_path=str(tmp / "mountinfo"),
        kubelet_healthz="http://127.0.0.1:9/healthz",
        plugins_registry=str(tmp / "registry"),
        grpc_timeout_s=2,
        **kw,
    )


# --- the probe's visibility keys -------------------------------------------------------


def test_a_sighted_probe_of_nothing_left_is_kubelet_not_progressing(tmp_path: Path) -> None:
    probe = probe_pod(_node(tmp_path), UID, now=NOW, plugins={})
    assert probe["podUID"] == UID and probe["podDirExists"] is True
    assert probe["podDirsSeen"] == 3
    assert probe["runtime"] == "cgroup" and probe["containers"] == []  # the real /proc
    assert probe["holderScan"] == "complete" and probe["blindSpots"] == []
    d = _diagnose(probe)
    assert d.cause is Cause.KubeletNotProgressing and d.nothing_left


def test_a_wrong_kubelet_root_is_blind_not_nothing_left(tmp_path: Path) -> None:
    probe = probe_pod(_node(tmp_path, root="kubelt"), UID, now=NOW, plugins={})
    assert probe["podDirExists"] is False and probe["podDirsSeen"] == 0
    assert any("kubelt/pods" in b for b in probe["blindSpots"])
    d = _diagnose(probe)
    assert d.cause is Cause.Unknown and not d.nothing_left
    assert any("holds no pod dirs" in e.message for e in d.evidence), d.evidence


def test_a_pod_dir_that_is_a_symlink_does_not_exist(tmp_path: Path) -> None:
    settings = _node(tmp_path)
    pod = tmp_path / "kubelet" / "pods" / UID
    pod.rmdir()
    pod.symlink_to(tmp_path / "kubelet" / "pods" / "other-1")
    probe = probe_pod(settings, UID, now=NOW, plugins={})
    assert probe["podDirExists"] is False and probe["podDirsSeen"] == 2


@pytest.fixture
def dead_socket(tmp_path: Path) -> Iterator[str]:
    """A CRI socket file whose runtime is gone (bound, never listening)."""
    path = Path("/tmp") / f"ua-dead-{uuid.uuid4().hex[:8]}.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    try:
        yield str(path)
    finally:
        path.unlink(missing_ok=True)


def test_a_dead_cri_socket_and_an_unusable_proc_leave_the_runtime_unanswered(
    tmp_path: Path, dead_socket: str
) -> None:
    (tmp_path / "proc").mkdir()  # lists no process: not a mounted /proc
    settings = _node(tmp_path, proc=str(tmp_path / "proc"), cri_socket=dead_socket)
    probe = probe_pod(settings, UID, now=NOW, plugins={})
    assert probe["runtime"] == "unanswered" and probe["containers"] is None
    blind = " | ".join(probe["blindSpots"])
    assert "did not answer" in blind and "lists no process" in blind
    d = _diagnose(probe)
    assert d.cause is Cause.Unknown and not d.nothing_left
    # the same probe with the dead socket only: the complete cgroup scan answers
    answer = runtime_answer("/proc", UID, dead_socket, 2)
    assert answer.runtime == "cgroup" and answer.answered


def test_an_incomplete_holder_scan_is_reported_and_never_orphaned_mount(tmp_path: Path) -> None:
    """/proc of another PID namespace (no `self`): the holder scan cannot be complete, so a
    mount with no listed holder is Unknown, not OrphanedMount (which would unmount)."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)  # one process, and no `self`
    (proc / "1" / "cgroup").write_text("0::/\n")
    mount = f"{tmp_path}/kubelet/pods/{UID}/volumes/kubernetes.io~empty-dir/cache"
    settings = _node(
        tmp_path, proc=str(proc), mountinfo=f"60 22 0:50 / {mount} rw - tmpfs tmpfs rw\n"
    )
    probe = probe_pod(settings, UID, now=NOW, plugins={})
    assert probe["holderScan"] == "incomplete" and probe["holders"] == []
    assert any("holder scan incomplete" in b for b in probe["blindSpots"])
    d = _diagnose(probe)
    assert d.cause is Cause.Unknown
    assert any("holder scan was incomplete" in e.message for e in d.evidence), d.evidence


@pytest.mark.mountns
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setpriv)")
def test_an_unreadable_cgroup_file_makes_the_cgroup_scan_incomplete(tmp_path: Path) -> None:
    """One process's cgroup file belongs to another user (0600) and the scan runs without
    CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH (setpriv): reading it fails with EACCES."""
    proc = tmp_path / "proc"
    for pid in ("1", "2"):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text("0::/\n")
    os.chown(proc / "2" / "cgroup", 65534, 65534)
    (proc / "2" / "cgroup").chmod(0o600)
    (proc / "self").symlink_to("1")
    code = (
        "from unstick.agent.probe.containers import scan_cgroups, runtime_answer\n"
        f"print(scan_cgroups({str(proc)!r}, {UID!r}).gap)\n"
        f"print(runtime_answer({str(proc)!r}, {UID!r}, None).runtime)\n"
    )
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"]
    done = subprocess.run(
        [*drop, "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    gap, runtime = done.stdout.splitlines()
    assert f"cannot read {proc}/2/cgroup: Permission denied" in gap
    assert runtime == "unanswered"
    assert scan_cgroups(str(proc), UID).gap is None  # with the capabilities: complete


# --- the union of the CRI answer and the cgroup scan -------------------------------------


class _Runtime(cri_pb2_grpc.RuntimeServiceServicer):
    """A CRI RuntimeService answering ListContainers from a fixed list (no container
    runtime can run here) — it says the container exited."""

    def __init__(self, containers: list[Any]) -> None:
        self.containers = containers

    def ListContainers(self, request: Any, context: Any) -> Any:
        wanted = dict(request.filter.label_selector)
        return cri_pb2.ListContainersResponse(
            containers=[
                c for c in self.containers if all(c.labels.get(k) == v for k, v in wanted.items())
            ]
        )


@pytest.fixture
def cri(request: pytest.FixtureRequest) -> Iterator[str]:
    path = Path("/tmp") / f"ua-cri-{uuid.uuid4().hex[:8]}.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    cri_pb2_grpc.add_RuntimeServiceServicer_to_server(_Runtime(request.param), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield str(path)
    finally:
        server.stop(0)
        path.unlink(missing_ok=True)


def _container(cid: str, state: int, name: str = "app") -> Any:
    return cri_pb2.Container(
        id=cid,
        metadata=cri_pb2.ContainerMetadata(name=name),
        state=state,
        labels={"io.kubernetes.pod.uid": UID},
    )


@pytest.mark.mountns
@pytest.mark.skipif(not os.access(PIDS_CGROUP, os.W_OK), reason="needs a writable pids cgroup")
@pytest.mark.parametrize("cri", [[_container("abc123", cri_pb2.CONTAINER_EXITED)]], indirect=True)
def test_a_container_the_cri_calls_exited_but_whose_cgroup_has_processes_runs(
    tmp_path: Path, cri: str
) -> None:
    with pod_container_cgroup(UID, "abc123", qos=None) as cgroup, process_in(cgroup):
        probe = probe_pod(_node(tmp_path, cri_socket=cri), UID, now=NOW, plugins={})
    assert probe["runtime"] == "cri+cgroup"
    assert probe["containers"] == [
        {"podUID": UID, "name": "app", "id": "abc123", "state": "running", "runtimeState": "exited"}
    ]
    assert _diagnose(probe).cause is Cause.ContainersStillRunning


DEBUG = "debugger-x7k2p"  # a `kubectl debug` (ephemeral) container of the pod


@pytest.mark.mountns
@pytest.mark.skipif(not os.access(PIDS_CGROUP, os.W_OK), reason="needs a writable pids cgroup")
@pytest.mark.parametrize(
    "cri",
    [
        [
            _container("abc123", cri_pb2.CONTAINER_EXITED),
            _container("dbg456", cri_pb2.CONTAINER_RUNNING, name=DEBUG),
        ]
    ],
    indirect=True,
)
def test_a_running_debug_container_is_containers_still_running(tmp_path: Path, cri: str) -> None:
    """Issue #22 finding 8: the app container exited, a `kubectl debug` container still runs
    (a real process in its container cgroup, and the runtime lists it): the probe shows it
    running and the diagnosis is ContainersStillRunning — also when pod.status lags."""
    with pod_container_cgroup(UID, "dbg456", qos=None) as cgroup, process_in(cgroup):
        probe = probe_pod(_node(tmp_path, cri_socket=cri), UID, now=NOW, plugins={})
    assert probe["runtime"] == "cri+cgroup"
    assert [(c["name"], c["state"]) for c in probe["containers"]] == [
        ("app", "exited"),
        (DEBUG, "running"),
    ]
    for debug_status in ("running", "waiting"):  # "waiting": a status the kubelet has not updated
        pod = _pod()
        pod["status"]["ephemeralContainerStatuses"] = [{"name": DEBUG, "state": {debug_status: {}}}]
        d = _diagnose(probe, pod)
        assert d.cause is Cause.ContainersStillRunning, d.evidence
        assert d.running_containers == (f"container {DEBUG}",)


@pytest.mark.parametrize("cri", [[_container("abc123", cri_pb2.CONTAINER_EXITED)]], indirect=True)
def test_the_cri_answer_alone_counts_when_the_cgroup_scan_is_incomplete(
    tmp_path: Path, cri: str
) -> None:
    settings = _node(tmp_path, proc=str(tmp_path / "no-proc"), cri_socket=cri)
    probe = probe_pod(settings, UID, now=NOW, plugins={})
    assert probe["runtime"] == "cri" and probe["containers"][0]["state"] == "exited"
    assert any("cgroup scan incomplete" in b for b in probe["blindSpots"])
    assert _diagnose(probe).cause is Cause.KubeletNotProgressing


# --- the agent's start-up check of --kubelet-root ----------------------------------------


def _agent(root: Path, *args: str, mounts: Sequence[Path] = ()) -> subprocess.CompletedProcess[str]:
    """`unstick agent --kubelet-root ROOT` in a private mount namespace where `mounts` are
    real tmpfs mounts; the command reads that namespace's mount table."""
    script = "".join(f"mount -t tmpfs -o size=1m t {m} && " for m in mounts)
    cmd = [
        sys.executable, "-m", "unstick", "agent", "--node-name", "n1",
        "--kubelet-root", str(root), "--host-proc", "/proc",
        "--mountinfo", "/proc/self/mountinfo", "--kubeconfig", "/nonexistent", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script + 'exec "$@"', "sh", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.mountns
def test_the_agent_refuses_to_start_on_a_wrong_kubelet_root(work: Path) -> None:
    kubelet = work / "kubelet"
    mounts = []
    for uid in ("u1", "u2"):
        m = kubelet / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "cache"
        m.mkdir(parents=True)
        mounts.append(m)
    typo = _agent(work / "kubelt", mounts=mounts)
    assert typo.returncode == 2, typo.stderr
    assert f"--kubelet-root {work}/kubelt: no such directory" in typo.stderr
    assert f"2 mounts under {kubelet}/pods/ — is the root {kubelet}?" in typo.stderr
    assert "Traceback" not in typo.stderr
    # a root that exists but is not the one mounted (e.g. hostPath and mountPath differ)
    elsewhere = work / "elsewhere"
    (elsewhere / "pods").mkdir(parents=True)
    wrong = _agent(elsewhere, mounts=mounts)
    assert wrong.returncode == 2 and "no mount under" in wrong.stderr, wrong.stderr
    assert f"is the root {kubelet}?" in wrong.stderr


def test_the_start_up_check_passes_a_real_root_and_names_the_flag(tmp_path: Path) -> None:
    pods = f"{tmp_path}/kubelet/pods"
    line = f"60 22 0:50 / {pods}/{UID}/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw\n"
    assert kubelet_root_problem(_node(tmp_path, mountinfo=line)) is None
    fresh = tmp_path / "fresh"
    (fresh / "kubelet" / "pods").mkdir(parents=True)  # a node with no pods yet
    assert kubelet_root_problem(_node(fresh)) is None
    gone = f"61 22 0:51 / {pods}/vanished/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw\n"
    problem = kubelet_root_problem(_node(tmp_path, mountinfo=line + gone)) or ""
    assert problem.startswith(f"--kubelet-root {tmp_path}/kubelet: the host mount table has 1")
    assert "(e.g. vanished)" in problem
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "kubelet")
    assert "is a symlink" in (kubelet_root_problem(_node(tmp_path, root="link")) or "")
