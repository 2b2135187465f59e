"""``session.open``, ``session.close``, ``session.list`` and ``session.get``: the sessions of
the turn core, and the package a session runs as installed now."""

from __future__ import annotations

import anyio.to_thread

from supervisor.control.answers import package_answer
from supervisor.turns.core import TurnCore
from supervisor.wire.control import NoParams, SessionOpenParams, SessionRef

__all__ = ["SessionOperations"]


class SessionOperations:
    """The session operations of one `TurnCore`."""

    def __init__(self, turn_core: TurnCore) -> None:
        self._turn_core = turn_core

    async def open_session(self, params: SessionOpenParams) -> object:
        row = await self._turn_core.open_session(
            package_id=params.package_id,
            tier=params.tier or "default",
            work_order_id=params.work_order_id,
            workspace=params.workspace,
            tenant=params.tenant,
            priority=params.priority,
        )
        return row.to_dict()

    async def close_session(self, params: SessionRef) -> object:
        sid = params.session_id
        return (await self._turn_core.close_session(sid)).to_dict()

    async def get_session(self, params: SessionRef) -> object:
        record = await self._turn_core.get_session(params.session_id)
        path = self._turn_core.settings.root / "installed" / record.package_id / "manifest.json"
        return {"session": record.to_dict(), **await anyio.to_thread.run_sync(package_answer, path)}

    async def list_sessions(self, params: NoParams) -> object:
        return {"sessions": [s.to_dict() for s in await self._turn_core.list_sessions()]}
