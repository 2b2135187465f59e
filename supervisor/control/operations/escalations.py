"""``escalations.list`` and ``escalations.resolve``: the turns parked for an operator, and the
operator's decision on one."""

from __future__ import annotations

from supervisor.control.answers import turn_answer
from supervisor.control.operations.attribution import caller_decision
from supervisor.executors.peercred import PeerCredentials
from supervisor.turns.core import TurnCore
from supervisor.wire.control import EscalationResolveParams, EscalationsListParams

__all__ = ["EscalationOperations"]


class EscalationOperations:
    """The escalation operations of one `TurnCore`."""

    def __init__(self, turn_core: TurnCore) -> None:
        self._turn_core = turn_core

    async def list_escalations(self, params: EscalationsListParams) -> object:
        page = await self._turn_core.list_escalations(
            after_turn_id=params.after_turn_id, limit=params.limit
        )
        return {"escalations": [turn_answer(t) for t in page.turns], "next_after": page.next_after}

    async def resolve(
        self, params: EscalationResolveParams, peer: PeerCredentials | None
    ) -> object:
        """A decision, attributed to *peer*."""
        action = params.action
        decision = await caller_decision(action, peer, params.operator, params.reason)
        turn = await self._turn_core.resolve_escalation(params.id, action, decision)
        return {"turn": turn_answer(turn)}
