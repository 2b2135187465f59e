"""The agent's own trail as MCP resources: each session's ledgers and each turn's decision
record (resource templates; only sessions and turns of the reading MCP session).

``hunter://sessions/{session_id}/ledger/{name}``: the ``exec`` or ``evidence`` ledger, JSON
lines as written (the last `MAX_LEDGER_BYTES` of a longer one, from a line's start);
``hunter://turns/{turn_id}/decision``: the turn's decision record (``turn.get``), JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import anyio
import orjson
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError

from ledger import session_dir_for
from supervisor.client import HunterError
from supervisor.mcp.backend import Backend
from supervisor.mcp.errors import BadInput

__all__ = ["LEDGER_URI", "TURN_URI", "Resources"]

LEDGER_URI: Final = "hunter://sessions/{session_id}/ledger/{name}"
TURN_URI: Final = "hunter://turns/{turn_id}/decision"
MAX_LEDGER_BYTES: Final = 1_048_576


def _tail(path: Path, limit: int) -> str:
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        start = max(0, size - limit)
        fh.seek(start)
        data = fh.read(limit)
    if start > 0:
        data = data[data.find(b"\n") + 1 :]
    return data.decode("utf-8", "replace")


class Resources:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def _owner(self, ctx: Context) -> str:
        return (ctx.headers or {}).get("mcp-session-id", "")

    async def ledger(self, session_id: str, name: str, ctx: Context) -> str:
        """A session's exec or evidence ledger: hash-chained JSON lines, one per entry."""
        if name not in ("exec", "evidence"):
            raise ResourceError(f"ledger {name!r}: the ledgers are 'exec' and 'evidence'")
        bucket = self._backend.limits.bucket(self._owner(ctx))
        try:
            bucket.owns_session(session_id)
            info = await self._backend.client.session(session_id)
        except (BadInput, HunterError) as exc:
            raise ResourceError(str(exc)) from None
        path = (
            session_dir_for(self._backend.root, info.session.tier, session_id)
            / "ledger"
            / f"{name}.jsonl"
        )
        try:
            return await anyio.to_thread.run_sync(_tail, path, MAX_LEDGER_BYTES)
        except OSError as exc:
            raise ResourceError(
                f"the {name} ledger of {session_id} cannot be read: {exc}"
            ) from None

    async def decision(self, turn_id: str, ctx: Context) -> str:
        """A turn's decision record: the turn, its attempts and its ledger entries (JSON)."""
        if not turn_id.isdigit() or len(turn_id) > 19:
            raise ResourceError(f"turn id {turn_id!r}: a turn id is a positive whole number")
        bucket = self._backend.limits.bucket(self._owner(ctx))
        try:
            bucket.owns_turn(int(turn_id))
            record = await self._backend.client.decision_record(int(turn_id))
        except (BadInput, HunterError) as exc:
            raise ResourceError(str(exc)) from None
        return orjson.dumps(record.to_dict(), option=orjson.OPT_INDENT_2).decode()
