"""The fixed words of DESIGN §2 and §3: causes and actions.

Tools and tests outside the code rely on these exact strings; never rename them.
"""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    """Why a pod is stuck: the first blocked stage of the termination pipeline."""

    NotStuck = "NotStuck"
    FinalizerBlocked = "FinalizerBlocked"
    NodeGone = "NodeGone"
    NodeUnreachable = "NodeUnreachable"
    ContainersStillRunning = "ContainersStillRunning"
    MountBusy = "MountBusy"
    CSIDriverMissing = "CSIDriverMissing"
    OrphanedMount = "OrphanedMount"
    StaleVolumeDirs = "StaleVolumeDirs"
    KubeletNotProgressing = "KubeletNotProgressing"
    Unknown = "Unknown"


class Action(StrEnum):
    """What unstick may do about a stuck pod."""

    OBSERVE = "observe"
    REPLAY_UNPUBLISH = "replay-unpublish"
    UNMOUNT = "unmount"
    RMDIR_STALE = "rmdir-stale"
    RESTART_KUBELET = "restart-kubelet"
    FORCE_DELETE = "force-delete"
    REMOVE_FINALIZER = "remove-finalizer"


#: Actions run by the node agent on the pod's node.
NODE_ACTIONS: frozenset[Action] = frozenset(
    {Action.REPLAY_UNPUBLISH, Action.UNMOUNT, Action.RMDIR_STALE, Action.RESTART_KUBELET}
)

#: Actions run by the controller against the Kubernetes API.
API_ACTIONS: frozenset[Action] = frozenset({Action.FORCE_DELETE, Action.REMOVE_FINALIZER})

#: Actions that change something (everything except observe).
CHANGING_ACTIONS: frozenset[Action] = NODE_ACTIONS | API_ACTIONS
