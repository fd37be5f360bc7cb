"""Every alert the chart can ship has a `runbook_url` that points at a section of
docs/runbooks.md, and that section says what it means, how to look and what to do."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from devcluster.prometheus import render_chart

ROOT = Path(__file__).parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
BASE = "https://example.test/runbooks.md"


def _helm() -> Path:
    for candidate in (ROOT / "bin" / "helm", Path(shutil.which("helm") or "/nonexistent")):
        if candidate.exists():
            return candidate
    pytest.skip("helm not built (make tools)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    return {_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_alert_has_a_runbook_section() -> None:
    values = {"prometheusRule": {"kubeStateMetrics": True, "runbookBaseUrl": BASE}}
    groups = render_chart(_helm(), values).rule_groups
    rules: list[dict[str, Any]] = [r for g in groups for r in g["rules"] if "alert" in r]
    sections = _sections()
    assert len(rules) >= 8
    for rule in rules:
        url = rule["annotations"].get("runbook_url", "")
        base, _, anchor = url.partition("#")
        assert base == BASE, (rule["alert"], url)
        assert anchor == rule["alert"].lower(), (rule["alert"], url)
        body = sections.get(anchor)
        assert body is not None, f"docs/runbooks.md has no section for {rule['alert']}"
        for part in ("**What it means.**", "**How to look.**", "**What to do.**"):
            assert part in body, f"{rule['alert']}: no {part}"
        assert "kubectl" in body, rule["alert"]


def test_runbook_links_inside_the_page_resolve() -> None:
    sections = _sections()
    for target in re.findall(r"\]\(#([\w-]+)\)", RUNBOOKS.read_text()):
        assert target in sections, f"link to #{target} has no section"
