"""Safety rules of the agent that need no mounts: stale or future node-step requests are
refused (S1), node steps run only for the overdue Terminating pod of this node that the
Remediation names, checked against the pod from the API (S2; here a callable, the real GET
is in test_agent_envtest.py), and a holder scan that cannot see every process is
"unknown", never "no holders" (S6; the real mounts are in test_mountns_safety.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.agent.policy_sources import opted_in
from unstick.agent.handler import Handler
from unstick.agent.holders.scan import scan_holders
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor
from unstick.core.model.mountinfo import parse_mountinfo

UID = "cccccccc-3333-4333-8333-cccccccccccc"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
STEPS = [
    {"action": "unmount", "target": "", "reason": "test"},
    {"action": "rmdir-stale", "target": "", "reason": "test"},
]


def _pod(**changes: Any) -> dict[str, Any]:
    meta = {"name": "web-0", "uid": UID, "deletionTimestamp": "2026-03-01T11:50:00Z"}
    pod: dict[str, Any] = {"metadata": meta, "spec": {"nodeName": "node-1"}}
    for key, value in changes.items():
        where = pod["spec"] if key == "nodeName" else meta
        if value is None:
            where.pop(key, None)
        else:
            where[key] = value
    return pod


class Setup:
    """A handler on node-1 whose mount table has one (text) mount of the pod, with a
    stale volume dir; `pod` is what the pod lookup answers (an exception is raised)."""

    def __init__(self, tmp_path: Path, pod: Any) -> None:
        pods = tmp_path / "kubelet" / "pods"
        self.mount = f"{pods}/{UID}/volumes/kubernetes.io~projected/t"
        self.stale = pods / UID / "volumes" / "kubernetes.io~empty-dir" / "cache"
        self.stale.mkdir(parents=True)
        Path(self.mount).mkdir(parents=True)  # "mounted" in the text mount table only
        (tmp_path / "mountinfo").write_text(f"50 22 0:40 / {self.mount} rw - tmpfs tmpfs rw\n")
        proc = tmp_path / "proc"  # one process (no fds, no mounts) that is "self"
        (proc / "1").mkdir(parents=True)
        (proc / "self").symlink_to("1")
        self.settings = AgentSettings(
            node_name="node-1",
            kubelet_root=str(tmp_path / "kubelet"),
            host_proc=str(proc),
            mountinfo_path=str(tmp_path / "mountinfo"),
            kubelet_healthz="http://127.0.0.1:9/healthz",
            plugins_registry=str(tmp_path / "registry"),
        )
        self.patches: list[dict[str, Any]] = []
        self.lookups: list[tuple[str, str]] = []
        self.pod = pod

        def lookup(ns: str, name: str) -> Any:
            self.lookups.append((ns, name))
            if isinstance(self.pod, Exception):
                raise self.pod
            return self.pod

        self.handler = Handler(
            self.settings,
            Executor(self.settings),
            lambda ns, n, p: self.patches.append(p),
            lookup,
            clock=lambda: NOW,
        )

    def request(self, requested: datetime, dry_run: bool = True) -> list[dict[str, str]]:
        # dry-run comes from the policy in force (read from the API), not from the record
        self.handler.policies = opted_in(dry_run=dry_run)
        self.handler.handle(
            {
                "metadata": {"namespace": "shop", "name": "web-0-cccccccc", "uid": "r1"},
                "spec": {
                    "podName": "web-0",
                    "podUID": UID,
                    "nodeName": "node-1",
                    "nodeSteps": STEPS,
                    "nodeStepsRequestedAt": requested.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    "dryRun": dry_run,
                },
                "status": {},
            }
        )
        patch = self.patches[-1]
        assert patch["nodeStepsDoneAt"] >= requested.strftime("%Y-%m-%dT%H:%M:%S")
        actions: list[dict[str, str]] = patch["nodeActions"]
        return actions


# --- S1: stale and future requests -------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "why"),
    [
        (NOW - timedelta(seconds=121), "older than --max-request-age (120s)"),
        (NOW - timedelta(hours=6), "older than --max-request-age (120s)"),
        (NOW + timedelta(seconds=60), "in the future"),
    ],
)
def test_a_request_that_is_not_fresh_is_refused_step_by_step(
    tmp_path: Path, requested: datetime, why: str
) -> None:
    setup = Setup(tmp_path, _pod())
    actions = setup.request(requested, dry_run=False)
    assert [a["action"] for a in actions] == ["unmount", "rmdir-stale"]
    for action in actions:
        assert action["result"] == "refused", action
        assert (
            action["message"].startswith("spec.nodeStepsRequestedAt") and why in action["message"]
        )
    assert setup.stale.is_dir(), "a stale request removed a directory"
    assert setup.lookups == [], "the age is checked before asking the API"


def test_a_fresh_request_runs_and_the_age_limit_is_a_setting(tmp_path: Path) -> None:
    setup = Setup(tmp_path, _pod())
    fresh = setup.request(NOW - timedelta(seconds=119))
    assert [a["result"] for a in fresh] == ["dry_run", "dry_run"], fresh
    assert setup.lookups == [("shop", "web-0")]
    slightly_ahead = setup.request(NOW + timedelta(seconds=5))  # within the clock skew
    assert [a["result"] for a in slightly_ahead] == ["dry_run", "dry_run"], slightly_ahead
    setup.handler.settings = replace(setup.settings, max_request_age_s=600)
    old = setup.request(NOW - timedelta(seconds=300))
    assert [a["result"] for a in old] == ["dry_run", "dry_run"], old


# --- S2: the pod must be this Remediation's overdue Terminating pod on this node ------------


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (None, "does not exist"),
        (_pod(uid="ffffffff-0000-4000-8000-ffffffffffff"), "spec.podUID: pod 'web-0' has uid"),
        (_pod(nodeName="node-2"), "bound to 'node-2', not this node"),
        (_pod(nodeName=None), "bound to None, not this node"),
        (_pod(deletionTimestamp=None), "is not terminating"),  # e.g. ContainerCreating
        (_pod(deletionTimestamp="2026-03-01T12:00:25Z"), "still within its grace period"),
        (_pod(deletionTimestamp="soon"), "deletionTimestamp"),
        (RuntimeError("connection refused"), "cannot GET pod 'web-0'"),
    ],
)
def test_steps_for_a_pod_that_is_not_overdue_terminating_here_are_refused(
    tmp_path: Path, pod: Any, why: str
) -> None:
    setup = Setup(tmp_path, pod)
    actions = setup.request(NOW - timedelta(seconds=5), dry_run=False)
    assert [a["result"] for a in actions] == ["refused", "refused"], actions
    assert all(why in a["message"] for a in actions), actions
    assert setup.stale.is_dir()
    assert setup.lookups == [("shop", "web-0")]


def test_a_pod_name_that_is_not_a_name_is_never_looked_up(tmp_path: Path) -> None:
    setup = Setup(tmp_path, _pod())
    setup.handler.handle(
        {
            "metadata": {"namespace": "shop", "name": "r", "uid": "r2"},
            "spec": {
                "podName": "../../secrets/x",
                "podUID": UID,
                "nodeName": "node-1",
                "nodeSteps": STEPS,
                "nodeStepsRequestedAt": "2026-03-01T12:00:00Z",
            },
        }
    )
    (patch,) = setup.patches
    assert {a["result"] for a in patch["nodeActions"]} == {"refused"}
    assert "spec.podName" in patch["nodeActions"][0]["message"]
    assert setup.lookups == []


# --- S6: an incomplete holder scan is "unknown" and refuses unmount -----------------------


def test_holder_scan_of_an_unusable_proc_is_unknown(tmp_path: Path) -> None:
    mounts = parse_mountinfo("50 22 0:1048575 / /x/vol rw - tmpfs tmpfs rw\n")
    assert "cannot list" in (scan_holders(str(tmp_path / "missing"), mounts).unknown or "")
    (tmp_path / "empty").mkdir()
    assert "lists no process" in (scan_holders(str(tmp_path / "empty"), mounts).unknown or "")
    (tmp_path / "other" / "1").mkdir(parents=True)  # like the /proc of another PID namespace
    unknown = scan_holders(str(tmp_path / "other"), mounts).unknown or ""
    assert "does not show the agent's own process" in unknown and "hostPID" in unknown
    complete = scan_holders("/proc", mounts)
    assert complete.unknown is None and complete.holders == []


def test_unreadable_fds_make_the_scan_unknown(tmp_path: Path) -> None:
    """A process whose fd dir the agent may not read (no CAP_SYS_PTRACE): unknown."""
    mounts = parse_mountinfo("50 22 0:1048575 / /x/vol rw - tmpfs tmpfs rw\n")
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        script = (
            "import os, sys; sys.path[:0] = sys.argv[2:]\n"
            "from unstick.agent.holders.scan import scan_holders\n"
            "from unstick.core.model.mountinfo import parse_mountinfo\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "m = parse_mountinfo('50 22 0:1048575 / /x/vol rw - tmpfs tmpfs rw\\n')\n"
            "print(scan_holders('/proc', m).unknown)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, str(sleeper.pid), *sys.path],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "cannot read /proc/" in out and "/fd: Permission denied" in out, out
    assert scan_holders("/proc", mounts).unknown is None  # root may read them all


@pytest.mark.parametrize("lazy", [False, True])
def test_unmount_is_refused_when_no_holder_scan_can_run(tmp_path: Path, lazy: bool) -> None:
    setup = Setup(tmp_path, _pod())
    (tmp_path / "empty").mkdir()
    (tmp_path / "other" / "1").mkdir(parents=True)
    for proc in ("empty", "other"):
        ex = Executor(replace(setup.settings, host_proc=str(tmp_path / proc)))
        result = ex.run_step(UID, "unmount", "", dry_run=False, lazy_unmount=lazy)
        assert result.result == "refused", result
        # a /proc that shows nobody is blind to holders and to the pod's containers alike:
        # either check refuses first
        assert (
            "cannot tell who holds" in result.message
            or "cannot tell whether containers" in result.message
        ), result
