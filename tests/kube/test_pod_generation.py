"""What a real API server does with a pod's generations and its DisruptionTarget condition
(docs/compatibility.md, "What 1.33-1.37 changed for the evidence"), on whichever version
the envtests run (bin/, or `make test-envtest KUBE_VERSION=...`):

- since 1.33 it sets metadata.generation 1 at create and raises it at the first graceful
  delete (the Eviction API's here); before, a pod has none;
- the Eviction API sets DisruptionTarget=True, reason EvictionByEvictionAPI (every version);
- it keeps a status.observedGeneration the kubelet writes (since 1.33; 1.35 locks the gate
  on) — so the pod read back says whether the kubelet wrote its status after the delete,
  and the controller's small watch record keeps what the diagnosis reads of it.

No kubelet runs here: the status writes are the ones a kubelet makes (before and after it
sees the delete), through the same pods/status endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.bundles import bundle, probe
from tests.support.pods import pod_body
from unstick.core.model.snapshot import parse_bundle, parse_pod
from unstick.core.remediation import parse_time, rfc3339
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Cause
from unstick.kube.podwatch import pod_json, terminating_record

pytestmark = pytest.mark.envtest


def _minor(control_plane: ControlPlane) -> int:
    return int(str(control_plane.request("GET", "/version")["minor"]).rstrip("+"))


def _kubelet_writes(cp: ControlPlane, path: str, observed: int) -> dict[str, Any]:
    """A status write as the kubelet makes it: the pod's status, observedGeneration set."""
    pod = cp.request("GET", path)
    pod["status"]["observedGeneration"] = observed
    pod["status"]["phase"] = "Running"
    return dict(cp.request("PUT", f"{path}/status", pod))


def test_generation_observed_generation_and_disruption_on_a_real_api_server(
    control_plane: ControlPlane, namespace: str, make_node: Any
) -> None:
    cp, minor = control_plane, _minor(control_plane)
    node = make_node(kubelet=False)  # nothing finalises the pod: it stays Terminating
    path = f"/api/v1/namespaces/{namespace}/pods/evicted"
    created = cp.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", pod_body("evicted", node, grace=30)
    )
    assert created["metadata"].get("generation") == (1 if minor >= 33 else None)
    if minor >= 33:  # a status of the pod before its delete, as a kubelet writes it
        assert _kubelet_writes(cp, path, 1)["status"]["observedGeneration"] == 1

    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "evicted"}}
    cp.request("POST", f"{path}/eviction", eviction)
    deleted = cp.request("GET", path)
    assert deleted["metadata"]["deletionTimestamp"]
    assert deleted["metadata"].get("generation") == (2 if minor >= 33 else None)
    target = [c for c in deleted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c["reason"]) for c in target] == [("True", "EvictionByEvictionAPI")]

    facts = parse_pod(deleted)
    assert facts.disruption is not None and facts.disruption.reason == "EvictionByEvictionAPI"
    assert facts.kubelet_saw_delete is (False if minor >= 33 else None)

    after = _kubelet_writes(cp, path, 2)  # the kubelet has the deleted pod (generation 2)
    if minor >= 33:
        assert after["status"]["observedGeneration"] == 2
        assert parse_pod(after).kubelet_saw_delete is True
    else:  # no such field before 1.33: the server drops it
        assert "observedGeneration" not in after["status"]
        assert parse_pod(after).kubelet_saw_delete is None

    record = terminating_record(after)
    assert record is not None
    kept = parse_pod(pod_json(record))
    facts = parse_pod(after)
    assert (kept.generation, kept.observed_generation, kept.disruption) == (
        facts.generation,
        facts.observed_generation,
        facts.disruption,
    )

    # the diagnosis of the pod as the server returned it, with nothing of it on its node
    deadline = parse_time(after["metadata"]["deletionTimestamp"])
    now = rfc3339(deadline + 120)
    seen = probe(
        containers=[],
        node_name=node,
        uid=after["metadata"]["uid"],
        probed_at=rfc3339(deadline + 110),
    )
    the_node = cp.request("GET", f"/api/v1/nodes/{node}")
    the_node["status"] = {  # Ready, as a live kubelet's node
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "lastTransitionTime": the_node["metadata"]["creationTimestamp"],
            }
        ]
    }
    d = diagnose(parse_bundle(bundle(the_pod=after, the_node=the_node, the_probe=seen, now=now)))
    assert d.cause is Cause.KubeletNotProgressing
    said = [e.message for e in d.evidence]
    assert said[-1] == (
        "the pod was deleted as a disruption: condition DisruptionTarget, reason "
        "EvictionByEvictionAPI: Eviction API: evicting"
    )
    assert any(m.startswith("the kubelet saw the delete") for m in said) is (minor >= 33)
