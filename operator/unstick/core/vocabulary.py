"""The fixed words of design.md §2, §3 and §7: causes, actions, refusal reasons.

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
    ContainerFrozen = "ContainerFrozen"
    HungMount = "HungMount"  # a network/FUSE mount of the pod whose server is gone
    ContainersStillRunning = "ContainersStillRunning"
    CNITeardownFailed = "CNITeardownFailed"  # the CNI plugin's DEL fails (observe)
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
    LAZY_UNMOUNT = "lazy-unmount"  # MNT_DETACH of a hung mount (HungMount only)
    RMDIR_STALE = "rmdir-stale"
    THAW = "thaw"  # thaw the pod's frozen cgroups (ContainerFrozen only)
    RESTART_KUBELET = "restart-kubelet"
    FORCE_DELETE = "force-delete"
    REMOVE_FINALIZER = "remove-finalizer"
    # node-level (design.md §10): the out-of-service taint on a node proven off, and its removal
    TAINT_OUT_OF_SERVICE = "taint-out-of-service"
    UNTAINT_OUT_OF_SERVICE = "untaint-out-of-service"


#: Actions run by the node agent on the pod's node.
NODE_ACTIONS: frozenset[Action] = frozenset(
    {
        Action.REPLAY_UNPUBLISH,
        Action.UNMOUNT,
        Action.LAZY_UNMOUNT,
        Action.RMDIR_STALE,
        Action.THAW,
        Action.RESTART_KUBELET,
    }
)

#: Actions run by the controller against the Kubernetes API.
API_ACTIONS: frozenset[Action] = frozenset({Action.FORCE_DELETE, Action.REMOVE_FINALIZER})

#: Actions that change something about a pod (everything of a pod's plan except observe).
CHANGING_ACTIONS: frozenset[Action] = NODE_ACTIONS | API_ACTIONS

#: Actions the controller takes on a Node, never in a pod's plan (docs/fencing.md): only
#: the policy named `default` can permit them (a node is no tenant's).
NODE_LEVEL_ACTIONS: frozenset[Action] = frozenset(
    {Action.TAINT_OUT_OF_SERVICE, Action.UNTAINT_OUT_OF_SERVICE}
)


class Refusal(StrEnum):
    """Why a request was refused (the `reason` label of `unstick_refusals_total`, design.md §7).

    Fixed vocabulary: text from a CR never becomes a label value."""

    FORGED = "forged"  # a record that does not match the pod, the node or the request
    STALE = "stale"  # a request or probe too old, or from the future beyond the clock skew
    NOT_OPTED_IN = "not_opted_in"  # the pod (or its namespace) has not opted in
    POLICY_FORBIDS = "policy_forbids"  # the policy does not permit it or does not serve the ns
    DRY_RUN = "dry_run"  # the policy in force is in dry-run
    UNSAFE = "unsafe"  # a safety invariant does not hold right before acting
