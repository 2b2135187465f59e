# The `hunter` command line: argument parsing and the sub-commands, which talk to a running daemon
# through the client library (`supervisor.client`) or run local tools (ledger, package, config).
"""The `hunter` command line."""

from supervisor.cli.main import build_parser as build_parser
from supervisor.cli.main import main as main

__all__ = ["build_parser", "main"]
