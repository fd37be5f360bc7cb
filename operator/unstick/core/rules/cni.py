"""CNI teardown failing: the kubelet cannot remove the pod's sandbox because the
CNI plugin's DEL fails, so `KillPodSandbox` is retried for ever and the pod stays
Terminating (calico#7272, multus-cni#669).

The kubelet says so in an Event on the pod (reason `FailedKillPod`), e.g.:

    error killing pod: failed to "KillPodSandbox" for "<uid>" with KillPodSandboxError:
    "rpc error: code = Unknown desc = failed to destroy network for sandbox \\"<id>\\":
    plugin type=\\"calico\\" failed (delete): error getting ClusterInformation: ..."

or, over CRI-O (the sandbox's name and id, and the CNI network; libcni's `plugin type=`
only when the plugin ran):

    ... desc = failed to destroy network for pod sandbox k8s_<pod>_<ns>_<uid>_0(<id>):
    error removing pod <ns>_<pod> from CNI network \\"cilium\\": <the plugin's error>"

The bundle's `events` (Events about this pod, as the API returns them; optional; read by
`unstick.core.model.snapshot`) are searched for that; `CNITeardownFailed` names the
plugin, the sandbox and the plugin's error. Observe only: the kubelet retries the
teardown on its own once the plugin works again, and a force-delete would leave the pod's
network (its IP, its veth, the plugin's state) behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from unstick.core.model.facts import PodEvent, PodFacts

KILL_POD_REASONS = ("FailedKillPod",)
DESTROY = "failed to destroy network"
_PLUGIN = re.compile(r'plugin type=\\*"([^"\\]+)\\*"(?:\s+name=\\*"([^"\\]+)\\*")?')
# containerd: `for sandbox "<id>"`; CRI-O: `for pod sandbox k8s_<name>_<ns>_<uid>_<n>(<id>)`
_SANDBOX = re.compile(
    r'failed to destroy network for (?:sandbox \\*"([0-9a-zA-Z]+)\\*"'
    r"|pod sandbox [^\s(]*\(([0-9a-zA-Z]+)\))"
)
# CRI-O (ocicni): `error removing pod <ns>_<name> from CNI network "<network>": <error>`
_NETWORK = re.compile(r'from CNI network \\*"([^"\\]+)\\*":\s*(.+)$', re.DOTALL)
_ERROR = re.compile(r"failed \((?:delete|del)\):\s*(.+)$", re.DOTALL)
HISTORY_SLACK = timedelta(minutes=1)
MAX_ERROR_CHARS = 400


@dataclass(frozen=True, slots=True)
class CNIFailure:
    plugin: str  # the CNI plugin type ("" when the message does not say)
    network: str  # its network name, when given (multus)
    sandbox: str  # the sandbox id ("" when not given)
    error: str  # what the plugin said
    count: int  # how many times the kubelet reported it (1 when not counted)


def teardown_failure(pod: PodFacts, events: tuple[PodEvent, ...]) -> CNIFailure | None:
    """The latest CNI teardown failure the kubelet reported for this termination."""
    since = None
    if pod.deletion_timestamp is not None:
        grace = timedelta(seconds=pod.deletion_grace_period_seconds or 0)
        since = pod.deletion_timestamp - grace - HISTORY_SLACK  # the delete request
    found = [
        e
        for e in events
        if e.reason in KILL_POD_REASONS
        and DESTROY in e.message
        and (since is None or e.last is None or e.last >= since)
    ]
    if not found:
        return None
    latest = max(found, key=lambda e: (e.last is not None, e.last.timestamp() if e.last else 0.0))
    plugin = _PLUGIN.search(latest.message)
    sandbox = _SANDBOX.search(latest.message)
    network = _NETWORK.search(latest.message)
    error = _ERROR.search(latest.message) or network
    said = error.group(error.lastindex or 1) if error else latest.message.split(DESTROY, 1)[-1]
    return CNIFailure(
        plugin=plugin.group(1) if plugin else "",
        network=((plugin.group(2) if plugin else None) or (network.group(1) if network else "")),
        sandbox=(sandbox.group(1) or sandbox.group(2)) if sandbox else "",
        error=said.strip().rstrip('"\\').replace('\\"', '"').strip()[:MAX_ERROR_CHARS],
        count=sum(e.count for e in found),
    )


def failure_words(c: CNIFailure) -> str:
    plugin = f"CNI plugin {c.plugin}" if c.plugin else "the CNI plugin"
    if c.network:
        plugin += f" (network {c.network})"
    sandbox = f" {c.sandbox}" if c.sandbox else ""
    times = f" ({c.count} times)" if c.count > 1 else ""
    return (
        f"the kubelet cannot remove the pod's sandbox{sandbox}: {plugin} fails to delete its "
        f"network{times}: {c.error}"
    )
