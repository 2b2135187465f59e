"""Turns of sessions homed by another daemon of the fleet: accepted, awaited and resolved here.

Only a session's home runs its turns and writes its ledgers (`homes.Homes`). A turn submitted
to another daemon is accepted there, durably and unclaimed, and the home claims it (woken by
``NOTIFY``); a client waiting on it here reads its state from the store; an escalation of it
decided here is carried out by the home, asked through the store.

It is apart from the homes and the claim rounds: it serves the control API's calls for turns
that do not run here, and reads and writes only the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from sandbox.policy.lifecycle import TurnState
from supervisor.logging import get_logger
from supervisor.store.fleet import FleetStore
from supervisor.store.protocol import NewTurn, Resolution, TurnRecord
from supervisor.turns.context import TurnDeps
from supervisor.turns.decisions import Decision
from supervisor.turns.requests import TurnRequest

__all__ = ["Elsewhere"]

#: A session with turns in these states cannot be closed from any daemon.
_UNFINISHED = frozenset(
    {TurnState.ACCEPTED, TurnState.RUNNING, TurnState.WAITING_RETRY, TurnState.ESCALATED}
)

#: Reads a turn as the control API sees it (`TurnCore.get_turn`).
GetTurn = Callable[[int], Awaitable[TurnRecord]]


class Elsewhere:
    """The control API's calls for turns of sessions another daemon homes."""

    def __init__(self, deps: TurnDeps, store: FleetStore) -> None:
        self._deps = deps
        self._store = store
        self._log = get_logger("supervisor.turns.fleet")

    async def unfinished(self, session_id: str) -> list[int]:
        """Turns of the session not yet final in the store, wherever they run (up to 100)."""
        page = await self._deps.store.list_turns(
            session_id=session_id, states=_UNFINISHED, limit=100
        )
        return [t.turn_id for t in page.turns]

    async def accept(self, request: TurnRequest) -> tuple[TurnRecord, bool]:
        """A turn of a session homed by another daemon: accepted here, durably and unclaimed;
        the home claims it (woken by the store) and runs it. Store errors propagate."""
        accepted = await self._deps.store.accept(
            NewTurn(
                session_id=request.session_id,
                spec=request.spec,
                idempotency_key=request.idempotency_key,
            )
        )
        if accepted.created:
            self._deps.tracker.accepted(accepted.turn)
            self._log.info(
                "turn_accepted",
                session_id=request.session_id,
                turn_number=accepted.turn.turn_number,
                turn_id=accepted.turn.turn_id,
                kind=accepted.turn.kind.value,
                home="elsewhere",
            )
        return accepted.turn, accepted.created

    async def wait(
        self, turn_id: int, until: frozenset[TurnState], get_turn: GetTurn
    ) -> TurnRecord:
        """A turn another daemon runs (or will): its state is read from the store, every 10 ms
        at first, then less often (up to 250 ms), until final, escalated or in *until*."""
        delay = 0.01
        while True:
            turn = await get_turn(turn_id)
            if turn.final or turn.state is TurnState.ESCALATED or turn.state in until:
                return turn
            active = self._deps.tracker.get(turn_id)
            if active is not None:  # claimed here meanwhile
                await active.wait_settled()
                return await get_turn(turn_id)
            await anyio.sleep(delay)
            delay = min(0.25, delay * 1.5)

    async def ask_home(
        self,
        turn: TurnRecord,
        resolution: Resolution,
        get_turn: GetTurn,
        decision: Decision | None = None,
    ) -> TurnRecord:
        """Ask the session's home to carry out *resolution* (it writes the ending's ledger
        entries, with *decision*: who asked and why); waits up to 10 s for it, then returns the
        turn as it is."""
        await self._store.request_resolution(
            turn.turn_id,
            resolution,
            decided_by=None if decision is None else decision.to_dict(),
        )
        self._log.info(
            "resolution_requested",
            turn_id=turn.turn_id,
            action=resolution.value,
            uid=None if decision is None else decision.uid,
            operator=None if decision is None else decision.operator,
            reason=None if decision is None else decision.reason,
        )
        delay = 0.01
        with anyio.move_on_after(10):
            while True:
                current = await get_turn(turn.turn_id)
                if current.state is not TurnState.ESCALATED:
                    return current
                await anyio.sleep(delay)
                delay = min(0.25, delay * 1.5)
        return await get_turn(turn.turn_id)
