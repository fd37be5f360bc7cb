"""The controller judges the API server's timestamps in the API server's time (issue #31):
a NodeGone pod's slack counts from its `deletionTimestamp`, which the API server wrote on
its clock; a controller whose wall clock is 20 s ahead must not find it up 20 s early
(deciding/detector.py hands the core a `now` corrected by kube/server_clock.py), nor one
20 s behind 20 s late. The real controller with its clock 20 s ahead:
test_leader_election.py::test_a_controller_ahead_waits_out_the_slack_by_the_servers_clock."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from tests.support import bundles
from tests.support.detectors import node_gone_detector
from unstick.core.remediation import parse_time
from unstick.kube.podwatch import terminating_record
from unstick.kube.server_clock import ServerClock

SLACK_S = 30.0
DELETED = parse_time("2026-11-20T09:45:00Z")  # bundles.pod's deletionTimestamp


def clock_off_by(ahead_s: float) -> ServerClock:
    """A ServerClock that measured this replica's clock `ahead_s` ahead of the server's."""
    clock = ServerClock()
    for i in range(20):  # answers at every tenth of a second: the bound narrows
        sent = DELETED + i * 0.13
        clock.answered(sent, sent + 0.01, formatdate(int(sent - ahead_s), usegmt=True))
    return clock


@pytest.mark.parametrize("ahead_s", [20.0, -20.0, 0.0])
def test_the_slack_ends_by_the_servers_clock(ahead_s: float) -> None:
    spec = {"actions": ["force-delete"], "slackSeconds": SLACK_S, "nodeLostAfterSeconds": 1}
    detector = node_gone_detector({"default": spec}, server_clock=clock_off_by(ahead_s))
    pod = bundles.pod(opt_in="true")
    record = terminating_record(pod)
    assert record is not None
    due = detector.due(record, SLACK_S)
    # never before the server's clock says the slack is up, and not a second after it
    assert DELETED + SLACK_S + ahead_s <= due <= DELETED + SLACK_S + ahead_s + 1.0
    stuck = lambda local: detector.decide(pod, None, local, None).diagnosis.stuck  # noqa: E731
    assert not stuck(DELETED + SLACK_S + ahead_s - 0.5)
    assert stuck(due + 1.0)  # strictly past the slack (core/rules/diagnosis.py)
    if ahead_s > 0:  # by its own clock the slack was up 20 s before: not by the server's
        assert not stuck(DELETED + SLACK_S + 1.0)
