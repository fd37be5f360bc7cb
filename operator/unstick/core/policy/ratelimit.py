"""Action budgets (design.md §3 invariant 6): cluster-wide and per node, actions per minute.
Pure: the caller passes `now` (seconds on any clock).

A sliding window: an action is granted only if fewer than the limit were granted in the
last 60 s — cluster-wide AND on its node — so no 60 s window ever holds more than the
limit (a token bucket would let a full burst plus a full refill through in one minute).

The windows are shared by every policy, and the strictest limit holds: a request is
checked against the smallest of its own policy's limit, the limits of every policy that
took a grant still in the window (cluster-wide for the cluster limit, on the node for the
node limit), and the caps (the controller's flags, which no policy can raise). So after
a strict policy's grants, a pod naming a permissive policy gets nothing more in the same
minute than the strict policy allows. Hence no 60 s window ever holds more grants than
the strictest limit among the policies that took grants in it, nor more than the caps.

When over budget the caller learns how long to wait and retries then — a step waits, it
is never dropped. (The wait is an upper bound: a strict grant leaving the window can only
loosen the limit.) `record` puts back grants made before a restart or by another replica
(read from the Remediations), so a restart or failover does not reset the budget.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 60.0
#: Caps when the controller sets none (its flags `--max-actions-per-minute` and
#: `--max-node-actions-per-minute` have the same defaults).
DEFAULT_CLUSTER_CAP = 60
DEFAULT_NODE_CAP = 10


@dataclass(frozen=True, slots=True)
class Grant:
    at: float
    limit: int  # the limit of the policy that took it, for the window it is in


@dataclass
class SlidingWindow:
    granted: deque[Grant] = field(default_factory=deque)  # oldest first

    def _expire(self, now: float) -> None:
        while self.granted and self.granted[0].at <= now - WINDOW_S:
            self.granted.popleft()

    def limit(self, now: float, own: int) -> int:
        """The strictest of `own` and the limits of the grants in the window."""
        self._expire(now)
        return min([own, *(g.limit for g in self.granted)])

    def wait_s(self, now: float, own: int) -> float:
        """Seconds until one more grant fits (0 when it fits now)."""
        limit = self.limit(now, own)
        if len(self.granted) < limit:
            return 0.0
        return max(self.granted[len(self.granted) - limit].at + WINDOW_S - now, 1e-3)

    def remove(self, at: float) -> None:
        """Drop one grant made at `at` (none: nothing happens)."""
        for grant in self.granted:
            if grant.at == at:
                self.granted.remove(grant)
                return

    def add(self, grant: Grant) -> None:
        if not self.granted or self.granted[-1].at <= grant.at:
            self.granted.append(grant)
            return
        items = list(self.granted)  # a recorded past grant: keep the order by time
        bisect.insort(items, grant, key=lambda g: g.at)
        self.granted = deque(items)


@dataclass
class ActionBudget:
    cluster_cap: int = DEFAULT_CLUSTER_CAP
    node_cap: int = DEFAULT_NODE_CAP
    cluster: SlidingWindow = field(default_factory=SlidingWindow)
    nodes: dict[str, SlidingWindow] = field(default_factory=dict)

    def try_acquire(
        self, node: str, now: float, cluster_per_minute: int, node_per_minute: int
    ) -> float:
        """Take one action's budget for a policy with these limits; 0.0 when granted,
        else the seconds to wait."""
        wait = self.peek(node, now, cluster_per_minute, node_per_minute)
        if wait > 0:
            return wait
        cluster_limit = min(cluster_per_minute, self.cluster_cap)
        node_limit = min(node_per_minute, self.node_cap)
        self._add(node, Grant(now, cluster_limit), Grant(now, node_limit))
        return 0.0

    def peek(self, node: str, now: float, cluster_per_minute: int, node_per_minute: int) -> float:
        """What `try_acquire` would answer, without taking anything (0.0: it would grant)."""
        cluster_limit = min(cluster_per_minute, self.cluster_cap)
        node_limit = min(node_per_minute, self.node_cap)
        window = self.nodes.get(node) or SlidingWindow()
        return max(self.cluster.wait_s(now, cluster_limit), window.wait_s(now, node_limit))

    def record(self, node: str, at: float, cluster_per_minute: int, node_per_minute: int) -> None:
        """A grant made at `at` elsewhere (before a restart, by another replica): it counts
        in the windows, and its policy's limits with it."""
        self._add(
            node,
            Grant(at, min(cluster_per_minute, self.cluster_cap)),
            Grant(at, min(node_per_minute, self.node_cap)),
        )

    def release(self, node: str, at: float) -> None:
        """Give back a grant made at `at` whose action was not carried out (the API server
        refused it: the object had changed since it was read)."""
        self.cluster.remove(at)
        window = self.nodes.get(node)
        if window is not None:
            window.remove(at)

    def _add(self, node: str, in_cluster: Grant, on_node: Grant) -> None:
        self.cluster.add(in_cluster)
        self.nodes.setdefault(node, SlidingWindow()).add(on_node)
        if len(self.nodes) > 64:  # forget nodes with nothing in their window
            for name in [n for n, w in self.nodes.items() if n != node and not w.granted]:
                del self.nodes[name]
