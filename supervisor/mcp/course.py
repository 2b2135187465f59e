"""A turn's course for the MCP tools: submitted with who asked (`supervisor.mcp.attribution`),
followed to its end within the wait the server allows while its events are relayed as progress
(`supervisor.mcp.progress`), cancelled when the MCP call is, and answered as a bounded outcome
charged to the MCP session's output allowance. Apart from `supervisor.mcp.tools` (the tools'
schemas and their checks of the input) because it changes with how a turn is followed, not with
what a tool takes."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import msgspec
from mcp.server.mcpserver import Context

from supervisor.client import DecisionRecord, HunterError, Turn, TurnHandle
from supervisor.mcp.answers import TurnOutcome, outcome_of
from supervisor.mcp.attribution import requested_by
from supervisor.mcp.backend import Backend
from supervisor.mcp.errors import DaemonRefused
from supervisor.mcp.limits import SessionBucket
from supervisor.mcp.progress import relay_progress
from supervisor.wire.turn_spec import RequestedBy

__all__ = ["TurnCourse", "refused"]

_CANCEL_REASON: Final = "the MCP client cancelled the tool call"
#: how long a cancel of the turn may take when the call is cancelled
_CANCEL_S: Final = 10.0


def refused(exc: HunterError) -> DaemonRefused:
    """The tool error of a request the daemon refused."""
    return DaemonRefused(f"the daemon refused: {exc.code}: {exc.message}")


class TurnCourse:
    """The course of the turns the tools of one server start, over its `Backend`."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._settings = backend.settings
        self._client = backend.client

    def requested_by(self, ctx: Context) -> RequestedBy:
        """Who asked: this server, and the MCP client as it named itself."""
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        return requested_by(
            self._backend.instance,
            info.name if info is not None else None,
            info.version if info is not None else None,
        )

    def wait_s(self, asked: float | None) -> float:
        """The wait for a turn: *asked*, else the server's default, at most its max_wait_s."""
        wait = self._settings.default_wait_s if asked is None else asked
        return min(wait, self._settings.max_wait_s)

    def operator(self, ctx: Context) -> str:
        """The operator name of a decision the MCP client takes (a cancel)."""
        who = self.requested_by(ctx)
        return f"mcp:{who.client_name}"[:256]

    async def run(
        self,
        bucket: SessionBucket,
        ctx: Context,
        submit: Callable[[], Awaitable[TurnHandle]],
        wait_s: float | None,
    ) -> TurnOutcome:
        """Submit a turn (*submit*: the client's call, with who asked) in one of *bucket*'s turn
        slots, follow it for at most *wait_s* (`wait_s`), and answer its outcome."""
        with self._backend.limits.turn_slot(bucket):
            try:
                handle = await submit()
            except HunterError as exc:
                raise refused(exc) from None
            turn_id = handle.turn_id
            bucket.turns.add(turn_id)
            turn = handle.turn
            record: DecisionRecord | None = None
            if not turn.settled:
                record = await self.follow(ctx, turn, self.wait_s(wait_s))
                turn = record.turn
            return await self.outcome(bucket, turn, wait_s, record=record)

    async def follow(self, ctx: Context, turn: Turn, wait_s: float) -> DecisionRecord:
        """Wait for *turn* to settle (at most *wait_s*), relaying its events as progress; the
        call cancelled cancels the turn. The turn as it is then, with its ledger entries."""
        turn_id = turn.turn_id
        with self._backend.watch.watch(turn_id) as events:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(
                        relay_progress,
                        events,
                        ctx.report_progress,
                        f"turn {turn_id} accepted ({turn.state})",
                    )
                    settled = await self.recorded(turn_id, wait_s)
                    tg.cancel_scope.cancel()
                return settled
            except anyio.get_cancelled_exc_class():
                # (a turn ended meanwhile, or not cancellable here: nothing more to do)
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(_CANCEL_S),
                    contextlib.suppress(HunterError),
                ):
                    await self._client.cancel(
                        turn_id, reason=_CANCEL_REASON, operator=self.operator(ctx)
                    )
                raise

    async def compact(self, turn_id: int, wait_s: float) -> Turn:
        """The turn's outcome only, once it settles or *wait_s* passes (``turn.wait``)."""
        try:
            answer = await self._client.call(
                "turn.wait", turn_id=turn_id, timeout_s=wait_s, answer="compact"
            )
        except HunterError as exc:
            raise refused(exc) from None
        return msgspec.convert(answer["turn"], Turn)

    async def recorded(self, turn_id: int, wait_s: float) -> DecisionRecord:
        """The turn once it settles or *wait_s* passes, with its ledger entries (``turn.wait``
        answering ``"record"``: one round trip for what a wait and ``turn.get`` took)."""
        try:
            answer = await self._client.call(
                "turn.wait", turn_id=turn_id, timeout_s=wait_s, answer="record"
            )
        except HunterError as exc:
            raise refused(exc) from None
        ledger = answer.get("ledger") or {}
        return msgspec.convert({"turn": answer["turn"], **ledger}, DecisionRecord)

    async def outcome(
        self,
        bucket: SessionBucket,
        turn: Turn,
        wait_s: float | None,
        *,
        record: DecisionRecord | None = None,
    ) -> TurnOutcome:
        """*turn*'s bounded outcome; once settled with its decision record (*record* when the
        caller has it, else read)."""
        note = None
        if turn.settled:
            if record is None:
                try:
                    record = await self._client.decision_record(turn.turn_id)
                except HunterError as exc:
                    raise refused(exc) from None
            turn = record.turn
        else:
            record = None
            note = (
                f"still {turn.state} after the wait: call wait_turn with turn_id"
                f" {turn.turn_id} (or cancel_turn)"
            )
        outcome, spent = outcome_of(
            turn, record, self._backend.limits.output_allowance(bucket), note=note
        )
        self._backend.limits.charge(bucket, spent)
        return outcome
