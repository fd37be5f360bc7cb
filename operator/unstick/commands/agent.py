"""`unstick agent`: run the node agent on this node (DaemonSet, privileged)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from unstick.commands import logs

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from unstick.agent.settings import AgentSettings
    from unstick.core.model.kubelet_paths import RootView


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent",
        help="run the node agent on this node",
        description=(
            "Run the node agent: watch the Remediations labelled for this node, probe the "
            "node for their pods (mounts, holders, volume dirs, containers, plugins) and run "
            "the node steps the controller approved. Standalone (no Kopf). See docs/agent.md."
        ),
    )
    p.add_argument(
        "--node-name", required=True, help="this node's name (use $NODE_NAME from the downward API)"
    )
    p.add_argument(
        "--kubelet-root",
        default="auto",
        help="the kubelet's root dir, real path without symlinks; auto (the default): the one "
        "root the host mount table has pod volume mounts under, else the one of "
        "/var/lib/kubelet, /var/lib/k0s/kubelet, /var/snap/microk8s/common/var/lib/kubelet "
        "holding pods/ on the host (through <host-proc>/1/root); none found: the agent does "
        "not start (docs/compatibility.md)",
    )
    p.add_argument(
        "--host-proc",
        default="/host/proc",
        help="the host's /proc, for holders and containers (default: %(default)s)",
    )
    p.add_argument(
        "--mountinfo", default="", help="mount table to read (default: <host-proc>/1/mountinfo)"
    )
    p.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster service account)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9101,
        help="port of /metrics and /healthz (default: %(default)s)",
    )
    p.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        help="address /metrics and /healthz listen on; with hostNetwork pass the node IP "
        "(status.hostIP from the downward API) so they are not served on every interface "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--plugins-registry",
        default="",
        help="kubelet plugin registration dir (default: <kubelet-root>/plugins_registry)",
    )
    p.add_argument(
        "--cri-socket",
        default="auto",
        help="CRI runtime socket, e.g. /run/containerd/containerd.sock; auto (the default): "
        "the first of the containerd, k3s/RKE2, k0s, MicroK8s and CRI-O sockets on the host "
        "(through <host-proc>/1/root) that answers the CRI; none: containers from the "
        "host's cgroups only (docs/compatibility.md)",
    )
    p.add_argument(
        "--kubelet-healthz",
        default="http://127.0.0.1:10248/healthz",
        help="kubelet health URL (default: %(default)s)",
    )
    p.add_argument(
        "--kubelet-metrics-url",
        default="",
        metavar="URL",
        help="the node's kubelet /metrics, e.g. https://$(NODE_IP):10250/metrics (the chart "
        "passes it), read with the agent's ServiceAccount token (nodes/metrics) for the "
        "kubelet's own pod-worker counts in every probe; the kubelet's serving certificate "
        "must verify against the cluster CA (default: not read; docs/agent.md)",
    )
    p.add_argument(
        "--restart-kubelet-command",
        default=None,
        help="command that restarts this host's kubelet, whitespace-separated, run from the "
        "agent's container (a host program through nsenter into PID 1's namespaces, e.g. "
        "'nsenter -t 1 -m -p -- /usr/local/bin/restart-kubelet'); default: the systemd unit "
        "kubelet (nsenter -t 1 -m -u -i -n -p -- systemctl restart kubelet) where the host "
        "has one, else restart-kubelet is refused (docs/agent.md)",
    )
    p.add_argument(
        "--state-dir",
        default="/var/lib/unstick-agent",
        help="where the agent remembers its last kubelet restart (default: %(default)s)",
    )
    p.add_argument(
        "--max-request-age",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="refuse node steps requested longer ago than this (spec.nodeStepsRequestedAt), "
        "e.g. requests written while the agent was down (default: %(default)s)",
    )
    p.add_argument(
        "--orphan-min-age",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a pod dir whose pod is not in the API counts as orphaned only when it is older "
        "than this (docs/aftermath.md; default: %(default)s)",
    )
    p.add_argument(
        "--max-node-actions-per-minute",
        type=int,
        default=10,  # unstick.core.policy.ratelimit.DEFAULT_NODE_CAP, as the controller's flag
        metavar="N",
        help="cap on this node's batches of node steps per minute, which no policy can raise; "
        "set it as the controller's --max-node-actions-per-minute (default: %(default)s)",
    )
    p.add_argument(
        "--namespace-scope",
        action="append",
        default=[],
        metavar="NS",
        help="the controller's namespace scope (repeat; the chart passes "
        "controller.namespaceScope): a Remediation in any other namespace is not the "
        "controller's request and is refused on record (default: all namespaces)",
    )
    p.add_argument(
        "--admission-policy",
        default="",
        metavar="NAME",
        help="the ValidatingAdmissionPolicy (and its binding of the same name) that lets only "
        "the controller write a Remediation's spec (the chart passes it when "
        "admission.enabled); while it is missing or narrowed every request is refused on "
        "record (default: none, nothing checked; docs/admission.md)",
    )
    logs.add_log_flags(p)
    p.set_defaults(command="agent")


def run(args: argparse.Namespace) -> int:
    import os

    from unstick.agent.memory import tune_malloc

    tune_malloc()  # before any thread starts: at most 2 malloc arenas (agent/memory.py)

    from unstick.agent.loop import Agent, LoopSettings
    from unstick.agent.settings import AgentSettings

    logs.setup(args.log_format, args.log_level)
    if args.kubelet_root != "auto" and not args.kubelet_root.startswith("/"):
        print(
            f"unstick agent: --kubelet-root {args.kubelet_root!r} must be an absolute path",
            file=sys.stderr,
        )
        return 2
    if args.max_node_actions_per_minute < 1:
        print("unstick agent: --max-node-actions-per-minute must be at least 1", file=sys.stderr)
        return 2
    if args.max_request_age <= 0:
        print("unstick agent: --max-request-age must be a positive number of seconds",
              file=sys.stderr)  # fmt: skip
        return 2
    command = tuple((args.restart_kubelet_command or "").split())
    settings = AgentSettings(
        node_name=args.node_name,
        kubelet_root=args.kubelet_root,
        host_proc=args.host_proc,
        mountinfo_path=args.mountinfo,
        plugins_registry=args.plugins_registry,
        cri_socket=args.cri_socket,
        kubelet_healthz=args.kubelet_healthz,
        kubelet_metrics_url=args.kubelet_metrics_url,
        restart_kubelet_command=command,
        state_dir=args.state_dir,
        max_request_age_s=args.max_request_age,
        namespace_scope=tuple(dict.fromkeys(args.namespace_scope)),
        admission_policy=args.admission_policy,
    )
    if not os.access(settings.mountinfo, os.R_OK):
        print(
            f"unstick agent: cannot read the mount table {settings.mountinfo}: "
            "mount the host's /proc at --host-proc or pass --mountinfo",
            file=sys.stderr,
        )
        return 2
    settings, problem = find_host_paths(settings)
    problem = problem or kubelet_root_problem(settings)
    if problem:
        print(f"unstick agent: {problem}", file=sys.stderr)
        return 2
    agent = Agent(
        settings,
        LoopSettings(
            kubeconfig=args.kubeconfig,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_address,
            orphan_min_age_s=max(0.0, args.orphan_min_age),
            node_actions_per_minute=args.max_node_actions_per_minute,
        ),
    )
    build_info(agent.metrics.registry)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.shutdown())
    agent.run()
    return 0


def build_info(registry: CollectorRegistry) -> None:
    """`unstick_build_info{version}` 1 on the agent's /metrics, as on the controller's."""
    from prometheus_client import Gauge

    from unstick import __version__

    info = Gauge(
        "unstick_build_info",
        "Always 1; the version of unstick this process runs",
        ["version"],
        registry=registry,
    )
    info.labels(__version__).set(1)


def find_host_paths(settings: AgentSettings) -> tuple[AgentSettings, str | None]:
    """`--kubelet-root auto` and `--cri-socket auto` resolved on the host (through
    `<host-proc>/1/root`, `agent.settings.find_kubelet_root`, `probe.containers.
    find_cri_socket`), each logged with how it was found; `--cri-socket none` is no socket.
    The problem, when no kubelet root is found: the agent does not start."""
    import dataclasses
    import logging
    import os

    from unstick.agent.probe.containers import find_cri_socket
    from unstick.agent.probe.mount_file import read_mount_table
    from unstick.agent.settings import AUTO, KNOWN_CRI_SOCKETS, find_kubelet_root, host_root
    from unstick.core.model.mountinfo import MountinfoError

    log = logging.getLogger("unstick.agent")
    root = host_root(settings.host_proc)
    reach = "" if os.access(root, os.X_OK) else f" ({root} cannot be entered: run with hostPID)"
    kubelet_root, cri = settings.kubelet_root, settings.cri_socket
    if kubelet_root == AUTO:
        try:
            mounts = read_mount_table(settings.mountinfo).mounts
        except (OSError, MountinfoError) as exc:
            return settings, f"cannot read the mount table {settings.mountinfo}: {exc}"
        found, how = find_kubelet_root(root, mounts)
        if found is None:
            return settings, (
                f"cannot find the kubelet root: {how}{reach}; pass --kubelet-root "
                "(the chart's agent.kubeletRoot)"
            )
        log.info("kubelet root %s: %s", found, how)
        kubelet_root = found
    if cri == AUTO:
        cri, seen = find_cri_socket(root, KNOWN_CRI_SOCKETS, settings.grpc_timeout_s)
        if cri is None:
            log.warning(
                "no CRI socket answered on the host%s%s: containers come from the cgroup "
                "scan only; pass --cri-socket (the chart's agent.criSocket)",
                reach,
                f" ({'; '.join(seen)})" if seen else "",
            )
        else:
            log.info("CRI socket %s: %s", cri, seen[-1])
    elif cri in ("", "none"):
        cri = None
    return dataclasses.replace(settings, kubelet_root=kubelet_root, cri_socket=cri), None


def root_view(root: str) -> RootView:
    """What this process sees of `root` (lstat: no symlink followed)."""
    import stat
    from pathlib import Path

    from unstick.core.model.kubelet_paths import RootView

    def is_dir(path: Path) -> bool:
        try:
            return stat.S_ISDIR(path.lstat().st_mode)
        except OSError:
            return False

    top, pods = Path(root), Path(root) / "pods"
    names: frozenset[str] = frozenset()
    try:
        names = frozenset(p.name for p in pods.iterdir() if is_dir(p))
    except OSError:
        pass
    return RootView(root, is_dir(top), top.is_symlink(), is_dir(pods), names)


def kubelet_root_problem(settings: AgentSettings) -> str | None:
    """The start-up check: does `--kubelet-root` hold the pod dirs that the host mount table
    shows mounts of? (`unstick.core.model.kubelet_paths.check_kubelet_root`)"""
    from unstick.agent.probe.mount_file import read_mount_table
    from unstick.agent.settings import find_kubelet_root, host_root
    from unstick.core.model.kubelet_paths import check_kubelet_root, normalise
    from unstick.core.model.mountinfo import MountinfoError

    try:
        table = read_mount_table(settings.mountinfo)
    except (OSError, MountinfoError) as exc:
        return f"cannot read the mount table {settings.mountinfo}: {exc}"
    problem = check_kubelet_root(root_view(settings.kubelet_root), table.mounts)
    if problem and "is the root" not in problem:  # no hint from the mount table: the host's
        found, how = find_kubelet_root(host_root(settings.host_proc), table.mounts)
        if found == (normalise(settings.kubelet_root) or settings.kubelet_root):
            problem += (
                f"; {found} is the host's kubelet root ({how}): mount it into the agent at the "
                "same path (the chart's agent.kubeletRoot)"
            )
        elif found:
            problem += f"; the host's kubelet root is {found} ({how}): pass it (the chart's "
            problem += "agent.kubeletRoot)"
    return problem
