"""The PostgreSQL engine's writer: the one connection its committer's batches run on, and
what keeps a batch from being lost or applied twice.

* **A batch runs in one transaction** (`batches.try_batch`, its accepts and endings grouped by
  `many.run_grouped`), again, whole, after a deadlock or serialization failure (PostgreSQL
  aborts one transaction) a few times, and after a lock or statement timeout for up to two
  leases, before failing its ops.
* **A lost connection never fails a write**: the writer reconnects with backoff (50 ms
  doubling to 2 s) and runs the batch again unless its transaction is found committed
  (`committed`: the batch read its transaction id before ``COMMIT``). So a write is never lost
  and never applied twice.
* **Outages** are counted (`Outages`): since when the server is unreachable, how often it
  was, the last error; `PostgresTurnStore.statistics` reports them.

Apart from the engine's facade because this is the connection's life (its reconnects, its
reruns, the lost-commit check), which changes for reasons the `TurnStore` methods never see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import anyio
import asyncpg

from supervisor.errors import IntakeClosedError
from supervisor.logging import get_logger
from supervisor.store.postgres.batches import (
    BatchAttempt,
    Op,
    connection_lost,
    rerun_error,
    try_batch,
)
from supervisor.store.postgres.connections import SessionSettings
from supervisor.store.postgres.connector import Connector
from supervisor.store.postgres.many import run_grouped
from supervisor.store.postgres.schema import check_schema, migrate
from supervisor.store.queued import withdraw_batch

__all__ = ["Outages", "Writer"]

_log = get_logger("supervisor.store")
#: how often a batch aborted by a deadlock or serialization failure runs again
_BATCH_RETRIES: Final = 5


class Outages:
    """Whether the server is reachable, how often it was not, and the last error seen."""

    def __init__(self, where: str) -> None:
        self._where = where
        #: the writer's connection is down since this monotonic time (None: it is up)
        self.down_since: float | None = None
        self.count = 0
        self.last_error = ""

    def noted(self, exc: BaseException) -> None:
        """An error on the way to the server (the last one is reported)."""
        self.last_error = f"{type(exc).__name__}: {exc}"

    def down(self, exc: BaseException) -> None:
        """The writer lost the server: an outage begins (unless one is on)."""
        self.noted(exc)
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.count += 1
            _log.error("store_unavailable", store=self._where, error=self.last_error)

    def up(self) -> None:
        """A batch went through: the outage, if any, is over."""
        if self.down_since is not None:
            down_s = time.monotonic() - self.down_since
            self.down_since = None
            _log.warning("store_reconnected", store=self._where, down_s=round(down_s, 3))


class Writer:
    """The writer connection (the committer's `BatchRunner`); *writable* says whether the
    store still takes writes (reconnecting stops when it does not)."""

    #: a batch's I/O let the loop run; yield once its callers are told anyway
    checkpoint_after: Final = True

    def __init__(
        self,
        connector: Connector,
        settings: SessionSettings,
        *,
        where: str,
        writable: Callable[[], bool],
    ) -> None:
        self._connector = connector
        self._settings = settings
        self._where = where
        self._writable = writable
        self.conn: asyncpg.Connection | None = None
        self.outages = Outages(where)
        #: batches run again after a deadlock, a serialization failure or a timeout
        self.retried_batches = 0

    async def start(self, *, migrate_schema: bool) -> None:
        """Connect; create or upgrade the schema (*migrate_schema*), else check it."""
        self.conn = conn = await self._connector.connect("writer")
        if migrate_schema:
            # a migration may wait for another's (its advisory lock) and take long
            await conn.execute("SET lock_timeout = 0; SET statement_timeout = 0")
            await migrate(conn, self._where)
            await conn.execute("RESET lock_timeout; RESET statement_timeout")
        else:
            await check_schema(conn, self._where)

    def detach(self) -> asyncpg.Connection | None:
        """The connection, for the store to close."""
        conn, self.conn = self.conn, None
        return conn

    async def run_batch(self, batch: list[Op[object]]) -> None:
        """Run *batch* in one transaction, each op all-or-nothing; again, whole, after a
        deadlock or serialization failure, a lock or statement timeout, and after a lost
        connection whose transaction did not commit (`batches`: never lost, never applied
        twice)."""
        retries = 0
        began = time.monotonic()
        while True:
            conn = await self.connected()
            attempt = BatchAttempt()
            try:
                await self._settings.apply(conn, "writer")
                await try_batch(conn, batch, attempt, run_grouped=run_grouped)
            except Exception as exc:
                if rerun_error(exc):
                    withdraw_batch(batch)  # rolled back (at its COMMIT too): the rerun seals again
                    retries += 1
                    if self._gives_up(exc, retries, began):
                        raise
                    self.retried_batches += 1
                    for op in batch:
                        op.reset()
                    await anyio.sleep(0.001 * 2 ** min(retries, 8))
                    continue
                if not connection_lost(exc, conn):
                    withdraw_batch(batch)  # the server refused the batch: nothing committed
                    raise
                self._lost(conn, exc)
                if attempt.xid is not None and await self.committed(attempt.xid):
                    self.outages.up()
                    return  # the COMMIT landed; only its answer was lost
                withdraw_batch(batch)  # it did not: the lines it sealed leave their chains
                for op in batch:
                    op.reset()
                continue
            self.outages.up()
            return

    def _gives_up(self, exc: Exception, retries: int, began: float) -> bool:
        """Whether a batch stops running again after *exc* (`batches.rerun_error`): a lock or
        statement timeout after two leases (another daemon paused inside a transaction loses
        its connection after half of one), a deadlock or serialization failure after
        `_BATCH_RETRIES` tries."""
        if isinstance(exc, asyncpg.TransactionRollbackError):
            return retries >= _BATCH_RETRIES
        waited_s = time.monotonic() - began
        _log.warning(
            "store_batch_waited",
            store=self._where,
            error=f"{type(exc).__name__}: {exc}",
            tries=retries,
            waited_s=round(waited_s, 3),
        )
        return waited_s > 2 * self._settings.lease_ms / 1000 and retries >= _BATCH_RETRIES

    async def connected(self) -> asyncpg.Connection:
        """The connection, reconnecting with backoff (50 ms doubling to 2 s) while the server
        is unreachable; the batch waits (nothing acknowledged is lost meanwhile)."""
        delay = 0.05
        while self.conn is None or self.conn.is_closed():
            if not self._writable():
                raise IntakeClosedError(f"turn store {self._where} is closed")
            try:
                self.conn = await self._connector.connect("writer")
            except Exception as exc:  # still down: wait and try again
                self._lost(None, exc)
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)
        return self.conn

    async def committed(self, xid: int) -> bool:
        """Whether transaction *xid* (its answer lost with the connection) committed.

        A server that crashed and came back may not know *xid* at all ("transaction ID ... is
        in the future"): its id was handed out, but no commit record of it survived the crash
        (replaying one would have moved the server's next id past it), so it did not commit.
        """
        conn = await self.connected()
        try:
            status = await conn.fetchval("SELECT txid_status($1)", xid)
        except asyncpg.InvalidParameterValueError as exc:
            if "in the future" not in str(exc):
                raise
            return False
        return bool(status == "committed")

    def _lost(self, conn: asyncpg.Connection | None, exc: BaseException) -> None:
        if conn is not None:
            conn.terminate()
            self.conn = None
        self.outages.down(exc)
