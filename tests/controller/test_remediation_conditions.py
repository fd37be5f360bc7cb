"""A Remediation's status.conditions (controller/records/conditions.py) in the metav1 shape,
folded into the status writes the controller makes anyway (records/writer.patch_status):
the pure derivation, and against a real API server (the CRD's schema takes them; a write
of the phase is still one PATCH; an unguarded write without a phase leaves them alone)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from devcluster import ControlPlane
from unstick.controller.records import writer as records
from unstick.controller.records.conditions import conditions
from unstick.core.remediation import new_remediation, rfc3339
from unstick.kube.client import Kube, remediation_path

KEYS = {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
T0, T1 = 1_800_000_000.0, 1_800_000_100.0


def by_type(conds: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conds or []}


def test_the_conditions_follow_the_phase() -> None:
    assert conditions({}, 1, T0) is None  # no phase yet: nothing to say
    acting = by_type(conditions({"phase": "Remediating", "waitingFor": "a budget slot"}, 2, T0))
    assert set(acting) == {"Resolved", "Stalled"}
    assert all(set(c) == KEYS for c in acting.values())
    assert acting["Resolved"]["status"] == "False" and acting["Stalled"]["status"] == "False"
    assert acting["Resolved"]["reason"] == "Remediating"
    assert acting["Resolved"]["message"] == "waiting for a budget slot"
    assert acting["Resolved"]["observedGeneration"] == 2
    assert acting["Resolved"]["lastTransitionTime"] == rfc3339(T0)

    refused = by_type(conditions({"phase": "Refused", "refusal": "forged"}, 1, T0))
    assert refused["Stalled"]["status"] == "True" and refused["Stalled"]["message"] == "forged"
    assert by_type(conditions({"phase": "Failed"}, 1, T0))["Stalled"]["status"] == "True"
    incident = by_type(conditions({"phase": "Resolved", "podCount": 5}, 1, T0))
    assert incident["Resolved"]["status"] == "True" and "(5)" in incident["Resolved"]["message"]


def test_the_transition_time_moves_only_with_the_status() -> None:
    first = conditions({"phase": "WaitingForAgent"}, 1, T0)
    then = by_type(conditions({"phase": "Remediating", "conditions": first}, 2, T1))
    assert then["Resolved"]["lastTransitionTime"] == rfc3339(T0)  # False before and after
    assert (
        then["Resolved"]["reason"] == "Remediating" and then["Resolved"]["observedGeneration"] == 2
    )
    done = by_type(conditions({"phase": "Resolved", "conditions": first}, 2, T1))
    assert done["Resolved"]["lastTransitionTime"] == rfc3339(T1)
    assert done["Stalled"]["lastTransitionTime"] == rfc3339(T0)


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> None:
    control_plane.install_crds()


class Counting:
    """The client, counting the requests sent through it."""

    def __init__(self, kube: Kube) -> None:
        self.kube, self.sent = kube, []  # type: ignore[var-annotated]

    def request(self, method: str, path: str, **kw: Any) -> Any:
        self.sent.append((method, path))
        return self.kube.request(method, path, **kw)


@pytest.mark.envtest
@pytest.mark.usefixtures("crds")
def test_written_with_the_phase_in_one_patch(kube: Kube, namespace: str) -> None:
    name = f"p-{uuid.uuid4().hex[:6]}"
    body = new_remediation(namespace, name, "p", str(uuid.uuid4()), node="n1", dry_run=False)
    created = kube.request("POST", remediation_path(namespace), body=body)
    counting = Counting(kube)
    writer = records.RecordWriter(counting)  # type: ignore[arg-type]
    writer.offer(created)  # the watch's copy: a pass reads from it
    rem = writer.read(namespace, name)
    assert rem is not None
    writer.patch(rem, {"phase": "WaitingForAgent", "waitingFor": "the agent's probe"})
    assert [m for m, _ in counting.sent] == ["PATCH"]  # the phase's own write, nothing more
    on_server = kube.get(remediation_path(namespace, name))
    assert on_server is not None
    first = by_type(on_server["status"]["conditions"])
    assert all(set(c) == KEYS for c in first.values())
    assert (
        first["Resolved"]["status"] == "False" and first["Resolved"]["reason"] == "WaitingForAgent"
    )
    assert first["Resolved"]["observedGeneration"] == created["metadata"]["generation"]

    # an unguarded write without a phase (the waiters of a holder): conditions untouched
    records.patch_status(kube, on_server, {"waiters": []})
    again = kube.get(remediation_path(namespace, name))
    assert again is not None and again["status"]["conditions"] == on_server["status"]["conditions"]

    writer.offer(again)  # the watch delivers that version; the next pass reads it
    rem = writer.read(namespace, name)
    assert rem is not None
    counting.sent.clear()
    # resolved as the pod's going does it: from a stub of the record's name, unguarded (the
    # conditions' times and generation come from the writer's copy)
    stub = {"metadata": {"namespace": namespace, "name": name}, "status": {}}
    final = {"phase": "Resolved", "resolvedAt": rfc3339(T1), "waitingFor": None}
    writer.patch(stub, final, guarded=False)
    assert [m for m, _ in counting.sent] == ["PATCH"]
    done = kube.get(remediation_path(namespace, name))
    assert done is not None
    resolved = by_type(done["status"]["conditions"])
    assert resolved["Resolved"]["status"] == "True" and resolved["Resolved"]["reason"] == "Resolved"
    assert resolved["Resolved"]["lastTransitionTime"] >= first["Resolved"]["lastTransitionTime"]
    assert resolved["Stalled"]["lastTransitionTime"] == first["Stalled"]["lastTransitionTime"]
    assert resolved["Stalled"]["observedGeneration"] == first["Stalled"]["observedGeneration"]
