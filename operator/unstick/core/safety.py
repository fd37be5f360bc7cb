"""The safety invariants of design.md §3 as predicates.

The planner uses them to build a plan, and the executors (controller, agent) call them
again right before acting, with facts re-read at that moment: state may have changed
since the diagnosis. Each returns a `unstick.core.verdict.Verdict`: truthy when the action
is safe, else it carries the reason to record as a refusal. Invariant 5 (opt-in) is
`unstick.core.policy.mandate.opted_in`, beside the one opt-in rule.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from unstick.core.durations import human
from unstick.core.model.kubelet_paths import CSI_PLUGIN, classify, is_pod_volume_path
from unstick.core.verdict import SAFE, Verdict, refuse
from unstick.core.vocabulary import Cause

RESTART_KUBELET_EVERY = timedelta(hours=1)
_MINUTE = timedelta(minutes=1)


# 1. No node action without a fresh probe of that node.
#: The clock-skew rule (docs/diagnosis.md#clock-skew), the one definition: a time another
#: clock wrote (a probe's probedAt, a request's nodeStepsRequestedAt) may lie at most this
#: far ahead of the reader's clock and still be read as "now".
MAX_CLOCK_SKEW_S = 10.0
CLOCK_SKEW_DOC = "docs/diagnosis.md#clock-skew"


def clock_skew(at: datetime, now: datetime) -> Verdict:
    """The clock-skew rule: `at`, written by another clock, is at most MAX_CLOCK_SKEW_S
    ahead of `now`, the reader's clock; further ahead it is no evidence of now. The reason
    says how far ahead and the rule ("30s in the future of the reader's clock, more ...")."""
    ahead = (at - now).total_seconds()
    if ahead > MAX_CLOCK_SKEW_S:
        return refuse(
            f"{human(ahead)} in the future of the reader's clock, more than the "
            f"{human(MAX_CLOCK_SKEW_S)} of clock skew allowed ({CLOCK_SKEW_DOC})"
        )
    return SAFE


def fresh_probe(
    probe_node: str | None,
    probed_at: datetime | None,
    node: str | None,
    now: datetime,
    max_age_s: float,
) -> Verdict:
    """A probe of the pod's node, at most `max_age_s` old and not from the future beyond
    the clock-skew rule (a probe from further ahead is no evidence of the node's state
    now). `now` is the reader's clock: the controller's, or a snapshot's capturedAt."""
    if probed_at is None or probe_node is None:
        return refuse("no probe of the node: node-side state is unknown")
    if node is None or probe_node != node:
        return refuse(f"the probe is of node {probe_node}, not of the pod's node {node}")
    age = (now - probed_at).total_seconds()
    if age > max_age_s:
        return refuse(
            f"the probe of node {node} is {human(age)} old (probeMaxAge {human(max_age_s)}): "
            "node-side state is unknown"
        )
    skew = clock_skew(probed_at, now)
    if not skew:
        return refuse(
            f"the probe of node {node} is {skew.reason}: node-side state is unknown — is "
            "the reader's clock (capturedAt: the workstation that took a snapshot?) behind "
            "the node's?"
        )
    return SAFE


# 7. No safety fact from a record someone else can write: a probe counts only if it names
#    this pod's UID and node and was taken after this controller asked for it.
def bound_probe(
    probe_uid: str | None,
    probe_node: str | None,
    probed_at: datetime | None,
    *,
    pod_uid: str,
    node: str | None,
    requested_at: datetime | None,
) -> Verdict:
    """The probe answers this controller's request about this pod on this node.

    `requested_at` is the time of the first probe (or node-step) request this controller
    itself made for the pod, from its own memory — never from the record; None: it has
    asked nothing yet, so no probe can be an answer. A probe taken before the request
    still counts within the clock-skew rule (the agent's clock may be a little behind:
    the request's time is then ahead of the probe's clock)."""
    if not probe_uid:
        return refuse("the probe names no pod UID: it cannot be bound to this pod")
    if probe_uid != pod_uid:
        return refuse(f"the probe is of pod UID {probe_uid}, not of this pod ({pod_uid})")
    if node is None or probe_node != node:
        return refuse(f"the probe is of node {probe_node}, not of the pod's node {node}")
    if probed_at is None:
        return refuse("the probe has no probedAt time")
    if requested_at is None:
        return refuse("this controller has not asked for a probe of the pod yet")
    if not clock_skew(requested_at, probed_at):
        early = (requested_at - probed_at).total_seconds()
        return refuse(
            f"the probe was taken {human(early)} before this controller asked for it: an old "
            "or replayed answer"
        )
    return SAFE


# 2. unmount only strictly under the pod's volume dirs, no holders, no running container.
def unmount_safe(
    mount_point: str, kubelet_root: str, uid: str, holders: int, containers_running: bool
) -> Verdict:
    if not is_pod_volume_path(mount_point, kubelet_root, uid):
        return refuse(
            f"{mount_point} is not strictly under pods/{uid}/volumes/ or volume-subpaths/"
        )
    if holders:
        return refuse(f"{mount_point} is held by {holders} process(es)")
    if containers_running:
        return refuse("a container of the pod is still running")
    return SAFE


def rmdir_safe(path: str, kubelet_root: str, uid: str, empty: bool | None) -> Verdict:
    """rmdir-stale: only the pod's volume dirs, only when empty (never a recursive delete)."""
    if not is_pod_volume_path(path, kubelet_root, uid):
        return refuse(f"{path} is not strictly under pods/{uid}/volumes/ or volume-subpaths/")
    if empty is False:
        return refuse(f"{path} is not empty: unstick never deletes data")
    return SAFE


def replay_unpublish_safe(
    target: str, kubelet_root: str, uid: str, driver_registered: bool | None
) -> Verdict:
    """replay-unpublish: only a CSI publish target of this pod, only with a registered driver."""
    c = classify(target, kubelet_root, uid)
    if c is None or c.kind != "volume" or c.plugin != CSI_PLUGIN:
        return refuse(f"{target} is not a CSI volume target of pod {uid}")
    if driver_registered is not True:
        return refuse(f"the CSI driver of {target} is not registered on the node")
    return SAFE


# 3. force-delete only for NodeGone, fenced NodeUnreachable, or nothing of the pod left.
def force_delete_safe(
    cause: Cause, fenced: bool | None, nothing_left: bool, probe_fresh: bool
) -> Verdict:
    if cause is Cause.NodeGone:
        return SAFE
    if cause is Cause.NodeUnreachable:
        if fenced:
            return SAFE
        return refuse(
            "the node is not fenced (no proof it is off from a source the policy trusts: "
            "docs/fencing.md): the pod may still run there (split-brain risk)"
        )
    if nothing_left and probe_fresh:
        return SAFE
    return refuse(
        "the node is not gone or fenced, and no fresh probe shows that nothing of the pod is "
        "left on it"
    )


# 4. remove-finalizer only for finalizers on the policy's allowlist (empty by default).
def finalizer_allowed(finalizer: str, allowlist: tuple[str, ...] | frozenset[str]) -> Verdict:
    if finalizer in allowlist:
        return SAFE
    return refuse(f"finalizer {finalizer} is not on the policy's finalizerAllowlist")


# 5. Nothing happens to a pod that has not opted in: `unstick.core.policy.mandate.opted_in`.


# 6. Rate limits: cluster-wide and per node, actions per minute: `unstick.core.policy.ratelimit`.


def restart_kubelet_allowed(last_restart: datetime | None, now: datetime) -> Verdict:
    """restart-kubelet: at most once per node per hour."""
    if last_restart is not None and now - last_restart < RESTART_KUBELET_EVERY:
        return refuse("the kubelet of this node was restarted less than an hour ago")
    return SAFE
