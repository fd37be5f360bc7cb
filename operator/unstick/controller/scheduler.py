"""When to look at a terminating pod again: a heap of wake-up times. Pure, no clock reads.

Each terminating pod gets one due time (first: deletionTimestamp + slack, the moment it
becomes stuck; later: whenever the reconciler asks to look again, e.g. when a probe is
overdue or a rate-limit budget frees up). The controller sleeps until the earliest due
time — no periodic full scans, no per-pod API timers. Rescheduling a key replaces its due
time; stale heap entries are skipped lazily.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class Scheduler:
    _heap: list[tuple[float, int, str]] = field(default_factory=list)
    _due: dict[str, tuple[float, int]] = field(default_factory=dict)
    _seq: int = 0

    def schedule(self, key: str, due: float) -> None:
        """Wake `key` at `due` (epoch seconds), replacing any earlier wish for it."""
        self._seq += 1
        self._due[key] = (due, self._seq)
        heapq.heappush(self._heap, (due, self._seq, key))
        self._compact()

    def schedule_earliest(self, key: str, due: float) -> None:
        """Wake `key` at `due` unless it is already due sooner."""
        current = self._due.get(key)
        if current is None or due < current[0]:
            self.schedule(key, due)

    def cancel(self, key: str) -> None:
        self._due.pop(key, None)

    def due_at(self, key: str) -> float | None:
        entry = self._due.get(key)
        return entry[0] if entry else None

    def next_due(self) -> float | None:
        """The earliest due time, or None when nothing is scheduled."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[str]:
        """Remove and return every key due at or before `now`, earliest first."""
        out: list[str] = []
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                return out
            _, _, key = heapq.heappop(self._heap)
            del self._due[key]
            out.append(key)

    def __len__(self) -> int:
        return len(self._due)

    def _drop_stale(self) -> None:
        while self._heap:
            due, seq, key = self._heap[0]
            if self._due.get(key) == (due, seq):
                return
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._due):
            self._heap = [(d, s, k) for k, (d, s) in self._due.items()]
            heapq.heapify(self._heap)
