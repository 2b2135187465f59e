"""Escalated turns: parked in the store until a person (or a client's cancel) decides.

A decision is carried out in the store, so any daemon sharing it can resolve any escalation:
retry puts the turn back to ``accepted`` with a fresh attempt budget, and this daemon claims it
and runs it; terminate and cancel end it, with its ledger entries written first. The first
decision taken here wins before any await, so a second one never writes ledger entries for an
ending that will not happen.

A decision is attributed (`supervisor.turns.decisions`): who took it and why is recorded as
``decided_by`` in the turn's result (a retry's until the retried turn ends), in the evidence
entry of an ending, and in the ``escalation_resolved`` log event.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from sandbox.policy.lifecycle import TurnState
from supervisor.errors import NotEscalatedError, RequestError
from supervisor.logging import get_logger
from supervisor.store.protocol import (
    RESOLUTION_REASONS,
    Claim,
    Resolution,
    TurnEnding,
    TurnPage,
    TurnRecord,
)
from supervisor.store.sealing import EMPTY, LineSeal
from supervisor.turns.context import TurnDeps, with_ending
from supervisor.turns.decisions import Decision

__all__ = ["Escalations"]

#: A page of `escalations.list` (the store pages; the control API shows the first page).
_PAGE = 500
_ENDS = {Resolution.TERMINATE: TurnState.TERMINATED, Resolution.CANCEL: TurnState.CANCELLED}


def _not_escalated(turn_id: int, state: str, *, busy: bool = False) -> RequestError:
    why = "is already being resolved" if busy else f"is {state}, not escalated"
    return RequestError("not_escalated", f"turn {turn_id} {why}", turn_id=turn_id, state=state)


class Escalations:
    """Lists and resolves escalated turns; *start* runs a turn claimed again after a retry."""

    def __init__(
        self,
        deps: TurnDeps,
        *,
        start: Callable[[TurnRecord, Claim], None],
        fleet: bool = False,
    ) -> None:
        self._deps = deps
        self._start = start
        #: in a fleet the session's home claims a retried turn (woken by the store)
        self._fleet = fleet
        self._resolving: set[int] = set()
        self._log = get_logger("supervisor.turns")

    async def list(self, *, after_turn_id: int = 0, limit: int = _PAGE) -> TurnPage:
        """A page of the parked turns, by turn id, after *after_turn_id*."""
        return await self._deps.store.list_turns(
            states=frozenset({TurnState.ESCALATED}), after_turn_id=after_turn_id, limit=limit
        )

    async def resolve(
        self, turn: TurnRecord, resolution: Resolution, decision: Decision | None = None
    ) -> TurnRecord:
        """Carry out *resolution* on *turn* (`RequestError` not_escalated when it is not parked
        or another decision on it is under way); *decision*: who took it and why."""
        if turn.turn_id in self._resolving:
            raise _not_escalated(turn.turn_id, turn.state.value, busy=True)
        self._resolving.add(turn.turn_id)
        try:
            with anyio.CancelScope(shield=True):  # a decision, once taken, is carried out
                resolved = await self._carry_out(turn, resolution, decision)
        finally:
            self._resolving.discard(turn.turn_id)
        return resolved

    async def _carry_out(
        self, turn: TurnRecord, resolution: Resolution, decision: Decision | None
    ) -> TurnRecord:
        deps = self._deps
        if turn.state is not TurnState.ESCALATED:
            raise _not_escalated(turn.turn_id, turn.state.value)
        state = _ENDS.get(resolution)
        decided = {"decided_by": decision.to_dict()} if decision is not None else {}
        # the stored result: an ending keeps the parked turn's, a retry starts without one
        result = None
        if decided:
            kept = turn.result if state is not None and turn.result is not None else {}
            result = {**kept, **decided}
        lines: LineSeal = EMPTY
        if state is not None:
            code, why = RESOLUTION_REASONS[resolution]
            ending = TurnEnding(
                state=state, verdict="TERMINATE", reason_code=code, reason=why, result=decided
            )
            lines = deps.sessions.record_end(with_ending(turn, ending))
        try:
            resolved = await deps.store.resolve_escalation(
                turn.turn_id, resolution, ledger_lines=lines, result=result
            )
        except NotEscalatedError as exc:  # never sealed: the ledgers hold nothing of it
            raise _not_escalated(turn.turn_id, exc.state) from None
        if lines.lines:  # committed: the files may have them now
            deps.sessions.flush(turn.session_id, lines.lines)
        self._log.info(
            "escalation_resolved",
            turn_id=turn.turn_id,
            action=resolution.value,
            uid=None if decision is None else decision.uid,
            pid=None if decision is None else decision.pid,
            operator=None if decision is None else decision.operator,
            reason=None if decision is None else decision.reason,
        )
        deps.tracker.escalation_resolved(resolved, resolution.value)
        if resolved.final:
            deps.tracker.remember(resolved)
            deps.tracker.ended(resolved, ledger_lines=lines.lines)
            return resolved
        # retry: claim it again and run it here with a fresh attempt budget
        if self._fleet:
            return await deps.store.get_turn(turn.turn_id)
        for claim in await deps.store.claim(deps.owner, limit=64, lease_ms=deps.settings.lease_ms):
            if deps.tracker.get(claim.turn_id) is None:
                self._start(claim.turn, claim)
        return await deps.store.get_turn(turn.turn_id)
