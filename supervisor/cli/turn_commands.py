"""`hunter submit` and `hunter turn show|wait|cancel`: turns submitted, followed, described."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from supervisor.cli.client import client_options, decision_options, decision_params, run_client
from supervisor.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_NOT_SETTLED,
    EXIT_OK,
    EXIT_USAGE,
    STATE_EXIT_CODES,
)
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


#: `hunter turn wait --help`: what it waits for and its exit codes.
_WAIT_DESCRIPTION = (
    "Wait until the turn is final or escalated, printing each new state on stderr, then print"
    " it. Exit codes: 0 succeeded, 1 failed, 3 timed out, 4 violation or rejected, 5 exhausted,"
    f" 6 escalated, 7 terminated or cancelled, {EXIT_NOT_SETTLED} not settled within --timeout"
    " (the turn goes on), 10 no daemon."
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


def _settled_states() -> frozenset[str]:
    """The states a wait ends at: the final ones, and escalated (parked for an operator)."""
    from sandbox.policy.lifecycle import FINAL_STATES, TurnState

    return frozenset({s.value for s in FINAL_STATES} | {TurnState.ESCALATED.value})


async def wait_with_progress(
    client: ControlClient,
    turn_id: int,
    *,
    show: Callable[[str], None],
    limit_s: float | None = None,
    compact: bool = False,
) -> dict[str, Any]:
    """Follow the turn's events (``events.subscribe``, no polling), reporting each new
    state/attempt, until it settles (final or escalated); returns the turn as it is then (with
    *compact*, the compact turn object: its outcome only), or as it is when *limit_s* passes.

    The subscription begins before the turn is read, so no change falls between the two; a
    subscription the daemon cuts off is taken up again from its last cursor."""
    import anyio

    from supervisor.errors import ControlClientError

    settled = _settled_states()
    form: dict[str, Any] = {"answer": "compact"} if compact else {}
    last: tuple[object, object] | None = None

    def report(state: object, attempt: object) -> None:
        nonlocal last
        if (state, attempt) != last:
            last = (state, attempt)
            show(f"turn {turn_id}: {state} (attempt {attempt})")

    after: str | None = None
    with anyio.move_on_after(limit_s if limit_s is not None else float("inf")):
        while True:
            resume = {"after": after} if after else {}
            try:
                async with client.subscribe(turns=[turn_id], **resume) as events:
                    now = (await client.call("turn.wait", turn_id=turn_id, timeout_s=0, **form))[
                        "turn"
                    ]
                    report(now["state"], now["attempt"])
                    if now["state"] in settled:
                        return dict(now)
                    async for event in events:
                        after = events.last
                        state = event.get("state")
                        if state is not None:
                            report(state, event.get("attempt", now["attempt"]))
                        if event["kind"] in {"turn.ended", "escalation.raised"}:
                            break
                    else:  # pragma: no cover - the iterator ends by raising, never by itself
                        continue
            except ControlClientError as exc:
                if exc.code != "subscriber_too_slow":
                    raise
                continue  # taken up again from the last cursor
            result = await client.call("turn.wait", turn_id=turn_id, timeout_s=0, **form)
            if result["turn"]["state"] in settled:
                return dict(result["turn"])
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
        if turn["state"] not in _settled_states():
            err(_not_settled(args.turn_id, args.timeout, turn))
            return EXIT_NOT_SETTLED
        return STATE_EXIT_CODES.get(turn["state"], EXIT_FAILED)

    return run_client(args, body)


def _not_settled(turn_id: int, timeout_s: float, turn: dict[str, Any]) -> str:
    """What `hunter turn wait` says on stderr when its --timeout passed first."""
    return (
        f"hunter turn wait: turn {turn_id} did not settle within the --timeout of {timeout_s:g}s:"
        f" it is {turn['state']} now (attempt {turn['attempt']}) and goes on. Wait again with"
        f" `hunter turn wait {turn_id}` (a longer --timeout, or none), or look at it with"
        f" `hunter turn show {turn_id}`. Exit code {EXIT_NOT_SETTLED}: not settled yet."
    )


def _cmd_turn_cancel(args: argparse.Namespace) -> int:
    async def body(client: ControlClient) -> int:
        params = decision_params(args)
        turn = (await client.call("turn.cancel", turn_id=args.turn_id, **params))["turn"]
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
    p.add_argument("--session", required=True, metavar="SID", help="the open session it runs in")
    p.add_argument(
        "--command",
        dest="command_type",
        metavar="TYPE",
        help="NAVIGATE, CLICK, READ, SCROLL, SCREENSHOT, EXTRACT",
    )
    p.add_argument("--url", metavar="URL", help="with --command: the page it acts on")
    p.add_argument(
        "--selector", metavar="SEL", help="with --command: the CSS selector of the element"
    )
    p.add_argument(
        "--param",
        type=_parse_param,
        action="append",
        metavar="KEY=VALUE",
        help="with --command: a parameter of the instruction (repeatable; true/false and"
        " integers are typed, the rest are strings)",
    )
    p.add_argument(
        "--timeout-ms",
        type=int,
        metavar="MS",
        help="deadline of each attempt (default: the daemon's sandbox.default_timeout_ms)",
    )
    p.add_argument(
        "--phase",
        choices=("RED", "GREEN", "VERIFY", "REFACTOR", "red", "green", "verify", "refactor"),
        help="the agent's phase: automatic retries only in GREEN and VERIFY (docs/policy.md)",
    )
    p.add_argument(
        "--declare-output",
        action="append",
        metavar="PATH[:ROLE]",
        help="a file the process turn writes, to be promoted (repeatable)",
    )
    p.add_argument(
        "--declare-input",
        action="append",
        metavar="PATH",
        help="a file the process turn reads (repeatable)",
    )
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="submitting the same request again with the same key in the session gives the"
        " first turn back, not a second one (another request under a used key is refused:"
        " idempotency_conflict)",
    )
    p.add_argument("--wait", action="store_true", help="show progress and the result")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
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
        t = sp.add_parser(
            name, help=help_text, description=_WAIT_DESCRIPTION if name == "wait" else None
        )
        t.add_argument("turn_id", type=parse_turn_id, help="the turn's id (as submit printed it)")
        t.add_argument("--json", action="store_true", help="print the turn as JSON")
        if name == "wait":
            t.add_argument(
                "--timeout",
                type=float,
                metavar="S",
                help=f"wait at most S seconds; if the turn has not settled by then, say so on"
                f" stderr and exit {EXIT_NOT_SETTLED} (default: wait until it settles)",
            )
            t.add_argument("--compact", action="store_true", help=_COMPACT_HELP)
        if name == "cancel":
            decision_options(t, reason_required=False)
        client_options(t)
        t.set_defaults(handler=handler)
