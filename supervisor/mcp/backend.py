"""`Backend`: what every tool call of one `hunter mcp` shares: the client of the daemon (one
control connection), the one event subscription (`TurnWatch`), the limits of each MCP session
and this server's identity."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from supervisor.client import Client, connect
from supervisor.mcp.attribution import ServerInstance
from supervisor.mcp.config import McpSettings
from supervisor.mcp.limits import Limits
from supervisor.mcp.progress import TurnWatch

__all__ = ["Backend"]

#: how long the client reconnects after the daemon went away, before a call fails
_RECONNECT_S = 10.0


@dataclass
class Backend:
    settings: McpSettings
    client: Client
    watch: TurnWatch
    limits: Limits
    instance: ServerInstance
    #: the daemon's root (from ``ping``): where packages and session workspaces are
    root: Path
    _workspaces: dict[str, Path] = field(default_factory=dict)

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: McpSettings) -> AsyncIterator[Backend]:
        """Connect to the daemon (`DaemonNotRunning` when none answers) and follow its feed
        for the block."""
        async with connect(socket=settings.socket, reconnect_s=_RECONNECT_S) as client:
            ping = await client.call("ping")
            root = Path(str(ping.get("root") or settings.socket.parent.parent))
            watch = TurnWatch(client)
            async with anyio.create_task_group() as tg:
                await tg.start(watch.run)
                yield cls(
                    settings=settings,
                    client=client,
                    watch=watch,
                    limits=Limits(settings),
                    instance=ServerInstance.here(settings.server_name),
                    root=root,
                )
                tg.cancel_scope.cancel()

    async def workspace(self, session_id: str) -> Path:
        """Where the session's outputs are promoted (``session.open``'s workspace, by default
        ``<root>/workspace/<session_id>``)."""
        found = self._workspaces.get(session_id)
        if found is None:
            info = await self.client.session(session_id)
            given = info.session.workspace
            found = Path(given) if given else self.root / "workspace" / session_id
            self._workspaces[session_id] = found
        return found

    def statistics(self) -> dict[str, int]:
        return {**self.watch.statistics(), **self.limits.statistics()}
