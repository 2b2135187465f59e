"""`hunter demo`: the end-to-end demo (run by `supervisor.demo.stack`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_demo_parser"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from supervisor.demo.stack import run_demo

    code: int = run_demo(
        root=Path(args.root) if args.root else None, fresh=args.fresh, keep=args.keep
    )
    return code


def add_demo_parser(subparsers: Any) -> None:
    """Register `hunter demo`."""
    p = subparsers.add_parser(
        "demo",
        help="run the end-to-end demo (daemon, executors, mixed batch, ledger check)",
        description="Starts a daemon on a demo root (default: a new temporary directory, "
        "removed afterwards unless --keep or the demo fails), example executors "
        "(working and chaos), opens a session of the 'demo' package, submits a mixed batch, "
        "prints a table of outcomes and verifies every ledger. Exit 0 only if every outcome "
        "was the expected one.",
    )
    p.add_argument("--root", metavar="DIR", help="demo root (default: a new temporary dir)")
    p.add_argument("--fresh", action="store_true", help="with --root: delete it first")
    p.add_argument("--keep", action="store_true", help="keep the temporary root afterwards")
    p.set_defaults(handler=_cmd_demo)
