"""The answer of every safety predicate: truthy when the action is safe, else the reason to
record as a refusal (design.md §3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


SAFE = Verdict(True)


def refuse(reason: str) -> Verdict:
    return Verdict(False, reason)
