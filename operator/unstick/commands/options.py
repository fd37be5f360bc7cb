"""The flags the commands that read the cluster share, spelt as kubectl spells them:
`--kubeconfig`, `--context`, `-n NAMESPACE POD` (or `NAMESPACE/POD`), `-o FORMAT`.

Not a command (not in `unstick.cli.COMMANDS`): a helper of the modules that are.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unstick.kube.client import Kube

#: Bad arguments or an unusable kubeconfig: nothing was asked of the cluster.
EXIT_USAGE = 2

OUTPUTS = ("text", "wide", "json", "yaml")


class UsageError(Exception):
    """Arguments that do not name what the command needs; one line, exit status 2."""


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, or in-cluster)",
    )
    p.add_argument(
        "--context",
        metavar="NAME",
        help="the kubeconfig context to use (default: its current-context)",
    )


def add_pod_args(p: argparse.ArgumentParser, example: str) -> None:
    p.add_argument(
        "pod",
        metavar="[NAMESPACE/]POD",
        help=f"the pod, e.g. {example} or -n {example.replace('/', ' ')}",
    )
    add_namespace_flag(p, "the pod's namespace (default: the context's namespace, else default)")


def add_namespace_flag(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("-n", "--namespace", metavar="NAMESPACE", help=text)


def add_output_flag(
    p: argparse.ArgumentParser, choices: tuple[str, ...] = OUTPUTS, default: str = "text",
    text: str = "",
) -> None:  # fmt: skip
    p.add_argument(
        "-o",
        "--output",
        choices=choices,
        default=default,
        help=text or f"output format: {', '.join(choices)} (default: {default})",
    )


def pod_of(args: argparse.Namespace) -> tuple[str, str]:
    """(namespace, name) from `NAMESPACE/POD`, or `POD` with `-n`, or `POD` in the context's
    namespace (as kubectl)."""
    text = str(args.pod)
    flag = getattr(args, "namespace", None)
    namespace, sep, name = text.rpartition("/")
    if sep:
        if not namespace or not name or "/" in namespace:
            raise UsageError(f"{text!r} is not NAMESPACE/POD or POD (e.g. shop/web-0)")
        if flag and flag != namespace:
            raise UsageError(f"{text!r} names namespace {namespace!r}, -n says {flag!r}")
        return namespace, name
    if not name:
        raise UsageError("no pod given (e.g. shop/web-0 or -n shop web-0)")
    if flag:
        return flag, name
    from unstick.kube.client import context_namespace

    return context_namespace(args.kubeconfig, args.context), name


def connect(args: argparse.Namespace, user_agent: str) -> Kube:
    """The project's client for the kubeconfig and context the flags name (a few quick
    retries: a person is waiting). KubeconfigError: one line naming the file."""
    from unstick.kube.client import ClientSettings, Kube

    return Kube(
        ClientSettings(
            kubeconfig=args.kubeconfig,
            context=args.context,
            user_agent=user_agent,
            retry_attempts=3,
            retry_max_wait_s=5.0,
        )
    )


def dump(data: Any, output: str) -> str:
    """`data` as JSON (indented) or YAML (block style, keys in their order)."""
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False)).rstrip("\n")
    return json.dumps(data, indent=2)
