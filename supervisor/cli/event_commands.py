"""`hunter events`: a ``tail -f`` of the daemon's change feed (``events.subscribe``).

Each event is one line (``--json``: the event object, one per line, for tools). It follows the
feed until interrupted; when the connection ends (the daemon restarted) or the daemon cut the
subscription off (this terminal fell too far behind), it says so on stderr and subscribes
again from the last cursor it printed, so that nothing is missed or printed twice; after a
daemon restart the cursor cannot be honoured, and it says that there is a gap.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from supervisor.cli.client import client_options, locate
from supervisor.cli.exit_codes import EXIT_OK, EXIT_USAGE
from supervisor.cli.output import err, out

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers

__all__ = ["add_events_parser", "describe_event"]

#: seconds between attempts to reach the daemon again
_RETRY_S = 1.0


def describe_event(event: dict[str, Any]) -> str:
    """One event as a line a person reads: time, kind, then what it is about."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event["at_us"] / 1e6))
    millis = (event["at_us"] // 1000) % 1000
    parts = [f"{stamp}.{millis:03d}", f"{event['kind']:<20}"]
    if "turn_id" in event:
        parts.append(f"turn {event['turn_id']}")
    if "session_id" in event:
        parts.append(f"session {event['session_id']}")
    if "executor_id" in event:
        parts.append(f"executor {event['executor_id']}")
    if "daemon" in event:
        parts.append(f"daemon {event['daemon']}")
    for key in ("state", "attempt", "decision", "reason_code"):
        if key in event:
            parts.append(f"{key}={event[key]}")
    if event.get("command_types"):
        parts.append("commands=" + ",".join(event["command_types"]))
    if "detail" in event:
        parts.append(f"({event['detail']})")
    return "  ".join(parts)


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if args.session:
        params["sessions"] = args.session
    if args.turn:
        params["turns"] = args.turn
    if args.kind:
        params["kinds"] = args.kind
    return params


def _cmd_events(args: argparse.Namespace) -> int:
    import anyio
    import orjson

    from supervisor.control.client import ControlClient
    from supervisor.errors import ConfigError, ConnectionLost, ControlClientError, DaemonNotRunning

    try:
        socket = locate(args)
    except ConfigError as exc:
        err(f"hunter events: {exc}")
        return EXIT_USAGE
    params = _params(args)
    after: str | None = args.after
    printed = [0]

    async def follow() -> int:
        nonlocal after
        while True:
            try:
                async with (
                    ControlClient(socket.path) as client,
                    client.subscribe(**params, **({"after": after} if after else {})) as events,
                ):
                    if events.ack.get("gap"):
                        err(f"hunter events: gap: {events.ack['gap']}")
                    async for event in events:
                        out(orjson.dumps(event).decode() if args.json else describe_event(event))
                        after = event["cursor"]
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
