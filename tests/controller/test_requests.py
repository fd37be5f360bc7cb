"""What a stuck pod's record costs in API requests, and why the cheaper way is safe (issue
23, the controller side), on a real API server (audit log).

- The real controller (a subprocess, its Remediation watch feeding its copies) plays a
  pod through its Remediation while the test plays the agent: the probe is asked in the
  record's create (no spec PATCH before it), the pod's Remediation is never read with a
  GET, and from the agent's probe to the node-steps request the controller makes exactly
  one request — the request itself.
- The pod's Event says its diagnosis: none says "Unknown" while the probe is awaited; it
  comes when the probe answers (its cause), or when the wait ends without one (Unknown).
- A pass that decides from a copy older than the record (the agent wrote meanwhile) writes
  nothing from it: its write carries the copy's resourceVersion, the API server answers
  409, and the pass decides again from a fresh read (in-process reconciler, so the copy
  is held back from the watch on purpose); the node-steps slot goes back to the budget.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.audit_log import object_ref, requests, status_code
from tests.support.controller import (
    USER_AGENT_PREFIX,
    Controller,
    Objects,
    agent_probe,
    policies_in_place,
    policy_spec,
    write_as_agent,
)
from tests.support.reconciler import InProcess, overdue_record
from unstick.core.remediation import remediation_name
from unstick.kube.client import Kube

pytestmark = pytest.mark.envtest

POLICY = "t-requests"
QUICK = "t-requests-quick"  # the agent never answers: the probe's wait ends in 2 s
#: From the agent's probe to the node-steps request: the request itself, nothing else
#: (before issue 23's controller work: a GET of the Remediation first).
PROBE_TO_STEPS_REQUESTS = 1


def _stale_dir(uid: str, name: str) -> str:
    return f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/{name}"


def _record_requests(cp: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    """The controller's audited requests on Remediation `name`, oldest first."""
    return requests(
        cp,
        by=USER_AGENT_PREFIX,
        resource="remediations",
        namespace=namespace,
        name=name,
        oldest_first=True,
    )


def _kind(event: dict[str, Any]) -> str:
    sub = object_ref(event).get("subresource")
    return f"{event.get('verb')}{'/' + sub if sub else ''} {status_code(event)}"


POLICIES = {
    POLICY: policy_spec(probeMaxAgeSeconds=60),
    QUICK: policy_spec(probeMaxAgeSeconds=2),
}
# The old flow on purpose, run with --no-node-round-trip: its probe request and the
# controller's spec.nodeSteps (what an agent of the previous release answers; supported
# for one more release, docs/upgrading.md). The round trip's writes: test_lean_record.py.
CONTROLLER_ARGS = ("--no-node-round-trip",)


def test_from_the_probe_to_the_node_steps_request_the_controller_makes_one_request(
    control_plane: ControlPlane,
    controller: Controller,
    objects: Objects,
    namespace: str,
    make_node: Any,
) -> None:
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    rem = objects.remediation_when(
        namespace, pod, timeout=60, what="a probe request", phase="WaitingForAgent"
    )
    name = rem["metadata"]["name"]
    assert rem["spec"].get("probeRequestedAt")
    # The probe was asked in the create: a POST, then the status — no spec PATCH.
    assert [_kind(e) for e in _record_requests(control_plane, namespace, name)] == [
        "create 201",
        "patch/status 200",
    ]

    stale = _stale_dir(pod["uid"], "cache")
    answered = len(_record_requests(control_plane, namespace, name))
    write_as_agent(
        objects,
        namespace,
        rem,
        {"probe": agent_probe(node, [{"path": stale, "empty": True}], pod["uid"])},
    )
    objects.remediation_when(
        namespace, pod, timeout=30, what="node steps for the agent", spec_has="nodeSteps"
    )
    after = _record_requests(control_plane, namespace, name)[answered:]
    requested = next(i for i, e in enumerate(after) if _kind(e) == "patch 200")
    assert len(after[: requested + 1]) == PROBE_TO_STEPS_REQUESTS, [_kind(e) for e in after]

    # The pod goes (its kubelet's final delete, played here): Resolved, still no GET.
    objects.core.delete_namespaced_pod(pod["name"], namespace, grace_period_seconds=0)
    objects.remediation_when(namespace, pod, timeout=30, what="Resolved", phase="Resolved")
    kinds = [_kind(e) for e in _record_requests(control_plane, namespace, name)]
    assert not [k for k in kinds if k.startswith("get")], kinds
    assert not [k for k in kinds if not k.endswith(" 200") and not k.endswith(" 201")], kinds


def _reasons(objects: Objects, namespace: str, pod: dict[str, Any]) -> list[str]:
    found = objects.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod['name']}"
    )
    return sorted(str(e.reason) for e in found.items)


def test_the_event_says_the_probes_cause_not_unknown_while_the_probe_is_awaited(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node = objects.ready_node(make_node)
    answered = objects.pod(namespace, node, remediate=POLICY)
    silent = objects.pod(namespace, node, remediate=QUICK)
    for pod in (answered, silent):
        objects.core.delete_namespaced_pod(pod["name"], namespace)
    rem = objects.remediation_when(
        namespace, answered, timeout=60, what="a probe request", phase="WaitingForAgent"
    )
    stale = _stale_dir(answered["uid"], "cache")
    write_as_agent(
        objects,
        namespace,
        rem,
        {"probe": agent_probe(node, [{"path": stale, "empty": True}], answered["uid"])},
    )
    wait_until(
        lambda: _reasons(objects, namespace, answered) == ["StuckStaleVolumeDirs"],
        timeout=30,
        what="the Event of the probe's diagnosis",
    )
    # no probe for the other pod: once its wait ended (Observing), its Event says Unknown
    objects.remediation_when(
        namespace, silent, timeout=60, what="the wait for a probe to end", phase="Observing"
    )
    wait_until(
        lambda: _reasons(objects, namespace, silent) == ["StuckUnknown"],
        timeout=30,
        what="the Event",
    )
    assert _reasons(objects, namespace, answered) == ["StuckStaleVolumeDirs"]


# --- a copy older than the record: the write is refused, the pass decides again -------------


@pytest.fixture
def in_process(control_plane: ControlPlane, kube: Kube) -> Iterator[tuple[InProcess, Objects]]:
    """The reconciler in this process: no Remediation watch, so the test decides which
    versions of the record its copies hold."""
    with policies_in_place(control_plane, {}) as objects:
        # the old flow too (CONTROLLER_ARGS): a probe request, then spec.nodeSteps
        ctl = InProcess(
            kube, round_trip=False, rateLimits={"clusterPerMinute": 10, "nodePerMinute": 2}
        )
        try:
            yield ctl, objects
        finally:
            ctl.close()


def test_a_pass_deciding_from_an_older_copy_writes_nothing_and_decides_again(
    control_plane: ControlPlane,
    kube: Kube,
    in_process: tuple[InProcess, Objects],
    namespace: str,
    make_node: Any,
) -> None:
    ctl, objects = in_process
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate="true")  # no kubelet: it stays
    reconciler = ctl.reconciler
    record = overdue_record(kube, namespace, pod["name"])
    reconciler.reconcile(record)  # the record, with the probe asked in its create
    name = remediation_name(pod["name"], pod["uid"])
    rem = objects.remediation(namespace, pod)
    assert rem is not None and rem["status"]["phase"] == "WaitingForAgent"

    first, second = _stale_dir(pod["uid"], "first"), _stale_dir(pod["uid"], "second")
    write_as_agent(objects, namespace, rem, {"probe": agent_probe(node, [
        {"path": first, "empty": True}], pod["uid"])})  # fmt: skip
    older = objects.remediation(namespace, pod)
    assert older is not None
    # The agent probes again before the controller saw its first probe; the copy the pass
    # reads (as the watch would have delivered it) is the older version.
    write_as_agent(objects, namespace, rem, {"probe": agent_probe(node, [
        {"path": second, "empty": True}], pod["uid"])})  # fmt: skip
    reconciler.writer.copies.offer(older)
    before = len(_record_requests(control_plane, namespace, name))

    reconciler.reconcile(record)

    kinds = [_kind(e) for e in _record_requests(control_plane, namespace, name)[before:]]
    # decided from the older probe: its node-steps request refused (409), nothing written;
    # read again, decided again from the newer probe, asked for its steps
    assert kinds[:3] == ["patch 409", "get 200", "patch 200"], kinds
    rem = objects.remediation(namespace, pod)
    assert rem is not None
    assert [s["target"] for s in rem["spec"]["nodeSteps"]] == [second]
    # one batch of node steps handed over: one slot of the node's budget (2 per minute),
    # the refused request's slot given back — one more may be taken now
    policy = reconciler.detector.policies.lookup("default")[0]
    assert policy is not None
    assert reconciler.grants.take(policy, node, time.time()) == 0.0
    assert reconciler.grants.take(policy, node, time.time()) > 0.0
