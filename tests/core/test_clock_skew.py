"""Issue 33 finding 10: one clock-skew rule (docs/diagnosis.md#clock-skew), defined once in
core (`core/safety.py`: MAX_CLOCK_SKEW_S and `clock_skew`) and applied by every reader of a
time another clock wrote: the controller (a probe's probedAt, bound to its request), the
agent (a request's nodeStepsRequestedAt) and `unstick diagnose` on a snapshot taken on a
workstation whose clock lags the node's (its capturedAt is the reader's clock)."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from tests.support.bundles import bundle, probe
from unstick.agent.settings import AgentSettings
from unstick.core.model.snapshot import parse_bundle
from unstick.core.rules.diagnosis import diagnose
from unstick.core.safety import MAX_CLOCK_SKEW_S, bound_probe, clock_skew, fresh_probe
from unstick.core.vocabulary import Cause

NOW = datetime.fromisoformat("2026-11-20T10:00:00+00:00")
UID = "u-1"


@given(st.floats(min_value=-3600, max_value=3600))
def test_one_rule_a_time_of_another_clock_may_be_at_most_the_skew_ahead(ahead_s: float) -> None:
    at = NOW + timedelta(seconds=ahead_s)
    within = ahead_s <= MAX_CLOCK_SKEW_S
    assert bool(clock_skew(at, NOW)) == within
    # the controller's freshness (invariant 1) and binding (invariant 7) apply that rule
    assert bool(fresh_probe("n1", at, "n1", NOW, 7200)) == within
    requested = NOW
    bound = bound_probe(UID, "n1", NOW, pod_uid=UID, node="n1", requested_at=at)
    assert bool(bound) == within  # the probe's clock behind the request's by at most that
    assert bool(fresh_probe("n1", at, "n1", NOW, 7200)) == bool(clock_skew(at, requested))


def test_the_agent_applies_the_same_skew_to_a_request() -> None:
    assert AgentSettings(node_name="n1").max_request_skew_s == MAX_CLOCK_SKEW_S


def test_a_snapshot_from_a_lagging_workstation_says_whose_clock_and_which_rule() -> None:
    """`unstick snapshot` on a workstation 30 s behind the node: the probe it carries was
    taken 30 s "after" capturedAt. Beyond the rule's 10 s it is no evidence of now — the
    same answer the controller would give — and the evidence says which clock to check."""
    b = bundle(the_probe=probe(probed_at="2026-11-20T10:00:30Z"))  # capturedAt 10:00:00Z
    d = diagnose(parse_bundle(b))
    assert d.cause is Cause.Unknown
    words = " | ".join(e.message for e in d.evidence)
    assert (
        "probe ignored: the probe of node node-1 is 30s in the future of the reader's clock, "
        "more than the 10s of clock skew allowed (docs/diagnosis.md#clock-skew)" in words
    )
    assert "is the reader's clock (capturedAt: the workstation that took a snapshot?)" in words
    lagging_5s = bundle(the_probe=probe(probed_at="2026-11-20T10:00:05Z"))
    assert "probe ignored" not in str(diagnose(parse_bundle(lagging_5s)).evidence)
