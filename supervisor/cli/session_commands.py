"""`hunter session open|close|list`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.cli.client import client_options, run_client
from supervisor.cli.exit_codes import EXIT_OK
from supervisor.cli.output import out, table, to_json

if TYPE_CHECKING:
    from supervisor.client import Client

__all__ = ["add_session_parser"]


def _cmd_session_open(args: argparse.Namespace) -> int:
    workspace = str(Path(args.workspace).absolute()) if args.workspace else None

    async def body(client: Client) -> int:
        session = await client.open_session(
            args.package,
            tier=args.tier,
            work_order_id=args.work_order or None,
            workspace=workspace,
            tenant=args.tenant or None,
            priority=args.priority,
        )
        out(to_json(session.to_dict()) if args.json else session.session_id)
        return EXIT_OK

    return run_client(args, body)


def _cmd_session_close(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        session = await client.close_session(args.session_id)
        out(to_json(session.to_dict()) if args.json else f"{session.session_id} closed")
        return EXIT_OK

    return run_client(args, body)


def _cmd_session_list(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        sessions = await client.sessions()
        if args.json:
            out(to_json({"sessions": [s.to_dict() for s in sessions]}))
        else:
            rows = [
                (
                    s.session_id,
                    s.package_id,
                    s.tier,
                    s.tenant or "-",
                    s.priority or "-",
                    s.state,
                    s.turns,
                )
                for s in sessions
            ]
            header = ("SESSION", "PACKAGE", "TIER", "TENANT", "PRIORITY", "STATE", "TURNS")
            out(table(header, rows))
        return EXIT_OK

    return run_client(args, body)


def add_session_parser(subparsers: Any) -> None:
    """Register `hunter session open|close|list`."""
    p = subparsers.add_parser("session", help="open, close and list sessions")
    sp = p.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    o = sp.add_parser("open", help="open a session of an installed package; prints its id")
    o.add_argument("package", help="package id (installed under <root>/installed/)")
    o.add_argument(
        "--tier",
        default="default",
        help="the session's tier: its plane under <root>/planes/ (default: default)",
    )
    o.add_argument("--work-order", metavar="ID", help="work order id recorded in the evidence")
    o.add_argument("--workspace", metavar="DIR", help="where promoted outputs go")
    o.add_argument(
        "--tenant",
        metavar="LABEL",
        help="turns of one tenant's sessions share one place in the fair order (default: the"
        " session is its own tenant)",
    )
    o.add_argument(
        "--priority",
        type=int,
        metavar="1-10",
        help="the tenant's weight in that order: this many turns start per round (default 1)",
    )
    o.add_argument("--json", action="store_true", help="print the session as JSON")
    client_options(o)
    o.set_defaults(handler=_cmd_session_open)
    c = sp.add_parser("close", help="close a session (no unfinished turns)")
    c.add_argument("session_id", help="the session's id (as `session open` printed it)")
    c.add_argument("--json", action="store_true", help="print the session as JSON")
    client_options(c)
    c.set_defaults(handler=_cmd_session_close)
    ls = sp.add_parser("list", help="list sessions")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    client_options(ls)
    ls.set_defaults(handler=_cmd_session_list)
