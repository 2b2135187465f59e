"""The PostgreSQL engine's read connections: a few, each serving one read at a time.

Idle connections wait in a memory object stream: a read takes one, runs its function in one
read-only ``REPEATABLE READ`` transaction (one snapshot, `connections.read_only`), so it never
waits behind a commit, and puts it back. A read that does not end (cancelled, failed) is
rolled back before its connection serves another. A lost connection is replaced and the read
tried again (a read changes nothing) for about 10 s, then `StoreUnavailableError`.

Apart from the engine because reads share nothing with the committer's writes but the
connector: their own connections, their own retries.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import anyio
import asyncpg

from supervisor.errors import IntakeClosedError, StoreUnavailableError
from supervisor.store.postgres.batches import connection_lost
from supervisor.store.postgres.connections import SessionSettings, end_transaction, read_only
from supervisor.store.postgres.connector import Connector

__all__ = ["Readers"]

T = TypeVar("T")

#: how often a read is tried, on a new connection after the first one was lost
_READ_TRIES: Final = 3


class Readers:
    """*count* read connections, opened by `start`."""

    def __init__(
        self, connector: Connector, settings: SessionSettings, *, where: str, count: int
    ) -> None:
        self._connector = connector
        self._settings = settings
        self._where = where
        self._count = count
        #: every read connection (a connection runs one query at a time: taken, used, put back)
        self._conns: list[asyncpg.Connection] = []
        self._idle_send, self._idle_receive = anyio.create_memory_object_stream[asyncpg.Connection](
            math.inf
        )

    async def start(self) -> None:
        """Open the connections."""
        for _ in range(self._count):
            reader = await self._connector.connect("reader")
            self._conns.append(reader)
            self._idle_send.send_nowait(reader)

    def detach(self) -> list[asyncpg.Connection]:
        """The connections, for the store to close; no read starts any more."""
        conns, self._conns = self._conns, []
        self._idle_send.close()
        return conns

    def shut(self) -> None:
        """Closed for good: a read waiting for a connection raises `IntakeClosedError`."""
        self._idle_send.close()
        self._idle_receive.close()

    async def read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """*fn* in a read-only transaction on an idle connection."""
        try:
            conn = await self._idle_receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise IntakeClosedError(f"turn store {self._where} is closed") from None
        try:
            for tries in range(_READ_TRIES):
                try:
                    await self._settings.apply(conn, "reader")
                    return await read_only(conn, fn)
                except Exception as exc:
                    if not connection_lost(exc, conn) or tries == _READ_TRIES - 1:
                        raise
                    conn = await self._reconnect(conn, exc)
            raise AssertionError("unreachable")
        finally:
            if not conn.is_closed() and conn.is_in_transaction():
                await end_transaction(conn)  # never handed on inside a transaction
            # when closing, the connection is being closed instead
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._idle_send.send_nowait(conn)

    async def _reconnect(self, old: asyncpg.Connection, exc: BaseException) -> asyncpg.Connection:
        """A new connection in place of a lost reader (reads are retried: they change
        nothing). Gives up with `StoreUnavailableError` after about 10 s."""
        old.terminate()
        delay = 0.05
        deadline = time.monotonic() + 10
        while True:
            try:
                conn = await self._connector.connect("reader")
            except Exception as again:
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(
                        f"turn store {self._where} is unreachable: {again}"
                    ) from exc
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            self._conns = [conn if r is old else r for r in self._conns]
            return conn
