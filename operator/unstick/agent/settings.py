"""The agent's settings: one frozen dataclass, built from the command line."""

from __future__ import annotations

import os
from dataclasses import dataclass

from unstick.core.safety import MAX_CLOCK_SKEW_S

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
