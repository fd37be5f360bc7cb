"""Every scenario bundle gives its `expect`: the shared ones (design.md's examples) and ours."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.mandate import opted_in
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.diagnosis import diagnose

REPO = Path(__file__).resolve().parents[2]
OURS = REPO / "tests" / "scenarios"
SHARED = Path(os.environ.get("UNSTICK_SCENARIOS", REPO.parent / "shared" / "scenarios"))


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def check(bundle: dict[str, Any]) -> None:
    expect = bundle["expect"]
    facts = parse_bundle(bundle)
    if "policy" in expect:
        policy = parse_policy(expect["policy"])
        d = diagnose(facts, policy.settings)
        consent = bool(opted_in(facts.pod.annotations, None, policy.name))
        p = plan(d, policy, opted_in=consent)
    else:
        d = diagnose(facts)
        p = plan(d, None)
    planned = [s.action.value for s in p.steps]
    refused = {r.action.value for r in p.refused}
    context = f"planned {planned}, refused {sorted(refused)}, evidence {d.evidence}"
    assert d.cause.value == expect["cause"], context
    if expect.get("planAnyOf"):
        assert set(planned) & set(expect["planAnyOf"]), context
    assert not set(planned) & set(expect.get("mustNotPlan", [])), context
    if "plan" in expect:
        assert planned == expect["plan"], context
    assert set(expect.get("refused", [])) <= refused, context
    messages = " | ".join(ev.message for ev in d.evidence)
    for text in expect.get("evidence", []):
        assert text in messages, context


@pytest.mark.parametrize("path", _files(SHARED), ids=lambda p: p.stem)
def test_shared_scenario(path: Path) -> None:
    check(json.loads(path.read_text()))


def test_shared_scenarios_exist() -> None:
    if not _files(SHARED):
        pytest.skip(f"no shared scenarios at {SHARED} (set UNSTICK_SCENARIOS to their directory)")


@pytest.mark.parametrize("path", _files(OURS), ids=lambda p: p.stem)
def test_our_scenario(path: Path) -> None:
    check(json.loads(path.read_text()))


def test_every_cause_has_at_least_two_of_our_scenarios() -> None:
    from unstick.core.vocabulary import Cause

    causes = [json.loads(p.read_text())["expect"]["cause"] for p in _files(OURS)]
    for cause in Cause:
        assert causes.count(cause.value) >= 2, cause


def test_committed_scenarios_are_generated() -> None:
    from tests.core import generate_scenarios

    cases = generate_scenarios.cases()
    assert {p.stem for p in _files(OURS)} == set(cases)
    for name, b in cases.items():
        assert (OURS / f"{name}.json").read_text() == generate_scenarios.render(b), name
