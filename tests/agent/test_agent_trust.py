"""The agent re-derives opt-in and the policy in force from the API (DESIGN §3 invariant 7):
a Remediation a tenant wrote — for a pod that never opted in, naming a policy that does not
serve the namespace, asking for `restart-kubelet`, claiming `dryRun: false` or
`lazyUnmount: true` — makes nothing happen but a refusal on record. Probes are gated by
the same pod check. (Here the API is callables; test_agent_envtest.py reads the real
objects from a real API server.)"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.agent.policy_sources import opted_in
from unstick.agent.authority.rederive import NodeBudget, PolicySources
from unstick.agent.handler import Handler
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor

UID = "dddddddd-4444-4444-8444-dddddddddddd"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod(annotation: str | None = None, uid: str = UID) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "web-0",
        "namespace": "team-a",
        "uid": uid,
        "deletionTimestamp": "2026-03-01T11:50:00Z",
    }
    if annotation is not None:
        meta["annotations"] = {"unstick.dev/remediate": annotation}
    return {"metadata": meta, "spec": {"nodeName": "node-1"}}


def policy(name: str, **spec: Any) -> dict[str, Any]:
    base = {
        "dryRun": False,
        "actions": ["unmount", "rmdir-stale", "restart-kubelet"],
        "rateLimits": {"clusterPerMinute": 100, "nodePerMinute": 100},
    }
    return {"metadata": {"name": name}, "spec": {**base, **spec}}


class Node:
    """A handler on node-1 with one stale volume dir of the pod and a restart-kubelet
    command that leaves a mark; the API answers from `pods`, `labels` and `policies`."""

    def __init__(self, tmp_path: Path, the_pod: dict[str, Any]) -> None:
        root = tmp_path / "kubelet"
        self.stale = root / "pods" / UID / "volumes" / "kubernetes.io~empty-dir" / "cache"
        self.stale.mkdir(parents=True)
        (tmp_path / "mountinfo").write_text("")
        proc = tmp_path / "proc"
        (proc / "1").mkdir(parents=True)
        (proc / "self").symlink_to("1")
        self.restarted = tmp_path / "restarted"
        self.settings = AgentSettings(
            node_name="node-1",
            kubelet_root=str(root),
            host_proc=str(proc),
            mountinfo_path=str(tmp_path / "mountinfo"),
            kubelet_healthz="http://127.0.0.1:9/healthz",
            plugins_registry=str(tmp_path / "registry"),
            restart_kubelet_command=("touch", str(self.restarted)),
            state_dir=str(tmp_path / "state"),
        )
        self.pod = the_pod
        self.labels: dict[str, str] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.patches: list[dict[str, Any]] = []
        self.refusals: Counter[str] = Counter()
        self.handler = Handler(
            self.settings,
            Executor(self.settings),
            lambda ns, n, p: self.patches.append(p),
            lambda ns, name: self.pod,
            policies=PolicySources(
                namespace=lambda n: {"metadata": {"name": n, "labels": self.labels}},
                policy=self.policies.get,
            ),
            budget=NodeBudget(cap=100),
            on_refusal=lambda r: self.refusals.update([str(r)]),
            clock=lambda: NOW,
        )
        self.requests = 0

    def probe(self, name: str, uid: str) -> dict[str, Any]:
        """The one patch answering a probe of web-0 (UID) asked in Remediation `name`."""
        self.handler.handle(
            {
                "metadata": {"namespace": "team-a", "name": name, "uid": uid},
                "spec": {
                    "podName": "web-0",
                    "podUID": UID,
                    "nodeName": "node-1",
                    "probeRequestedAt": stamp(NOW),
                },
                "status": {},
            }
        )
        (patch,) = self.patches
        return patch

    def steps(self, *actions: str, **spec: Any) -> list[dict[str, str]]:
        self.requests += 1
        self.handler.handle(
            {
                "metadata": {
                    "namespace": "team-a",
                    "name": "web-0-dddd",
                    "uid": f"r{self.requests}",
                },
                "spec": {
                    "podName": "web-0",
                    "podUID": UID,
                    "nodeName": "node-1",
                    "nodeSteps": [{"action": a, "target": "", "reason": "x"} for a in actions],
                    "nodeStepsRequestedAt": stamp(NOW - timedelta(seconds=2)),
                    **spec,
                },
                "status": {},
            }
        )
        result: list[dict[str, str]] = self.patches[-1]["nodeActions"]
        return result


def test_a_never_opted_in_pod_gets_no_kubelet_restart(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())
    node.policies["default"] = policy("default")
    (action,) = node.steps("restart-kubelet", dryRun=False)
    assert action["result"] == "refused" and "has not opted in" in action["message"], action
    assert not node.restarted.exists(), "the kubelet was restarted for a pod never opted in"
    assert node.refusals == {"not_opted_in": 1}
    assert "probe" not in node.patches[-1], "a refused request must not leak a probe"


def test_opted_out_by_annotation_in_an_opted_in_namespace(tmp_path: Path) -> None:
    node = Node(tmp_path, pod("false"))
    node.labels["unstick.dev/remediate"] = "true"
    node.policies["default"] = policy("default")
    (action,) = node.steps("rmdir-stale")
    assert action["result"] == "refused" and "=false" in action["message"]
    assert node.stale.is_dir()


def test_a_policy_that_does_not_serve_the_namespace_is_not_honoured(tmp_path: Path) -> None:
    node = Node(tmp_path, pod("fast"))
    node.policies["fast"] = policy("fast", namespaceSelector={"matchLabels": {"team": "b"}})
    (action,) = node.steps("rmdir-stale")
    assert action["result"] == "refused", action
    assert "does not serve namespace 'team-a'" in action["message"]
    assert node.stale.is_dir()
    assert node.refusals == {"policy_forbids": 1}
    node.labels["team"] = "b"  # the admin scopes it to this namespace: now it is honoured
    (action,) = node.steps("rmdir-stale")
    assert action["result"] == "succeeded", action
    assert not node.stale.exists()


def test_a_missing_or_invalid_policy_is_a_refusal(tmp_path: Path) -> None:
    node = Node(tmp_path, pod("nope"))
    (action,) = node.steps("rmdir-stale")
    assert "'nope' cannot be used: it does not exist" in action["message"]
    node.pod = pod("bad")
    node.policies["bad"] = policy("bad", actions=["launch-missiles"])
    (action,) = node.steps("rmdir-stale")
    assert action["result"] == "refused" and "spec.actions[0]" in action["message"], action
    assert node.stale.is_dir()


def test_an_action_the_policy_does_not_permit_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, pod("true"))
    node.policies["default"] = policy("default", actions=["unmount", "rmdir-stale"])
    actions = node.steps("rmdir-stale", "restart-kubelet")
    assert [a["result"] for a in actions] == ["refused", "refused"], actions
    assert "does not permit restart-kubelet" in actions[0]["message"]
    assert node.stale.is_dir() and not node.restarted.exists()
    assert node.refusals == {"policy_forbids": 1}, "one request refused, counted once"


def test_dry_run_is_the_policys_not_the_records(tmp_path: Path) -> None:
    node = Node(tmp_path, pod("true"))
    node.policies["default"] = policy("default", dryRun=True)
    (action,) = node.steps("rmdir-stale", dryRun=False)
    assert action["result"] == "dry_run", action
    assert node.stale.is_dir()
    assert node.refusals == {"dry_run": 1}


def test_the_nodes_budget_holds_whatever_the_records_say(tmp_path: Path) -> None:
    node = Node(tmp_path, pod("true"))
    node.policies["default"] = policy("default", rateLimits={"nodePerMinute": 2})
    results = [node.steps("restart-kubelet")[0]["result"] for _ in range(3)]
    # the first restart runs; the second is refused by the hourly rule; the third by the budget
    assert results[0] == "succeeded" and results[2] == "refused", results
    assert "rate limit" in node.patches[-1]["nodeActions"][0]["message"]


def test_probe_of_a_pod_that_is_not_named_is_refused_and_nothing_leaks(tmp_path: Path) -> None:
    """A tenant's Remediation asking to probe another UID on the node: no probe (which
    would list that pod's mounts, holders and containers), a refusal on record."""
    node = Node(tmp_path, pod("true", uid="eeeeeeee-5555-4555-8555-eeeeeeeeeeee"))
    patch = node.probe("spy", "r-spy")
    assert "probe" not in patch
    (refusal,) = patch["nodeRefusals"]
    assert refusal["action"] == "probe" and refusal["reason"] == "forged", refusal
    assert "spec.podUID" in refusal["message"]
    assert node.refusals == {"forged": 1}


def test_probe_of_the_named_overdue_pod_is_served(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())  # probes need no opt-in: observed pods are diagnosed too
    patch = node.probe("web-0-dddd", "r-ok")
    assert patch["probe"]["nodeName"] == "node-1"


def test_opted_in_helper_is_what_the_other_tests_assume(tmp_path: Path) -> None:
    node = Node(tmp_path, pod())
    node.handler.policies = opted_in()
    (action,) = node.steps("rmdir-stale")
    assert action["result"] == "succeeded", action
