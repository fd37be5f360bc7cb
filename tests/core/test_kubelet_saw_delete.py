"""What Kubernetes 1.33-1.37 put in the pod itself (docs/compatibility.md, "What 1.33-1.37
changed for the evidence"): metadata.generation, raised by the API server at the delete,
against the kubelet's status.observedGeneration says whether the kubelet wrote the pod's
status after the delete reached it; the condition DisruptionTarget says who set out to
delete it. Evidence only: the cause, the plan's inputs and every other line are those of
the same pod without them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.bundles import bundle, node, pod, probe
from unstick.core.fields import FieldError
from unstick.core.model.snapshot import parse_bundle, parse_pod
from unstick.core.rules.diagnosis import Diagnosis, diagnose
from unstick.core.vocabulary import Cause
from unstick.kube.podwatch import pod_json, terminating_record


def _generations(the_pod: dict[str, Any], generation: Any, observed: Any) -> dict[str, Any]:
    if generation is not None:
        the_pod["metadata"]["generation"] = generation
    if observed is not None:
        the_pod["status"]["observedGeneration"] = observed
    return the_pod


def _disrupted(the_pod: dict[str, Any], status: str, reason: str, message: str) -> dict[str, Any]:
    the_pod["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "PodCompleted"},
        {"type": "DisruptionTarget", "status": status, "reason": reason, "message": message},
    ]
    return the_pod


def _diagnose(the_pod: dict[str, Any], **kw: Any) -> Diagnosis:
    return diagnose(parse_bundle(bundle(the_pod=the_pod, **kw)))


SEEN = (
    "the kubelet saw the delete (status.observedGeneration 2, metadata.generation 2): it "
    "wrote the pod's status after the delete reached it"
)
NOT_SEEN = (
    "the kubelet has not written the pod's status since the delete "
    "(status.observedGeneration 1, metadata.generation 2): the delete has not reached it, "
    "or it never began terminating the pod, or its status writes do not reach the API server"
)
UNREACHABLE = {"the_node": node(ready="Unknown", since="2026-11-20T09:40:00Z")}
NOTHING_LEFT = {"the_probe": probe(containers=[])}


@pytest.mark.parametrize("where", [UNREACHABLE, NOTHING_LEFT], ids=["unreachable", "kubelet"])
@pytest.mark.parametrize(("observed", "says"), [(2, SEEN), (1, NOT_SEEN)])
def test_the_kubelets_observed_generation_says_whether_it_saw_the_delete(
    where: dict[str, Any], observed: int, says: str
) -> None:
    d = _diagnose(_generations(pod(), 2, observed), **where)
    without = _diagnose(pod(), **where)
    assert d.cause is without.cause
    assert d.cause in (Cause.NodeUnreachable, Cause.KubeletNotProgressing)
    assert d.nothing_left == without.nothing_left and d.fenced == without.fenced
    assert d.evidence[-1].kind == "kubelet" and d.evidence[-1].message == says
    assert d.evidence[:-1] == without.evidence


@pytest.mark.parametrize(
    ("generation", "observed"),
    [
        (None, None),  # an API server before 1.33: pods have no generation
        (2, None),  # a kubelet before 1.33, or PodObservedGenerationTracking off (1.33)
        (None, 3),  # no generation: nothing to compare with
        (0, 0),
    ],
)
def test_no_line_when_either_number_is_missing(generation: Any, observed: Any) -> None:
    d = _diagnose(_generations(pod(), generation, observed), **NOTHING_LEFT)
    assert d.evidence == _diagnose(pod(), **NOTHING_LEFT).evidence
    assert parse_pod(_generations(pod(), generation, observed)).kubelet_saw_delete is None


def test_not_being_deleted_is_no_answer() -> None:
    assert parse_pod(_generations(pod(deletion=None), 1, 1)).kubelet_saw_delete is None


@given(generation=st.integers(1, 10**6), observed=st.integers(1, 10**6))
def test_seen_exactly_when_the_status_is_of_the_current_generation(
    generation: int, observed: int
) -> None:
    seen = parse_pod(_generations(pod(), generation, observed)).kubelet_saw_delete
    assert seen is (observed >= generation)


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"),
        ("DeletionByPodGC", "PodGC: node no longer exists"),
        ("TerminationByKubelet", "The node was low on resource: memory."),
        ("PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher pod"),
        ("EvictionByEvictionAPI", "Eviction API: evicting"),
        ("DeletionByDeviceTaintManager", "Device Taint manager: deleting due to NoExecute"),
    ],
)
def test_the_disruption_target_reason_is_named_last(reason: str, message: str) -> None:
    for where in (UNREACHABLE, NOTHING_LEFT, {}):
        d = _diagnose(_disrupted(pod(), "True", reason, message), **where)
        without = _diagnose(pod(), **where)
        assert d.cause is without.cause
        assert d.evidence[:-1] == without.evidence
        assert d.evidence[-1].kind == "deletion"
        assert d.evidence[-1].message == (
            f"the pod was deleted as a disruption: condition DisruptionTarget, reason "
            f"{reason}: {message}"
        )


def test_a_disruption_target_not_true_or_a_pod_not_stuck_says_nothing() -> None:
    false = _diagnose(_disrupted(pod(), "False", "DeletionByTaintManager", "x"))
    assert false.evidence == _diagnose(pod()).evidence
    fresh = _disrupted(pod(deletion="2026-11-20T09:59:30Z"), "True", "DeletionByPodGC", "")
    assert _diagnose(fresh).cause is Cause.NotStuck
    assert [e.kind for e in _diagnose(fresh).evidence] == ["deletion"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda p: p["metadata"].update(generation="2"), "pod.metadata.generation"),
        (lambda p: p["status"].update(observedGeneration=1.5), "pod.status.observedGeneration"),
        (lambda p: p["status"].update(conditions=[{"type": "DisruptionTarget", "status": 1}]),
         "pod.status.conditions[0].status"),
        (lambda p: p["status"].update(conditions="x"), "pod.status.conditions"),
    ],
)  # fmt: skip
def test_a_malformed_field_is_named(edit: Any, field: str) -> None:
    the_pod = pod()
    edit(the_pod)
    with pytest.raises(FieldError) as e:
        parse_pod(the_pod)
    assert e.value.field == field


def test_the_controllers_pod_record_keeps_them() -> None:
    """The controller diagnoses a stuck pod from its watch's small record (pod_json):
    the generations and the condition survive it, so a live diagnosis says what the
    offline one says."""
    full = _disrupted(_generations(pod(), 2, 1), "True", "DeletionByTaintManager", "taint")
    record = terminating_record(full)
    assert record is not None
    rebuilt = parse_pod(pod_json(record))
    assert (rebuilt.generation, rebuilt.observed_generation) == (2, 1)
    assert rebuilt.kubelet_saw_delete is False
    assert rebuilt.disruption == parse_pod(full).disruption
    bare = terminating_record(pod())
    assert bare is not None
    assert parse_pod(pod_json(bare)).disruption is None
    assert parse_pod(pod_json(bare)).generation is None
