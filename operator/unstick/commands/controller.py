"""`unstick controller`: run the controller (Kopf operator + lean pod watcher)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from unstick.commands import logs
from unstick.core.policy.ratelimit import DEFAULT_CLUSTER_CAP, DEFAULT_NODE_CAP

#: Kopf renews a peering record `lifetime - randint(5, 10)` s after the last renewal (at
#: least 1 s): with 20 s a renewal is due 10-15 s after the last one, 5-10 s before the
#: record runs out; at 10 s every 1-5 s.
DEFAULT_PEERING_LIFETIME_S = 20
MIN_PEERING_LIFETIME_S = 10

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
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--peering",
        metavar="NAME",
        default="unstick",
        help="Kopf peering name (ClusterKopfPeering) so only one replica is active "
        "(default: unstick)",
    )
    p.add_argument(
        "--peering-lifetime",
        type=int,
        default=DEFAULT_PEERING_LIFETIME_S,
        metavar="S",
        help="seconds this replica's peering record stays valid; Kopf renews it 5-10 s "
        "before it runs out. After a replica is killed without saying goodbye (SIGKILL, "
        f"node lost) the next one waits up to S seconds (default {DEFAULT_PEERING_LIFETIME_S}"
        f", at least {MIN_PEERING_LIFETIME_S}; Kopf's own default is 60)",
    )
    mode.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: for a single replica, tests and local runs",
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
    if args.peering_lifetime < MIN_PEERING_LIFETIME_S:
        print(
            f"unstick controller: --peering-lifetime must be at least {MIN_PEERING_LIFETIME_S} "
            "(a renewal must arrive before the record expires)",
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

    from unstick.controller.operator import ControllerSettings, State, build_registry, configure
    from unstick.controller.peering import PeeringSettings, own_identity
    from unstick.controller.reconciler import ReconcileSettings
    from unstick.controller.runtime import RuntimeSettings
    from unstick.kube.client import POOL_EXTRA, POOL_SIZE, ClientSettings, load_configuration

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
    identity = own_identity()
    settings = ControllerSettings(
        client=ClientSettings(
            kubeconfig=args.kubeconfig, pool_size=max(POOL_SIZE, args.workers + POOL_EXTRA)
        ),
        runtime=RuntimeSettings(
            namespaces=namespaces,
            workers=args.workers,
            reconcile=ReconcileSettings(
                recheck_s=args.recheck_seconds,
                kubelet_finish_s=args.kubelet_finish_seconds,
                max_cluster_per_minute=args.max_actions_per_minute,
                max_node_per_minute=args.max_node_actions_per_minute,
            ),
        ),
        metrics_port=args.metrics_port,
        peering=None if args.standalone else PeeringSettings(args.peering, identity),
    )
    kopf_settings = kopf.OperatorSettings()
    registry = build_registry()
    configure(kopf_settings, args.log_level == "DEBUG", registry)
    kopf_settings.peering.lifetime = args.peering_lifetime
    memo = kopf.Memo(state=State(settings=settings))
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    try:
        asyncio.run(
            kopf.operator(
                registry=registry,
                settings=kopf_settings,
                standalone=args.standalone,
                peering_name=None if args.standalone else args.peering,
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=liveness,
                memo=memo,
                identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType(str)
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0
