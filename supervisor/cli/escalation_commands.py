"""`hunter escalations list|resolve`: turns parked for an operator's decision."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from supervisor.cli.client import client_options, decision_options, run_client
from supervisor.cli.exit_codes import EXIT_OK
from supervisor.cli.output import out, table, to_json
from supervisor.cli.turn_commands import parse_turn_id

if TYPE_CHECKING:
    from supervisor.client import Client

__all__ = ["add_escalations_parser"]


def _cmd_escalations_list(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        escalations = await client.escalations()
        if args.json:
            out(to_json({"escalations": [t.to_dict() for t in escalations]}))
        elif not escalations:
            out("no escalated turns")
        else:
            rows = [
                (t.turn_id, t.session_id, t.turn_number, t.kind, t.fault_type, t.reason_code)
                for t in escalations
            ]
            out(table(("TURN", "SESSION", "#", "KIND", "FAULT", "REASON"), rows))
        return EXIT_OK

    return run_client(args, body)


def _cmd_escalations_resolve(args: argparse.Namespace) -> int:
    action = "retry" if args.retry else "terminate"

    async def body(client: Client) -> int:
        turn = await client.resolve(
            args.turn_id, action, reason=args.reason, operator=args.operator
        )
        out(to_json(turn.to_dict()) if args.json else f"turn {turn.turn_id}: {turn.state}")
        return EXIT_OK

    return run_client(args, body)


def add_escalations_parser(subparsers: Any) -> None:
    """Register `hunter escalations list|resolve`."""
    p = subparsers.add_parser("escalations", help="turns parked for an operator's decision")
    sp = p.add_subparsers(dest="escalations_command", metavar="ACTION", required=True)
    ls = sp.add_parser("list", help="list escalated turns")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    client_options(ls)
    ls.set_defaults(handler=_cmd_escalations_list)
    r = sp.add_parser(
        "resolve", help="decide an escalated turn: --retry or --terminate, and --reason why"
    )
    r.add_argument("turn_id", type=parse_turn_id, help="the escalated turn's id")
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--retry", action="store_true", help="give the turn another attempt")
    how.add_argument("--terminate", action="store_true", help="end the turn as terminated")
    decision_options(r, reason_required=True)
    r.add_argument("--json", action="store_true", help="print the turn as JSON")
    client_options(r)
    r.set_defaults(handler=_cmd_escalations_resolve)
