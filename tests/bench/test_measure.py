"""The benchmark's measuring pieces, on hand-made audit events (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

from bench.measure import AuditTail, Window, lag_stats, percentile, read_requests, verb_counts


def _ev(verb: str, ua: str, resource: str, name: str, when: str, **extra: object) -> dict:
    return {
        "stage": "ResponseComplete",
        "verb": verb,
        "userAgent": ua,
        "objectRef": {"resource": resource, "name": name, "namespace": "bench"},
        "responseStatus": {"code": extra.pop("code", 200)},
        "requestReceivedTimestamp": when,
        "stageTimestamp": when,
        **extra,
    }


EARLIER = "2025-12-31T23:59:59.000000Z"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) is None
    assert lag_stats([]) == {"lag_p50_s": None, "lag_p99_s": None, "lag_max_s": None}


def test_read_requests_attributes_by_user_agent_and_counts_healthy_writes() -> None:
    t = "2026-01-01T00:00:{:02d}.000000Z".format
    window = Window(start=1767225600.0, ready=1767225601.0, strike=1767225610.0, end=1767225700.0)
    events = [
        # before this contender was started (an earlier run with the same User-Agent)
        {
            **_ev("list", "me/1", "pods", "", t(0)),
            "requestReceivedTimestamp": "2025-12-31T23:59:59.000000Z",
        },
        _ev("list", "me/1", "pods", "", t(0)),  # start-up list: not counted as quiet
        _ev("watch", "me/1", "pods", "", t(0)),
        _ev("list", "me/1", "nodes", "", t(5)),  # a LIST while quiet
        _ev("patch", "me/1", "pods", "h-00001", t(20)),  # a write to a healthy pod
        _ev("delete", "me/1", "pods", "d-00001", t(21), code=404),  # refused: not acted
        _ev("delete", "me/1", "pods", "d-00001", t(22)),
        _ev("delete", "me/1", "pods", "d-00001", t(23)),  # second delete: first one counts
        _ev("create", "me/1", "remediations", "d-00001-abcdef12", t(21), code=201),
        _ev("delete", "other/1", "pods", "h-00002", t(24)),  # someone else: ignored
        {**_ev("get", "me/1", "pods", "d-00001", t(25)), "stage": "ResponseStarted"},
    ]
    req = read_requests(events, ("me/",), window)
    counts = verb_counts(req.by_verb)
    assert counts["list"] == 2 and counts["watch"] == 1 and counts["delete"] == 3
    assert counts["get"] == 0 and counts["create"] == 1
    assert req.lists_while_quiet == 1
    assert req.writes_to_healthy == 1
    assert req.first_delete == {"d-00001": 1767225622.0}
    assert req.remediation_created == {"d-00001-abcdef12": 1767225621.0}


def test_audit_tail_returns_only_complete_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text('{"a": 1}\n{"b"')
    tail = AuditTail(log)
    assert list(tail.new_events()) == [{"a": 1}]
    with log.open("a") as f:
        f.write(': 2}\n{"c": 3}\n')
    assert list(tail.new_events()) == [{"b": 2}, {"c": 3}]
    assert list(tail.new_events()) == []
