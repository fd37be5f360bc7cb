"""Diagnosis.node_lost_at: when a not-Ready node will count as lost (design.md §2 rule 3), so
the controller looks at its stuck pods again then — nothing about the Node changes at that
moment to poke it (found with the real kubelet: the diagnosis stayed ContainersStillRunning
until the 300 s re-check)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.support.bundles import bundle, node
from unstick.core.model.snapshot import parse_bundle
from unstick.core.rules.diagnosis import diagnose
from unstick.core.rules.settings import DiagnosisSettings
from unstick.core.vocabulary import Cause

# the bundles' capturedAt is 2026-11-20T10:00:00Z


def lost_at(the_node: dict[str, Any] | None, node_lost_after_s: float = 300) -> datetime | None:
    settings = DiagnosisSettings(node_lost_after_s=node_lost_after_s)
    return diagnose(parse_bundle(bundle(the_node=the_node)), settings).node_lost_at


def test_a_node_not_ready_for_less_than_node_lost_after_is_lost_later() -> None:
    down = node(ready="Unknown", since="2026-11-20T09:59:50Z")
    assert lost_at(down, 30) == datetime(2026, 11, 20, 10, 0, 20, tzinfo=UTC)
    d = diagnose(parse_bundle(bundle(the_node=down)), DiagnosisSettings(node_lost_after_s=30))
    assert d.cause is not Cause.NodeUnreachable


def test_no_moment_for_a_ready_node_a_lost_one_or_none() -> None:
    assert lost_at(node(ready="True", since="2026-11-20T09:59:50Z"), 30) is None
    assert lost_at(node(ready="False", since="2026-11-20T09:55:00Z")) is None  # lost already
    assert lost_at(None) is None


def test_a_node_without_ready_counts_from_its_creation() -> None:
    young = node(ready=None, created="2026-11-20T09:58:00Z")
    assert lost_at(young) == datetime(2026, 11, 20, 10, 3, 0, tzinfo=UTC)
