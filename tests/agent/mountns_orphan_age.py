"""When a pod dir becomes an orphan (#33 finding 8b), run INSIDE a private mount namespace
by conftest (`run_scenario(name, workdir, script=AGE)`), like mountns_orphans.py.

A long-lived pod: its dir was made an hour ago and not changed since (the pass's clock is
an hour ahead of the dir's times), with a projected volume still mounted. The pod is in
the node's pod list for the first pass, then force-deleted: the kubelet is tearing it
down right now. Passes follow on the same clock (the deletion seen at the second), then
five minutes later.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

from tests.agent.mountns_orphan_budget import Clock, _orphans
from tests.agent.mountns_scenarios import UID_A, Node, main, mount_points, scenarios_in
from unstick.agent.authority.rederive import NodeBudget


def scenario_force_deleted(node: Node) -> dict[str, Any]:
    vol = node.projected(UID_A, "kube-api-access-x")
    clock, budget = Clock(), NodeBudget(cap=10)
    clock.now = datetime.now(UTC).timestamp() + 3600  # the dir is an hour old
    orphans = _orphans(node, clock, budget)
    orphans.min_age_s = 300.0  # the agent's default (--orphan-min-age)
    pods: list[dict[str, Any]] = [{"metadata": {"uid": UID_A, "name": "web-0"}}]
    orphans.list_pods = lambda: pods
    alive = orphans.run()
    pods.clear()  # force-deleted: gone from the API, the kubelet's teardown begins
    just_deleted = orphans.run()
    mounted_after_deletion = str(vol) in mount_points()
    clock.now += 299
    almost = orphans.run()
    clock.now += 1
    later = orphans.run()
    return {
        "alive": [d.to_json() for d in alive or []],
        "just_deleted": [d.to_json() for d in just_deleted or []],
        "mounted_after_deletion": mounted_after_deletion,
        "almost": [d.to_json() for d in almost or []],
        "later": [d.to_json() for d in later or []],
        "mounted_later": str(vol) in mount_points(),
    }


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
