"""Action budgets (DESIGN §3 invariant 6): cluster-wide and per node, actions per minute.
Pure: the caller passes `now` (seconds on any clock).

A sliding window: an action is granted only if fewer than the limit were granted in the
last 60 s — cluster-wide AND on its node — so no 60 s window ever holds more than the
limit (a token bucket would let a full burst plus a full refill through in one minute).
The windows are shared by every policy: the cluster-wide budget is really cluster-wide;
each request is checked against the limits of the policy it acts for. When over budget
the caller learns how long to wait and retries then — a step waits, it is never dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 60.0


@dataclass
class SlidingWindow:
    granted: deque[float] = field(default_factory=deque)  # grant times, oldest first

    def _expire(self, now: float) -> None:
        while self.granted and self.granted[0] <= now - WINDOW_S:
            self.granted.popleft()

    def wait_s(self, now: float, limit: int) -> float:
        """Seconds until one more grant fits under `limit` (0 when it fits now)."""
        self._expire(now)
        if len(self.granted) < limit:
            return 0.0
        return max(self.granted[len(self.granted) - limit] + WINDOW_S - now, 1e-3)

    def add(self, now: float) -> None:
        self.granted.append(now)


@dataclass
class ActionBudget:
    cluster: SlidingWindow = field(default_factory=SlidingWindow)
    nodes: dict[str, SlidingWindow] = field(default_factory=dict)

    def try_acquire(
        self, node: str, now: float, cluster_per_minute: int, node_per_minute: int
    ) -> float:
        """Take one action's budget; 0.0 when granted, else the seconds to wait."""
        window = self.nodes.setdefault(node, SlidingWindow())
        wait = max(
            self.cluster.wait_s(now, cluster_per_minute), window.wait_s(now, node_per_minute)
        )
        if wait > 0:
            return wait
        self.cluster.add(now)
        window.add(now)
        if len(self.nodes) > 64:  # forget nodes with nothing in their window
            for name in [n for n, w in self.nodes.items() if n != node and not w.granted]:
                del self.nodes[name]
        return 0.0
