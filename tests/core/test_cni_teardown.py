"""Issue #25, CNI teardown failing: the kubelet's real FailedKillPod Event text (cni_events.py)
→ CNITeardownFailed naming the plugin, the sandbox and the plugin's error; observe only."""

from __future__ import annotations

import pytest

from tests.support.bundles import UID, bundle, mount_line, pod, pod_path, probe
from tests.support.cni_events import CALICO_ERROR, SANDBOX, kill_pod_event
from unstick.core.model.snapshot import BundleError, parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import CHANGING_ACTIONS, Action, Cause

AFTER_DELETE = "2026-11-20T09:50:00Z"  # the pod's deletionTimestamp is 09:45:00Z (grace 30 s)


def _case(events: list[dict], **kw) -> tuple:
    b = bundle(the_pod=kw.pop("the_pod", pod(statuses=[("app", "terminated")])), **kw)
    b["events"] = events
    d = diagnose(parse_bundle(b))
    return d, plan(d, None), " | ".join(e.message for e in d.evidence)


def test_calico_del_failing_is_named_with_its_error_and_only_observed() -> None:
    d, p, words = _case([kill_pod_event(UID, AFTER_DELETE)])
    assert d.cause is Cause.CNITeardownFailed
    assert f"sandbox {SANDBOX[:12]}" in words and "CNI plugin calico fails to delete" in words
    assert f"(7 times): {CALICO_ERROR}" in words
    assert p.actions == (Action.OBSERVE,)
    assert {r.action for r in p.refused} == set(CHANGING_ACTIONS) - {Action.REMOVE_FINALIZER}


def test_multus_names_its_network_and_the_error_keeps_its_quotes() -> None:
    error = 'delegateDel: error invoking DelegateDel - "calico": error in getting result'
    ev = kill_pod_event(UID, AFTER_DELETE, 1, "multus", error, name="multus-cni-network")
    d, _, words = _case([ev])
    assert d.cause is Cause.CNITeardownFailed
    assert (
        f"CNI plugin multus (network multus-cni-network) fails to delete its network: {error}"
        in words
    )


def test_it_comes_before_the_volume_rules_and_after_running_containers() -> None:
    mounted = probe(mounts=[mount_line(1200, pod_path("volumes/kubernetes.io~empty-dir/x"))])
    d, p, _ = _case([kill_pod_event(UID, AFTER_DELETE)], the_probe=mounted)
    assert d.cause is Cause.CNITeardownFailed  # not OrphanedMount: no unmount, no force-delete
    assert p.actions == (Action.OBSERVE,)
    running = pod(statuses=[("app", "running")])
    d, _, _ = _case([kill_pod_event(UID, AFTER_DELETE)], the_pod=running)
    assert d.cause is Cause.ContainersStillRunning


def test_history_another_pod_and_other_kill_failures_do_not_count() -> None:
    old = kill_pod_event(UID, "2026-11-19T09:00:00Z")  # a day before the delete
    other = kill_pod_event("another-uid", AFTER_DELETE)
    timeout = kill_pod_event(UID, AFTER_DELETE) | {
        "message": 'error killing pod: failed to "KillContainer" for "app" with '
        'KillContainerError: "timeout"'
    }
    for events in ([old], [other], [timeout]):
        d, _, _ = _case(events)
        assert d.cause is not Cause.CNITeardownFailed, events


def test_an_events_k8s_io_event_counts_too() -> None:
    ev = kill_pod_event(UID, AFTER_DELETE)
    new = {
        "regarding": ev["involvedObject"], "reason": "FailedKillPod", "note": ev["message"],
        "eventTime": "2026-11-20T09:50:00.123456Z",
        "series": {"count": 3, "lastObservedTime": AFTER_DELETE},
    }  # fmt: skip
    d, _, words = _case([new])
    assert d.cause is Cause.CNITeardownFailed and "(3 times)" in words


def test_a_malformed_event_is_a_clear_error_naming_the_field() -> None:
    ev = kill_pod_event(UID, AFTER_DELETE) | {"lastTimestamp": "yesterday"}
    b = bundle(the_pod=pod())
    b["events"] = [ev]
    with pytest.raises(BundleError, match=r"events\[0\]\.lastTimestamp"):
        parse_bundle(b)
