"""The `unstick` command line: one subcommand per module in `unstick.commands`.

Each command module defines `add_parser(subparsers)` and `run(args) -> int`, and keeps
its heavy imports inside `run`, so `unstick diagnose` never loads Kopf or a client.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("diagnose", "snapshot", "controller", "agent", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unstick",
        description=(
            "Find pods stuck in Terminating, work out why, and fix the cause where that is "
            "safe. See `unstick COMMAND --help`."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"unstick.commands.{name}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"unstick.commands.{args.command}")
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
