"""The agent's settings: one frozen dataclass, built from the command line — and where the
agent looks for the kubelet root and the CRI socket when it is not told
(docs/compatibility.md: the distributions' paths, checked against their documentation).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from unstick.core.model.kubelet_paths import mounted_pods
from unstick.core.model.mountinfo import Mount
from unstick.core.safety import MAX_CLOCK_SKEW_S

# The kubelet roots of the common distributions, as (path, who uses it).
KNOWN_KUBELET_ROOTS = (
    ("/var/lib/kubelet", "kubeadm, k3s, RKE2, kind and most managed clusters"),
    ("/var/lib/k0s/kubelet", "k0s"),
    ("/var/snap/microk8s/common/var/lib/kubelet", "MicroK8s"),
)
# Their CRI sockets, in the order the agent tries them. A socket is reached through the
# host's root (`<host-proc>/1/root`), where an absolute symlink such as Debian's
# /var/run -> /run would point into the agent's own filesystem: /run/... comes first.
KNOWN_CRI_SOCKETS = (
    ("/run/containerd/containerd.sock", "containerd"),
    ("/run/k3s/containerd/containerd.sock", "k3s, RKE2"),
    ("/run/k0s/containerd.sock", "k0s"),
    ("/var/snap/microk8s/common/run/containerd.sock", "MicroK8s"),
    ("/run/crio/crio.sock", "CRI-O"),
    ("/var/run/crio/crio.sock", "CRI-O"),
)
AUTO = "auto"  # --kubelet-root / --cri-socket: look for them on the host

# Into PID 1's namespaces: a command after this prefix runs on the host.
HOST_NAMESPACES = ("nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--")
# What no configured command means: the systemd unit `kubelet` (only where there is one:
# unstick.agent.steps.restart_kubelet checks).
DEFAULT_RESTART_KUBELET = (*HOST_NAMESPACES, "systemctl", "restart", "kubelet")


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Where the agent finds the host's facts and how it talks to the host.

    `kubelet_root` must be the real path (no symlink component): mountinfo reports real
    paths, and the executor refuses any path with a symlink component.
    """

    node_name: str
    kubelet_root: str = "/var/lib/kubelet"
    host_proc: str = "/host/proc"
    mountinfo_path: str = ""  # default: <host_proc>/1/mountinfo
    plugins_registry: str = ""  # default: <kubelet_root>/plugins_registry
    cri_socket: str | None = None
    kubelet_healthz: str = "http://127.0.0.1:10248/healthz"
    # the kubelet's /metrics (HTTPS), for its pod-worker counts; empty: not read
    kubelet_metrics_url: str = ""
    grpc_timeout_s: float = 5.0
    # empty: the systemd unit `kubelet`, if the host has one (else restart-kubelet is refused)
    restart_kubelet_command: tuple[str, ...] = ()
    restart_kubelet_min_interval_s: float = 3600.0
    state_dir: str = "/var/lib/unstick-agent"
    # node steps requested longer ago than this are refused (the controller re-requests)
    max_request_age_s: float = 120.0
    # a request time further than this in the future is refused too (clock skew)
    max_request_skew_s: float = MAX_CLOCK_SKEW_S  # core's one rule: docs/diagnosis.md#clock-skew
    # the controller's namespace scope (empty: all namespaces): Remediations elsewhere are
    # refused on record (agent/authority/scope.py)
    namespace_scope: tuple[str, ...] = ()
    # the ValidatingAdmissionPolicy (and binding) that ties requests to the controller;
    # every request is refused while it is not in force (agent/authority/admission.py)
    admission_policy: str = ""

    @property
    def mountinfo(self) -> str:
        """The mount table the agent reads (the host's, by default PID 1's)."""
        return self.mountinfo_path or os.path.join(self.host_proc, "1", "mountinfo")

    @property
    def registry_dir(self) -> str:
        """The kubelet's plugin registration directory."""
        return self.plugins_registry or os.path.join(self.kubelet_root, "plugins_registry")


def host_root(host_proc: str) -> str:
    """The host's root directory as the agent reaches it: PID 1's (`<host-proc>/1/root`)."""
    return os.path.join(host_proc, "1", "root")


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def find_kubelet_root(root: str, mounts: Iterable[Mount]) -> tuple[str | None, str]:
    """(the kubelet root, how it was found) — or (None, why not).

    The host mount table decides first: the one root that pod volume mounts are under
    (any path, a custom `--root-dir` too). With no pod mount yet, the one known root
    (KNOWN_KUBELET_ROOTS) that holds a `pods/` directory under the host's root `root`.
    Two candidates is no answer: the agent never guesses between kubelet roots."""
    by_root = mounted_pods(mounts)
    if len(by_root) == 1:
        (found,) = by_root
        count = sum(by_root[found].values())
        return found, f"the host mount table has {count} pod volume mounts under {found}/pods/"
    if by_root:
        roots = ", ".join(sorted(by_root))
        return None, f"the host mount table has pod volume mounts under several roots: {roots}"
    hits = [(p, who) for p, who in KNOWN_KUBELET_ROOTS if _is_dir(root + p + "/pods")]
    if len(hits) == 1:
        path, who = hits[0]
        return path, f"{path}/pods exists on the host ({who}), no pod volume mounted yet"
    tried = ", ".join(p for p, _ in (hits or KNOWN_KUBELET_ROOTS))
    if hits:
        return None, f"several kubelet roots hold pods/ on the host: {tried}"
    return None, f"none of {tried} holds pods/ on the host, and no pod volume is mounted"
