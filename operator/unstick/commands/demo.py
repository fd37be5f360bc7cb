"""`unstick demo`: run the local demo: control plane, stuck pods, unstick fixing them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run the local demo: control plane, stuck pods, unstick fixing them",
        description=(
            "Start a local control plane (etcd + kube-apiserver + kwok nodes), a node with real "
            "mounts — a real node (kubelet + containerd, unstick installed from the chart) "
            "where this machine can run one, else a storage node in a private mount namespace "
            "with a kubelet stand-in — and unstick; reproduce the classic stuck terminations "
            "and show live what unstick does. Needs root and the binaries `make tools` builds "
            "(and the images of `make images` for the real node). Leaves nothing running."
        ),
    )
    p.add_argument(
        "--non-interactive",
        action="store_true",
        help="print the table when it changes instead of redrawing the screen (for logs, CI)",
    )
    p.add_argument("--timeout", type=float, default=100.0, help="give up after S seconds")
    p.add_argument("--summary", type=Path, help="write the outcome of each scenario as JSON")
    p.add_argument(
        "--node",
        choices=("auto", "real", "stand-in"),
        default="auto",
        help="auto (default): a real node (kubelet + containerd, unstick from the chart) when "
        "this machine can run one and no other runs, else the kubelet stand-in, said on "
        "screen; real: the real node or an error saying why not (waits for another real "
        "node to stop); stand-in: the stand-in",
    )
    p.set_defaults(command="demo")


def run(args: argparse.Namespace) -> int:
    try:
        from devcluster.demo.run import DemoSettings
        from devcluster.demo.run import run as run_demo
    except ModuleNotFoundError:  # the wheel holds the operator only, not the dev harness
        print(
            "unstick demo: the demo runs from a source checkout of unstick, not from the "
            "installed package (it holds the operator only): git clone the repository and "
            "run `make demo` there",
            file=sys.stderr,
        )
        return 2

    settings = DemoSettings(
        interactive=sys.stdout.isatty() and not args.non_interactive,
        timeout_s=args.timeout,
        summary_path=args.summary,
        node=args.node,
    )
    return run_demo(settings)
