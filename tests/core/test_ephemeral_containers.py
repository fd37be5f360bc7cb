"""Ephemeral containers (`kubectl debug`) are containers of the pod (issue #22 finding 8):
a debug container still running in a Terminating pod is ContainersStillRunning wherever the
diagnosis looks — pod.status.ephemeralContainerStatuses in the API form of rule 4, and the
node's runtime in the probe form — never Unknown, and never a plan that touches the node."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from tests.core.test_safety_properties import cases, fresh
from tests.support.bundles import (
    DRIVER,
    bundle,
    csi_mount_path,
    csi_node,
    inline_csi_volume,
    mount_line,
    node,
    pod,
    probe,
    staging_line,
)
from unstick.core.model.snapshot import BundleError, parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import CHANGING_ACTIONS, Cause
from unstick.kube.podwatch import pod_json, terminating_record

DEBUG = "debugger-x7k2p"
# ContainerFrozen (rule 3a, issue #25) comes before rule 4 too and plans only observe
BEFORE_RULE_4 = {
    Cause.NotStuck,
    Cause.FinalizerBlocked,
    Cause.NodeGone,
    Cause.NodeUnreachable,
    Cause.ContainerFrozen,
}


def with_debug_container(b: dict[str, Any], state: str = "running") -> dict[str, Any]:
    """The bundle's pod with a `kubectl debug` container in `state` (status and spec)."""
    the_pod = b["pod"]
    the_pod["spec"]["ephemeralContainers"] = [
        {"name": DEBUG, "image": "busybox:1.36", "targetContainerName": "app"}
    ]
    the_pod["status"]["ephemeralContainerStatuses"] = [
        {"name": DEBUG, "ready": False, "restartCount": 0, "state": {state: {}}}
    ]
    return b


def test_a_running_debug_container_without_a_probe_is_containers_still_running() -> None:
    b = with_debug_container(bundle(the_pod=pod(statuses=[("app", "terminated")]), the_node=node()))
    d = diagnose(parse_bundle(b))
    assert d.cause is Cause.ContainersStillRunning, d.evidence
    assert d.running_containers == (f"ephemeral container {DEBUG}",)
    assert any("ephemeral container" in e.message and "pod.status" in e.message for e in d.evidence)
    assert {s.action for s in plan(d, None).steps}.isdisjoint(CHANGING_ACTIONS)


def test_a_finished_debug_container_does_not_hold_the_pod() -> None:
    b = with_debug_container(bundle(the_pod=pod(), the_node=node()), state="terminated")
    assert diagnose(parse_bundle(b)).cause is Cause.Unknown  # no probe: node side unknown


def test_an_unmount_is_never_planned_while_a_debug_container_runs() -> None:
    """A probe whose runtime did not say (an older agent's) shows an unheld CSI mount: only
    the API status knows of the debug container — it must win over OrphanedMount."""
    mount = csi_mount_path("scratch")
    the_probe = probe(mounts=[mount_line(1000, mount), staging_line()], legacy=True)
    b = bundle(
        the_pod=pod(volumes=[inline_csi_volume("scratch")]),
        the_node=node(),
        the_csi_node=csi_node([DRIVER]),
        the_probe=the_probe,
    )
    assert diagnose(parse_bundle(b)).cause is Cause.OrphanedMount  # without the debug container
    d = diagnose(parse_bundle(with_debug_container(b)))
    assert d.cause is Cause.ContainersStillRunning, d.evidence
    assert {s.action for s in plan(d, None).steps}.isdisjoint(CHANGING_ACTIONS)


def test_the_node_runtime_view_counts_a_debug_container_once() -> None:
    """The runtime lists the debug container by name like any other: running per the node,
    and the API entry of the same container is not listed twice."""
    the_probe = probe(containers=[("app", "exited"), (DEBUG, "running")], sight={"runtime": None})
    b = with_debug_container(bundle(the_pod=pod(), the_node=node(), the_probe=the_probe))
    d = diagnose(parse_bundle(b))
    assert d.cause is Cause.ContainersStillRunning
    assert d.running_containers == (f"container {DEBUG}",)


def test_a_bad_ephemeral_status_names_the_field() -> None:
    b = with_debug_container(bundle(the_pod=pod(), the_node=node()))
    b["pod"]["status"]["ephemeralContainerStatuses"] = [{"state": {}}]
    try:
        parse_bundle(b)
    except BundleError as err:
        assert "pod.status.ephemeralContainerStatuses[0]" in str(err)
    else:
        raise AssertionError("a status without a name was accepted")


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_a_running_debug_container_keeps_every_pod_out_of_the_node_side_rules(
    case: tuple[dict[str, Any], Any, bool],
) -> None:
    b, policy, consent = case
    facts = parse_bundle(with_debug_container(b))
    d = diagnose(facts, policy.settings if policy else None)
    if d.cause in BEFORE_RULE_4:
        return
    if d.cause is Cause.HungMount:  # rule 3b, before 4: it too changes nothing while one runs
        steps = plan(d, policy, opted_in=consent).steps
        assert {s.action for s in steps}.isdisjoint(CHANGING_ACTIONS), steps
        return
    p = facts.probe
    if fresh(facts) and p is not None and p.runtime_answered:
        return  # the node's runtime answered: it, not a lagging pod.status, is the truth
    assert d.cause is Cause.ContainersStillRunning, d.evidence
    assert f"ephemeral container {DEBUG}" in d.running_containers
    steps = plan(d, policy, opted_in=consent).steps
    assert {s.action for s in steps}.isdisjoint(CHANGING_ACTIONS), steps


def test_the_controller_record_keeps_a_debug_container() -> None:
    """The controller diagnoses a stuck pod from its memory of the pod (`pod_json` of the
    watch record): the debug container must survive that round trip."""
    b = with_debug_container(bundle(the_pod=pod(), the_node=node()))
    the_pod = b["pod"]
    record = terminating_record(the_pod)
    assert record is not None and record.containers_running
    b["pod"] = pod_json(record)
    d = diagnose(parse_bundle(b))
    assert d.cause is Cause.ContainersStillRunning, d.evidence
    assert d.running_containers == (f"ephemeral container {DEBUG}",)
