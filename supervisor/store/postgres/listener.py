"""The PostgreSQL engine's ``LISTEN`` connection: how a daemon hears that another one queued
work it may take (`operations.WORK_CHANNEL`).

`wait` sleeps until a notification or its timeout; polling is the fallback, so a notification
lost with a dropped connection strands nothing. `keep` reconnects the connection every second
while it is down, and wakes the waiter once it is back (to look for what was missed).

Apart from the engine because it shares nothing with the committer or the readers: its own
connection, its own event, its own reconnects.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import asyncpg

from supervisor.store.postgres.connector import Connector
from supervisor.store.postgres.operations import WORK_CHANNEL

__all__ = ["WorkListener"]


class WorkListener:
    """The ``LISTEN`` connection on the work channel; *noted* is told of each failed
    reconnect (the store's last error)."""

    def __init__(self, connector: Connector, *, noted: Callable[[BaseException], None]) -> None:
        self._connector = connector
        self._noted = noted
        self._conn: asyncpg.Connection | None = None
        self._work = anyio.Event()

    async def start(self) -> None:
        """Connect and listen."""
        self._conn = await self._listen()

    async def _listen(self) -> asyncpg.Connection:
        conn = await self._connector.connect("listener", counted=False)
        await conn.add_listener(WORK_CHANNEL, self._notified)
        return conn

    def detach(self) -> asyncpg.Connection | None:
        """The connection, for the store to close (no longer kept)."""
        conn, self._conn = self._conn, None
        return conn

    async def keep(self) -> None:
        """Keep the connection up (reconnecting every second while it is down); polling covers
        the notifications missed meanwhile."""
        while True:
            await anyio.sleep(1.0)
            if self._conn is not None and not self._conn.is_closed():
                continue
            try:
                conn = await self._listen()
            except Exception as exc:  # still down
                self._noted(exc)
                continue
            self._conn = conn
            self._work.set()  # look for what was missed

    async def wait(self, timeout_s: float) -> bool:
        """Sleep until a ``NOTIFY`` on the work channel or *timeout_s* (polling is the
        fallback: a notification lost with a dropped listener connection strands nothing)."""
        with anyio.move_on_after(timeout_s):
            await self._work.wait()
            self._work = anyio.Event()
            return True
        return False

    def _notified(self, *_: object) -> None:
        self._work.set()
