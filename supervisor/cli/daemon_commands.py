"""`hunter serve`, and the commands about the running daemon as a whole: `status`, `executors`,
`check-ledgers`, `drain`."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.cli.client import client_options, decision_options, run_client
from supervisor.cli.exit_codes import EXIT_FAILED, EXIT_OK
from supervisor.cli.output import out, table, to_json

if TYPE_CHECKING:
    from supervisor.client import Client

__all__ = [
    "add_check_ledgers_parser",
    "add_drain_parser",
    "add_executors_parser",
    "add_sandbox_helper_parser",
    "add_serve_parser",
    "add_status_parser",
    "format_executors",
    "format_status",
]


def _cmd_serve(args: argparse.Namespace) -> int:
    from supervisor.server import run_daemon

    return run_daemon(
        root=Path(args.root) if args.root else None,
        config_path=Path(args.config) if args.config else None,
        log_format=args.log_format,
    )


def format_status(status: dict[str, Any]) -> str:
    daemon = status["daemon"]
    sched = status.get("turn_core") or status["scheduler"]  # a daemon of the last release
    hub = status["hub"]
    lines = [
        f"daemon pid {daemon['pid']}  root {daemon.get('root', '?')}"
        + ("  DRAINING" if daemon.get("draining") else ""),
        f"sessions open {sched['sessions_open']}  turns active {sched['turns_active']}"
        f"  attempts running {sched['attempts_running']}  waiting retry "
        f"{sched['turns_waiting_retry']}  escalated {sched['turns_escalated']}",
        "",
        table(("STATE", "TURNS"), sorted(status["turns_by_state"].items())),
    ]
    store = status.get("store") or {}
    if store.get("available") is False:
        lines.insert(
            2,
            f"STORE UNAVAILABLE (writes wait; outages {store.get('outages')}):"
            f" {store.get('last_error', '')}",
        )
    sandbox = status.get("sandbox")
    if sandbox:
        levels = sandbox.get("levels") or {}
        where = (
            f"helper {sandbox['helper_socket']} ({levels.get('helper', '?')})"
            if sandbox.get("helper_socket")
            else "in the daemon"
        )
        lines.insert(2, f"sandbox: {sandbox.get('enforcement')}, confined {where}")
        for name, why in sorted((sandbox.get("missing") or {}).items()):
            lines.insert(3, f"SANDBOX MISSING {name}: {why}")
    queued = hub.get("queued_by_command") or {}
    lines += [
        "",
        f"executors connected {hub['executors_connected']}  in flight {hub['in_flight']}"
        f"  queued {sum(queued.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(queued.items()))})" if queued else ""),
    ]
    circuits = hub.get("circuits") or {}
    for command, circuit in sorted(circuits.items()):
        if circuit.get("state") != "closed":
            probe = circuit.get("probe_in_ms")
            lines.append(
                f"CIRCUIT {str(circuit['state']).upper()} {command}: fails fast"
                + (f", probe in {int(probe) / 1000:g}s" if probe is not None else ", probing")
            )
    budget = status.get("retry_budget")
    if budget and budget.get("enabled"):
        lines.append(
            f"retry budget: {budget['retries']} of {budget['allowance']} retries used in the"
            f" window ({budget['first_attempts']} first attempts); refused"
            f" {budget['refused_total']} since start"
        )
    if status["in_flight"]:
        rows = [
            (
                t["turn_id"],
                t["session_id"],
                t["turn_number"],
                t["kind"],
                t["state"],
                t["attempt"],
                t.get("executor_id") or "-",
            )
            for t in status["in_flight"]
        ]
        lines += ["", table(("TURN", "SESSION", "#", "KIND", "STATE", "ATTEMPT", "EXECUTOR"), rows)]
        total = int(status.get("in_flight_total", len(rows)))
        if total > len(rows):
            lines.append(f"({len(rows)} oldest of {total} active turns shown)")
    if status.get("daemons"):
        lines += ["", format_daemons(status["daemons"])]
    if status["executors"]:
        lines += ["", format_executors(status["executors"])]
        total = int(status.get("executors_total", len(status["executors"])))
        if total > len(status["executors"]):
            lines.append(
                f"({len(status['executors'])} of {total} executors shown; `hunter executors`"
                " lists all)"
            )
    return "\n".join(lines)


def format_daemons(daemons: Sequence[dict[str, Any]]) -> str:
    """The daemons sharing the store (several hosts on PostgreSQL), with their heartbeats."""
    now_us = time.time_ns() // 1000
    rows = [
        (
            d["owner"],
            d["host"],
            d["pid"],
            f"{max(0, now_us - int(d['heartbeat_us'])) / 1e6:.1f}s ago"
            + ("" if d.get("alive", True) else "  GONE (past its lease)"),
            d["turns_held"],
            d["sessions_homed"],
        )
        for d in daemons
    ]
    return table(("DAEMON", "HOST", "PID", "HEARTBEAT", "TURNS HELD", "SESSIONS"), rows)


def format_executors(executors: Sequence[dict[str, Any]]) -> str:
    rows = [
        (
            e["executor_id"],
            e["status"],
            f"{e['in_flight']}/{e['slots']}",
            ",".join(e["commands"]),
            e.get("pid") or "-",
            e.get("detail") or "",
        )
        for e in executors
    ]
    return table(("EXECUTOR", "STATUS", "BUSY", "COMMANDS", "PID", "DETAIL"), rows)


def _cmd_status(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        status = await client.status()
        out(to_json(status) if args.json else format_status(status))
        return EXIT_OK

    return run_client(args, body)


def _cmd_executors(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        # every page: the answer of one call is bounded by the frame limit
        executors = [e.to_dict() async for e in client.executors()]
        if args.json:
            out(to_json({"executors": executors}))
        elif not executors:
            out("no executors connected")
        else:
            out(format_executors(executors))
        return EXIT_OK

    return run_client(args, body)


def _cmd_ledger_check(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        check = await client.verify_ledgers(session_id=args.session or None)
        if args.json:
            out(to_json(check.to_dict()))
        else:
            for r in check.ledgers:
                out(f"ok  {r['ledger_id']}  {r['entries']} entries")
            # in a fleet: sessions this daemon does not home (their files are on their home)
            for e in check.elsewhere:
                out(f"--  {e['session_id']}  {e['detail']}")
            for f in check.failures:
                out(f"BAD {f['session_id']}: {f['error']}")
            if not (check.ledgers or check.failures or check.elsewhere):
                out("no sessions")
        return EXIT_OK if check.ok else EXIT_FAILED

    return run_client(args, body)


def _cmd_drain(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        await client.drain(reason=args.reason, operator=args.operator)
        out("drain started")
        return EXIT_OK

    return run_client(args, body)


def add_serve_parser(subparsers: Any) -> None:
    """Register `hunter serve`."""
    p = subparsers.add_parser("serve", help="run the supervisor daemon in the foreground")
    p.add_argument("--root", metavar="DIR", help="the root directory (default ./.hunter)")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (default $HUNTER_CONFIG, else ROOT/hunter.toml if it exists;"
        " the daemon_ready log event names the file read)",
    )
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default=None,
        help="json lines (for journald), console (readable) or auto: console on a tty, else"
        " json (default: the log.format key)",
    )
    p.set_defaults(handler=_cmd_serve)


def _cmd_sandbox_helper(args: argparse.Namespace) -> int:
    from supervisor.sandbox_helper import run_sandbox_helper

    return run_sandbox_helper(
        root=Path(args.root) if args.root else None,
        socket_path=Path(args.socket) if args.socket else None,
        allow_users=args.allow_user or [],
        config_path=Path(args.config) if args.config else None,
        log_format=args.log_format,
    )


def add_sandbox_helper_parser(subparsers: Any) -> None:
    """Register `hunter sandbox-helper`."""
    p = subparsers.add_parser(
        "sandbox-helper",
        help="run the root sandbox helper of an unprivileged daemon (docs/operations.md)",
    )
    p.add_argument(
        "--root", metavar="DIR", help="the helper's own directory (default $STATE_DIRECTORY)"
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="listen here (default: the socket systemd passes, else sandbox.helper_socket)",
    )
    p.add_argument(
        "--allow-user",
        metavar="USER",
        action="append",
        help="the daemon's user (name or uid); repeat for more. Nobody else may connect",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file (default $HUNTER_CONFIG)")
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default=None,
        help="json lines (for journald), console (readable) or auto: console on a tty, else"
        " json (default: the log.format key)",
    )
    p.set_defaults(handler=_cmd_sandbox_helper)


def add_status_parser(subparsers: Any) -> None:
    """Register `hunter status`."""
    p = subparsers.add_parser("status", help="queues, executors, in-flight turns, counts")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    client_options(p)
    p.set_defaults(handler=_cmd_status)


def add_executors_parser(subparsers: Any) -> None:
    """Register `hunter executors`."""
    p = subparsers.add_parser("executors", help="list connected executors")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    client_options(p)
    p.set_defaults(handler=_cmd_executors)


def add_check_ledgers_parser(subparsers: Any) -> None:
    """Register `hunter check-ledgers`."""
    p = subparsers.add_parser(
        "check-ledgers",
        help="ask the daemon to verify session ledgers (in a fleet: of the sessions it homes)",
        description="Ask the daemon to verify the exec and evidence ledgers of every session "
        "(or one) on its root. In a fleet, a session another daemon homes is listed as "
        "'homed by <daemon>, checked there' and is not a failure. Exit 0 when every ledger "
        "checked is intact, 1 otherwise.",
    )
    p.add_argument("--session", metavar="SID", help="only this session's ledgers")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    client_options(p)
    p.set_defaults(handler=_cmd_ledger_check)


def add_drain_parser(subparsers: Any) -> None:
    """Register `hunter drain`."""
    p = subparsers.add_parser("drain", help="ask the daemon to drain and stop (like SIGTERM)")
    decision_options(p, reason_required=False)
    client_options(p)
    p.set_defaults(handler=_cmd_drain)
