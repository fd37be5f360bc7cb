"""The kubelet's real `FailedKillPod` Event text for a CNI DEL that fails (issue #25).

Built exactly as the kubelet and containerd build it (Kubernetes pkg/kubelet/kubelet.go
`killPod`: `Eventf(pod, Warning, "FailedKillPod", "error killing pod: %v", err)`; the error is
kubecontainer.SyncResult's `failed to %q for %q with %v: %q` for KillPodSandbox, the pod UID,
`KillPodSandboxError` and the CRI error; containerd: `failed to destroy network for sandbox
%q: %w`; libcni: `plugin type=%q failed (delete): %w`, multus adds ` name=%q`) — the %q
quoting escapes the inner quotes as `\\"`, as on a real cluster.
"""

from __future__ import annotations

import json
from typing import Any

SANDBOX = "3f9a1c0d2b7e4a5f8c6d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b"
CALICO_ERROR = "error getting ClusterInformation: connection is unauthorized: Unauthorized"


def kubelet_message(
    uid: str, plugin: str = "calico", error: str = CALICO_ERROR, name: str = ""
) -> str:
    named = f" name={json.dumps(name)}" if name else ""
    cri = (
        f"rpc error: code = Unknown desc = failed to destroy network for sandbox "
        f"{json.dumps(SANDBOX)}: plugin type={json.dumps(plugin)}{named} failed (delete): {error}"
    )
    sync = f'failed to "KillPodSandbox" for "{uid}" with KillPodSandboxError: {json.dumps(cri)}'
    return f"error killing pod: {sync}"


def kill_pod_event(
    uid: str,
    last: str,
    count: int = 7,
    plugin: str = "calico",
    error: str = CALICO_ERROR,
    name: str = "",
) -> dict[str, Any]:
    """The Event as the API returns it (core/v1)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "app-0.17f3a", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "app-0", "uid": uid},
        "reason": "FailedKillPod",
        "type": "Warning",
        "source": {"component": "kubelet", "host": "node-1"},
        "message": kubelet_message(uid, plugin, error, name),
        "count": count,
        "firstTimestamp": last,
        "lastTimestamp": last,
    }
