"""The classic stuck terminations the demo reproduces, and what unstick must do about each."""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "shop"
AGENT_NODE = "node-storage"  # kubelet-less node the demo's agent serves (real mounts)
GONE_NODE = "node-vanished"  # deleted while its pod terminates
QUIET_NODE = "node-silent"  # stops reporting, not fenced
KWOK_NODES = ("node-a", "node-b", "node-c")
CSI_DRIVER = "hostpath.csi.unstick.dev"
ABANDONED_FINALIZER = "demo.unstick.dev/abandoned-controller"


@dataclass(frozen=True)
class Scenario:
    pod: str
    node: str
    title: str
    cause: str
    fixed: bool  # True: the pod must end gone; False: unstick must leave it alone

    @property
    def expectation(self) -> str:
        return "fixed" if self.fixed else "left alone"


def scenarios(agent_node: str, csi_driver: str = "") -> tuple[Scenario, ...]:
    """The scenarios, db-0 and uploader on `agent_node` (the node with an agent and real
    mounts: the stand-in's node-storage, or the real node). cache-0, report-job and web-7
    are API-only: their nodes have no kubelet (or kwok's). `csi_driver`: db-0's driver and
    version when it is the upstream one (e.g. "hostpath v1.11.0"), named in its row."""
    db_title = f"{csi_driver} restart" if csi_driver else "CSI driver lost its state"
    return (
        Scenario("cache-0", GONE_NODE, "node disappeared", "NodeGone", fixed=True),
        Scenario("report-job", KWOK_NODES[0], "abandoned finalizer", "FinalizerBlocked", True),
        Scenario("db-0", agent_node, db_title, "OrphanedMount", fixed=True),
        Scenario("uploader", agent_node, "mount held by a process", "MountBusy", fixed=False),
        Scenario("web-7", QUIET_NODE, "node silent, not fenced", "NodeUnreachable", False),
    )


SCENARIOS = scenarios(AGENT_NODE)
