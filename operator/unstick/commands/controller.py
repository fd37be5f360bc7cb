"""`unstick controller`: run the controller (Kopf operator)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("controller", help="run the controller (Kopf operator)", description="run the controller (Kopf operator)")
    p.set_defaults(command="controller")


def run(args: argparse.Namespace) -> int:
    print("unstick controller: not implemented yet", file=sys.stderr)
    return 1
