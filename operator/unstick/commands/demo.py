"""`unstick demo`: run the local demo: control plane, stuck pods, unstick fixing them."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("demo", help="run the local demo: control plane, stuck pods, unstick fixing them", description="run the local demo: control plane, stuck pods, unstick fixing them")
    p.set_defaults(command="demo")


def run(args: argparse.Namespace) -> int:
    print("unstick demo: not implemented yet", file=sys.stderr)
    return 1
