"""The controller's copies of the pods' Remediations (controller/records/copies.py): the newest
version offered wins, per record name; what a caller gets is its own copy."""

from __future__ import annotations

from typing import Any

from unstick.controller.records.copies import RemediationCopies


def _rem(version: str, name: str = "p-1234abcd", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": version},
        "spec": {"podUID": "uid-1"},
        "status": status,
    }


def _kept_phase(copies: RemediationCopies, *offered: dict[str, Any]) -> str:
    """Offer these versions in turn; the phase of the copy kept of p-1234abcd."""
    for rem in offered:
        copies.offer(rem)
    kept = copies.get("ns", "p-1234abcd")
    assert kept is not None
    return str(kept["status"]["phase"])


def test_the_newest_version_wins_whatever_the_order_offered() -> None:
    copies = RemediationCopies()
    ours, watched = _rem("12", phase="Remediating"), _rem("9", phase="WaitingForAgent")
    assert _kept_phase(copies, ours, watched) == "Remediating"  # the watch, behind our write
    assert _kept_phase(copies, _rem("13", phase="Resolved")) == "Resolved"


def test_a_version_that_is_not_a_number_is_taken_as_offered_last() -> None:
    copies = RemediationCopies()
    assert _kept_phase(copies, _rem("12", phase="a"), _rem("x7", phase="b")) == "b"


def test_another_record_claiming_the_same_pod_never_replaces_the_copy() -> None:
    forged = _rem("99", name="forged", phase="Resolved")
    assert (
        _kept_phase(RemediationCopies(), _rem("12", phase="Remediating"), forged) == "Remediating"
    )


def test_the_caller_gets_its_own_copy_and_a_dropped_record_is_gone() -> None:
    copies = RemediationCopies()
    copies.offer(_rem("12", actions=[{"action": "observe"}]))
    mine = copies.get("ns", "p-1234abcd")
    assert mine is not None
    mine["status"]["actions"].append({"action": "force-delete"})
    again = copies.get("ns", "p-1234abcd")
    assert again is not None and again["status"]["actions"] == [{"action": "observe"}]
    copies.drop("ns", "p-1234abcd")
    assert copies.get("ns", "p-1234abcd") is None


def test_objects_without_a_name_or_version_are_not_kept() -> None:
    copies = RemediationCopies()
    copies.offer({"metadata": {"namespace": "ns", "name": "a"}})
    copies.offer({"metadata": {"resourceVersion": "3"}})
    assert len(copies) == 0


def test_an_equal_version_offered_again_keeps_the_first_copy() -> None:
    """The answer to our own write is offered first, its watch event later: the same
    version, not copied again (issue 23, fifth round)."""
    copies = RemediationCopies()
    copies.offer(_rem("12", phase="Remediating"))
    copies.offer(_rem("12", phase="not this one"))
    kept = copies.get("ns", "p-1234abcd")
    assert kept is not None and kept["status"]["phase"] == "Remediating"
