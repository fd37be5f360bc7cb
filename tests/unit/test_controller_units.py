"""Pure parts of the controller: scheduler, token buckets, pod records, opt-in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from unstick.controller.policies import PolicyBook, opt_in
from unstick.controller.records import remediation_name
from unstick.controller.scheduler import Scheduler
from unstick.kube.podwatch import terminating_record


def test_scheduler_wakes_in_due_order_and_reschedule_replaces() -> None:
    s = Scheduler()
    s.schedule("a", 30.0)
    s.schedule("b", 10.0)
    s.schedule("c", 20.0)
    s.schedule("a", 5.0)  # replaces 30
    assert s.next_due() == 5.0
    assert s.pop_due(15.0) == ["a", "b"]
    assert s.pop_due(15.0) == []
    assert s.next_due() == 20.0
    s.cancel("c")
    assert s.next_due() is None
    assert len(s) == 0


def test_schedule_earliest_keeps_the_sooner_time() -> None:
    s = Scheduler()
    s.schedule("a", 10.0)
    s.schedule_earliest("a", 50.0)
    assert s.due_at("a") == 10.0
    s.schedule_earliest("a", 1.0)
    assert s.due_at("a") == 1.0


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 1000)), max_size=200))
def test_scheduler_matches_last_wish_per_key(wishes: list[tuple[str, float]]) -> None:
    s = Scheduler()
    last: dict[str, float] = {}
    for key, due in wishes:
        s.schedule(key, due)
        last[key] = due
    popped = s.pop_due(2000.0)
    assert sorted(popped) == sorted(last)
    assert [last[k] for k in popped] == sorted(last[k] for k in popped)


def _pod(**meta: object) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u1", **meta},
        "spec": {"nodeName": "n1"},
        "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]},
    }


def test_only_terminating_pods_become_records() -> None:
    assert terminating_record(_pod()) is None
    rec = terminating_record(
        _pod(
            deletionTimestamp="2026-11-20T10:00:00Z",
            deletionGracePeriodSeconds=30,
            finalizers=["a/b"],
            annotations={"unstick.dev/remediate": "true", "other": "x"},
        )
    )
    assert rec is not None
    assert (rec.node, rec.finalizers, rec.remediate, rec.containers_running) == (
        "n1",
        ("a/b",),
        "true",
        True,
    )
    assert rec.deletion_timestamp == 1795168800.0
    assert terminating_record(_pod(deletionTimestamp="not a time")) is None


def test_opt_in_rules() -> None:
    assert opt_in("true", {}).opted_in
    assert opt_in(None, {"unstick.dev/remediate": "true"}).policy_name == "default"
    assert opt_in("strict", {}).policy_name == "strict"
    assert not opt_in("false", {"unstick.dev/remediate": "true"}).opted_in
    assert not opt_in(None, {}).opted_in
    # Exact values only, as `unstick diagnose` reads them: "TRUE" names a (missing) policy.
    assert opt_in("TRUE", {}).policy_name == "TRUE"
    assert not opt_in(None, {"unstick.dev/remediate": "True"}).opted_in


def test_remediation_names_are_valid_object_names() -> None:
    name = remediation_name("a" * 52 + ".b" + "c" * 10, "0123456789abcdef")
    assert name == "a" * 52 + "-01234567"
    assert remediation_name("web-0", "0123456789") == "web-0-01234567"


def test_invalid_policy_is_kept_as_error_naming_the_field() -> None:
    book = PolicyBook()
    error = book.update("bad", {"spec": {"actions": ["explode"]}})
    assert error is not None and "spec.actions" in error
    policy, why = book.lookup("bad")
    assert policy is None and why is not None and "invalid" in why
    assert book.update("good", {"spec": {"slackSeconds": 5, "dryRun": False}}) is None
    good, _ = book.lookup("good")
    assert good is not None and good.slack_s == 5 and not good.dry_run
    assert book.lookup("missing")[1] == "RemediationPolicy 'missing' does not exist"


def test_peering_gate_follows_kopf_rule() -> None:
    from unstick.controller.peering import is_active

    now = 1_000_000.0
    seen = "1970-01-12T13:46:30+00:00"  # now - 10 s
    assert is_active({}, "me", 0, now)
    assert is_active({"me": {"priority": 0, "lastseen": seen, "lifetime": 60}}, "me", 0, now)
    assert not is_active({"other": {"priority": 0, "lastseen": seen, "lifetime": 60}}, "me", 0, now)
    assert not is_active({"other": {"priority": 5, "lastseen": seen, "lifetime": 60}}, "me", 1, now)
    assert is_active({"other": {"priority": 0, "lastseen": seen, "lifetime": 60}}, "me", 1, now)
    assert is_active({"other": {"priority": 9, "lastseen": seen, "lifetime": 5}}, "me", 0, now)
