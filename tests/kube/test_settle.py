"""An act whose answer was lost is settled by looking at the pod (kube/actions.py
`settled`): gone → `gone`; the act's effect seen → `succeeded`; the pod as it was sent to →
`failed`. The lost-answer path end to end is tests/controller/test_lost_answers.py."""

from __future__ import annotations

from typing import Any

from unstick.kube.actions import GONE, Outcome, settled

UID = "0f10fc4c-3875-40b3-9da7-b14274c3f5a4"
SENT = Outcome("unknown", "sent once, its answer lost")


def _pod(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"uid": UID, "resourceVersion": "7", **meta}}


def _force_delete(pod: dict[str, Any] | None) -> str:
    return settled(pod, UID, action="force-delete", target="p", version="7", sent=SENT).result


def _remove_finalizer(pod: dict[str, Any] | None) -> str:
    k = "example.com/keep"
    return settled(pod, UID, action="remove-finalizer", target=k, version="7", sent=SENT).result


def test_a_pod_gone_or_replaced_settles_as_gone() -> None:
    assert _force_delete(None) == GONE
    assert _force_delete({"metadata": {"uid": "another", "resourceVersion": "9"}}) == GONE
    assert _remove_finalizer(None) == GONE


def test_a_force_delete_settles_by_the_pods_grace_period_and_version() -> None:
    held = _pod(resourceVersion="8", deletionGracePeriodSeconds=0, finalizers=["x/y"])
    assert _force_delete(held) == "succeeded"  # took effect: the finalizer holds it
    assert _force_delete(_pod(deletionGracePeriodSeconds=30)) == "failed"  # as sent: not done
    # grace 0 already when it was sent (a final delete carried out half): not ours
    assert _force_delete(_pod(deletionGracePeriodSeconds=0)) == "failed"


def test_a_finalizer_removal_settles_by_the_finalizer() -> None:
    assert _remove_finalizer(_pod(finalizers=["example.com/other"])) == "succeeded"
    assert _remove_finalizer(_pod(finalizers=["example.com/keep"])) == "failed"
