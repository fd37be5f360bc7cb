"""The retention's pure decision (controller/retention.removable): which finished
Remediations may go, and which a budget window, an open node incident or a pod still
Terminating keeps."""

from __future__ import annotations

from typing import Any

from unstick.commands.controller import parse_duration
from unstick.controller.retention import (
    last_written,
    open_incident_nodes,
    removable,
    sweep_interval,
)
from unstick.core.remediation import rfc3339

DAY = 86_400.0
WEEK = 7 * DAY
NOW = 1_800_000_000.0


def record(
    phase: str = "Resolved",
    *,
    written: float = NOW - 8 * DAY,
    node: str = "n1",
    uid: str = "u1",
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "r", "namespace": "ns", "creationTimestamp": rfc3339(written)},
        "spec": {"podName": "p", "podUID": uid, "nodeName": node},
        "status": {"phase": phase, **status},
    }


def keeps(rem: dict[str, Any], *, terminating: frozenset[str] = frozenset(),
          nodes: frozenset[str] = frozenset(), retention: float = WEEK) -> bool:  # fmt: skip
    return not removable(
        rem, NOW, retention, terminating=terminating.__contains__, incident_nodes=set(nodes)
    )


def test_a_finished_record_older_than_the_retention_goes() -> None:
    assert not keeps(record("Resolved"))
    assert not keeps(record("Refused"))


def test_an_open_record_stays_however_old() -> None:
    for phase in ("Diagnosing", "Observing", "WaitingForAgent", "Remediating", "Failed", None):
        assert keeps(record(phase))  # type: ignore[arg-type]


def test_zero_keeps_every_record_for_ever() -> None:
    assert keeps(record(), retention=0)


def test_the_newest_time_written_counts_not_the_creation() -> None:
    rem = record(resolvedAt=rfc3339(NOW - DAY))
    assert last_written(rem) == NOW - DAY
    assert keeps(rem)
    # the server's managedFields times count too (a write the controller's keys do not show)
    rem = record()
    rem["metadata"]["managedFields"] = [{"manager": "x", "time": rfc3339(NOW - 60)}]
    assert keeps(rem)
    # the agent's results and a node incident's pods too
    assert keeps(record(nodeActions=[{"action": "unmount", "time": rfc3339(NOW - DAY)}]))
    assert keeps(record(pods=[{"uid": "u9", "goneAt": rfc3339(NOW - DAY)}]))


def test_a_record_with_no_readable_time_stays() -> None:
    rem = record()
    rem["metadata"]["creationTimestamp"] = "yesterday"
    assert last_written(rem) is None
    assert keeps(rem)


def test_a_grant_in_the_budget_window_keeps_it_even_past_a_short_retention() -> None:
    recent = rfc3339(NOW - 30)
    act = {"action": "force-delete", "target": "pod", "result": "succeeded", "time": recent,
           "by": "controller"}  # fmt: skip
    rem = record(actions=[act])
    assert keeps(rem, retention=1)  # the retention alone would let it go
    # a grant recorded ahead of this replica's clock (its writer's clock ran ahead)
    ahead = record(actions=[{**act, "time": rfc3339(NOW + 600)}])
    assert keeps(ahead, retention=1)
    # and the node steps handed to the agent
    handed = record()
    handed["spec"]["nodeStepsRequestedAt"] = rfc3339(NOW - 10)
    assert keeps(handed, retention=1)
    # outside the window: the retention decides
    old = record(actions=[{**act, "time": rfc3339(NOW - 120)}])
    assert not keeps(old, retention=60)


def test_an_open_node_incident_on_its_node_keeps_it() -> None:
    incident = record("Remediating", node="n1")
    incident["spec"]["incident"] = "NodeGone"
    nodes = open_incident_nodes([incident, record(node="n2")])
    assert nodes == {"n1"}
    assert keeps(record(node="n1"), nodes=frozenset(nodes))
    assert not keeps(record(node="n2"), nodes=frozenset(nodes))
    finished = {**incident, "status": {"phase": "Resolved"}}
    assert open_incident_nodes([finished]) == set()


def test_a_record_of_a_pod_still_terminating_stays() -> None:
    assert keeps(record(uid="u1"), terminating=frozenset({"u1"}))
    assert not keeps(record(uid="u1"), terminating=frozenset({"u2"}))
    # a node incident's pods
    incident = record(uid="", pods=[{"name": "a", "uid": "u7"}])
    assert keeps(incident, terminating=frozenset({"u7"}))


def test_the_flag_takes_kubectl_durations() -> None:
    assert parse_duration("168h") == WEEK
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("0") == 0.0
    assert parse_duration("7d") is None  # not a Go duration
    assert parse_duration("h") is None


def test_sweeps_are_hourly_at_most_and_a_minute_apart_at_least() -> None:
    assert sweep_interval(WEEK) == 3600.0
    assert sweep_interval(1) == 60.0


def test_a_bad_retention_is_one_line_and_exit_2() -> None:
    import subprocess
    import sys
    from pathlib import Path

    unstick = Path(sys.executable).parent / "unstick"
    bad = subprocess.run(
        [str(unstick), "controller", "--standalone", "--remediation-retention", "a week"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "unstick controller: --remediation-retention 'a week': not a duration "
        "(e.g. 168h, 30m; 0: keep for ever)"
    ]
