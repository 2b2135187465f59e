"""The `hunter` command line: one entry point; each area registers its own subcommands.

Every area module exposes `add_parser(subparsers)` which adds its subcommand(s) and sets
`handler=<callable(args) -> int>` as a parser default. Handlers return the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias, cast

from supervisor import __version__

EXIT_OK = 0
EXIT_USAGE = 2

# Modules that contribute subcommands, in the order `hunter --help` lists them. A module that is
# not present yet (an area still being built) is simply skipped.
_AREAS = (
    "supervisor.cli.commands",
    "supervisor.config",
    "sandbox.cli",
    "ledger.cli",
    "supervisor.console.cli",
    "supervisor.mcp.cli",
)

Handler = Callable[[argparse.Namespace], int]
#: What every area's ``add_parser`` is handed: the ``hunter`` sub-command registry.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hunter",
        description="HUMANOID HUNTER supervisor: runs agent work safely.",
    )
    parser.add_argument("--version", action="version", version=f"hunter {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = cast("Handler | None", getattr(args, "handler", None))
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return handler(args)
