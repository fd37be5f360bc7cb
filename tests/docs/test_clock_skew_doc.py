"""Issue 33 finding 10: the clock-skew rule is written once, in docs/diagnosis.md's
"Clock skew" section, with the value core defines (`core/safety.py` MAX_CLOCK_SKEW_S); the
controller's and the agent's docs link to it instead of stating their own number (they
once said 10 s while docs/diagnosis.md said probeMaxAge, 120 s)."""

from __future__ import annotations

import re
from pathlib import Path

from unstick.core.safety import MAX_CLOCK_SKEW_S

DOCS = Path(__file__).resolve().parents[2] / "docs"
LINK = "diagnosis.md#clock-skew"


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_diagnosis_md_writes_the_rule_with_cores_value() -> None:
    text = (DOCS / "diagnosis.md").read_text()
    rule = _section(text, "Clock skew")
    assert f"{MAX_CLOCK_SKEW_S:.0f} s" in rule and "MAX_CLOCK_SKEW_S" in rule
    assert "from the future by more than\n  probeMaxAge" not in text
    assert "future by more than probeMaxAge" not in " ".join(text.split())


def test_controller_and_agent_docs_link_to_it_without_a_number_of_their_own() -> None:
    for name in ("controller.md", "agent.md"):
        text = " ".join((DOCS / name).read_text().split())
        assert LINK in text, name
        for mention in re.finditer(r"clock[ -]skew", text):
            around = text[max(0, mention.start() - 150) : mention.end() + 150]
            assert not re.search(r"\b10 ?s\b", around), (name, around)
