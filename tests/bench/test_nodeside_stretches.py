"""bench/nodeside_stretches.py: each pod's stretches from audit events (who asked what,
when), with the probe requested by a spec patch or in the create itself."""

from __future__ import annotations

from typing import Any

from bench.nodeside_stretches import STRETCHES, stretches
from tests.bench.audit_events import audit_event

WHO = {"controller": ("ctl/",), "agent": ("agent/",), "standin": ("kubelet/",)}


def _pod(probe_patch: bool) -> list[dict[str, Any]]:
    marks = [
        audit_event(1.0, "ctl/1", "create", "remediations", "r-a"),
        *([audit_event(1.5, "ctl/1", "patch", "remediations", "r-a")] if probe_patch else []),
        audit_event(2.0, "agent/1", "get", "pods", "a"),
        audit_event(2.5, "agent/1", "patch", "remediations", "r-a", "status"),
        audit_event(4.0, "ctl/1", "patch", "remediations", "r-a"),
        audit_event(7.0, "agent/1", "get", "pods", "a"),
        audit_event(8.0, "agent/1", "patch", "remediations", "r-a", "status"),
        audit_event(8.5, "kubelet/1", "delete", "pods", "a"),
    ]
    other = audit_event(3.0, "agent/1", "get", "pods", "b")  # another pod's request: not a's mark
    return [*marks, other]


def test_each_stretch_of_a_pod_from_its_marks() -> None:
    out = stretches(_pod(probe_patch=True), {"a": "r-a"}, WHO, 1_800_000_000)
    got = {k: v["p50"] for k, v in out.items()}
    assert got == {
        "created_to_probe_requested": 0.5,
        "probe_queue": 0.5,
        "probe": 0.5,
        "probe_to_steps_requested": 1.5,
        "steps_queue": 3.0,
        "steps": 1.0,
        "steps_to_gone": 0.5,
    }
    assert all(out[k]["n"] == 1 for k in STRETCHES)


def test_a_probe_requested_in_the_create_counts_from_the_create() -> None:
    out = stretches(_pod(probe_patch=False), {"a": "r-a"}, WHO, 1_800_000_000)
    assert out["created_to_probe_requested"]["p50"] == 0.0
    assert out["probe_queue"]["p50"] == 1.0
    assert out["steps_queue"]["p50"] == 3.0


def test_a_pod_without_every_mark_is_left_out() -> None:
    events = [e for e in _pod(probe_patch=True) if e["verb"] != "delete"]
    events = events[:-2]  # no answer to the node steps
    out = stretches(events, {"a": "r-a"}, WHO, 1_800_000_000)
    assert all(v["n"] == 0 and v["p50"] is None for v in out.values())
