"""`hunter` subcommands of the daemon core: serve, session, submit, status, executors, turn,
escalations, demo.

Every client command finds the daemon from ``--socket PATH`` (the control socket itself) or
``--root DIR`` (default ``./.hunter``; the socket is ``<root>/run/control.sock``).

Exit codes
----------
* 0 — done (with ``--wait``: the turn succeeded)
* 1 — the daemon refused the request (the message names the problem), or the turn failed
* 2 — usage error (bad flags)
* 3 — the turn timed out; 4 — capability/security violation or rejected; 5 — budget exhausted;
  6 — escalated (parked for an operator); 7 — terminated or cancelled
  (these match `hunter turn` of the sandbox runtime)
* 10 — no daemon answers on the socket (it says which socket and how to start one)
* `hunter serve`: 0 after a drain, 1 forced by a second signal, 2 bad config, 3 root already
  served by another daemon.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["EXIT_NO_DAEMON", "STATE_EXIT_CODES", "add_parser"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_NO_DAEMON: Final = 10

#: Exit code of `--wait` / `turn wait` by the turn's final (or parked) state.
STATE_EXIT_CODES: Final[dict[str, int]] = {
    "succeeded": 0,
    "failed": 1,
    "timeout": 3,
    "violation": 4,
    "exhausted": 5,
    "escalated": 6,
    "terminated": 7,
    "cancelled": 7,
    "rejected": 4,
}

DEFAULT_ROOT: Final = Path(".hunter")


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def _socket(args: argparse.Namespace) -> Path:
    from supervisor.control.client import socket_for_root

    if getattr(args, "socket", None):
        return Path(args.socket)
    return socket_for_root(Path(args.root or DEFAULT_ROOT).absolute())


def _client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("daemon")
    group.add_argument("--root", metavar="DIR", help="root the daemon serves (default ./.hunter)")
    group.add_argument("--socket", metavar="PATH", help="the control socket itself")


def _run_client(args: argparse.Namespace, body: Callable[[Any], Awaitable[int]]) -> int:
    """Connect, run *body(client)*, map errors to exit codes."""
    import anyio

    from supervisor.control.client import ControlClient, ControlClientError, DaemonNotRunning

    async def main() -> int:
        async with ControlClient(_socket(args)) as client:
            return await body(client)

    try:
        return anyio.run(main)
    except DaemonNotRunning as exc:
        _err(f"hunter: {exc}")
        return EXIT_NO_DAEMON
    except ControlClientError as exc:
        extra = "".join(f"\n  {k}: {v}" for k, v in exc.details.items())
        _err(f"hunter: {exc.code}: {exc.message}{extra}")
        return EXIT_FAILED


def _json(data: object) -> str:
    import orjson

    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- serve ----------------------------------------------------------------------------------


def _cmd_serve(args: argparse.Namespace) -> int:
    from supervisor.server import run_daemon

    return run_daemon(
        root=Path(args.root) if args.root else None,
        config_path=Path(args.config) if args.config else None,
        log_format=args.log_format,
    )


# -- sessions -------------------------------------------------------------------------------


def _cmd_session_open(args: argparse.Namespace) -> int:
    workspace = str(Path(args.workspace).absolute()) if args.workspace else None

    async def body(client: Any) -> int:
        params: dict[str, object] = {"package_id": args.package, "tier": args.tier}
        if args.work_order:
            params["work_order_id"] = args.work_order
        if args.workspace:
            params["workspace"] = workspace
        session = await client.call("session.open", **params)
        _out(_json(session) if args.json else session["session_id"])
        return EXIT_OK

    return _run_client(args, body)


def _cmd_session_close(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        session = await client.call("session.close", session_id=args.session_id)
        _out(_json(session) if args.json else f"{session['session_id']} closed")
        return EXIT_OK

    return _run_client(args, body)


def _cmd_session_list(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        result = await client.call("session.list")
        if args.json:
            _out(_json(result))
        else:
            rows = [
                (s["session_id"], s["package_id"], s["tier"], s["state"], s["turns"])
                for s in result["sessions"]
            ]
            _out(table(("SESSION", "PACKAGE", "TIER", "STATE", "TURNS"), rows))
        return EXIT_OK

    return _run_client(args, body)


# -- turns ----------------------------------------------------------------------------------


def _parse_param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--param wants KEY=VALUE, got {text!r}")
    if value in {"true", "false"}:
        return key, value == "true"
    if value.lstrip("-").isdigit():
        return key, int(value)
    return key, value


def _declared_output(text: str) -> dict[str, object]:
    path, sep, role = text.rpartition(":")
    if not sep or not path or "/" in role:
        path, role = text, ""
    return {"path": path, "role": role or None}


def submit_params(args: argparse.Namespace) -> dict[str, object]:
    """The ``turn.submit`` params for `hunter submit`'s flags (raises ValueError on misuse)."""
    argv = list(args.argv or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    params: dict[str, object] = {
        "session_id": args.session,
        "declared_outputs": [_declared_output(d) for d in args.declare_output or []],
        "declared_inputs": list(args.declare_input or []),
    }
    if args.phase:
        params["phase"] = args.phase.upper()
    if args.timeout_ms is not None:
        params["timeout_ms"] = args.timeout_ms
    if args.idempotency_key:
        params["idempotency_key"] = args.idempotency_key
    if argv:
        if args.command_type:
            raise ValueError("give either --command (an instruction) or `-- CMD ARGS`, not both")
        params.update(kind="process", argv=argv)
    elif args.command_type:
        params.update(
            kind="instruction",
            command_type=args.command_type.upper(),
            target_url=args.url or "",
            target_selector=args.selector or "",
            parameters=dict(args.param or []),
        )
    else:
        raise ValueError("nothing to submit: give --command TYPE (instruction) or `-- CMD ARGS`")
    return params


def describe_turn(turn: dict[str, Any]) -> str:
    """A readable multi-line description of a turn (``hunter turn show``)."""
    spec = turn["spec"]
    what = (
        " ".join(str(spec.get(k) or "") for k in ("command_type", "target_url", "target_selector"))
        if turn["kind"] == "instruction"
        else " ".join(spec.get("argv", []))
    ).strip()
    lines = [
        f"turn {turn['turn_id']}  session {turn['session_id']}  #{turn['turn_number']}",
        f"  kind:    {turn['kind']}: {what}",
        f"  state:   {turn['state']}"
        + (f"  ({turn['verdict']} {turn['reason_code']})" if turn.get("verdict") else ""),
    ]
    if turn.get("reason"):
        lines.append(f"  reason:  {turn['reason']}")
    rows = [
        (
            a["attempt"],
            a.get("executor_id") or ("sandbox" if turn["kind"] == "process" else "-"),
            a.get("outcome") or "-",
            a.get("fault_type") or "-",
            a.get("decision") or "-",
            a.get("reason_code") or "-",
            a.get("duration_ms") if a.get("duration_ms") is not None else "-",
        )
        for a in turn.get("attempts", [])
    ]
    if rows:
        lines.append("")
        lines.append(
            table(("ATTEMPT", "EXECUTOR", "OUTCOME", "FAULT", "DECISION", "REASON", "MS"), rows)
        )
    return "\n".join(lines)


async def wait_with_progress(
    client: Any, turn_id: int, *, show: Callable[[str], None], limit_s: float | None = None
) -> dict[str, Any]:
    """Long-poll `turn.wait`, reporting each new state/attempt; returns the final turn."""
    import anyio

    from sandbox.policy.lifecycle import TurnState

    every = {s.value for s in TurnState}
    last: tuple[object, object] | None = None
    current = ""
    with anyio.move_on_after(limit_s if limit_s is not None else float("inf")):
        while True:
            until = sorted(every - {current})
            result = await client.call("turn.wait", turn_id=turn_id, timeout_s=30, until=until)
            turn: dict[str, Any] = result["turn"]
            current = turn["state"]
            key = (turn["state"], turn["attempt"])
            if key != last:
                last = key
                show(f"turn {turn_id}: {turn['state']} (attempt {turn['attempt']})")
            if turn["final"] or turn["state"] == "escalated":
                return turn
    result = await client.call("turn.get", turn_id=turn_id)
    return dict(result["turn"])


def _cmd_submit(args: argparse.Namespace) -> int:
    try:
        params = submit_params(args)
    except ValueError as exc:
        _err(f"hunter submit: {exc}")
        return EXIT_USAGE

    async def body(client: Any) -> int:
        result = await client.call("turn.submit", **params)
        turn = result["turn"]
        if not args.wait:
            if args.json:
                _out(_json(result))
            else:
                again = "" if result["created"] else " (already accepted earlier: same turn)"
                _out(f"turn {turn['turn_id']} accepted{again}")
            return EXIT_OK
        turn = await wait_with_progress(client, turn["turn_id"], show=_err)
        _out(_json(turn) if args.json else describe_turn(turn))
        return STATE_EXIT_CODES.get(turn["state"], EXIT_FAILED)

    return _run_client(args, body)


def _turn_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a turn id is a number, got {text!r}") from None


def _cmd_turn_show(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        turn = (await client.call("turn.get", turn_id=args.turn_id))["turn"]
        _out(_json(turn) if args.json else describe_turn(turn))
        return EXIT_OK

    return _run_client(args, body)


def _cmd_turn_wait(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        turn = await wait_with_progress(client, args.turn_id, show=_err, limit_s=args.timeout)
        _out(_json(turn) if args.json else describe_turn(turn))
        if not turn["final"] and turn["state"] != "escalated":
            return EXIT_FAILED
        return STATE_EXIT_CODES.get(turn["state"], EXIT_FAILED)

    return _run_client(args, body)


def _cmd_turn_cancel(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        turn = (await client.call("turn.cancel", turn_id=args.turn_id))["turn"]
        _out(_json(turn) if args.json else f"turn {turn['turn_id']}: {turn['state']}")
        return EXIT_OK

    return _run_client(args, body)


# -- status, executors, escalations ------------------------------------------------------------


def format_status(status: dict[str, Any]) -> str:
    daemon = status["daemon"]
    sched = status["scheduler"]
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
    queued = hub.get("queued_by_command") or {}
    lines += [
        "",
        f"executors connected {hub['executors_connected']}  in flight {hub['in_flight']}"
        f"  queued {sum(queued.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(queued.items()))})" if queued else ""),
    ]
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
    if status["executors"]:
        lines += ["", format_executors(status["executors"])]
    return "\n".join(lines)


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
    async def body(client: Any) -> int:
        status = await client.call("status")
        _out(_json(status) if args.json else format_status(status))
        return EXIT_OK

    return _run_client(args, body)


def _cmd_executors(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        result = await client.call("executors.list")
        if args.json:
            _out(_json(result))
        elif not result["executors"]:
            _out("no executors connected")
        else:
            _out(format_executors(result["executors"]))
        return EXIT_OK

    return _run_client(args, body)


def _cmd_escalations_list(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        result = await client.call("escalations.list")
        if args.json:
            _out(_json(result))
        elif not result["escalations"]:
            _out("no escalated turns")
        else:
            rows = [
                (
                    t["turn_id"],
                    t["session_id"],
                    t["turn_number"],
                    t["kind"],
                    t.get("fault_type"),
                    t.get("reason_code"),
                )
                for t in result["escalations"]
            ]
            _out(table(("TURN", "SESSION", "#", "KIND", "FAULT", "REASON"), rows))
        return EXIT_OK

    return _run_client(args, body)


def _cmd_escalations_resolve(args: argparse.Namespace) -> int:
    action = "retry" if args.retry else "terminate"

    async def body(client: Any) -> int:
        turn = (await client.call("escalations.resolve", turn_id=args.turn_id, action=action))[
            "turn"
        ]
        _out(_json(turn) if args.json else f"turn {turn['turn_id']}: {turn['state']}")
        return EXIT_OK

    return _run_client(args, body)


def _cmd_ledger_check(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        params = {"session_id": args.session} if args.session else {}
        result = await client.call("ledger.verify", **params)
        if args.json:
            _out(_json(result))
        else:
            for r in result["ledgers"]:
                _out(f"ok  {r['ledger_id']}  {r['entries']} entries")
            for f in result["failures"]:
                _out(f"BAD {f['session_id']}: {f['error']}")
        return EXIT_OK if result["ok"] else EXIT_FAILED

    return _run_client(args, body)


def _cmd_drain(args: argparse.Namespace) -> int:
    async def body(client: Any) -> int:
        await client.call("drain")
        _out("drain started")
        return EXIT_OK

    return _run_client(args, body)


def _cmd_demo(args: argparse.Namespace) -> int:
    from supervisor.demo.stack import run_demo

    code: int = run_demo(
        root=Path(args.root) if args.root else None, fresh=args.fresh, keep=args.keep
    )
    return code


# -- registration ---------------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Register serve, session, submit, status, executors, turn, escalations, drain, demo."""
    p = subparsers.add_parser("serve", help="run the supervisor daemon in the foreground")
    p.add_argument("--root", metavar="DIR", help="the root directory (default ./.hunter)")
    p.add_argument("--config", metavar="FILE", help="TOML config file (default $HUNTER_CONFIG)")
    p.add_argument("--log-format", choices=("auto", "json", "console"), default=None)
    p.set_defaults(handler=_cmd_serve)

    p = subparsers.add_parser("session", help="open, close and list sessions")
    sp = p.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    o = sp.add_parser("open", help="open a session of an installed package; prints its id")
    o.add_argument("package", help="package id (installed under <root>/installed/)")
    o.add_argument("--tier", default="default")
    o.add_argument("--work-order", metavar="ID")
    o.add_argument("--workspace", metavar="DIR", help="where promoted outputs go")
    o.add_argument("--json", action="store_true")
    _client_options(o)
    o.set_defaults(handler=_cmd_session_open)
    c = sp.add_parser("close", help="close a session (no unfinished turns)")
    c.add_argument("session_id")
    c.add_argument("--json", action="store_true")
    _client_options(c)
    c.set_defaults(handler=_cmd_session_close)
    ls = sp.add_parser("list", help="list sessions")
    ls.add_argument("--json", action="store_true")
    _client_options(ls)
    ls.set_defaults(handler=_cmd_session_list)

    p = subparsers.add_parser(
        "submit",
        help="submit a turn: an instruction (--command) or a process (-- CMD ARGS)",
        description="Submit an instruction for the executors (--command TYPE ...) or a process "
        "turn run in the sandbox (-- CMD ARGS). declared outputs are required for process turns "
        "that write files (--declare-output PATH[:ROLE], repeatable).",
    )
    p.add_argument("--session", required=True, metavar="SID")
    p.add_argument(
        "--command",
        dest="command_type",
        metavar="TYPE",
        help="NAVIGATE, CLICK, READ, SCROLL, SCREENSHOT, EXTRACT",
    )
    p.add_argument("--url", metavar="URL")
    p.add_argument("--selector", metavar="SEL")
    p.add_argument("--param", type=_parse_param, action="append", metavar="KEY=VALUE")
    p.add_argument("--timeout-ms", type=int, metavar="MS")
    p.add_argument(
        "--phase",
        choices=("RED", "GREEN", "VERIFY", "REFACTOR", "red", "green", "verify", "refactor"),
    )
    p.add_argument("--declare-output", action="append", metavar="PATH[:ROLE]")
    p.add_argument("--declare-input", action="append", metavar="PATH")
    p.add_argument("--idempotency-key", metavar="KEY")
    p.add_argument("--wait", action="store_true", help="show progress and the result")
    p.add_argument("--json", action="store_true")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS for a process turn")
    _client_options(p)
    p.set_defaults(handler=_cmd_submit)

    p = subparsers.add_parser("status", help="queues, executors, in-flight turns, counts")
    p.add_argument("--json", action="store_true")
    _client_options(p)
    p.set_defaults(handler=_cmd_status)

    p = subparsers.add_parser("executors", help="list connected executors")
    p.add_argument("--json", action="store_true")
    _client_options(p)
    p.set_defaults(handler=_cmd_executors)

    _add_turn_parser(subparsers)

    p = subparsers.add_parser("escalations", help="turns parked for an operator's decision")
    sp = p.add_subparsers(dest="escalations_command", metavar="ACTION", required=True)
    ls = sp.add_parser("list", help="list escalated turns")
    ls.add_argument("--json", action="store_true")
    _client_options(ls)
    ls.set_defaults(handler=_cmd_escalations_list)
    r = sp.add_parser("resolve", help="decide an escalated turn: --retry or --terminate")
    r.add_argument("turn_id", type=_turn_id)
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--retry", action="store_true")
    how.add_argument("--terminate", action="store_true")
    r.add_argument("--json", action="store_true")
    _client_options(r)
    r.set_defaults(handler=_cmd_escalations_resolve)

    p = subparsers.add_parser("check-ledgers", help="ask the daemon to verify session ledgers")
    p.add_argument("--session", metavar="SID")
    p.add_argument("--json", action="store_true")
    _client_options(p)
    p.set_defaults(handler=_cmd_ledger_check)

    p = subparsers.add_parser("drain", help="ask the daemon to drain and stop (like SIGTERM)")
    _client_options(p)
    p.set_defaults(handler=_cmd_drain)

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


def _add_turn_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("turn", help="show, wait for or cancel a turn")
    sp = p.add_subparsers(dest="turn_command", metavar="ACTION", required=True)
    for name, handler, help_text in (
        ("show", _cmd_turn_show, "show a turn, its attempts and outcome"),
        ("wait", _cmd_turn_wait, "wait until the turn ends (or is escalated)"),
        ("cancel", _cmd_turn_cancel, "cancel a turn"),
    ):
        t = sp.add_parser(name, help=help_text)
        t.add_argument("turn_id", type=_turn_id)
        t.add_argument("--json", action="store_true")
        if name == "wait":
            t.add_argument("--timeout", type=float, metavar="S")
        _client_options(t)
        t.set_defaults(handler=handler)
