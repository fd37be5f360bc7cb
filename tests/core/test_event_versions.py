"""Issue 33 finding 10: an Event about the pod reads the same whichever API version it was
read as. The kubelet writes core/v1 Events (`count`, `lastTimestamp`); read as
events.k8s.io/v1 (`kubectl get events.events.k8s.io -o json`, the newer clients), the API
server returns those as `deprecatedCount` and `deprecatedLastTimestamp` (`series` only for
an Event written with one). The "(N times)" and the time that scopes an Event to this
termination must not go missing. The shape is the real API server's: the Event is written
as core/v1 and read back as events.k8s.io/v1 from the envtest control plane."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.bundles import UID, bundle, pod
from tests.support.cni_events import kill_pod_event
from unstick.core.model.snapshot import parse_bundle
from unstick.core.rules.cni import failure_words, teardown_failure
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Cause
from unstick.kube.client import ClientSettings, Kube

LAST = "2026-11-20T09:50:00Z"  # after the pod's deletion (09:45:00Z, grace 30 s)
STALE = "2026-11-19T09:50:00Z"  # a day before: an earlier termination's failure


def _read_as_events_v1(control_plane: ControlPlane, namespace: str, last: str) -> Any:
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    try:
        event = kill_pod_event(UID, last, count=5)
        event["metadata"]["namespace"] = event["involvedObject"]["namespace"] = namespace
        name = event["metadata"]["name"]
        kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
        return kube.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}")
    finally:
        kube.close()


def _facts(event: Any) -> Any:
    b = bundle(the_pod=pod(statuses=[("app", "terminated")]))
    b["events"] = [event]
    return parse_bundle(b)


@pytest.mark.envtest
def test_an_event_read_as_events_v1_keeps_its_count_and_time(
    control_plane: ControlPlane, namespace: str
) -> None:
    event = _read_as_events_v1(control_plane, namespace, LAST)
    assert event["apiVersion"] == "events.k8s.io/v1"  # the API server's shape, not ours
    assert (event.get("deprecatedCount"), "series" in event) == (5, False)
    facts = _facts(event)
    (seen,) = facts.events
    assert seen.count == 5
    assert seen.last is not None and seen.last.isoformat() == "2026-11-20T09:50:00+00:00"
    failure = teardown_failure(facts.pod, facts.events)
    assert failure is not None and "(5 times)" in failure_words(failure)
    assert diagnose(facts).cause is Cause.CNITeardownFailed


@pytest.mark.envtest
def test_an_old_event_read_as_events_v1_is_not_this_terminations(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Its deprecatedLastTimestamp scopes it: a failure from a day before the deletion is
    not this termination's (as the same Event read as core/v1 is not)."""
    facts = _facts(_read_as_events_v1(control_plane, namespace, STALE))
    assert teardown_failure(facts.pod, facts.events) is None
    assert teardown_failure(facts.pod, _facts(kill_pod_event(UID, STALE)).events) is None
