"""`hunter events`: a ``tail -f`` of the daemon's change feed (``events.subscribe``, through
the client library's `Client.events`).

Each event is one line (``--json``: the event object, one per line, for tools). It follows the
feed until interrupted; when the connection ends (the daemon restarted) or the daemon cut the
subscription off (this terminal fell too far behind), it says so on stderr and subscribes
again from the last cursor it printed, so that nothing is missed or printed twice; after a
daemon restart the cursor cannot be honoured, and it says that there is a gap.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from supervisor.cli.client import client_options, locate
from supervisor.cli.exit_codes import EXIT_OK, EXIT_USAGE
from supervisor.cli.output import err, out

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers
    from supervisor.feed import Event

__all__ = ["add_events_parser", "describe_event"]

#: seconds between attempts to reach the daemon again
_RETRY_S = 1.0


def describe_event(event: Event) -> str:
    """One event as a line a person reads: time, kind, then what it is about (the fields it
    has: those of another kind are None)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.at_us / 1e6))
    millis = (event.at_us // 1000) % 1000
    parts = [f"{stamp}.{millis:03d}", f"{event.kind:<20}"]
    for label, value in (
        ("turn", event.turn_id),
        ("session", event.session_id),
        ("executor", event.executor_id),
        ("daemon", event.daemon),
    ):
        if value is not None:
            parts.append(f"{label} {value}")
    for key, field in (
        ("state", event.state),
        ("attempt", event.attempt),
        ("decision", event.decision),
        ("reason_code", event.reason_code),
    ):
        if field is not None:
            parts.append(f"{key}={field}")
    if event.command_types:
        parts.append("commands=" + ",".join(event.command_types))
    if event.detail is not None:
        parts.append(f"({event.detail})")
    return "  ".join(parts)


def _event_json(event: Event) -> str:
    """The event as one JSON line: the object the daemon sent (the fields its kind has)."""
    import msgspec
    import orjson

    return orjson.dumps(msgspec.to_builtins(event)).decode()


def _cmd_events(args: argparse.Namespace) -> int:
    import anyio

    from supervisor.client import Client
    from supervisor.errors import ConfigError, ConnectionLost, ControlClientError, DaemonNotRunning

    try:
        socket = locate(args)
    except ConfigError as exc:
        err(f"hunter events: {exc}")
        return EXIT_USAGE
    after: str | None = args.after
    printed = [0]

    async def follow() -> int:
        nonlocal after
        while True:
            try:
                async with (
                    Client(socket.path, reconnect_s=0, auto_keys=False) as client,
                    client.events(
                        sessions=args.session or None,
                        turns=args.turn or None,
                        kinds=args.kind or None,
                        after=after or None,
                    ) as events,
                ):
                    if events.gap:
                        err(f"hunter events: gap: {events.gap}")
                    async for event in events:
                        out(_event_json(event) if args.json else describe_event(event))
                        after = event.cursor
                        printed[0] += 1
                        if args.count and printed[0] >= args.count:
                            return EXIT_OK
            except ControlClientError as exc:
                if exc.code == "bad_request":
                    err(f"hunter events: {exc.message}")
                    return EXIT_USAGE
                err(f"hunter events: {exc.code}: {exc.message}; following again")
            except (ConnectionLost, DaemonNotRunning) as exc:
                err(f"hunter events: {exc}; trying again every {_RETRY_S:g} s")
            await anyio.sleep(_RETRY_S)

    try:
        return anyio.run(follow)
    except KeyboardInterrupt:
        return EXIT_OK


def add_events_parser(subparsers: Subparsers) -> None:
    """Register `hunter events`."""
    p = subparsers.add_parser(
        "events",
        help="follow what happens to turns, escalations, executors and daemons (tail -f)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--session", action="append", metavar="SID", help="only this session's (repeatable)"
    )
    p.add_argument(
        "--turn", action="append", type=int, metavar="N", help="only this turn's (repeatable)"
    )
    p.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help="only events of this kind, e.g. turn.ended, escalation.raised (repeatable)",
    )
    p.add_argument(
        "--after",
        metavar="CURSOR",
        help="begin after this event's cursor (the kept events since then come first)",
    )
    p.add_argument(
        "--count", type=int, metavar="N", help="stop after printing N events (default: follow)"
    )
    p.add_argument("--json", action="store_true", help="print each event as one JSON line")
    client_options(p)
    p.set_defaults(handler=_cmd_events)
