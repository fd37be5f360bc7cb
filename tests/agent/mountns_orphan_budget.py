"""The orphan pass and the node budget, with real dirs and mounts, run INSIDE a private
mount namespace by conftest (`run_scenario(name, workdir, script=BUDGET)`), like
mountns_orphans.py. The pass and the handler of a stuck pod share one NodeBudget, and
both run on one clock the scenario moves (passes every 30 s, as the agent's summary
thread makes them).

- `starve`: five orphaned pod dirs that can never be emptied (a user's file, the
  kubelet's etc-hosts) under `nodePerMinute: 5`, four passes, then a stuck pod's node
  steps; then one dir's file goes and the next pass cleans that dir.
- `share`: six orphaned dirs with only empty directories in them, one pass, then a stuck
  pod's node steps.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

from tests.agent.mountns_orphans import _policy
from tests.agent.mountns_scenarios import (
    UID_A,
    Node,
    main,
    mount_points,
    recording_handler,
    scenarios_in,
    steps_request,
)
from unstick.agent.authority.rederive import NodeBudget, PolicySources
from unstick.agent.orphans.cleanup import OrphanPass


def _uid(i: int) -> str:
    return f"dddddddd-{i:04d}-4444-8444-dddddddddddd"


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).timestamp()

    def __call__(self) -> float:
        return self.now


def _policy_5() -> dict[str, Any]:
    policy = _policy("clean")
    policy["spec"]["rateLimits"] = {"clusterPerMinute": 1000, "nodePerMinute": 5}
    return policy


def _orphans(node: Node, clock: Clock, budget: NodeBudget) -> OrphanPass:
    policy = _policy_5()
    return OrphanPass(
        node.settings,
        node.executor(),
        list_pods=lambda: [],
        get_policy=lambda name: policy if name == "default" else None,
        budget=budget,
        clock=clock,
        min_age_s=0.0,
    )


def _stuck_pod_steps(node: Node, clock: Clock, budget: NodeBudget) -> dict[str, Any]:
    """The stuck pod A (a projected volume) asks for its node steps now: the handler with
    the same budget, on the same clock."""
    vol = node.projected(UID_A, "kube-api-access-x")
    policy = _policy_5()
    handler, patches = recording_handler(
        node,
        policies=PolicySources(
            namespace=lambda name: {
                "metadata": {"name": name, "labels": {"unstick.dev/remediate": "true"}}
            },
            policy=lambda name: policy if name == "default" else None,
        ),
        budget=budget,
        clock=lambda: datetime.fromtimestamp(clock.now, UTC),
    )
    now = datetime.fromtimestamp(clock.now, UTC)
    handler.handle(steps_request(UID_A, ["unmount", "rmdir-stale"], now))
    return {"actions": patches[-1]["nodeActions"], "mounted": str(vol) in mount_points()}


def _results(dirs: Any) -> dict[str, str]:
    return {d.uid: d.result for d in dirs or []}


def scenario_starve(node: Node) -> dict[str, Any]:
    clock, budget = Clock(), NodeBudget(cap=10)
    files = []
    for i in range(5):
        top = node.pod(_uid(i))
        data = top / "volumes" / "kubernetes.io~empty-dir" / "scratch"
        data.mkdir(parents=True)
        (data / "results.csv").write_text("a,b\n1,2\n")
        (top / "etc-hosts").write_text("127.0.0.1 localhost\n")
        files.append(data / "results.csv")
    orphans = _orphans(node, clock, budget)
    start = clock.now = datetime.now(UTC).timestamp()  # the dirs are made: orphans now
    passes = []
    for t in (0, 30, 60, 90):
        clock.now = start + t
        passes.append(_results(orphans.run()))
    clock.now = start + 95
    stuck = _stuck_pod_steps(node, clock, budget)
    files[0].unlink()  # dir 0 changes: its scratch dir is empty now
    clock.now = start + 120
    changed = _results(orphans.run())
    return {
        "passes": passes,
        "stuck": stuck,
        "changed": changed,
        "uids": [_uid(i) for i in range(5)],
        "kept": [f.exists() for f in files[1:]],
        "scratch0": files[0].parent.exists(),
    }


def scenario_share(node: Node) -> dict[str, Any]:
    clock, budget = Clock(), NodeBudget(cap=10)
    for i in range(6):
        (node.pod(_uid(i)) / "containers" / "app").mkdir(parents=True)
    clock.now = datetime.now(UTC).timestamp()
    first = _results(_orphans(node, clock, budget).run())
    clock.now += 1
    stuck = _stuck_pod_steps(node, clock, budget)
    return {
        "first": first,
        "stuck": stuck,
        "left": sorted(p.name for p in (node.root / "pods").iterdir()),
    }


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
