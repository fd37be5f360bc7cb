"""The node step `thaw` end to end at the agent, against a real kube-apiserver (the CRDs as
shipped) and a real cgroup v1 freezer cgroup named like a container of the pod (issue #25):
the agent's probe reports the frozen cgroup in the Remediation's status (the CRD keeps
`frozenCgroups`), a thaw the policy does not permit is refused and nothing is thawed, and
once the default policy lists `thaw` the agent thaws exactly that cgroup and reports it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.process import wait_until
from tests.agent.policy_sources import default_policy
from tests.agent.test_agent_end_to_end import (
    POLICIES,
    _deleted_at,
    held_pod,
    node_steps_done,
    now,
    status_of,
)
from tests.support.agent import agent_running, node_under, watching
from tests.support.remediations import remediation
from unstick.kube.client import Kube, remediation_path

pytestmark = [pytest.mark.envtest, pytest.mark.mountns]

FREEZER = Path("/sys/fs/cgroup/freezer")


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


@pytest.fixture
def frozen_for() -> Iterator[Any]:
    """`frozen_for(uid)`: a real process in a frozen v1 freezer cgroup named like a
    container of pod `uid`; thawed, killed and removed at the end."""
    if not os.access(FREEZER, os.W_OK):
        pytest.skip("needs a writable cgroup v1 freezer")
    made: list[tuple[Path, Path, subprocess.Popen[bytes]]] = []

    def make(uid: str) -> Path:
        top = FREEZER / f"unstick-test-{uuid.uuid4().hex[:8]}"
        cgroup = top / "kubepods" / f"pod{uid}" / "cri-containerd-c0ffee.scope"
        cgroup.mkdir(parents=True)
        proc = subprocess.Popen(["sleep", "600"])
        made.append((top, cgroup, proc))
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
        (cgroup / "freezer.state").write_text("FROZEN")
        wait_until(
            lambda: (cgroup / "freezer.state").read_text().strip() == "FROZEN",
            timeout=60,
            what="FROZEN",
        )
        return cgroup

    try:
        yield make
    finally:
        for top, cgroup, proc in made:
            (cgroup / "freezer.state").write_text("THAWED")
            proc.kill()
            proc.wait()
            wait_until(lambda c=cgroup: not _procs(c), timeout=60, what="the test cgroup empty")
            for path in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
                if path.is_dir():
                    path.rmdir()
            top.rmdir()


def test_the_agent_thaws_only_when_the_policy_lists_thaw(
    control_plane: Any, kube: Kube, tmp_path: Path, frozen_for: Any
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    ns = f"thaw-{uuid.uuid4().hex[:6]}"
    kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"metadata": {"name": ns, "labels": {"unstick.dev/remediate": "true"}}},
    )
    uid = held_pod(kube, ns, node)
    pod_path = f"/api/v1/namespaces/{ns}/pods/web-0"
    cgroup = frozen_for(uid)
    target = "/" + str(cgroup.relative_to(FREEZER))
    settings = node_under(tmp_path, node, pods=(uid,))
    loop = watching(control_plane.kubeconfig, summary_interval_s=0.5)
    try:
        with agent_running(settings, loop):
            kube.request("DELETE", pod_path, body={"gracePeriodSeconds": 0})
            wait_until(
                lambda: _deleted_at(kube, pod_path), timeout=60, what="the pod's deletionTimestamp"
            )
            body = remediation("web-0", uid, node, probeRequestedAt=now())
            kube.request("POST", remediation_path(ns), body=body)

            def status() -> dict[str, Any]:
                return status_of(kube, ns, "web-0")

            probe = wait_until(lambda: status().get("probe"), timeout=60, what="the probe")
            assert probe["frozenCgroups"] == [
                {
                    "path": target,
                    "state": "FROZEN",
                    "version": "v1",
                    "container": "c0ffee",
                    "selfFrozen": True,
                }
            ]

            def request_thaw() -> dict[str, Any]:
                step = {"action": "thaw", "target": target, "reason": "test"}
                return node_steps_done(kube, ns, "web-0", [step])

            with default_policy(kube, ["unmount"]):
                (refused,) = request_thaw()["nodeActions"]
                assert refused["result"] == "refused", refused
                assert (cgroup / "freezer.state").read_text().strip() == "FROZEN"
                kube.request(
                    "PATCH",
                    f"{POLICIES}/default",
                    body={"spec": {"actions": ["thaw"]}},
                    content_type="application/merge-patch+json",
                )
                done = request_thaw()
            (action,) = done["nodeActions"]
            assert action["action"] == "thaw" and action["result"] == "succeeded", action
            assert (cgroup / "freezer.state").read_text().strip() == "THAWED"
            assert done["probe"]["frozenCgroups"] == []
    finally:
        kube.request("PATCH", pod_path, body={"metadata": {"finalizers": None}},
                     content_type="application/merge-patch+json")  # fmt: skip
        kube.request("DELETE", f"/api/v1/namespaces/{ns}")
