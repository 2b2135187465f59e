"""What a person or a client decides about a turn that is not final: cancel it, or resolve it.

A cancel stops a turn wherever it stands here: a parked turn (no task) is ended at once, a
running one is interrupted and awaited, an escalated one is resolved as cancelled. An operator
resolves an escalated turn with ``retry`` or ``terminate``. Escalations are resolved in the
store (`escalations.Escalations`), from any daemon on a shared store; in a fleet, an ending of
a session homed by another daemon is asked of that home (`elsewhere.Elsewhere.ask_home`),
which writes the ending's ledger entries. Each decision is attributed
(`supervisor.turns.decisions`): who took it and why is recorded as ``decided_by``.

It is apart from the front (`core.TurnCore`): it changes when the rules of a decision do, and
it is off the path of a turn nobody intervenes in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sandbox.policy.lifecycle import TurnState
from supervisor.errors import RequestError
from supervisor.logging import get_logger
from supervisor.store.protocol import Resolution, TurnRecord
from supervisor.turns.context import TurnDeps
from supervisor.turns.decisions import Decision
from supervisor.turns.fleet import Fleet
from supervisor.turns.tracker import ActiveTurn

__all__ = ["Interventions", "ParkedTurnEnds"]


class ParkedTurnEnds(Protocol):
    """What a cancel needs of the turn runner (`runner.TurnRunner`)."""

    def unpark(self, turn_id: int) -> bool: ...

    async def end_cancelled(self, turn: TurnRecord, active: ActiveTurn) -> None: ...


class Interventions:
    """Cancels turns and carries out operators' resolutions of escalated ones."""

    def __init__(
        self,
        deps: TurnDeps,
        runner: ParkedTurnEnds,
        *,
        get_turn: Callable[[int], Awaitable[TurnRecord]],
        resolve: Callable[[TurnRecord, Resolution, Decision | None], Awaitable[TurnRecord]],
        fleet: Fleet | None = None,
    ) -> None:
        self._deps = deps
        self._runner = runner
        #: the turn as the control API reads it (`core.TurnCore.get_turn`)
        self._get_turn = get_turn
        #: carry out a resolution here, in the store (`escalations.Escalations.resolve`)
        self._resolve_here = resolve
        self._fleet = fleet
        self._log = get_logger("supervisor.turns")

    async def cancel(self, turn_id: int, decision: Decision | None = None) -> TurnRecord:
        """Cancel a turn that is not final; *decision*: who asked and why (recorded with the
        ending as ``decided_by``, `supervisor.turns.decisions`)."""
        turn = await self._get_turn(turn_id)
        if turn.final:
            return turn
        active = self._deps.tracker.get(turn_id)
        if decision is not None and (active is not None or turn.state is TurnState.ESCALATED):
            self._log.info(
                "turn_cancel_requested",
                turn_id=turn_id,
                state=turn.state.value,
                uid=decision.uid,
                pid=decision.pid,
                operator=decision.operator,
                reason=decision.reason,
            )
        if active is None:
            if turn.state is TurnState.ESCALATED:
                return await self.resolve(turn, Resolution.CANCEL, decision)
            raise RequestError("not_cancellable", f"turn {turn_id} is not active", turn_id=turn_id)
        if decision is not None and active.decided_by is None:  # the first cancel's is kept
            active.decided_by = decision
        if self._runner.unpark(turn_id):  # no task: end it here
            try:
                await self._runner.end_cancelled(turn, active)
            finally:
                self._deps.tracker.remove(active)
            return await self._get_turn(turn_id)
        active.cancel_requested = True
        active.interrupt()
        await active.wait_finished()
        return await self._get_turn(turn_id)

    async def resolve_escalation(
        self, turn_id: int, action: str, decision: Decision | None = None
    ) -> TurnRecord:
        """An operator's decision for a parked turn: ``retry`` or ``terminate``; *decision*:
        who took it and why (recorded as ``decided_by``, `supervisor.turns.decisions`)."""
        if action not in {"retry", "terminate"}:
            raise RequestError(
                "bad_request", "action: must be 'retry' or 'terminate'", field="action"
            )
        turn = await self._get_turn(turn_id)
        return await self.resolve(turn, Resolution(action), decision)

    async def resolve(
        self, turn: TurnRecord, resolution: Resolution, decision: Decision | None = None
    ) -> TurnRecord:
        """Here, or (in a fleet, an ending of a session homed elsewhere) by asking the home,
        which writes the ending's ledger entries; waits up to 10 s for it."""
        fleet = self._fleet
        if (
            fleet is None
            or resolution is Resolution.RETRY
            or fleet.is_home(turn.session_id)
            or turn.state is not TurnState.ESCALATED
        ):
            resolved = await self._resolve_here(turn, resolution, decision)
            self._deps.sessions.write_pending()
            return resolved
        return await fleet.ask_home(turn, resolution, self._get_turn, decision)
