"""One home for the cause on the round trip (design.md §11, `--node-round-trip`), against a
real API server; the test plays the agent (as tests/agent/test_agent_mandate.py shows it
answers) and then the kubelet. The controller never diagnosed the node itself: the cause
the agent's plan names (`status.nodePlan.cause`) is the record's cause — `status.cause`
(the printer column), the pod's Event and the agent's results counted in
`unstick_remediations_total` — while the kubelet finishes the pod in its window after the
steps (KubeletNotProgressing is a diagnosis only once that window is over:
tests/controller/test_node_round_trip.py)."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    Controller,
    Objects,
    agent_probe,
    policies_in_place,
    utc_now,
    write_as_agent,
)
from tests.support.controller import policy_spec as spec
from tests.support.reconciler import InProcess, overdue_record
from unstick.controller.metrics import REMEDIATIONS
from unstick.kube.client import Kube

pytestmark = pytest.mark.envtest

POLICY = "t-round-trip-cause"
POLICIES = {POLICY: spec(probeMaxAgeSeconds=30)}
# The kubelet's window long enough that the test, as the kubelet, finishes the pod in it.
CONTROLLER_ARGS = ("--node-round-trip", "--kubelet-finish-seconds", "120")


COUNTED = {"action": "rmdir-stale", "result": "succeeded"}


def _answer(
    objects: Objects, namespace: str, node: str, pod: dict[str, Any], *, one_write: bool
) -> None:
    """The test as the agent: its mandate answered with a plan of cause StaleVolumeDirs
    (one rmdir-stale), the step done, a probe after it that shows nothing left — in the
    agent's two writes, or in one (as a controller that missed the first sees it)."""
    rem = objects.remediation_when(
        namespace, pod, timeout=60, what="the mandate", spec_has="mandate"
    )
    requested = rem["spec"]["nodeStepsRequestedAt"]
    stale = f"/var/lib/kubelet/pods/{pod['uid']}/volumes/kubernetes.io~empty-dir/cache"
    step = {"action": "rmdir-stale", "target": stale, "reason": "the pod's volume dir"}
    plan = {"for": requested, "cause": "StaleVolumeDirs", "steps": [step], "slotsUsed": 1}
    probe = agent_probe(node, [{"path": stale, "empty": True}], pod["uid"])
    if not one_write:  # the agent's write 1: probe and plan, before it acts
        write_as_agent(objects, namespace, rem, {"probe": probe, "nodePlan": plan})
    done = utc_now()
    result = {**step, "result": "succeeded", "message": "removed", "time": done}
    after = agent_probe(node, [], pod["uid"])
    answer = {"nodeActions": [result], "nodeStepsDoneAt": done, "probe": after}
    write_as_agent(objects, namespace, rem, {"nodePlan": plan, **answer} if one_write else answer)


def test_a_pod_gone_before_any_pass_read_the_agents_answer(
    control_plane: ControlPlane, kube: Kube, namespace: str, make_node: Any
) -> None:
    """The kubelet removed the pod before a pass read the agent's answer (the reconciler
    in this process, so that no pass runs in between): the Resolved write says the plan's
    cause and counts the agent's result under it. First in the module: the module's
    controller, started by the tests below, must not run beside this reconciler."""
    with policies_in_place(control_plane, {}) as objects:
        ctl = InProcess(kube)
        try:
            node = objects.ready_node(make_node)
            pod = objects.stuck_pod(namespace, node, remediate="true")
            record = overdue_record(kube, namespace, pod["name"])
            ctl.reconciler.reconcile(record)  # the record, created with the mandate
            _answer(objects, namespace, node, pod, one_write=False)
            answered = objects.remediation(namespace, pod)
            assert answered is not None
            ctl.reconciler.writer.offer(answered)  # as the Remediation watch delivers it
            objects.core.delete_namespaced_pod(pod["name"], namespace, grace_period_seconds=0)
            objects.pod_gone(namespace, pod, timeout=30, what="the pod finished by the kubelet")
            counter = REMEDIATIONS.labels("rmdir-stale", "StaleVolumeDirs", "succeeded")
            before = counter._value.get()
            assert ctl.reconciler.resolve(record)
            status = objects.status(namespace, pod)
            assert (status["phase"], status["cause"]) == ("Resolved", "StaleVolumeDirs"), status
            assert [(a["action"], a["by"]) for a in status["actions"]] == [("rmdir-stale", "agent")]
            assert counter._value.get() == before + 1
        finally:
            ctl.close()


def _round_trip(
    controller: Controller, objects: Objects, namespace: str, node: str, *, one_write: bool
) -> dict[str, Any]:
    """A stuck pod, its mandate answered (`_answer`), then the pod finished by the test as
    the kubelet within its window; the record once Resolved."""
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    _answer(objects, namespace, node, pod, one_write=one_write)
    # The controller counts the agent's result on the pass that reads it, then gives the
    # kubelet its window (nothing of the pod is left on the node) ...
    wait_until(
        lambda: sum(controller.sample("unstick_remediations_total", cause=c, **COUNTED)
                    for c in ("StaleVolumeDirs", "KubeletNotProgressing", "Unknown")) >= 1,
        timeout=30, what="the agent's result counted",
    )  # fmt: skip
    # ... in which the kubelet finishes the pod itself.
    objects.core.delete_namespaced_pod(pod["name"], namespace, grace_period_seconds=0)
    objects.pod_gone(namespace, pod, timeout=30, what="the pod finished by the kubelet")
    status = objects.remediation_when(
        namespace, pod, timeout=30, what="Resolved", phase="Resolved"
    )["status"]
    assert status["cause"] == "StaleVolumeDirs", status
    assert status["nodePlan"]["cause"] == "StaleVolumeDirs"
    recorded = [(a["action"], a["result"], a["by"]) for a in status["actions"]]
    assert recorded == [("rmdir-stale", "succeeded", "agent")], status["actions"]

    def reasons() -> list[str]:
        events = objects.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod['name']}"
        ).items
        return sorted(e.reason for e in events)

    wait_until(lambda: "StuckStaleVolumeDirs" in reasons(), timeout=30, what="the pod's Event")
    assert [r for r in reasons() if r.startswith("Stuck")] == ["StuckStaleVolumeDirs"]
    return status


def test_the_agents_cause_is_the_records_its_events_and_its_metrics(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node = objects.ready_node(make_node)
    before = controller.sample("unstick_remediations_total", cause="StaleVolumeDirs", **COUNTED)
    _round_trip(controller, objects, namespace, node, one_write=False)
    counted = controller.sample("unstick_remediations_total", cause="StaleVolumeDirs", **COUNTED)
    assert counted == before + 1
    for other in ("KubeletNotProgressing", "Unknown"):
        assert controller.sample("unstick_remediations_total", cause=other, **COUNTED) == 0


def test_the_agents_cause_when_no_pass_saw_its_plan_before_its_results(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """The controller may first meet the agent's plan with its results (a pass is not made
    for every version of the record): the window's record names the plan's cause, and the
    pod's Event is posted there, with the agent's steps as the plan."""
    node = objects.ready_node(make_node)
    status = _round_trip(controller, objects, namespace, node, one_write=True)
    assert status["evidence"][0]["kind"] == "agent", status["evidence"]
    for other in ("KubeletNotProgressing", "Unknown"):
        assert controller.sample("unstick_remediations_total", cause=other, **COUNTED) == 0
