"""Crash safety of node incidents (issue #21, design.md §3 invariants 6 and 10), on the real
API server with the real controller process, SIGKILLed again and again.

Two deleted nodes hold 7 opted-in pods each; the policy allows 5 force-deletes per node
and 9 in the cluster per minute, so the pods need two windows of the budget. The
controller is started over and over, and each incarnation is SIGKILLed — by itself, at a
named fail point (controller/failpoints.py) the Nth time it gets there, or by the test
when it does not get there in time — before the intent is on record, between the intent
and the DELETE, between the DELETE and its result, before and after a record's write,
while the writer backs off from a failed write, and right after adopting the dead
incarnation's records. After every kill, from the audit log and the records:

- no pod is deleted twice;
- no 60 s window holds more successful DELETEs than the node or cluster limit;
- no pod is listed by two records, and every pod deleted has exactly one entry with a
  result (an intent counts);

and at the end, after a last incarnation that is not killed: every pod is gone, every
entry has its final result and no record stays `Remediating`.

A DELETE on its way when its process is killed may be logged by the API server with 500
(the request's context cancelled): it removed the pod only if the pod is gone with no
other DELETE answered 200 (`_acted`); otherwise the pod is still there, either never
force-deleted (the next controller withdraws that intent and gives its grant back) or
half deleted — the API server wrote `deletionGracePeriodSeconds: 0` but did not remove
it — and the next controller keeps the grant and deletes it again
(test_incident_half_deleted.py).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.audit_log import AuditTail, Match, object_ref, received_at, status_code
from tests.support.controller import (
    USER_AGENT_PREFIX,
    Controller,
    Objects,
    policy_spec,
)
from unstick.controller.acting.budget_rebuild import ACT_WITHIN_S

pytestmark = pytest.mark.envtest

NODE_LIMIT, CLUSTER_LIMIT, PER_NODE = 5, 9, 7
ENV = "UNSTICK_TEST_FAILPOINTS"
# The incarnations, in order: the first acts until a pod has to wait for the budget (its
# window is full, DELETEs may be in flight); the next ones die around the DELETEs that
# the budget still allows ...
FIRST_WAVE = [
    "incident-rate-limited=kill@1",
    "incident-deleted=kill@1",
    "incident-intent-durable=kill@1",
    "incident-before-intent=kill@1",
]
# ... then while the pods left wait for the budget (each reached right after a start);
# the last one lives through the wait and dies at the first intent once there is room ...
WAITING = [
    "incidents-adopted=kill@1",
    "incident-write=kill@1",
    "incident-written=kill@1",
    "incident-write=fail@1,incident-backoff=kill@1",
    "incident-rate-limited=kill@2",
    "incidents-adopted=kill@1",
    "incident-write=kill@2",
    "incident-written=kill@2",
    "incident-write=fail@2,incident-backoff=kill@1",
    "incident-before-intent=kill@1",
]
# ... and once the budget has room again.
SECOND_WAVE = [
    "incident-intent-durable=kill@1",
    "incident-write=fail@1,incident-backoff=kill@1",
    "incident-deleted=kill@1",
    "incident-written=kill@2",
    "incidents-adopted=kill@1",
    "incident-rate-limited=kill@1",
]
PHASES = {
    "incident-before-intent",
    "incident-intent-durable",
    "incident-deleted",
    "incident-backoff",
    "incident-write",
    "incident-written",
    "incident-rate-limited",
    "incidents-adopted",
}
WINDOW_S = 60.0


POLICIES = {
    "default": policy_spec(
        rateLimits={"clusterPerMinute": CLUSTER_LIMIT, "nodePerMinute": NODE_LIMIT}
    )
}


class Audit:
    """The controller's pod DELETEs in one namespace, read from the audit log as it grows."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        match = Match(by=USER_AGENT_PREFIX, verbs={"delete"}, resource="pods", namespace=namespace)
        self.tail = AuditTail(cp.audit_log, match)

    def read(self) -> list[tuple[float, str, int]]:
        """(time, pod, code) of each DELETE so far."""
        return [
            (received_at(e), str(object_ref(e).get("name")), status_code(e))
            for e in self.tail.read()
        ]


def _most_in_a_window(times: list[float]) -> int:
    times = sorted(times)
    return max((sum(1 for u in times if t <= u < t + WINDOW_S) for t in times), default=0)


def _incidents(objects: Objects, namespace: str) -> list[dict[str, Any]]:
    found = objects.custom.list_namespaced_custom_object(
        "unstick.dev", "v1alpha1", namespace, "remediations"
    )
    return [r for r in found.get("items") or [] if (r.get("spec") or {}).get("incident")]


def _entries(objects: Objects, namespace: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(record, entry) of every pod listed in a node incident of the namespace."""
    return [
        (rem, entry)
        for rem in _incidents(objects, namespace)
        for entry in (rem.get("status") or {}).get("pods") or []
    ]


REFUSED = (404, 409, 422)  # a DELETE the API server refused: it did nothing


def _acted(objects: Objects, namespace: str, deletes: list[Any]) -> list[tuple[float, str]]:
    """The DELETEs that removed a pod: answered 200, or — sent by a process killed while it
    was on its way, so answered with an error that is no refusal — the last one of a pod
    that is gone with no DELETE answered 200 (nothing else deletes these pods)."""
    ok = {pod for _, pod, code in deletes if code == 200}
    last: dict[str, float] = {}
    for at, pod, code in deletes:
        if code not in REFUSED and code != 200 and pod not in ok:
            last[pod] = at
    gone = {pod: at for pod, at in last.items() if objects.read_pod(namespace, pod) is None}
    return [(at, pod) for at, pod, code in deletes if code == 200] + [
        (at, pod) for pod, at in gone.items()
    ]


def _check(objects: Objects, namespace: str, audit: Audit, node_of: dict[str, str]) -> set[str]:
    """The invariants that hold after any kill; returns the pods a DELETE removed."""
    deletes = audit.read()
    acted = _acted(objects, namespace, deletes)
    removed = [pod for _, pod in acted]
    assert len(removed) == len(set(removed)), f"a pod deleted twice: {deletes}"
    assert _most_in_a_window([at for at, _ in acted]) <= CLUSTER_LIMIT, deletes
    for node in set(node_of.values()):
        on_node = [at for at, pod in acted if node_of[pod] == node]
        assert _most_in_a_window(on_node) <= NODE_LIMIT, (node, deletes)
    entries = _entries(objects, namespace)
    listed = [e.get("uid") for _, e in entries]
    assert len(listed) == len(set(listed)), f"a pod in two records: {sorted(listed)}"
    for pod in removed:
        with_result = [e for _, e in entries if e.get("name") == pod and e.get("result")]
        assert len(with_result) == 1, (pod, with_result, [d for d in deletes if d[1] == pod])
    return set(removed)


class Incarnation(Controller):
    """One run of the controller, that may be killed at a fail point while it starts."""

    def start(self) -> Incarnation:
        try:
            super().start()
        except AssertionError:
            if "fail point" not in self.log():
                raise
        return self

    def end(self, timeout: float) -> str:
        """Wait for its fail point; SIGKILL it when not reached in time. What killed it."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None
            return "test"
        code, self.proc = self.proc.returncode, None
        assert code == -signal.SIGKILL, (code, self.log()[-3000:])
        line = next(x for x in self.log().splitlines() if x.startswith("fail point "))
        return line.split()[2]


def test_a_controller_killed_at_any_point_loses_no_record_and_breaks_no_budget(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    audit = Audit(control_plane, namespace)
    audit.read()  # from here on
    node_of: dict[str, str] = {}
    for _ in range(2):
        node = make_node(kubelet=False)
        for _ in range(PER_NODE):
            node_of[objects.pod(namespace, node, remediate="true")["name"]] = node
        objects.core.delete_node(node)
    for pod in node_of:
        objects.core.delete_namespaced_pod(pod, namespace)

    killed: list[str] = []
    running: Incarnation | None = None

    def run(rule: str, timeout: float) -> None:
        nonlocal running
        n = len(killed)
        running = Incarnation(control_plane, tmp_path / f"ctl-{n}.log", env={ENV: rule})
        running.start()
        killed.append(running.end(timeout))
        running = None
        deleted = _check(objects, namespace, audit, node_of)
        print(f"incarnation {n}: {rule} → killed at {killed[-1]}; {len(deleted)} pods deleted")

    try:
        for rule in FIRST_WAVE + WAITING + SECOND_WAVE:
            run(rule, timeout=90 if rule == WAITING[-1] else 10)
        assert len(killed) >= 20 and set(killed) >= PHASES, killed

        last = Incarnation(control_plane, tmp_path / "last.log")
        running = last.start()

        def settled() -> bool:
            entries = _entries(objects, namespace)
            return (
                all(objects.read_pod(namespace, p) is None for p in node_of)
                and {e.get("name") for _, e in entries} >= set(node_of)
                and all(e.get("goneAt") for _, e in entries)
                and all(
                    (r.get("status") or {}).get("phase") == "Resolved"
                    for r in _incidents(objects, namespace)
                )
            )

        # Two budget windows (60 s + ACT_WITHIN_S each). The grants the last incarnation
        # rebuilds are all gone after one (a grant recorded at T counts until T + 65 s);
        # a node with 6 or 7 pods left takes a second one (5 per node per minute). A
        # fresh-clone run at 4d35e05 did not settle in 120 s (the wait was 240 s since);
        # the cause found: a DELETE in flight when an incarnation is killed can leave its
        # pod half deleted (deletionGracePeriodSeconds 0, still there), and no later
        # incarnation looked at such a pod again (test_incident_half_deleted.py).
        wait_until(
            settled,
            timeout=2 * (WINDOW_S + ACT_WITHIN_S),
            what="every pod gone and every record Resolved",
        )
        assert _check(objects, namespace, audit, node_of) == set(node_of)
        print("DELETE answers:", sorted(code for _, _, code in audit.read()))
        for _, entry in _entries(objects, namespace):
            assert entry.get("action") == "force-delete", entry
            assert entry.get("result") in ("succeeded", "gone"), entry
    finally:
        if running is not None:
            running.stop()
            print(running.log()[-3000:])
        print("kills:", killed)
