"""The benchmark's measuring pieces, on hand-made audit events (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

from bench.measure import (
    AuditTail,
    LoadSampler,
    Window,
    detection_lags,
    lag_stats,
    load_stats,
    percentile,
    read_requests,
    verb_counts,
)
from devcluster.process import wait_until


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


def test_requests_about_finalizer_pods_are_not_the_nodegone_handling() -> None:
    t = "2026-01-01T00:00:{:02d}.000000Z".format
    window = Window(
        start=1767225600.0,
        ready=1767225601.0,
        strike=1767225610.0,
        end=1767225700.0,
        burst_end=1767225630.0,
    )
    mine = [
        _ev("list", "me/1", "pods", "", t(5)),  # before the strike: not counted
        _ev("watch", "me/1", "pods", "", t(12)),  # a WATCH: never counted
        # about the finalizer-held pod f-00001: its GET, Remediation, status, Event
        _ev("get", "me/1", "pods", "f-00001", t(12)),
        _ev("create", "me/1", "remediations", "f-00001-abcdef12", t(12)),
        {**_ev("patch", "me/1", "remediations", "f-00001-abcdef12", t(13)),
         "objectRef": {"resource": "remediations", "subresource": "status",
                       "name": "f-00001-abcdef12"}},
        _ev("create", "me/1", "events", "f-00001.0123456789ab", t(13)),
        # the NodeGone pods' handling: their node, pods, Remediations, Events, the rest
        _ev("get", "me/1", "nodes", "doomed-1", t(14)),
        _ev("delete", "me/1", "pods", "d-00001", t(14)),
        _ev("delete", "me/1", "pods", "d-00002", t(14)),
        _ev("create", "me/1", "remediations", "d-00001-0badc0de", t(14)),
        _ev("create", "me/1", "events", "doomed-1.0123456789ab", t(15)),
        _ev("list", "me/1", "remediations", "", t(15)),
        _ev("get", "me/1", "pods", "h-00007", t(16)),  # about a healthy pod
    ]  # fmt: skip
    others = [
        # every client's requests in the burst (strike → burst_end) are the API server's
        {**_ev("patch", "kwok/1", "pods", "h-00001", t(20)), "stageTimestamp": t(22)},
        {**_ev("watch", "kwok/1", "pods", "", t(20)), "stageTimestamp": t(50)},  # a WATCH
        _ev("get", "kwok/1", "pods", "h-00001", t(40)),  # after the burst
    ]
    req = read_requests(mine + others, ("me/",), window)
    assert req.after_strike == 11
    assert req.nodegone_after_strike == 7
    assert req.about_healthy == 1
    assert sorted(req.server_s_burst_all_clients) == [0.0] * 11 + [2.0]


def test_detection_lags_are_read_from_the_controllers_log(tmp_path: Path) -> None:
    log = tmp_path / "unstick.log"
    log.write_text(
        "2026-11-22 16:51:24,011 INFO unstick.decisions: pod=bench/f-00000 uid=5e "
        "cause=FinalizerBlocked action=detect result=stuck detection_lag=0.007s\n"
        "2026-11-22 16:51:24,012 INFO unstick.decisions: pod=bench/d-00004 uid=70 "
        "cause=NodeGone action=force-delete result=done\n"
        "2026-11-22 16:51:24,013 INFO unstick.decisions: pod=bench/d-00002 uid=eb "
        "cause=NodeGone action=detect result=stuck detection_lag=1.250s\n"
    )
    assert detection_lags(log) == [0.007, 1.25]
    assert detection_lags(tmp_path / "missing.log") == []


def test_load_sampler_reports_the_machines_load_over_a_window() -> None:
    sampler = LoadSampler(interval_s=0.01).start()
    wait_until(lambda: len(sampler.samples) >= 3, timeout=10, what="three load samples")
    sampler.stop()
    stats = sampler.stats()
    assert stats["load_samples"] == len(sampler.samples) >= 3
    assert stats["load_1min_max"] is not None and stats["load_1min_max"] >= 0
    assert sampler.stats(0.0, 1.0) == {
        "load_1min_max": None,
        "load_1min_mean": None,
        "load_samples": 0,
    }
    assert load_stats([1.0, 2.0, 4.5]) == {
        "load_1min_max": 4.5,
        "load_1min_mean": 2.5,
        "load_samples": 3,
    }
