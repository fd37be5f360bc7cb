"""The one post_event (kube/events.py) against a real API server: a repeat of the same
Event counts on the first one instead of making a new object, a long message is trimmed,
an Event gone in between is posted anew, and a failure is logged, never raised."""

from __future__ import annotations

from typing import Any

import pytest

from unstick.kube.client import Kube
from unstick.kube.events import MESSAGE_LIMIT, EventRecorder, post_event, recorder, trim

pytestmark = pytest.mark.envtest


def _ref(namespace: str, name: str = "web-0", uid: str = "u-1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


def _events(core_api: Any, namespace: str) -> list[Any]:
    return list(core_api.list_namespaced_event(namespace).items)


def test_trim_keeps_short_messages_and_marks_cut_ones() -> None:
    assert trim("short") == "short"
    cut = trim("x" * 5000)
    assert len(cut) == MESSAGE_LIMIT and cut.endswith("…")


def test_a_repeat_counts_on_the_first_event(kube: Kube, core_api: Any, namespace: str) -> None:
    clock = [1000.0]
    events = EventRecorder(kube, clock=lambda: clock[0])
    for _ in range(3):
        events.post(_ref(namespace), "StuckNodeGone", "node gone")
        clock[0] += 1
    events.post(_ref(namespace), "StuckNodeGone", "another message")
    (first, other) = sorted(_events(core_api, namespace), key=lambda e: e.message)
    assert (first.message, first.count, first.source.component) == (
        "another message",
        1,
        "unstick-controller",
    )
    assert (other.message, other.count) == ("node gone", 3)
    assert other.last_timestamp > other.first_timestamp


def test_after_the_window_and_after_a_delete_an_event_is_new(
    kube: Kube, core_api: Any, namespace: str
) -> None:
    clock = [1000.0]
    events = EventRecorder(kube, clock=lambda: clock[0], window_s=60)
    events.post(_ref(namespace), "Blocked", "m")
    clock[0] += 61
    events.post(_ref(namespace), "Blocked", "m")
    assert [e.count for e in _events(core_api, namespace)] == [1, 1]
    for e in _events(core_api, namespace):
        core_api.delete_namespaced_event(e.metadata.name, namespace)
    events.post(_ref(namespace), "Blocked", "m")  # the one it would count on is gone
    assert [e.count for e in _events(core_api, namespace)] == [1]


def test_long_messages_are_trimmed_and_failures_are_not_raised(
    kube: Kube, core_api: Any, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    post_event(kube, _ref(namespace), "Stuck", "e" * 3000, event_type="Normal")
    (event,) = _events(core_api, namespace)
    assert len(event.message) == MESSAGE_LIMIT and event.type == "Normal"
    assert recorder(kube) is recorder(kube)  # one dedup memory per client
    post_event(kube, _ref("no-such-namespace-here"), "Stuck", "m")
    assert "could not post Event Stuck on Pod no-such-namespace-here/web-0" in caplog.text


def test_events_about_a_namespace_go_to_default(kube: Kube, core_api: Any) -> None:
    ref = {"apiVersion": "v1", "kind": "Namespace", "namespace": "", "name": "gone", "uid": "n1"}
    post_event(kube, ref, "NamespaceBlockedByStuckPods", "1 stuck pod(s)")
    try:
        found = [e for e in _events(core_api, "default") if e.involved_object.uid == "n1"]
        assert [e.reason for e in found] == ["NamespaceBlockedByStuckPods"]
    finally:
        for e in found:
            core_api.delete_namespaced_event(e.metadata.name, "default")
