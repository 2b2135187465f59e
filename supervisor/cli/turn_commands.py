"""`hunter submit` and `hunter turn show|wait|cancel`: turns submitted, followed, described."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from supervisor.cli.client import client_options, decision_options, run_client
from supervisor.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_NOT_SETTLED,
    EXIT_OK,
    EXIT_USAGE,
    STATE_EXIT_CODES,
)
from supervisor.cli.output import err, out, to_json
from supervisor.cli.turn_list_commands import add_turn_list_parser
from supervisor.cli.turn_record import describe_turn

if TYPE_CHECKING:
    from supervisor.cli.main import Subparsers
    from supervisor.client import Client, Turn, TurnHandle

__all__ = [
    "Submission",
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


def _declared_output(text: str) -> dict[str, str | None]:
    path, sep, role = text.rpartition(":")
    if not sep or not path or "/" in role:
        path, role = text, ""
    return {"path": path, "role": role or None}


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """What `hunter submit`'s flags ask for: a process turn (``argv``) or an instruction
    (``command_type`` with its target and parameters), and the options both take."""

    session_id: str
    argv: tuple[str, ...] = ()
    command_type: str | None = None
    url: str = ""
    selector: str = ""
    parameters: Mapping[str, object] = field(default_factory=dict)
    #: ``{path, role}``, role None when none was given
    declared_outputs: tuple[Mapping[str, str | None], ...] = ()
    declared_inputs: tuple[str, ...] = ()
    phase: str | None = None
    timeout_ms: int | None = None
    idempotency_key: str | None = None
    #: ask for the compact turn object (its outcome only)
    compact: bool = False

    async def submit(self, client: Client) -> TurnHandle:
        """Submit it through the client library (`Client.submit_instruction` or
        `Client.submit_process`)."""
        if self.command_type is None:
            return await client.submit_process(
                self.session_id,
                self.argv,
                declared_outputs=self.declared_outputs,
                declared_inputs=self.declared_inputs,
                phase=self.phase,
                timeout_ms=self.timeout_ms,
                idempotency_key=self.idempotency_key,
                compact=self.compact,
            )
        return await client.submit_instruction(
            self.session_id,
            self.command_type,
            url=self.url,
            selector=self.selector,
            parameters=self.parameters,
            declared_inputs=self.declared_inputs,
            phase=self.phase,
            timeout_ms=self.timeout_ms,
            idempotency_key=self.idempotency_key,
            compact=self.compact,
        )


def submit_params(args: argparse.Namespace) -> Submission:
    """The turn `hunter submit`'s flags ask for (raises ValueError on misuse)."""
    argv = list(args.argv or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    common = Submission(
        session_id=args.session,
        declared_outputs=tuple(_declared_output(d) for d in args.declare_output or []),
        declared_inputs=tuple(args.declare_input or []),
        phase=args.phase.upper() if args.phase else None,
        timeout_ms=args.timeout_ms,
        idempotency_key=args.idempotency_key or None,
        compact=args.compact,
    )
    if argv:
        if args.command_type:
            raise ValueError("give either --command (an instruction) or `-- CMD ARGS`, not both")
        return replace(common, argv=tuple(argv))
    if not args.command_type:
        raise ValueError("nothing to submit: give --command TYPE (instruction) or `-- CMD ARGS`")
    if common.declared_outputs:
        raise ValueError(
            "--declare-output is for process turns (`-- CMD ARGS`): an instruction's executor"
            " writes nothing on this host"
        )
    return replace(
        common,
        command_type=args.command_type.upper(),
        url=args.url or "",
        selector=args.selector or "",
        parameters=dict(args.param or []),
    )


async def wait_with_progress(
    client: Client,
    turn_id: int,
    *,
    show: Callable[[str], None],
    limit_s: float | None = None,
    compact: bool = False,
) -> Turn:
    """Follow the turn's events (`Client.events`, no polling), reporting each new
    state/attempt, until it settles (final or escalated); returns the turn as it is then (with
    *compact*, the compact turn object: its outcome only), or as it is when *limit_s* passes.

    The subscription begins before the turn is read, so no change falls between the two; a
    subscription the daemon cuts off is taken up again from its last cursor."""
    import anyio

    from supervisor.client import SubscriberTooSlow

    last: tuple[object, object] | None = None

    def report(state: object, attempt: object) -> None:
        nonlocal last
        if (state, attempt) != last:
            last = (state, attempt)
            show(f"turn {turn_id}: {state} (attempt {attempt})")

    after: str | None = None
    with anyio.move_on_after(limit_s if limit_s is not None else float("inf")):
        while True:
            try:
                async with client.events(turns=[turn_id], after=after or None) as events:
                    now = await client.get_turn(turn_id, compact=compact)
                    report(now.state, now.attempt)
                    if now.settled:
                        return now
                    async for event in events:
                        after = events.last
                        if event.state is not None:
                            attempt = event.attempt if event.attempt is not None else now.attempt
                            report(event.state, attempt)
                        if event.kind in {"turn.ended", "escalation.raised"}:
                            break
                    else:  # pragma: no cover - the iterator ends by raising, never by itself
                        continue
            except SubscriberTooSlow:
                continue  # taken up again from the last cursor
            now = await client.get_turn(turn_id, compact=compact)
            if now.settled:
                return now
    return await client.get_turn(turn_id, compact=compact)  # as it is now, in the same form


def _show_turn(args: argparse.Namespace, turn: Turn) -> None:
    """Print a waited-for turn: JSON with --json or --compact, else its description."""
    data = turn.to_dict()
    out(to_json(data) if args.json or args.compact else describe_turn(data))


def _cmd_submit(args: argparse.Namespace) -> int:
    try:
        submission = submit_params(args)
    except ValueError as exc:
        err(f"hunter submit: {exc}")
        return EXIT_USAGE

    async def body(client: Client) -> int:
        handle = await submission.submit(client)
        for warning in handle.warnings:
            err(f"hunter submit: warning: {warning}")
        if not args.wait:
            if args.json or args.compact:
                out(to_json(handle.to_dict()))
            else:
                again = "" if handle.created else " (already accepted earlier: same turn)"
                out(f"turn {handle.turn_id} accepted{again}")
            return EXIT_OK
        turn = await wait_with_progress(client, handle.turn_id, show=err, compact=args.compact)
        _show_turn(args, turn)
        return STATE_EXIT_CODES.get(turn.state, EXIT_FAILED)

    return run_client(args, body)


def parse_turn_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a turn id is a number, got {text!r}") from None


def _cmd_turn_show(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        record = await client.decision_record(args.turn_id)
        turn, ledger = record.turn.to_dict(), record.ledger_dict()
        out(to_json({**turn, "ledger": ledger}) if args.json else describe_turn(turn, ledger))
        return EXIT_OK

    return run_client(args, body)


def _cmd_turn_wait(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        turn = await wait_with_progress(
            client, args.turn_id, show=err, limit_s=args.timeout, compact=args.compact
        )
        _show_turn(args, turn)
        if not turn.settled:
            err(_not_settled(args.turn_id, args.timeout, turn))
            return EXIT_NOT_SETTLED
        return STATE_EXIT_CODES.get(turn.state, EXIT_FAILED)

    return run_client(args, body)


def _not_settled(turn_id: int, timeout_s: float, turn: Turn) -> str:
    """What `hunter turn wait` says on stderr when its --timeout passed first."""
    return (
        f"hunter turn wait: turn {turn_id} did not settle within the --timeout of {timeout_s:g}s:"
        f" it is {turn.state} now (attempt {turn.attempt}) and goes on. Wait again with"
        f" `hunter turn wait {turn_id}` (a longer --timeout, or none), or look at it with"
        f" `hunter turn show {turn_id}`. Exit code {EXIT_NOT_SETTLED}: not settled yet."
    )


def _cmd_turn_cancel(args: argparse.Namespace) -> int:
    async def body(client: Client) -> int:
        turn = await client.cancel(args.turn_id, reason=args.reason, operator=args.operator)
        out(to_json(turn.to_dict()) if args.json else f"turn {turn.turn_id}: {turn.state}")
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
    """Register `hunter turn show|wait|cancel|list` (the sandbox adds `turn run` to it)."""
    p = subparsers.add_parser("turn", help="show, wait for, cancel or list turns")
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
    add_turn_list_parser(sp)
