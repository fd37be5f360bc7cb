"""Orphaned pod dirs with real mounts, run INSIDE a private mount namespace by conftest
(`run_scenario(name, workdir, script=ORPHANS)`), like mountns_scenarios.py.

Three pod dirs whose pods are not in the (fake, empty) pod list:
- UID_A: a projected tmpfs mount held by a real process (cwd inside it);
- UID_B: a projected tmpfs mount nobody holds, and a CSI volume dir left empty;
- UID_C: an emptyDir with a user file in it (not a mount).
The `default` policy says `orphanedPodDirs: clean` (or `observe`); the agent's
OrphanPass runs with the real executor, holder scan and cgroup scan.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mountns_scenarios import UID_A, UID_B, Node, main, mount_points

from unstick.agent.authority import NodeBudget
from unstick.agent.orphans import OrphanPass

UID_C = "cccccccc-3333-4333-8333-cccccccccccc"
LIVE = "eeeeeeee-5555-4555-8555-eeeeeeeeeeee"


def _policy(mode: str, dry_run: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "default"},
        "spec": {
            "dryRun": dry_run,
            "orphanedPodDirs": mode,
            "actions": ["observe", "replay-unpublish", "unmount", "rmdir-stale"],
        },
    }


def _layout(node: Node) -> dict[str, str]:
    held = node.projected(UID_A, "token")
    unheld = node.projected(UID_B, "token")
    csi_dir = node.pod(UID_B) / "volumes" / "kubernetes.io~csi" / "pv-b" / "mount"
    csi_dir.mkdir(parents=True)
    (node.pod(UID_B) / "plugins" / "kubernetes.io~empty-dir" / "cache").mkdir(parents=True)
    data = node.pod(UID_C) / "volumes" / "kubernetes.io~empty-dir" / "scratch"
    data.mkdir(parents=True)
    (data / "results.csv").write_text("a,b\n1,2\n" * 64)
    live = node.pod(LIVE) / "volumes" / "kubernetes.io~empty-dir" / "x"
    live.mkdir(parents=True)  # a pod the API knows: never an orphan
    return {"held": str(held), "unheld": str(unheld), "data": str(data / "results.csv")}


def _pass(node: Node, mode: str, *, min_age_s: float = 0.0, dry_run: bool = False) -> OrphanPass:
    pods = [{"metadata": {"uid": LIVE, "name": "live", "namespace": "default"}}]
    return OrphanPass(
        node.settings,
        node.executor(),
        list_pods=lambda: pods,
        get_policy=lambda name: _policy(mode, dry_run) if name == "default" else None,
        budget=NodeBudget(cap=10),
        min_age_s=min_age_s,
    )


def _run(node: Node, mode: str, **kw: Any) -> dict[str, Any]:
    paths = _layout(node)
    holder = node.start("sleep", "600", cwd=paths["held"])
    dirs = _pass(node, mode, **kw).run()
    mounted = mount_points()
    out = {
        "paths": paths,
        "reports": {d.uid: d.to_json() for d in dirs or []},
        "held_mounted": paths["held"] in mounted,
        "unheld_mounted": paths["unheld"] in mounted,
        "dir_a": node.pod(UID_A).exists(),
        "dir_b": node.pod(UID_B).exists(),
        "dir_c": node.pod(UID_C).exists(),
        "data_kept": Path(paths["data"]).read_text() == "a,b\n1,2\n" * 64,
        "live_kept": node.pod(LIVE).exists(),
        "holder_alive": holder.poll() is None,
    }
    node.stop(holder)
    return out


def scenario_clean(node: Node) -> dict[str, Any]:
    return _run(node, "clean")


def scenario_observe(node: Node) -> dict[str, Any]:
    return _run(node, "observe")


def scenario_dry_run(node: Node) -> dict[str, Any]:
    return _run(node, "clean", dry_run=True)


def scenario_young(node: Node) -> dict[str, Any]:
    """The default minimum age: dirs made a moment ago are no orphans."""
    return _run(node, "clean", min_age_s=300.0)


SCENARIOS = {
    "clean": scenario_clean,
    "observe": scenario_observe,
    "dry_run": scenario_dry_run,
    "young": scenario_young,
}

if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(SCENARIOS))
