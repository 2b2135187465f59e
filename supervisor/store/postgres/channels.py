"""How the PostgreSQL store's operations reach its database: `StoreChannels`.

The store (`engine.PostgresTurnStore`) says what each operation does in SQL; this says how it
gets there: through the committer in a batch (`write`, `enqueue`), on a read connection in a
snapshot (`read`), or on the renewal connection, never behind a batch (`renew`). It owns the
committer and the connections they use (writer, readers, renewal connection, work listener),
starts and closes them together, and counts the turns this store is writing (a renewal round
reads it). The store's fleet facade (`fleet_front.PostgresFleet`) takes the same channels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from supervisor.store.committer import Committer
from supervisor.store.postgres.batches import Op, PendingOp, RowLocks
from supervisor.store.postgres.connections import RenewalConnection, SessionSettings
from supervisor.store.postgres.connector import Connector, close_quietly
from supervisor.store.postgres.listener import WorkListener
from supervisor.store.postgres.readers import Readers
from supervisor.store.postgres.writer import Writer
from supervisor.store.sealing import LineSeal

__all__ = ["StoreChannels"]

T = TypeVar("T")


class StoreChannels:
    """The committer, the connections, and the three ways an operation takes."""

    def __init__(
        self,
        dsn: str,
        settings: SessionSettings,
        *,
        where: str,
        max_batch: int,
        read_connections: int,
        connect_timeout_s: float,
    ) -> None:
        self.settings = settings
        self.connector = connector = Connector(dsn, settings, timeout_s=connect_timeout_s)
        self.writer = Writer(
            connector,
            settings,
            where=where,
            writable=lambda: self.committer.state in {"open", "closing"},
        )
        self.committer = Committer(
            self.writer,
            where=where,
            opener="open_postgres_store",
            max_batch=max_batch,
            landed=self._landed,
        )
        self._submit = self.committer.submit
        self._check_open = self.committer.check_open
        self.readers = Readers(connector, settings, where=where, count=read_connections)
        self.listener = WorkListener(connector, noted=self.writer.outages.noted)
        self.renewals = RenewalConnection(
            lambda: connector.connect("renewal"),
            where=where,
            is_open=lambda: self.committer.state in {"starting", "open", "closing"},
            prepare=lambda conn: settings.apply(conn, "renewal"),
        )
        #: turn -> this store's writes of it queued or in a batch (`renew` reads it)
        self.writing: Counter[int] = Counter()

    async def start(self, *, migrate: bool) -> None:
        """Connect (the writer checks or migrates the schema first)."""
        await self.writer.start(migrate_schema=migrate)
        await self.readers.start()
        await self.renewals.start()
        await self.listener.start()

    async def close(self) -> None:
        listener = self.listener.detach()
        writer = self.writer.detach()
        for conn in (writer, *self.readers.detach(), listener):
            await close_quietly(conn)
        await self.renewals.aclose()

    def enqueue(self, op: Op[object]) -> None:
        """Queue *op* for the committer's next batch."""
        self._submit(op)
        self.writing.update(op.locks.turns if op.locks is not None else ())

    def _landed(self, op: Op[object]) -> None:
        """The committer is done with *op* (or skipped it): its turns are no longer written."""
        for turn_id in op.locks.turns if op.locks is not None else ():
            self.writing[turn_id] -= 1
            if self.writing[turn_id] <= 0:
                del self.writing[turn_id]

    async def write(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        lines: LineSeal | None = None,
        locks: RowLocks | None = None,
    ) -> T:
        op = Op(fn, lines=lines, locks=locks)
        self.enqueue(op)
        return await PendingOp(op).result()

    async def read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        self._check_open()
        return await self.readers.read(fn)

    async def renew(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        self._check_open()
        return await self.renewals.run(fn)

    def learn(self, lease_ms: int) -> None:
        """The lease the daemon claims and renews with (the connections' timeouts)."""
        self.settings.learn(lease_ms)
