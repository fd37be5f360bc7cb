"""`unstick why NAMESPACE/POD`: live diagnosis of one pod — the cause, the evidence and the
plan from the live API and the agent's latest probe, under the policy in force, without
writing a bundle first (`unstick snapshot` + `unstick diagnose` in one step)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2

DESCRIPTION = """\
Diagnose one pod now, from the live cluster: reads what `unstick snapshot` captures (the
Pod, Node, CSINode, volumes, Events, the latest agent probe and the RemediationPolicy in
force for the pod) and prints what `unstick diagnose` would say about that bundle: the
cause, the evidence, the plan and what is refused and why. Nothing is written to the
cluster. Example:  kubectl unstick why shop/web-0"""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "why",
        help="diagnose NAMESPACE/POD live (cause, evidence, plan) under the policy in force",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pod", metavar="NAMESPACE/POD", help="the pod, e.g. shop/web-0")
    p.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
    )
    p.add_argument(
        "--output",
        choices=("json", "text"),
        default="text",
        help="json: the docs/design.md §6 report; text: for people (default)",
    )
    p.set_defaults(command="why")


def run(args: argparse.Namespace) -> int:
    from unstick.commands.snapshot import capture_live, live_failure, split_pod

    pod = split_pod(str(args.pod))
    if pod is None:
        print(f"unstick why: {args.pod!r} is not NAMESPACE/POD (e.g. shop/web-0)", file=sys.stderr)
        return EXIT_USAGE
    from unstick.commands.diagnose import recorded_policy, render
    from unstick.core.model.snapshot import BundleError, parse_bundle
    from unstick.core.policy.remediation_policy import PolicyError, parse_policy

    try:
        bundle = capture_live(args.kubeconfig, *pod)
        raw_policy = recorded_policy(bundle)
        policy = parse_policy(raw_policy) if raw_policy is not None else None
        print(render(parse_bundle(bundle), policy, args.output))
    except (BundleError, PolicyError) as err:
        print(f"unstick why: cannot diagnose {args.pod}: {err}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:
        why = live_failure(err)
        if why is None:
            raise
        print(f"unstick why: {why}", file=sys.stderr)
        return EXIT_FAILED
    return 0
