"""One line of a diagnosis's evidence: what was seen, and where (docs/design.md §1-2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Evidence:
    kind: (
        str  # deletion | finalizer | node | probe | container | runtime | mount | holder | driver
        # | volumeDir | kubelet | freezer | task | network
    )
    message: str
