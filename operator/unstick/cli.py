"""The `unstick` command line: one subcommand per module in `unstick.commands`.

Each command module defines `add_parser(subparsers)` and `run(args) -> int`, and keeps
its heavy imports inside `run`, so `unstick diagnose` never loads Kopf or a client.

The user's commands are also a kubectl plugin: the `kubectl-unstick` entry point (kubectl
finds it on PATH) makes `kubectl unstick status|why|snapshot|diagnose` work; the server
and harness commands (controller, agent, demo) are `unstick` only.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Any, NoReturn

#: What a kubectl user runs: `kubectl unstick` lists (and accepts) only these.
USER_COMMANDS = ("status", "why", "diagnose", "snapshot")
#: The long-running parts: they need the `server` extra (Kopf, gRPC, prometheus-client).
SERVER_COMMANDS = ("controller", "agent")
COMMANDS = (*USER_COMMANDS, *SERVER_COMMANDS, "demo")
KUBECTL_PROG = "kubectl unstick"
EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """A usage error in one line (`unstick diagnose: argument --no-policy: not allowed with
    argument --policy; see unstick diagnose --help`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}; see {self.prog} --help\n")


def _not_yet(sub: Any, name: str) -> None:
    """A command named in COMMANDS whose module this version does not have."""
    p = sub.add_parser(name, help="(not available in this version of unstick)")
    p.set_defaults(command=name, missing=True)


def build_parser(prog: str = "unstick") -> argparse.ArgumentParser:
    from unstick import __version__

    parser = Parser(
        prog=prog,
        description=(
            "Find pods stuck in Terminating, work out why, and fix the cause where that is "
            f"safe. See `{prog} COMMAND --help`."
        ),
    )
    parser.add_argument("--version", action="version", version=f"unstick {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in USER_COMMANDS if prog == KUBECTL_PROG else COMMANDS:
        if importlib.util.find_spec(f"unstick.commands.{name}") is None:
            _not_yet(sub, name)
            continue
        module = importlib.import_module(f"unstick.commands.{name}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, prog: str = "unstick") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if getattr(args, "missing", False):
        print(f"{prog} {args.command}: not available in this version yet", file=sys.stderr)
        return 1
    module = importlib.import_module(f"unstick.commands.{args.command}")
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as err:
        if (
            args.command not in SERVER_COMMANDS
            or err.name is None
            or err.name.startswith("unstick")
        ):
            raise
        print(
            f"{prog} {args.command}: needs the server parts of unstick (missing: {err.name}): "
            "pip install 'unstick[server]'",
            file=sys.stderr,
        )
        return EXIT_USAGE


def kubectl_main() -> int:
    """`kubectl unstick ...`: kubectl runs the `kubectl-unstick` executable it finds on PATH
    with the remaining arguments."""
    return main(sys.argv[1:], prog=KUBECTL_PROG)


if __name__ == "__main__":
    sys.exit(main())
