"""Executor re-checks against real mounts, run INSIDE a private mount namespace by conftest
(`run_scenario(name, workdir, script=EXECUTOR)`), like mountns_scenarios.py:

- `id_reuse_same_path` / `id_reuse_other_path`: between planning and acting, the planned
  mount is replaced by a new mount at the same path (really: umount + mount), and the
  kernel's reuse of mount ids (ida: the lowest free id, which cannot be forced in a test)
  is modelled by rewriting ids in the table the executor re-reads;
- `odd_source`: a mount whose source holds `\\x1c` and `\\u2028` (a user-controlled NFS/CSI
  source): the probe and the unmount still work.
"""

from __future__ import annotations

import sys
from typing import Any

from tests.agent.mountns_scenarios import UID_A, Node, main, mount_points, scenarios_in, sh
from unstick.agent.probe.mount_file import MountTable
from unstick.agent.steps.checks import Checks
from unstick.agent.steps.executor import Executor

ODD_SOURCE = "nfs\x1cserver\u2028:/export"


class _Swapping(Checks):
    """Plans from the real table; on the re-read right before acting, the planned mount has
    been replaced (for real) and the table shows ids as the kernel could reuse them."""

    def __init__(self, node: Node, vol: str, other: str, same_path: bool) -> None:
        super().__init__(node.settings)
        self.reads = 0
        self.vol, self.other, self.same_path = vol, other, same_path

    def pod_table(self, uid: str) -> MountTable:
        self.reads += 1
        if self.reads == 2:
            sh("umount", self.vol)
            sh("mount", "-t", "tmpfs", "-o", "size=1m", "new", self.vol)
        table = super().pod_table(uid)
        if self.reads < 2:
            self.planned = next(m for m in table.mounts if m.mount_point == self.vol)
            return table
        moved = self.vol if self.same_path else self.other  # the mount that got the old id
        mounts = tuple(
            m._replace(mount_id=self.planned.mount_id) if m.mount_point == moved else m
            for m in table.mounts
        )
        return MountTable(table.text, mounts)


def _id_reuse(node: Node, same_path: bool) -> dict[str, Any]:
    vol = str(node.projected(UID_A, "planned"))
    other = str(node.projected(UID_A, "other"))
    ex = Executor(node.settings)
    ex.checks = _Swapping(node, vol, other, same_path)
    result = ex.run_step(UID_A, "unmount", vol, dry_run=False, lazy_unmount=False).to_json()
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        sources = [line.split(" - ")[1].split()[1] for line in f if f" {vol} " in line]
    return {"result": result, "sources_at_vol": sources, "other_mounted": other in mount_points()}


def scenario_id_reuse_same_path(node: Node) -> dict[str, Any]:
    return _id_reuse(node, same_path=True)


def scenario_id_reuse_other_path(node: Node) -> dict[str, Any]:
    return _id_reuse(node, same_path=False)


def scenario_odd_source(node: Node) -> dict[str, Any]:
    path = node.pod(UID_A) / "volumes" / "kubernetes.io~nfs" / "data"
    path.mkdir(parents=True)
    sh("mount", "-t", "tmpfs", "-o", "size=1m", ODD_SOURCE, str(path))
    probe = node.probe(UID_A)
    unmount = node.executor().run_step(UID_A, "unmount", "", dry_run=False, lazy_unmount=False)
    return {
        "path": str(path),
        "probe_mountinfo": probe["mountinfo"],
        "unmount": unmount.to_json(),
        "mounted_after": str(path) in mount_points(),
    }


if __name__ == "__main__":
    sys.exit(main(scenarios_in(globals())))
