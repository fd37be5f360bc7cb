"""`unstick why NAMESPACE/POD`: live diagnosis of one pod — the cause, the evidence and the
plan from the live API and the agent's latest probe, under the policy in force, without
writing a bundle first (`unstick snapshot` + `unstick diagnose` in one step)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from unstick.commands import options

EXIT_FAILED = 1
REPORT_FORMATS = (
    "json or yaml: the docs/design.md §6 report; text: for people (default); wide: the same "
    "as text (a diagnosis has no columns to widen)"
)

DESCRIPTION = """\
Diagnose one pod now, from the live cluster: reads what `unstick snapshot` captures (the
Pod, Node, CSINode, volumes, Events, the latest agent probe and the RemediationPolicy in
force for the pod) and prints what `unstick diagnose` would say about that bundle: the
cause, the evidence, the plan and what is refused and why. Nothing is written to the
cluster. Example:  kubectl unstick why shop/web-0  (or: kubectl unstick why -n shop web-0)

Exit status: 0 with a diagnosis, 1 when the cluster could not be read or the pod not
diagnosed, 2 on bad arguments or an unusable kubeconfig."""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "why",
        help="diagnose NAMESPACE/POD live (cause, evidence, plan) under the policy in force",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_pod_args(p, "shop/web-0")
    options.add_cluster_flags(p)
    options.add_output_flag(p, text=REPORT_FORMATS)
    p.set_defaults(command="why")


def run(args: argparse.Namespace) -> int:
    from unstick.commands.snapshot import capture_live, live_failure
    from unstick.kube.client import KubeconfigError

    try:
        pod = options.pod_of(args)
    except (options.UsageError, KubeconfigError) as err:
        print(f"unstick why: {err}", file=sys.stderr)
        return options.EXIT_USAGE
    from unstick.commands.diagnose import recorded_policy, render
    from unstick.core.model.snapshot import BundleError, parse_bundle
    from unstick.core.policy.remediation_policy import PolicyError, parse_policy

    try:
        bundle = capture_live(args, *pod)
        raw_policy = recorded_policy(bundle)
        policy = parse_policy(raw_policy) if raw_policy is not None else None
        print(render(parse_bundle(bundle), policy, args.output))
    except KubeconfigError as err:
        print(f"unstick why: {err}", file=sys.stderr)
        return options.EXIT_USAGE
    except (BundleError, PolicyError) as err:
        print(f"unstick why: cannot diagnose {'/'.join(pod)}: {err}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:
        why = live_failure(err)
        if why is None:
            raise
        print(f"unstick why: {why}", file=sys.stderr)
        return EXIT_FAILED
    return 0
