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
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.agent.mountns_scenarios import UID_A, UID_B, Node, main, mount_points, scenarios_in
from unstick.agent.authority.rederive import NodeBudget
from unstick.agent.orphans.cleanup import OrphanPass

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


UID_R = "ffffffff-6666-4666-8666-ffffffffffff"


def _no_volume_dirs(node: Node) -> Path:
    """A pod dir with no volume dirs at all (a static pod whose mirror pod was refused):
    only the kubelet's empty per-container and plugin dirs."""
    for sub in ("containers/app", "plugins/kubernetes.io~empty-dir/wrapped_cache"):
        (node.pod(UID_R) / sub).mkdir(parents=True)
    return node.pod(UID_R)


def _clean_pass(node: Node, settings: Any = None) -> dict[str, Any]:
    p = _pass(node, "clean")
    if settings is not None:
        p.settings = settings
    return {d.uid: d.to_json() for d in p.run() or []}


def scenario_running(node: Node) -> dict[str, Any]:
    """A process runs in the pod's container cgroup (argv[3], made by the test): the pass
    touches nothing of the pod; once the process is gone, the next pass cleans."""
    top = _no_volume_dirs(node)
    cgroup = Path(sys.argv[3])
    proc = node.start("sleep", "600")
    (cgroup / "cgroup.procs").write_text(str(proc.pid))
    first = _clean_pass(node)
    kept = sorted(str(p.relative_to(top)) for p in top.rglob("*"))
    node.stop(proc)
    second = _clean_pass(node)
    return {"first": first, "kept": kept, "second": second, "dir_after": top.exists()}


def scenario_blind(node: Node) -> dict[str, Any]:
    """No CRI socket and a /proc that lists no process: the runtime cannot tell, so the
    pass does nothing to the pod."""
    top = _no_volume_dirs(node)
    (node.work / "noproc").mkdir()
    blind = replace(node.settings, host_proc=str(node.work / "noproc"), cri_socket=None)
    first = _clean_pass(node, blind)
    return {"first": first, "dir_after": top.exists()}


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(scenarios_in(globals())))
