"""Issue #25 at the agent, on real parts: a real process in uninterruptible sleep (a vfork()ed
parent waits in D while its child runs; a tiny C program built here with gcc) and a real
cgroup v1 freezer cgroup, frozen by the test — both named like a container cgroup of the
pod. The probe reports them; the diagnosis names them; the node step `thaw` thaws exactly
the pod's frozen cgroup. Every process and cgroup is gone at the end, also on failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster.process import wait_until
from tests.support.agent import node_under
from tests.support.bundles import diagnose_probe, overdue_pod
from tests.support.processes import pod_container_cgroup
from unstick.agent.probe.collect import probe_pod
from unstick.agent.probe.containers import Member, pod_component
from unstick.agent.probe.pod_tasks import CgroupMount, frozen_cgroups
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor
from unstick.core.policy.planner import plan
from unstick.core.vocabulary import CHANGING_ACTIONS, Action, Cause

UID = "eeeeeeee-5555-4555-8555-eeeeeeeeeeee"
NOW = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
FREEZER_CGROUP = Path("/sys/fs/cgroup/freezer")
VFORK_C = r"""
#include <unistd.h>
#include <sys/wait.h>
int main(void) {
    pid_t c = vfork();
    if (c == 0) { sleep(600); _exit(0); }  /* the parent sleeps in D until this ends */
    waitpid(c, 0, 0);
    return 0;
}
"""


def _diagnose(probe: dict[str, Any]) -> Any:
    return diagnose_probe(probe, overdue_pod(UID, "running"))


def _node(tmp: Path) -> AgentSettings:
    return node_under(tmp, pods=(UID,), grpc_timeout_s=2)


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _remove(top: Path) -> None:
    for path in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_dir():
            path.rmdir()
    top.rmdir()


@pytest.fixture
def vfork_binary(tmp_path: Path) -> str:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the vfork program")
    src, out = tmp_path / "vfork.c", tmp_path / "vfork"
    src.write_text(VFORK_C)
    subprocess.run(["gcc", "-O0", "-o", str(out), str(src)], check=True)
    return str(out)


def _state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :].split(" ", 1)[0]


@pytest.fixture
def d_state_task(vfork_binary: str) -> Iterator[int]:
    """A real process in D state in a pids cgroup named like a container of pod UID."""
    with pod_container_cgroup(UID, "abc123", qos=None) as cgroup:
        proc: subprocess.Popen[bytes] | None = None
        try:
            # the cgroup first (its children inherit it), then the program
            proc = subprocess.Popen(
                [
                    "sh",
                    "-c",
                    f'echo $$ > {cgroup}/cgroup.procs && exec "$0"',
                    vfork_binary,
                ]
            )
            parent = proc.pid
            # D with its child there: vfork() happened (a page-in during exec is D briefly too)
            wait_until(
                lambda: _state(parent) == "D" and len(_procs(cgroup)) == 2,
                timeout=10,
                what="the vfork parent in D",
            )
            yield parent
        finally:
            for pid in _procs(cgroup):  # the child first: its parent then reaps it and exits
                if proc is None or pid != proc.pid:
                    os.kill(pid, signal.SIGKILL)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            wait_until(lambda: not _procs(cgroup), timeout=10, what="the test cgroup empty")


@pytest.mark.mountns
def test_a_task_in_d_state_is_named_with_its_wait_channel(
    tmp_path: Path, d_state_task: int
) -> None:
    probe = probe_pod(_node(tmp_path), UID, now=NOW, plugins={})
    tasks = probe["dTasks"]
    assert [(t["pid"], t["comm"], t["container"]) for t in tasks] == [
        (d_state_task, "vfork", "abc123")
    ]
    wchan = Path(f"/proc/{d_state_task}/wchan").read_text().strip()
    assert tasks[0]["wchan"] == wchan
    assert probe["frozenCgroups"] == []
    d = _diagnose(probe)
    assert d.cause is Cause.ContainersStillRunning
    words = (
        f"container abc123 cannot be killed: pid {d_state_task} (vfork) in uninterruptible sleep"
    )
    # it comes before the other node evidence: the Event message carries the first lines
    messages = [e.message for e in d.evidence]
    assert any(m.startswith(words) for m in messages[:3]), messages
    assert plan(d, None).actions == (Action.OBSERVE,)


def _freeze(cgroup: Path, state: str) -> None:
    (cgroup / "freezer.state").write_text(state)


@pytest.fixture
def frozen_container() -> Iterator[tuple[Path, int]]:
    """A real process in a v1 freezer cgroup named like a container of pod UID, frozen."""
    if not os.access(FREEZER_CGROUP, os.W_OK):
        pytest.skip("needs a writable cgroup v1 freezer")
    top = FREEZER_CGROUP / f"unstick-test-{uuid.uuid4().hex[:8]}"
    cgroup = top / "kubepods" / f"pod{UID}" / "cri-containerd-fff999.scope"
    cgroup.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "600"])
    try:
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
        _freeze(cgroup, "FROZEN")
        wait_until(
            lambda: (cgroup / "freezer.state").read_text().strip() == "FROZEN",
            timeout=10,
            what="the cgroup FROZEN",
        )
        yield cgroup, proc.pid
    finally:
        _freeze(cgroup, "THAWED")
        proc.kill()
        proc.wait()
        wait_until(lambda: not _procs(cgroup), timeout=10, what="the test cgroup empty")
        _remove(top)


@pytest.mark.mountns
def test_a_frozen_container_cgroup_is_container_frozen(
    tmp_path: Path, frozen_container: tuple[Path, int]
) -> None:
    cgroup, _ = frozen_container
    probe = probe_pod(_node(tmp_path), UID, now=NOW, plugins={})
    path = "/" + str(cgroup.relative_to(FREEZER_CGROUP))
    assert probe["frozenCgroups"] == [
        {
            "path": path,
            "state": "FROZEN",
            "version": "v1",
            "container": "fff999",
            "selfFrozen": True,
        }
    ]
    assert [c["id"] for c in probe["containers"]] == ["fff999"]
    d = _diagnose(probe)
    assert d.cause is Cause.ContainerFrozen
    assert [c.path for c in d.frozen_cgroups] == [path]
    messages = [e.message for e in d.evidence]
    assert any(m.startswith(f"cgroup {path} (container fff999) is FROZEN") for m in messages[:3])
    p = plan(d, None)
    assert p.actions == (Action.THAW,)  # every action permitted: only the thaw
    assert not set(p.actions) & (CHANGING_ACTIONS - {Action.THAW})
    assert {r.action for r in p.refused} >= {Action.FORCE_DELETE, Action.UNMOUNT}


@pytest.mark.mountns
def test_a_thawed_container_is_containers_still_running(
    tmp_path: Path, frozen_container: tuple[Path, int]
) -> None:
    cgroup, _ = frozen_container
    _freeze(cgroup, "THAWED")
    wait_until(
        lambda: (cgroup / "freezer.state").read_text().strip() == "THAWED",
        timeout=10,
        what="the cgroup THAWED",
    )
    probe = probe_pod(_node(tmp_path), UID, now=NOW, plugins={})
    assert probe["frozenCgroups"] == []
    assert _diagnose(probe).cause is Cause.ContainersStillRunning


# --- thaw: the node step (issue #25) ------------------------------------------------------


def _state_of(cgroup: Path) -> str:
    return (cgroup / "freezer.state").read_text().strip()


@pytest.mark.mountns
def test_thaw_thaws_exactly_the_pods_frozen_cgroup(
    tmp_path: Path, frozen_container: tuple[Path, int]
) -> None:
    """The planned step thaws the pod's frozen container cgroup: the process runs again (a
    SIGTERM then ends it), and the next probe shows ContainersStillRunning, not frozen."""
    cgroup, pid = frozen_container
    settings = _node(tmp_path)
    d = _diagnose(probe_pod(settings, UID, now=NOW, plugins={}))
    steps = plan(d, None).steps
    path = "/" + str(cgroup.relative_to(FREEZER_CGROUP))
    assert [(s.action, s.target) for s in steps] == [(Action.THAW, path)]
    ex = Executor(settings)
    dry = ex.run_step(UID, "thaw", path, dry_run=True, lazy_unmount=False)
    assert dry.result == "dry_run" and _state_of(cgroup) == "FROZEN", dry
    done = ex.run_step(UID, "thaw", path, dry_run=False, lazy_unmount=False)
    assert done.result == "succeeded", done
    assert "wrote THAWED to freezer.state" in done.message
    wait_until(lambda: _state_of(cgroup) == "THAWED", timeout=10, what="the cgroup THAWED")
    assert _diagnose(probe_pod(settings, UID, now=NOW, plugins={})).cause is (
        Cause.ContainersStillRunning
    )
    os.kill(pid, signal.SIGTERM)  # the runtime's kill now lands
    wait_until(lambda: not _procs(cgroup), timeout=10, what="the thawed process gone")


OTHER = "ffffffff-6666-4666-8666-ffffffffffff"


@pytest.mark.mountns
def test_thaw_refuses_a_cgroup_that_is_not_the_pods_frozen_one(
    tmp_path: Path, frozen_container: tuple[Path, int]
) -> None:
    """A target from a Remediation is only matched against the agent's own fresh scan of
    this pod: another pod's frozen cgroup, a path with `..`, a parent, a thawed cgroup and
    the right path under another pod's UID are all refused, and nothing is thawed."""
    cgroup, _ = frozen_container
    path = "/" + str(cgroup.relative_to(FREEZER_CGROUP))
    ex = Executor(_node(tmp_path))
    targets = [
        (UID, path.replace(UID, OTHER)),
        (UID, path + "/../cri-containerd-fff999.scope"),
        (UID, str(Path(path).parent.parent)),  # above the pod's cgroup
        (UID, "/"),
        (UID, ""),
        (OTHER, path),  # right path, another pod's request
    ]
    for uid, target in targets:
        r = ex.run_step(uid, "thaw", target, dry_run=False, lazy_unmount=False)
        assert r.result == "refused", (target, r)
        assert _state_of(cgroup) == "FROZEN"
    _freeze(cgroup, "THAWED")
    wait_until(lambda: _state_of(cgroup) == "THAWED", timeout=10, what="the cgroup THAWED")
    r = ex.run_step(UID, "thaw", path, dry_run=False, lazy_unmount=False)
    assert r.result == "refused" and "not a frozen cgroup of pod" in r.message, r


# --- cgroup v2 and what cannot be seen (files laid out like a cgroup2 mount) -------------


def _v2_member(path: str, container: str = "abc123") -> Member:
    return Member(4242, container, ("0::" + path,))


def test_v2_frozen_freezing_and_thawed_cgroups_are_read_from_cgroup_events(
    tmp_path: Path,
) -> None:
    """This machine has the v1 freezer; the v2 reading is checked on files laid out like a
    cgroup2 hierarchy (the kernel's own files cannot be made here)."""
    pod_cg = f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice"
    paths = {
        pod_cg: ("frozen 1\n", "1\n"),  # frozen itself
        f"{pod_cg}/cri-containerd-a.scope": ("populated 1\nfrozen 1\n", "0\n"),  # via parent
        f"{pod_cg}/cri-containerd-b.scope": ("frozen 0\n", "1\n"),  # freezing
        f"{pod_cg}/cri-containerd-c.scope": ("frozen 0\n", "0\n"),  # thawed
    }
    for path, (events, freeze) in paths.items():
        (tmp_path / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/") / "cgroup.events").write_text(events)
        (tmp_path / path.lstrip("/") / "cgroup.freeze").write_text(freeze)
    members = [_v2_member(f"{pod_cg}/cri-containerd-{c}.scope", c) for c in "abc"]
    mounts = [CgroupMount("v2", "/", str(tmp_path))]
    frozen, blind = frozen_cgroups(members, pod_component(UID), mounts)
    assert blind == []
    assert [(c.path, c.state, c.container, c.self_frozen) for c in frozen] == [
        (pod_cg, "FROZEN", "", True),
        (f"{pod_cg}/cri-containerd-a.scope", "FROZEN", "a", False),
        (f"{pod_cg}/cri-containerd-b.scope", "FREEZING", "b", True),
    ]
    # a cgroup under no mount the agent sees is a blind spot, never "not frozen"
    frozen, blind = frozen_cgroups(members[:1], pod_component(UID), [])
    assert frozen == [] and any("not under a cgroup mount" in b for b in blind)
    # another pod's processes are never looked at
    assert frozen_cgroups(members, pod_component(OTHER), mounts) == ([], [])
    # a path seen from another cgroup namespace ("/../..") is never followed: a blind spot
    outside = _v2_member(f"/../..{pod_cg}/cri-containerd-a.scope", "a")
    frozen, blind = frozen_cgroups([outside], pod_component(UID), mounts)
    assert frozen == [] and blind and all("not a plain path" in b for b in blind)
