"""`hunter turn list`: the turns the store holds, filtered and paged (``turns.list``).

Filters (each optional; the given ones all hold): ``--session SID``, ``--state STATE``
(repeatable, or comma-separated), ``--package PKG``, ``--since WHEN`` / ``--until WHEN``
(accepted at or after / before: an ISO 8601 time, a naive one is local, or an age such as
``90s``, ``15m``, ``2h``, ``7d``). It prints ``--limit`` turns (default 100) after turn
``--after ID``; when more follow, stderr says the ``--after`` of the next page.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from sandbox.policy.lifecycle import TurnState
from supervisor.cli.client import client_options, run_client
from supervisor.cli.exit_codes import EXIT_OK
from supervisor.cli.output import err, out, table, to_json

if TYPE_CHECKING:
    from supervisor.client import Client, Turn

__all__ = ["add_turn_list_parser", "parse_when"]

#: Turns a page of ``turns.list`` holds at most.
_PAGE_MAX: Final = 500
_AGE: Final = re.compile(r"^(?P<n>\d+)(?P<unit>[smhd])$")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_STATES: Final = ", ".join(s.value for s in TurnState)


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """``--since`` / ``--until``: an ISO 8601 time (naive: local) or an age before *now*."""
    age = _AGE.match(text.strip())
    if age is not None:
        ago = timedelta(**{_UNITS[age["unit"]]: int(age["n"])})
        return (now or datetime.now(UTC)) - ago
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time (2026-11-26T14:30) nor an age (15m, 2h, 7d)"
        ) from None


def _states(text: str) -> list[str]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in {s.value for s in TurnState}]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: a turn state is one of {_STATES}")
    return names


def _accepted(turn: Turn) -> str:
    if turn.accepted_us is None:
        return "-"
    when = datetime.fromtimestamp(turn.accepted_us / 1_000_000, tz=UTC)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _cmd_turn_list(args: argparse.Namespace) -> int:
    states = sorted({s for group in args.state or [] for s in group}) or None

    async def body(client: Client) -> int:
        turns: list[Turn] = []
        after: int | None = args.after
        while after is not None and len(turns) < args.limit:
            page = await client.turn_page(
                after=after,
                limit=min(_PAGE_MAX, args.limit - len(turns)),
                session_id=args.session,
                states=states,
                package_id=args.package,
                accepted_since=args.since,
                accepted_until=args.until,
            )
            turns.extend(page.turns)
            after = page.next_after
        if args.json:
            out(to_json({"turns": [t.to_dict() for t in turns], "next_after": after}))
        else:
            rows = [
                (
                    t.turn_id,
                    t.session_id,
                    t.turn_number,
                    t.kind or "-",
                    t.state,
                    t.attempt,
                    _accepted(t),
                    t.reason_code or "-",
                )
                for t in turns
            ]
            header = ("TURN", "SESSION", "NO", "KIND", "STATE", "ATTEMPT", "ACCEPTED", "REASON")
            out(table(header, rows))
        if after is not None:
            err(f"more turns follow: add --after {after} for the next page")
        return EXIT_OK

    return run_client(args, body)


def add_turn_list_parser(turn_actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `hunter turn list` under `hunter turn`."""
    ls = turn_actions.add_parser(
        "list",
        help="list turns: by session, state, package, time accepted; paged",
        description="List the turns the daemon's store holds, oldest first, those every given"
        " filter keeps. WHEN is an ISO 8601 time (2026-11-26T14:30, naive: local time) or an"
        " age (90s, 15m, 2h, 7d ago). When more turns follow, stderr says the --after of the"
        " next page.",
    )
    ls.add_argument("--session", metavar="SID", help="turns of this session")
    ls.add_argument(
        "--state",
        type=_states,
        action="append",
        metavar="STATE",
        help=f"turns in this state (repeatable, or comma-separated): {_STATES}",
    )
    ls.add_argument("--package", metavar="PKG", help="turns of the sessions of this package")
    ls.add_argument("--since", type=parse_when, metavar="WHEN", help="accepted at or after WHEN")
    ls.add_argument("--until", type=parse_when, metavar="WHEN", help="accepted before WHEN")
    ls.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="ID",
        help="start after this turn id (the next page's, as stderr said; default: the start)",
    )
    ls.add_argument(
        "--limit",
        type=_positive,
        default=100,
        metavar="N",
        help="print at most N turns (default 100)",
    )
    ls.add_argument("--json", action="store_true", help="print {turns: [...], next_after} as JSON")
    client_options(ls)
    ls.set_defaults(handler=_cmd_turn_list)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number of turns")
    return value
