"""The Remediation as a test writes it: the body the controller would create (or an agent
would be handed), and the node steps it asks for."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


def remediation(
    pod: str, uid: str, node: str, *, name: str = "", metadata: JSON | None = None, **spec: Any
) -> JSON:
    """A Remediation of the pod `pod` (UID `uid`) on `node`, named `name` (the pod's name by
    default; none with a generateName in `metadata`) and labelled with its node as the
    controller labels it; `metadata` adds to (or replaces) its metadata's keys, `spec`
    (camelCase keys: probeRequestedAt, nodeSteps, ...) to its spec."""
    meta: JSON = {"labels": {"unstick.dev/node": node}, **(metadata or {})}
    if "generateName" not in meta:
        meta["name"] = name or pod
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Remediation",
        "metadata": meta,
        "spec": {"podName": pod, "podUID": uid, "nodeName": node, **spec},
    }


def node_steps(*steps: str | tuple[str, str], reason: str = "test") -> list[JSON]:
    """The spec's nodeSteps: an action alone (target "") or an (action, target) pair."""
    pairs = [(s, "") if isinstance(s, str) else s for s in steps]
    return [{"action": action, "target": target, "reason": reason} for action, target in pairs]
