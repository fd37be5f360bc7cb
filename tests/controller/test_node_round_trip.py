"""The controller's half of one round trip (design.md §11, `--node-round-trip`), against a
real API server; the test plays the agent as tests/agent/test_agent_mandate.py shows it
answers. The controller asks once — the record's create carries a mandate in place of a
probe request: the node actions the policy permits, its name and resourceVersion,
dry-run, one budget slot — and
then does only what it alone does: it waits for the agent's plan and results, gives the
kubelet its window, force-deletes on a probe taken after the steps, and marks the record
Resolved. The Remediation's writes are counted from a watch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import watch

from devcluster.process import wait_until
from tests.support.controller import (
    GROUP,
    VERSION,
    Controller,
    Objects,
    agent_probe,
    utc_now,
    write_as_agent,
)
from tests.support.controller import policy_spec as spec

pytestmark = pytest.mark.envtest

POLICY = "t-round-trip"
POLICIES = {POLICY: spec(probeMaxAgeSeconds=30)}
CONTROLLER_ARGS = ("--node-round-trip",)
#: the node actions the test policy permits (tests/support/controller.py ALL_ACTIONS)
NODE_ACTIONS = ["replay-unpublish", "unmount", "rmdir-stale"]


class Writes:
    """Every version of the namespace's Remediations seen by a watch (ADDED/MODIFIED)."""

    def __init__(self, objects: Objects, namespace: str) -> None:
        self.versions: list[dict[str, Any]] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(objects, namespace), daemon=True)
        self._thread.start()

    def _run(self, objects: Objects, namespace: str) -> None:
        stream = self._watch.stream(
            objects.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "remediations",
            timeout_seconds=120,
        )
        for event in stream:
            if event["type"] in ("ADDED", "MODIFIED"):
                self.versions.append(event["object"])

    def stop(self) -> None:
        self._watch.stop()


@pytest.fixture
def writes(objects: Objects, namespace: str) -> Iterator[Writes]:
    seen = Writes(objects, namespace)
    try:
        yield seen
    finally:
        seen.stop()


def _policy_version(objects: Objects) -> str:
    obj = objects.custom.get_cluster_custom_object(GROUP, VERSION, "remediationpolicies", POLICY)
    return str(obj["metadata"]["resourceVersion"])


def test_one_round_trip_then_the_kubelets_window_force_delete_and_resolved(
    controller: Controller, objects: Objects, namespace: str, make_node: Any, writes: Writes
) -> None:
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    rem = objects.remediation_when(
        namespace, pod, timeout=60, what="the mandate", spec_has="mandate"
    )
    spec_ = rem["spec"]
    assert "probeRequestedAt" not in spec_ and not spec_.get("nodeSteps")
    assert spec_["mandate"] == {
        "podUID": pod["uid"],
        "nodeName": node,
        "actions": NODE_ACTIONS,
        "policy": POLICY,
        "policyResourceVersion": spec_["mandate"]["policyResourceVersion"],
        "dryRun": False,
        "slots": 1,
    }
    # a version the policy had (its status is written too, so it may have moved on since)
    assert 0 < int(spec_["mandate"]["policyResourceVersion"]) <= int(_policy_version(objects))
    requested = spec_["nodeStepsRequestedAt"]

    # The agent: its probe and its plan in one write, before it acts ...
    stale = f"/var/lib/kubelet/pods/{pod['uid']}/volumes/kubernetes.io~empty-dir/cache"
    step = {"action": "rmdir-stale", "target": stale, "reason": "the pod's volume dir"}
    plan = {"for": requested, "cause": "StaleVolumeDirs", "steps": [step], "slotsUsed": 1}
    probe = agent_probe(node, [{"path": stale, "empty": True}], pod["uid"])
    write_as_agent(objects, namespace, rem, {"probe": probe, "nodePlan": plan})
    # (the controller's pass on the plan writes nothing while the agent works: its status
    # is carried by its next write — docs/controller.md, "A lean record"; no second
    # request either: checked on every version below)

    # ... then its results with a probe taken after them, in one more write.
    done = utc_now()
    result = {**step, "result": "succeeded", "message": "removed", "time": done}
    after = agent_probe(node, [], pod["uid"])
    write_as_agent(
        objects, namespace, rem, {"nodeActions": [result], "nodeStepsDoneAt": done, "probe": after}
    )
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete after the kubelet's window")
    status = objects.remediation_when(
        namespace, pod, timeout=30, what="Resolved", phase="Resolved"
    )["status"]
    recorded = [(a["action"], a["result"], a["by"]) for a in status["actions"]]
    assert ("rmdir-stale", "succeeded", "agent") in recorded
    assert ("force-delete", "succeeded", "controller") in recorded
    final = objects.remediation(namespace, pod)
    assert final is not None and final["spec"]["nodeStepsRequestedAt"] == requested

    # One request: every spec the record ever had carries this one request only.
    wait_until(
        lambda: any((v.get("status") or {}).get("phase") == "Resolved" for v in writes.versions),
        timeout=30,
        what="the watch to see Resolved",
    )
    ours = [v for v in writes.versions if v["metadata"]["name"] == rem["metadata"]["name"]]
    asked = {v["spec"].get("nodeStepsRequestedAt") for v in ours} - {None}
    assert asked == {requested}
    assert ours[0]["spec"]["mandate"] == spec_["mandate"]  # the create is the request
    assert all(v["spec"] == ours[0]["spec"] for v in ours)  # and no spec write follows
    assert all("probeRequestedAt" not in v["spec"] for v in ours)
    print(f"Remediation writes for one pod (2 of them the agent's): {len(ours)}")
    for before, after in zip([{}, *ours], ours, strict=False):  # who wrote what, in order
        spec_b, spec_a = before.get("spec") or {}, after.get("spec") or {}
        st_b, st_a = before.get("status") or {}, after.get("status") or {}
        keys = [f"spec.{k}" for k in spec_a if spec_b.get(k) != spec_a[k]]
        keys += [f"status.{k}" for k in st_a if st_b.get(k) != st_a[k]]
        print("  write:", st_a.get("phase"), keys)


def test_an_unused_slot_and_a_plan_of_nothing_end_without_a_loop(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """The agent's own diagnosis planned nothing it may do (slotsUsed 0, its probe shows a
    container still running): the slot goes back and no second mandate follows."""
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    rem = objects.remediation_when(
        namespace, pod, timeout=60, what="the mandate", spec_has="mandate"
    )
    requested = rem["spec"]["nodeStepsRequestedAt"]
    probe = agent_probe(node, [], pod["uid"])
    probe["containers"] = [
        {"podUID": pod["uid"], "name": "app", "id": "c0ffee", "state": "running"}
    ]
    plan = {"for": requested, "cause": "ContainersStillRunning", "steps": [], "slotsUsed": 0}
    write_as_agent(
        objects,
        namespace,
        rem,
        {"probe": probe, "nodePlan": plan, "nodeActions": [], "nodeStepsDoneAt": utc_now()},
    )
    rem = objects.remediation_when(
        namespace, pod, timeout=30, what="observing", cause="ContainersStillRunning"
    )
    assert rem["status"]["phase"] == "Observing"
    assert rem["spec"]["nodeStepsRequestedAt"] == requested


def test_a_mandate_answered_without_a_plan_ends_failed_not_in_a_loop(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """An agent older than the mandate sees a request of no steps and answers it empty
    (no status.nodePlan, no probe): the controller asks for a probe, and on it, with the
    steps still needed, marks the record Failed — it does not hand out mandates in a loop."""
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    rem = objects.remediation_when(
        namespace, pod, timeout=60, what="the mandate", spec_has="mandate"
    )
    requested = rem["spec"]["nodeStepsRequestedAt"]
    write_as_agent(objects, namespace, rem, {"nodeActions": [], "nodeStepsDoneAt": utc_now()})
    rem = objects.remediation_when(
        namespace, pod, timeout=30, what="a probe request", spec_has="probeRequestedAt"
    )
    stale = f"/var/lib/kubelet/pods/{pod['uid']}/volumes/kubernetes.io~empty-dir/cache"
    probe = agent_probe(node, [{"path": stale, "empty": True}], pod["uid"])
    write_as_agent(objects, namespace, rem, {"probe": probe})
    rem = objects.remediation_when(namespace, pod, timeout=30, what="Failed", phase="Failed")
    assert rem["status"]["cause"] == "StaleVolumeDirs"
    assert rem["spec"]["nodeStepsRequestedAt"] == requested  # no second mandate
