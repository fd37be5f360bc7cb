"""`unstick agent`: run the node agent on this node."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("agent", help="run the node agent on this node", description="run the node agent on this node")
    p.set_defaults(command="agent")


def run(args: argparse.Namespace) -> int:
    print("unstick agent: not implemented yet", file=sys.stderr)
    return 1
