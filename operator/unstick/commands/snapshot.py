"""`unstick snapshot`: capture a snapshot bundle of NAMESPACE/POD from a live cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("snapshot", help="capture a snapshot bundle of NAMESPACE/POD from a live cluster", description="capture a snapshot bundle of NAMESPACE/POD from a live cluster")
    p.set_defaults(command="snapshot")


def run(args: argparse.Namespace) -> int:
    print("unstick snapshot: not implemented yet", file=sys.stderr)
    return 1
