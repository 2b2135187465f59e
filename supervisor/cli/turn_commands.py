"""`hunter submit` and `hunter turn show|wait|cancel`: turns submitted, followed, described."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from supervisor.cli.client import client_options, run_client
from supervisor.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, STATE_EXIT_CODES
from supervisor.cli.output import err, out, to_json
from supervisor.cli.turn_record import describe_turn

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers
    from supervisor.control.client import ControlClient

__all__ = [
    "add_submit_parser",
    "add_turn_parser",
    "describe_turn",
    "parse_turn_id",
    "submit_params",
    "wait_with_progress",
]


#: --compact of `hunter submit --wait` and `hunter turn wait`.
_COMPACT_HELP = (
    "ask for the compact turn (answer=compact: ids, state, verdict, reason_code, attempt,"
    " evidence_hash) and print it as JSON"
)


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
    if args.compact:
        params["answer"] = "compact"
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


async def wait_with_progress(
    client: ControlClient,
    turn_id: int,
    *,
    show: Callable[[str], None],
    limit_s: float | None = None,
    compact: bool = False,
) -> dict[str, Any]:
    """Long-poll `turn.wait`, reporting each new state/attempt; returns the final turn (with
    *compact*, the compact turn object: its outcome only)."""
    import anyio

    from sandbox.policy.lifecycle import FINAL_STATES, TurnState

    every = {s.value for s in TurnState}
    settled = {s.value for s in FINAL_STATES} | {TurnState.ESCALATED.value}
    form: dict[str, Any] = {"answer": "compact"} if compact else {}
    last: tuple[object, object] | None = None
    current = ""
    with anyio.move_on_after(limit_s if limit_s is not None else float("inf")):
        while True:
            until = sorted(every - {current})
            result = await client.call(
                "turn.wait", turn_id=turn_id, timeout_s=30, until=until, **form
            )
            turn: dict[str, Any] = result["turn"]
            current = turn["state"]
            key = (turn["state"], turn["attempt"])
            if key != last:
                last = key
                show(f"turn {turn_id}: {turn['state']} (attempt {turn['attempt']})")
            if current in settled:
                return turn
    if compact:  # the turn as it is now, in the same form
        result = await client.call("turn.wait", turn_id=turn_id, timeout_s=0, **form)
    else:
        result = await client.call("turn.get", turn_id=turn_id)
    return dict(result["turn"])


def _show_turn(args: argparse.Namespace, turn: dict[str, Any]) -> None:
    """Print a waited-for turn: JSON with --json or --compact, else its description."""
    out(to_json(turn) if args.json or args.compact else describe_turn(turn))


def _cmd_submit(args: argparse.Namespace) -> int:
    try:
        params = submit_params(args)
    except ValueError as exc:
        err(f"hunter submit: {exc}")
        return EXIT_USAGE

    async def body(client: ControlClient) -> int:
        result = await client.call("turn.submit", **params)
        for warning in result.get("warnings", ()):
            err(f"hunter submit: warning: {warning}")
        turn = result["turn"]
        if not args.wait:
            if args.json or args.compact:
                out(to_json(result))
            else:
                again = "" if result["created"] else " (already accepted earlier: same turn)"
                out(f"turn {turn['turn_id']} accepted{again}")
            return EXIT_OK
        turn = await wait_with_progress(client, turn["turn_id"], show=err, compact=args.compact)
        _show_turn(args, turn)
        return STATE_EXIT_CODES.get(turn["state"], EXIT_FAILED)

    return run_client(args, body)


def parse_turn_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a turn id is a number, got {text!r}") from None


def _cmd_turn_show(args: argparse.Namespace) -> int:
    async def body(client: ControlClient) -> int:
        answer = await client.call("turn.get", turn_id=args.turn_id)
        turn, ledger = answer["turn"], answer.get("ledger")
        out(to_json({**turn, "ledger": ledger}) if args.json else describe_turn(turn, ledger))
        return EXIT_OK

    return run_client(args, body)


def _cmd_turn_wait(args: argparse.Namespace) -> int:
    async def body(client: ControlClient) -> int:
        turn = await wait_with_progress(
            client, args.turn_id, show=err, limit_s=args.timeout, compact=args.compact
        )
        _show_turn(args, turn)
        return STATE_EXIT_CODES.get(turn["state"], EXIT_FAILED)

    return run_client(args, body)


def _cmd_turn_cancel(args: argparse.Namespace) -> int:
    async def body(client: ControlClient) -> int:
        turn = (await client.call("turn.cancel", turn_id=args.turn_id))["turn"]
        out(to_json(turn) if args.json else f"turn {turn['turn_id']}: {turn['state']}")
        return EXIT_OK

    return run_client(args, body)


def add_submit_parser(subparsers: Subparsers) -> None:
    """Register `hunter submit`."""
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
    p.add_argument("--compact", action="store_true", help=_COMPACT_HELP)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS for a process turn")
    client_options(p)
    p.set_defaults(handler=_cmd_submit)


def add_turn_parser(subparsers: Subparsers) -> None:
    """Register `hunter turn show|wait|cancel` (the sandbox adds `turn run` to it)."""
    p = subparsers.add_parser("turn", help="show, wait for or cancel a turn")
    sp = p.add_subparsers(dest="turn_command", metavar="ACTION", required=True)
    for name, handler, help_text in (
        ("show", _cmd_turn_show, "a turn's decision record: attempts, outputs, ledger hashes"),
        ("wait", _cmd_turn_wait, "wait until the turn ends (or is escalated)"),
        ("cancel", _cmd_turn_cancel, "cancel a turn"),
    ):
        t = sp.add_parser(name, help=help_text)
        t.add_argument("turn_id", type=parse_turn_id)
        t.add_argument("--json", action="store_true")
        if name == "wait":
            t.add_argument("--timeout", type=float, metavar="S")
            t.add_argument("--compact", action="store_true", help=_COMPACT_HELP)
        client_options(t)
        t.set_defaults(handler=handler)
