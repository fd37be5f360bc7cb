"""Adopting a dead controller's node incidents (controller/incidents/adoption.py, incidents.py), in
memory: which records are taken, a pod two records list is carried by one, and settling
by looking at the pods."""

from __future__ import annotations

from typing import Any

from unstick.controller.incidents import adoption
from unstick.controller.incidents.registry import Incidents

T = "2026-11-25T09:00:00.000000Z"


def _record(name: str, pods: list[dict[str, Any]], phase: str = "Remediating") -> Any:
    return {
        "metadata": {
            "namespace": "shop",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-25T08:59:00Z",
            "labels": {"pod.unstick.dev/web-0": "", "unstick.dev/node": "n1"},
        },
        "spec": {"nodeName": "n1", "incident": "NodeGone", "dryRun": False},
        "status": {
            "phase": phase,
            "cause": "NodeGone",
            "policy": "default",
            "plan": [{"action": "force-delete", "target": "each pod in status.pods"}],
            "stuckSince": T,
            "pods": pods,
        },
    }


def _pod(name: str, result: str = "", gone: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "uid": f"u-{name}"}
    if result:
        entry.update(action="force-delete", result=result, message="", time=T)
    if gone:
        entry["goneAt"] = T
    return entry


class _NoEvents:
    def post(self, *args: Any, **kwargs: Any) -> None:
        pass


def _incidents() -> Incidents:
    return Incidents(kube=None, events=_NoEvents(), clock=lambda: 1e9)  # type: ignore[arg-type]


def test_only_unresolved_incidents_are_adopted_and_empty_ones_resolved() -> None:
    per_pod = {"spec": {"podName": "x", "podUID": "u"}, "status": {"phase": "Remediating"}}
    items = [
        _record("open", [_pod("web-0", "deleting"), _pod("web-1", gone=True)]),
        _record("done", [_pod("web-2", "succeeded", gone=True)], phase="Resolved"),
        {**_record("empty", []), "status": {}},  # created, never written
        per_pod,
    ]
    adopted, empty = adoption.unresolved(items)
    assert [i.name for i in adopted] == ["open"]
    assert [(e["metadata"]["name"]) for e in empty] == ["empty"]
    inc = adopted[0]
    assert (inc.node, inc.cause, inc.policy) == ("n1", "NodeGone", "default")
    assert inc.pods["u-web-0"].result == "deleting" and inc.pods["u-web-1"].gone_at
    assert inc.labelled == {"pod.unstick.dev/web-0"} and not inc.dirty


def test_a_pod_two_records_list_is_carried_by_the_one_with_its_action() -> None:
    older = _record("older", [_pod("web-0", "deleting")])
    newer = _record("newer", [_pod("web-0"), _pod("web-1")])
    newer["metadata"]["creationTimestamp"] = "2026-11-25T09:00:30Z"
    incidents = _incidents()
    adopted, _ = adoption.unresolved([older, newer])
    incidents.adopt(adopted)
    by_name = {i.name: i for i in adopted}
    assert incidents._by_uid["u-web-0"] is by_name["older"]  # it has the action
    assert incidents._by_uid["u-web-1"] is by_name["newer"]
    # gone: both records note it, only one ever carried its action
    gone, unacted = incidents.settle(lambda uid: uid != "u-web-0", lambda uid: False, 2e9)
    assert (gone, unacted) == (1, [])
    assert by_name["older"].pods["u-web-0"].result == "gone"
    assert by_name["newer"].pods["u-web-0"].gone_at is not None
    assert not by_name["newer"].pods["u-web-0"].action


def test_an_intent_whose_pod_is_still_there_and_was_not_force_deleted_is_withdrawn() -> None:
    rec = _record("open", [_pod("web-0", "deleting"), _pod("web-1", "deleting")])
    incidents = _incidents()
    adopted, _ = adoption.unresolved([rec])
    incidents.adopt(adopted)
    # web-0 still there, never force-deleted; web-1 force-deleted but held by a finalizer
    gone, unacted = incidents.settle(lambda uid: True, lambda uid: uid == "u-web-1", 2e9)
    inc = adopted[0]
    assert gone == 0 and [node for node, _ in unacted] == ["n1"]
    assert inc.pods["u-web-0"].result == "" and inc.pods["u-web-1"].result == "deleting"
    assert inc.dirty  # written again without the withdrawn intent
