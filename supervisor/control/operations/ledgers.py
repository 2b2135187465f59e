"""``ledger.verify``: the sessions' hash-chained ledgers, checked by the turn core (in a fleet,
the sessions another daemon homes are named, and checked there)."""

from __future__ import annotations

from supervisor.turns.core import TurnCore
from supervisor.wire.control import SessionFilter

__all__ = ["LedgerOperations"]


class LedgerOperations:
    """The ledger operations of one `TurnCore`."""

    def __init__(self, turn_core: TurnCore) -> None:
        self._turn_core = turn_core

    async def verify(self, params: SessionFilter) -> object:
        sid = params.session_id
        return await self._turn_core.verify_ledgers(session_id=sid)
