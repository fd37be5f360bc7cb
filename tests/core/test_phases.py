"""The Remediation's lifecycle (core/remediation.py `Phase`, `TRANSITIONS`, `may_follow`):
which phase the controller may write over which. That every phase is in the CRD's schema
is tests/chart/test_crds.py."""

from __future__ import annotations

import json

from unstick.core.remediation import (
    FINAL_PHASES,
    PASS_PHASES,
    TRANSITIONS,
    Phase,
    may_follow,
)


def test_the_words_are_the_json_words() -> None:
    assert json.dumps({"phase": Phase.WaitingForAgent}) == '{"phase": "WaitingForAgent"}'
    assert all(str(phase) == phase.name == phase.value for phase in Phase)
    assert "Resolved" in FINAL_PHASES and {"Resolved": 1}.get(Phase.Resolved) == 1


def test_every_phase_is_a_pass_phase_a_final_one_or_diagnosing() -> None:
    assert PASS_PHASES.isdisjoint(FINAL_PHASES)
    assert PASS_PHASES | FINAL_PHASES | {Phase.Diagnosing} == set(Phase)
    assert set(TRANSITIONS) == {None, *Phase}


def test_a_new_record_takes_any_phase_but_diagnosing() -> None:
    for phase in Phase:
        assert may_follow(None, phase) is (phase is not Phase.Diagnosing)


def test_nothing_ever_goes_back_to_diagnosing() -> None:
    for before in [None, *Phase]:
        assert may_follow(before, Phase.Diagnosing) is (before is Phase.Diagnosing)


def test_a_pass_decides_again_each_time_and_its_pod_may_go_or_its_record_be_refused() -> None:
    for before in PASS_PHASES:
        for after in Phase:
            assert may_follow(before, after) is (after is not Phase.Diagnosing), (before, after)


def test_a_resolved_record_is_reopened_only_by_a_node_incident_or_refused() -> None:
    allowed = {after for after in Phase if may_follow(Phase.Resolved, after)}
    assert allowed == {Phase.Resolved, Phase.Remediating, Phase.Refused}


def test_a_refused_record_of_a_pod_stuck_later_is_that_pods_record() -> None:
    for after in PASS_PHASES | {Phase.Resolved, Phase.Refused}:
        assert may_follow(Phase.Refused, after)


def test_the_same_phase_again_is_no_transition() -> None:
    for phase in Phase:
        assert may_follow(phase, phase)
        assert may_follow(str(phase), phase)  # as read from a record's JSON


def test_a_word_that_is_no_phase_counts_as_no_phase_yet() -> None:
    for before in ("", "Bogus", 7, {"phase": "Resolved"}):
        for after in Phase:
            assert may_follow(before, after) is may_follow(None, after)
