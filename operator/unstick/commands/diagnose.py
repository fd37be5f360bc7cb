"""`unstick diagnose`: diagnose one pod offline from a snapshot bundle."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("diagnose", help="diagnose one pod offline from a snapshot bundle", description="diagnose one pod offline from a snapshot bundle")
    p.set_defaults(command="diagnose")


def run(args: argparse.Namespace) -> int:
    print("unstick diagnose: not implemented yet", file=sys.stderr)
    return 1
