"""The demo's live table: one row per scenario — cause, actions, outcome."""

from __future__ import annotations

from dataclasses import dataclass

from devcluster.demo.scenarios import Scenario

_WIDTHS = (10, 8, 25, 36, 64, 17)
_HEADER = ("POD", "NODE", "WHAT HAPPENED", "CAUSE", "ACTIONS (✓ succeeded)", "OUTCOME")


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    diagnoses: tuple[tuple[str, str], ...]  # every (cause, plan) of the pod, first one first
    phase: str
    actions: str  # actions carried out, with results, in order
    pod_gone: bool
    kubelet: str = ""  # the real kubelet's last log line about the pod's volumes
    # an action on record whose answer is not recorded yet: the controller's intent, or node
    # steps whose agent's answer is not in status.actions (run.py answer_recorded)
    pending: bool = False

    @property
    def causes(self) -> tuple[str, ...]:
        return tuple(cause for cause, _ in self.diagnoses)

    @property
    def plan(self) -> str:
        return ", then ".join(plan for _, plan in self.diagnoses if plan)

    @property
    def done(self) -> bool:
        """The expected outcome is reached (left-alone pods: diagnosed and observed) and
        every action on record has its answer (record before act: an intent comes first)."""
        if self.pending:
            return False
        if self.scenario.fixed:
            return self.pod_gone
        return self.causes[-1:] == (self.scenario.cause,) and self.phase in (
            "Observing",
            "Resolved",
        )

    @property
    def outcome(self) -> str:
        if self.done:
            return "✔ fixed: pod gone" if self.scenario.fixed else "✔ left alone"
        return f"… {self.phase or 'not stuck yet'}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render(rows: list[Row], elapsed_s: float) -> str:
    lines = [
        f"unstick demo — {elapsed_s:5.1f}s — stuck pods and what unstick does about them",
        "",
        "  ".join(h.ljust(w) for h, w in zip(_HEADER, _WIDTHS, strict=True)),
    ]
    for row in rows:
        cells = (
            row.scenario.pod,
            row.scenario.node.removeprefix("node-"),
            row.scenario.title,
            "→".join(row.causes) or "—",
            row.actions or (f"plan: {row.plan}" if row.plan else "—"),
            row.outcome,
        )
        lines.append(
            "  ".join(_cut(c, w).ljust(w) for c, w in zip(cells, _WIDTHS, strict=True)).rstrip()
        )
        if row.kubelet:
            lines.append(f"{'':{_WIDTHS[0]}}  └ kubelet: {_cut(row.kubelet, sum(_WIDTHS))}")
    return "\n".join(lines)
