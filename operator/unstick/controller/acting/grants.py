"""The controller's action budget (design.md §3 invariant 6): one ActionBudget shared by
all policies and passes (the strictest limit in a window and the caps hold), behind one
lock. A slot is taken only for an action carried out and counts from its time plus
ACT_WITHIN_S (controller/acting/budget_rebuild.py: a restarted controller counts a
recorded grant the same way)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from unstick.controller.acting import budget_rebuild as budget
from unstick.controller.deciding.policies import BUILTIN, Policy
from unstick.core.policy.ratelimit import ActionBudget
from unstick.kube.client import JSON

log = logging.getLogger(__name__)

NO_NODE = "(none)"


class Grants:
    def __init__(self, cluster_cap: int, node_cap: int) -> None:
        self.budget = ActionBudget(cluster_cap=cluster_cap, node_cap=node_cap)
        self.lock = threading.Lock()
        # Rebuilt grants that count from another time than the one on record + ACT_WITHIN_S
        # (recorded ahead of this clock, or stored later by the API server):
        # (node, time on record) → the time they count from, so a give-back of the
        # recorded time finds them.
        self.moved: dict[tuple[str, float], float] = {}

    def take(self, policy: Policy, node: str, now: float) -> float:
        """One slot (0.0) or the seconds to wait. The slot counts from `now` +
        ACT_WITHIN_S: the act follows within that long, and a restarted controller counts
        the grant recorded at `now` as made then too (budget_rebuild.py)."""
        limits = (policy.cluster_per_minute, policy.node_per_minute)
        with self.lock:
            wait = self.budget.peek(node or NO_NODE, now, *limits)
            if wait <= 0:
                self.budget.record(node or NO_NODE, now + budget.ACT_WITHIN_S, *limits)
            return wait

    def wait(self, policy: Policy, node: str, now: float) -> float:
        """Only a look (no slot taken): the seconds until `policy` may act on `node`."""
        with self.lock:
            return self.budget.peek(
                node or NO_NODE, now, policy.cluster_per_minute, policy.node_per_minute
            )

    def give_back(self, node: str, slot: float) -> None:
        """The act taken at `slot` was not carried out (the API server refused it, or a
        rebuilt grant's act did not take effect: incidents/adoption.py)."""
        node = node or NO_NODE
        with self.lock:
            at = self.moved.pop((node, slot), slot + budget.ACT_WITHIN_S)
            self.budget.release(node, at)

    def rebuild(
        self,
        remediations: list[JSON],
        now: float,
        lookup: Callable[[str], Policy | None],
        local_at: Callable[[float], float] = lambda server: server,
    ) -> int:
        """Put back the grants of the last minute recorded in `remediations` (a restart or
        failover does not reset the budget; controller/acting/budget_rebuild.py); returns
        their count. A grant keeps the limits of its recorded policy when `lookup` knows it.
        `local_at`: the local instant of an API server time (kube/server_clock.py)."""
        grants = list(budget.recent_grants(remediations, now, local_at))
        with self.lock:
            for g in grants:
                limits = (lookup(g.policy) if g.policy else None) or BUILTIN
                self.budget.record(g.node, g.at, limits.cluster_per_minute, limits.node_per_minute)
                if g.at != g.recorded + budget.ACT_WITHIN_S:
                    self.moved[(g.node, g.recorded)] = g.at
        ahead = [g.recorded - now for g in grants if g.recorded > now]
        if ahead:
            log.warning(
                "%d grants on record are up to %.1fs ahead of this replica's clock (the "
                "replica that recorded them had a clock ahead of this one's): counted as "
                "made now; check the time sync of the controller's nodes",
                len(ahead),
                max(ahead),
            )
        later = [g.at - budget.ACT_WITHIN_S - g.recorded for g in grants]
        if later and max(later) > budget.ACT_WITHIN_S:
            log.info(
                "%d grants count from when the API server stored their record, up to %.1fs "
                "after their time on record (written again since, or by a replica whose "
                "clock was behind this one's)",
                len([d for d in later if d > 0]),
                max(later),
            )
        return len(grants)
