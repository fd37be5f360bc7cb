"""The agent's node budget survives an agent restart, even mid-batch (#21).

The real `unstick agent` process against a real API server, with the pods, the namespace
and a RemediationPolicy (`nodePerMinute: 2`) as real objects. The first agent takes a grant
for a batch (`restart-kubelet`, whose command is a long `sleep`: the batch is running) and is
SIGKILLed mid-batch, before it could write anything back. A new agent on the same state dir
handles that request again (a second grant) and then a request for another pod's stale
volume directory: within the same minute that would be a third batch on the node, so it is
refused with the rate limit on record, and the directory stays. An agent that kept its
budget in memory only would have run it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until

pytestmark = pytest.mark.envtest

CRDS = Path(__file__).parents[2] / "operator" / "unstick" / "crds"
HOLD = "unstick.dev/test-hold"  # keeps the pods Terminating (no kubelet here)
JSON = dict[str, Any]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sleeping(marker: str) -> bool:
    """A process `sleep <marker>` runs (the batch's restart-kubelet command)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", marker.encode()]:
            return True
    return False


class AgentProcess:
    """`unstick agent` in its own process group (it and its children are killed by id)."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()


def held_pod(name: str, node: str, policy: str) -> JSON:
    """A pod on `node` opted in under `policy`, kept by the test finalizer once deleted."""
    return {
        "metadata": {"name": name, "finalizers": [HOLD],
                     "annotations": {"unstick.dev/remediate": policy}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]},
    }  # fmt: skip


def agent_argv(cp: ControlPlane, world: JSON, marker: str) -> list[str]:
    """`unstick agent` on the world's node: its kubelet root, mount table and state dir in
    the test's tmp dir, a restart-kubelet command that is a long `sleep <marker>`."""
    tmp = world["tmp"]
    return [
        sys.executable, "-m", "unstick", "agent",
        "--node-name", world["node"], "--kubelet-root", str(tmp / "kubelet"),
        "--host-proc", "/proc", "--mountinfo", str(tmp / "mountinfo"),
        "--kubeconfig", str(cp.kubeconfig),
        "--metrics-port", str(_free_port()), "--metrics-address", "127.0.0.1",
        "--kubelet-healthz", "http://127.0.0.1:9/healthz", "--state-dir", str(tmp / "state"),
        "--restart-kubelet-command", f"sleep {marker}",
    ]  # fmt: skip


@pytest.fixture
def world(control_plane: ControlPlane, tmp_path: Path) -> Iterator[JSON]:
    cp = control_plane
    cp.install_crds(CRDS)
    suffix = uuid.uuid4().hex[:6]
    ns, node, policy = f"budget-{suffix}", f"budget-node-{suffix}", f"budget-{suffix}"
    cp.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    try:
        cp.request(
            "POST",
            "/apis/unstick.dev/v1alpha1/remediationpolicies",
            {"apiVersion": "unstick.dev/v1alpha1", "kind": "RemediationPolicy",
             "metadata": {"name": policy},
             "spec": {"dryRun": False, "actions": ["observe", "rmdir-stale", "restart-kubelet"],
                      "slackSeconds": 0,
                      "rateLimits": {"clusterPerMinute": 100, "nodePerMinute": 2},
                      "namespaceSelector": {
                          "matchLabels": {"kubernetes.io/metadata.name": ns}}}},
        )  # fmt: skip
        uids = {}
        for name in ("web-0", "web-1"):
            body = held_pod(name, node, policy)
            pod = cp.request("POST", f"/api/v1/namespaces/{ns}/pods", body)
            uids[name] = pod["metadata"]["uid"]
            cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
        yield {"ns": ns, "node": node, "uids": uids, "tmp": tmp_path, "policy": policy}
    finally:
        cp.kubectl("delete", "remediations", "--all", "-n", ns, check=False)
        for name in ("web-0", "web-1"):
            cp.kubectl("patch", "pod", name, "-n", ns, "--type=merge",
                       "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        cp.kubectl("delete", "remediationpolicy", policy, "--ignore-not-found", check=False)
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _remediation(cp: ControlPlane, w: JSON, pod: str, action: str) -> str:
    uid = w["uids"][pod]
    body = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Remediation",
        "metadata": {"name": f"{pod}-{uid[:8]}", "labels": {"unstick.dev/node": w["node"]}},
        "spec": {"podName": pod, "podUID": uid, "nodeName": w["node"],
                 "nodeSteps": [{"action": action, "target": ""}],
                 "nodeStepsRequestedAt": now()},
    }  # fmt: skip
    path = f"/apis/unstick.dev/v1alpha1/namespaces/{w['ns']}/remediations"
    created = cp.request("POST", path, body)
    return f"{path}/{created['metadata']['name']}"


def _answered(cp: ControlPlane, path: str) -> JSON | None:
    status = cp.request("GET", path).get("status") or {}
    return status if status.get("nodeStepsDoneAt") else None


def test_the_node_budget_holds_across_an_agent_killed_mid_batch(
    control_plane: ControlPlane, world: JSON
) -> None:
    cp, tmp = control_plane, world["tmp"]
    root = tmp / "kubelet"
    stale = root / "pods" / world["uids"]["web-1"] / "volumes" / "kubernetes.io~empty-dir" / "c"
    stale.mkdir(parents=True)
    (tmp / "mountinfo").write_text("")
    marker = f"{86000 + uuid.uuid4().int % 399}"
    argv = agent_argv(cp, world, marker)
    first = AgentProcess(argv, tmp / "agent.log")
    try:
        batch = _remediation(cp, world, "web-0", "restart-kubelet")
        wait_until(lambda: _sleeping(marker), timeout=60, what="the first agent's batch to run")
    finally:
        first.kill()  # SIGKILL mid-batch: nothing written back
    assert _answered(cp, batch) is None

    second = AgentProcess(argv, tmp / "agent.log")
    try:
        # the restarted agent answers the request the first one died in (grant 2 of 2) ...
        wait_until(lambda: _answered(cp, batch), timeout=60, what="the batch answered")
        # ... and refuses a third batch on the node within the minute
        third = _remediation(cp, world, "web-1", "rmdir-stale")
        status = wait_until(lambda: _answered(cp, third), timeout=60, what="the third batch")
    finally:
        second.kill()
    (action,) = status["nodeActions"]
    assert action["action"] == "rmdir-stale" and action["result"] == "refused", action
    assert "rate limit: this node's budget (2 per minute" in action["message"], action
    (whole,) = [r for r in status["nodeRefusals"] if r["action"] == "node-steps"]
    assert whole["reason"] == "policy_forbids" and 1 <= whole["retryAfterSeconds"] <= 60, whole
    assert stale.is_dir()  # not run


# --- the same on one round trip (design.md §11): the agent plans, records, then acts -------


def _mandate(cp: ControlPlane, w: JSON, pod: str, actions: list[str]) -> str:
    """The pod's Remediation created with a mandate (as a controller with
    --node-round-trip creates it), or its mandate asked again; its path."""
    uid = w["uids"][pod]
    policy = cp.request("GET", f"/apis/unstick.dev/v1alpha1/remediationpolicies/{w['policy']}")
    spec = {
        "mandate": {"podUID": uid, "nodeName": w["node"], "actions": actions,
                    "policy": w["policy"],
                    "policyResourceVersion": policy["metadata"]["resourceVersion"],
                    "dryRun": False, "slots": 1},
        "nodeStepsRequestedAt": now(),
    }  # fmt: skip
    path = f"/apis/unstick.dev/v1alpha1/namespaces/{w['ns']}/remediations"
    name = f"{pod}-{uid[:8]}"
    if cp.request("GET", f"{path}?fieldSelector=metadata.name={name}")["items"]:
        cp.kubectl("patch", "remediation", name, "-n", w["ns"], "--type=merge",
                   "-p", json.dumps({"spec": spec}))  # fmt: skip
        return f"{path}/{name}"
    body = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Remediation",
        "metadata": {"name": name, "labels": {"unstick.dev/node": w["node"]}},
        "spec": {"podName": pod, "podUID": uid, "nodeName": w["node"], **spec},
    }
    cp.request("POST", path, body)
    return f"{path}/{name}"


def _answer_of(cp: ControlPlane, path: str) -> JSON | None:
    """The status once it answers the current request (nodeStepsDoneAt at or after it)."""
    rem = cp.request("GET", path)
    status = rem.get("status") or {}
    done = status.get("nodeStepsDoneAt")
    return status if done and done >= rem["spec"]["nodeStepsRequestedAt"] else None


@contextmanager
def terminating(cp: ControlPlane, w: JSON, *names: str) -> Iterator[None]:
    """More pods of the world, deleted with a grace period of 1 s (the test finalizer
    keeps them; no kubelet here): overdue once it passed, and not FinalizerBlocked (a final
    delete, grace 0, held only by finalizers, as the fixture's pods are) — so the agent's
    own diagnosis looks at the node. Their finalizers are removed at the end."""
    pods = f"/api/v1/namespaces/{w['ns']}/pods"
    try:
        for name in names:
            body = held_pod(name, w["node"], w["policy"])
            w["uids"][name] = cp.request("POST", pods, body)["metadata"]["uid"]
            cp.request("DELETE", f"{pods}/{name}", {"gracePeriodSeconds": 1})
        for name in names:
            wait_until(lambda n=name: _overdue(cp.request("GET", f"{pods}/{n}")), timeout=30,
                       what=f"{name}'s grace period over")  # fmt: skip
        yield
    finally:
        for name in names:
            cp.kubectl("patch", "pod", name, "-n", w["ns"], "--type=merge",
                       "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip


def _overdue(pod: JSON) -> bool:
    deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
    return bool(deleted) and datetime.now(UTC) > datetime.fromisoformat(deleted)


def test_a_mandate_killed_mid_act_is_settled_by_looking_and_the_budget_holds(
    control_plane: ControlPlane, world: JSON
) -> None:
    """The agent plans restart-kubelet itself (its probe sees nothing of rt-0 left:
    KubeletNotProgressing), puts probe and plan on record, and is SIGKILLed while the
    restart runs: a plan without results. The restarted agent never runs that plan again:
    it settles it by looking (its fresh probe still calls for the restart: `failed`, saying
    so). Its node budget (nodePerMinute 2) still holds the first agent's grant: rt-1's
    rmdir-stale takes the second, and rt-0 asked again within the minute is refused."""
    cp, tmp = control_plane, world["tmp"]
    with terminating(cp, world, "rt-0", "rt-1"):
        root = tmp / "kubelet"
        stale = root / "pods" / world["uids"]["rt-1"] / "volumes" / "kubernetes.io~empty-dir"
        stale.mkdir(parents=True)
        _killed_mid_act_then_settled(cp, world, stale)


def _killed_mid_act_then_settled(cp: ControlPlane, world: JSON, stale: Path) -> None:
    tmp = world["tmp"]
    (tmp / "mountinfo").write_text("")
    marker = f"{86000 + uuid.uuid4().int % 399}"
    argv = agent_argv(cp, world, marker)
    actions = ["rmdir-stale", "restart-kubelet"]
    first = AgentProcess(argv, tmp / "agent.log")
    try:
        batch = _mandate(cp, world, "rt-0", actions)
        wait_until(lambda: _sleeping(marker), timeout=60, what="the first agent's restart to run")
    finally:
        first.kill()  # SIGKILL mid-act: the plan is on record, its result is not
    status = cp.request("GET", batch)["status"]
    assert status["nodePlan"]["cause"] == "KubeletNotProgressing", status["nodePlan"]
    assert [s["action"] for s in status["nodePlan"]["steps"]] == ["restart-kubelet"]
    assert "nodeStepsDoneAt" not in status

    second = AgentProcess(argv, tmp / "agent.log")
    try:
        settled = wait_until(lambda: _answer_of(cp, batch), timeout=60, what="rt-0 settled")
        assert not _sleeping(marker)  # settled by looking, never run again
        (restart,) = settled["nodeActions"]
        assert restart["result"] == "failed" and "settled by looking" in restart["message"]
        other = _mandate(cp, world, "rt-1", actions)
        done = wait_until(lambda: _answer_of(cp, other), timeout=60, what="rt-1 answered")
        assert {a["result"] for a in done["nodeActions"]} == {"succeeded"}, done
        again = _mandate(cp, world, "rt-0", actions)
        refused = wait_until(lambda: _answer_of(cp, again), timeout=60, what="rt-0 again")
    finally:
        second.kill()
    (action,) = refused["nodeActions"]
    assert action["action"] == "restart-kubelet" and action["result"] == "refused", action
    assert "rate limit: this node's budget (2 per minute)" in action["message"], action
    assert not stale.exists()
