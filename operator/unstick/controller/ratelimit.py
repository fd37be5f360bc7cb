"""Action budgets (DESIGN §3 invariant 6): token buckets, cluster-wide and per node. Pure.

A bucket holds up to `per_minute` tokens and refills continuously at per_minute/60 per
second. An action takes one token from the cluster bucket AND one from its node's bucket,
or none at all; when over budget the caller learns how long to wait and retries then — a
step over budget waits, it is never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    per_minute: int
    tokens: float = -1.0
    stamp: float | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = float(self.per_minute)

    def _refill(self, now: float) -> None:
        if self.stamp is not None and now > self.stamp:
            rate = self.per_minute / 60.0
            self.tokens = min(float(self.per_minute), self.tokens + (now - self.stamp) * rate)
        if self.stamp is None or now > self.stamp:
            self.stamp = now

    def wait_s(self, now: float) -> float:
        """Seconds until one token is available (0 when one is available now)."""
        self._refill(now)
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) * 60.0 / self.per_minute

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1.0


@dataclass
class ActionBudget:
    cluster_per_minute: int
    node_per_minute: int
    cluster: TokenBucket = field(init=False)
    nodes: dict[str, TokenBucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cluster = TokenBucket(self.cluster_per_minute)

    def reconfigure(self, cluster_per_minute: int, node_per_minute: int) -> None:
        """New limits from the policy; current fill levels are capped to the new sizes."""
        if cluster_per_minute != self.cluster_per_minute:
            self.cluster_per_minute = cluster_per_minute
            self.cluster = TokenBucket(
                cluster_per_minute, min(self.cluster.tokens, cluster_per_minute), self.cluster.stamp
            )
        if node_per_minute != self.node_per_minute:
            self.node_per_minute = node_per_minute
            self.nodes.clear()

    def try_acquire(self, node: str, now: float) -> float:
        """Take one action's budget; 0.0 when granted, else the seconds to wait."""
        bucket = self.nodes.get(node)
        if bucket is None:
            bucket = self.nodes[node] = TokenBucket(self.node_per_minute)
        wait = max(self.cluster.wait_s(now), bucket.wait_s(now))
        if wait > 0:
            return wait
        self.cluster.take(now)
        bucket.take(now)
        return 0.0
