"""`unstick controller`: run the controller (Kopf operator + lean pod watcher)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unstick.commands import logs
from unstick.core.policy.ratelimit import DEFAULT_CLUSTER_CAP, DEFAULT_NODE_CAP

if TYPE_CHECKING:
    from unstick.controller.leader import LeaseSettings

#: client-go's defaults (kube-controller-manager's --leader-elect-* flags).
DEFAULT_LEASE_DURATION = "15s"
DEFAULT_RENEW_DEADLINE = "10s"
DEFAULT_RETRY_PERIOD = "2s"
DEFAULT_LEASE_NAME = "unstick-controller"
DEFAULT_RETENTION = "168h"  # finished Remediations kept a week (controller/retention.py)

DESCRIPTION = """\
Run the unstick controller. It watches pods with a lean paginated list+watch that keeps
only terminating pods in memory, diagnoses every pod stuck past deletionTimestamp + slack,
records a Remediation in the pod's namespace and posts one Event per diagnosis. For pods
that opted in (annotation unstick.dev/remediate="true" or a policy name, or namespace label
unstick.dev/remediate=true) it carries out the safe plan of the RemediationPolicy: API
actions itself, node actions through the node agent. See docs/controller.md.
"""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "controller",
        help="run the controller (Kopf operator)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig to use (default: in-cluster service account, else $KUBECONFIG or "
        "~/.kube/config)",
    )
    p.add_argument(
        "--namespace-scope",
        metavar="NS",
        action="append",
        default=[],
        help="watch pods and Remediations only in this namespace; repeat for several "
        "(default: all namespaces, cluster-wide)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9100,
        metavar="PORT",
        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (0: off; default 9100)",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=8080,
        metavar="PORT",
        help="Kopf liveness endpoint on http://0.0.0.0:PORT/healthz (0: off; default 8080)",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while this replica holds the leader Lease, so one of several replicas "
        "acts and the others stand by with warm caches (default: on)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="no leader election (--no-leader-elect): for a single replica, tests and local runs",
    )
    p.add_argument(
        "--leader-elect-lease-duration",
        default=DEFAULT_LEASE_DURATION,
        metavar="DURATION",
        help="a standby takes the Lease when its holder has not renewed it for this long, "
        f"measured on the standby's own clock (default {DEFAULT_LEASE_DURATION})",
    )
    p.add_argument(
        "--leader-elect-renew-deadline",
        default=DEFAULT_RENEW_DEADLINE,
        metavar="DURATION",
        help="the leader stops writing when no renew succeeded for this long; shorter than "
        f"the lease duration (default {DEFAULT_RENEW_DEADLINE})",
    )
    p.add_argument(
        "--leader-elect-retry-period",
        default=DEFAULT_RETRY_PERIOD,
        metavar="DURATION",
        help=f"the leader renews, a standby tries, this often (default {DEFAULT_RETRY_PERIOD})",
    )
    p.add_argument(
        "--leader-elect-lease-name",
        default=DEFAULT_LEASE_NAME,
        metavar="NAME",
        help="the Lease (coordination.k8s.io/v1) the replicas share "
        f"(default {DEFAULT_LEASE_NAME})",
    )
    p.add_argument(
        "--leader-elect-lease-namespace",
        default=None,
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE, else default)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=32,
        metavar="N",
        help="stuck pods reconciled at the same time (default 32); the HTTP connection "
        "pool is sized to match",
    )
    p.add_argument(
        "--recheck-seconds",
        type=float,
        default=300.0,
        metavar="S",
        help="look again at a stuck pod nothing changed about after S seconds (default 300)",
    )
    p.add_argument(
        "--kubelet-finish-seconds",
        type=float,
        default=20.0,
        metavar="S",
        help="after the agent's node steps left nothing of a pod on its node, give the "
        "kubelet S seconds to finish the pod itself before a KubeletNotProgressing "
        "force-delete (default 20)",
    )
    p.add_argument(
        "--node-round-trip",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask a stuck pod's node agent once, with a mandate (the node actions the "
        "policy permits): the agent probes, plans with the same core and acts in one round "
        "trip (design.md §11; default: on). --no-node-round-trip: the previous release's "
        "flow, for one release (the controller asks for a probe, then for the steps it "
        "planned), e.g. while agents older than this controller still run",
    )
    p.add_argument(
        "--max-actions-per-minute",
        type=int,
        default=DEFAULT_CLUSTER_CAP,
        metavar="N",
        help="cluster-wide cap on actions per minute that no RemediationPolicy can raise "
        f"(default {DEFAULT_CLUSTER_CAP}); a policy's rateLimits.clusterPerMinute applies "
        "when lower",
    )
    p.add_argument(
        "--max-node-actions-per-minute",
        type=int,
        default=DEFAULT_NODE_CAP,
        metavar="N",
        help="cap on actions per node per minute that no RemediationPolicy can raise "
        f"(default {DEFAULT_NODE_CAP}); a policy's rateLimits.nodePerMinute applies when lower",
    )
    p.add_argument(
        "--remediation-retention",
        default=DEFAULT_RETENTION,
        metavar="DURATION",
        help="remove Resolved and Refused Remediations nothing was written to for this long "
        "(e.g. 168h, 720h, 30m; 0: keep them for ever; default "
        f"{DEFAULT_RETENTION}). A record the action budget, an open node incident or a "
        "pod still Terminating needs is kept",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging (--log-level DEBUG)")
    logs.add_log_flags(p)
    p.set_defaults(command="controller")


def run(args: argparse.Namespace) -> int:
    if args.verbose:
        args.log_level = "DEBUG"
    logs.setup(args.log_format, args.log_level, kopf_json=True)
    from unstick.controller import logfilter

    logfilter.install()  # a retried 429/5xx answer is a WARNING, not an ERROR
    logfilter.write_off_thread()  # workers never wait for the log's lock
    if args.kubeconfig and not Path(args.kubeconfig).exists():
        print(f"unstick controller: --kubeconfig {args.kubeconfig}: no such file", file=sys.stderr)
        return 2
    for port_flag in ("metrics_port", "health_port"):
        if not 0 <= getattr(args, port_flag) <= 65535:
            print(
                f"unstick controller: --{port_flag.replace('_', '-')} must be 0..65535",
                file=sys.stderr,
            )
            return 2
    election, problem = lease_settings(args)
    if problem:
        print(f"unstick controller: {problem}", file=sys.stderr)
        return 2
    retention_s = parse_duration(str(args.remediation_retention))
    if retention_s is None:
        print(
            f"unstick controller: --remediation-retention {args.remediation_retention!r}: "
            "not a duration (e.g. 168h, 30m; 0: keep for ever)",
            file=sys.stderr,
        )
        return 2
    for count_flag in ("workers", "max_actions_per_minute", "max_node_actions_per_minute"):
        if getattr(args, count_flag) < 1:
            flag = count_flag.replace("_", "-")
            print(f"unstick controller: --{flag} must be at least 1", file=sys.stderr)
            return 2

    import asyncio

    import kopf

    from unstick.controller.leader import own_identity
    from unstick.controller.operator import ControllerSettings, State, build_registry, configure
    from unstick.controller.reconciler import ReconcileSettings
    from unstick.controller.runtime import RuntimeSettings
    from unstick.kube.client import (
        POOL_EXTRA,
        POOL_SIZE,
        USER_AGENT,
        ClientSettings,
        load_configuration,
    )

    try:
        load_configuration(args.kubeconfig)
    except Exception as exc:
        where = args.kubeconfig or "in-cluster config / $KUBECONFIG / ~/.kube/config"
        print(
            f"unstick controller: cannot load Kubernetes credentials from {where}: {exc}",
            file=sys.stderr,
        )
        return 2
    namespaces = tuple(args.namespace_scope)
    # Which replica sent a request: the audit log's userAgent names it.
    agent = USER_AGENT if election is None else f"{USER_AGENT} ({election.identity})"
    settings = ControllerSettings(
        client=ClientSettings(
            kubeconfig=args.kubeconfig,
            pool_size=max(POOL_SIZE, args.workers + POOL_EXTRA),
            user_agent=agent,
        ),
        runtime=RuntimeSettings(
            namespaces=namespaces,
            workers=args.workers,
            retention_s=retention_s,
            reconcile=ReconcileSettings(
                recheck_s=args.recheck_seconds,
                kubelet_finish_s=args.kubelet_finish_seconds,
                node_round_trip=args.node_round_trip,
                max_cluster_per_minute=args.max_actions_per_minute,
                max_node_per_minute=args.max_node_actions_per_minute,
            ),
        ),
        metrics_port=args.metrics_port,
        election=election,
    )
    kopf_settings = kopf.OperatorSettings()
    registry = build_registry()
    configure(kopf_settings, args.log_level == "DEBUG", registry)
    state = State(settings=settings)
    memo = kopf.Memo(state=state)
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    try:
        asyncio.run(
            kopf.operator(
                registry=registry,
                settings=kopf_settings,
                standalone=True,  # one replica acts: the Lease decides, not Kopf's peering
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=liveness,
                memo=memo,
                stop_flag=state.stop_flag,
                # Kopf's own name for this process (its logs); without one it asks the
                # passwd database, which has no entry for the image's uid 65532.
                identity=election.identity if election else own_identity(),  # type: ignore[arg-type]
            )
        )
    except KeyboardInterrupt:
        return 130
    if state.elector is not None and state.elector.lost:
        return 1  # lost the lease: started again (by the kubelet) as a standby
    return 0


_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """client-go's (Go's) flag durations as far as they are useful here: 15s, 1.5s, 500ms,
    1m, 168h, 1h30m, or plain seconds. None when it is none of these."""
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h))+", text):
        return None
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    return sum(float(value) * _UNIT_S[unit] for value, unit in parts)


def lease_settings(args: argparse.Namespace) -> tuple[LeaseSettings | None, str | None]:
    """The election's settings from the flags (None: no election), or the problem with them
    in one line naming the flag."""
    from unstick.controller.leader import LeaseSettings, own_identity

    if args.standalone or not args.leader_elect:
        return None, None
    durations: dict[str, float] = {}
    for flag in ("lease_duration", "renew_deadline", "retry_period"):
        text = getattr(args, f"leader_elect_{flag}")
        seconds = parse_duration(str(text))
        if seconds is None or seconds <= 0:
            name = "--leader-elect-" + flag.replace("_", "-")
            return None, f"{name} {text!r}: not a duration (e.g. 15s, 500ms, 1m)"
        durations[flag] = seconds
    namespace = args.leader_elect_lease_namespace or os.environ.get("POD_NAMESPACE") or "default"
    settings = LeaseSettings(
        identity=own_identity(),
        name=args.leader_elect_lease_name,
        namespace=namespace,
        lease_duration_s=durations["lease_duration"],
        renew_deadline_s=durations["renew_deadline"],
        retry_period_s=durations["retry_period"],
    )
    problem = settings.problem()
    if problem:
        return None, (
            f"--leader-elect-lease-duration {args.leader_elect_lease_duration}, "
            f"--leader-elect-renew-deadline {args.leader_elect_renew_deadline}, "
            f"--leader-elect-retry-period {args.leader_elect_retry_period}: {problem}"
        )
    return settings, None
