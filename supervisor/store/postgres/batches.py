"""The PostgreSQL engine's queued writes and how a batch of them commits.

Design notes
------------
* **One transaction per batch**, each op all-or-nothing: ops run without savepoints; when one
  raises, the transaction is rolled back and the batch runs again with a savepoint per op, so a
  failing op never takes its neighbours with it. A deadlock or serialization failure is the
  batch's, not an op's: the whole batch runs again (`PostgresTurnStore`).
* **A lost connection is the batch's too, never an op's.** When the connection drops (the
  server restarted, failed over, or a network cut), the batch's outcome may be unknown: the
  ``COMMIT`` may have landed before the answer was lost. Each batch therefore reads its
  transaction id (``txid_current()``) just before committing; after reconnecting, the engine asks
  the server (``txid_status``) whether that transaction committed. Committed: the ops' results
  stand. Not: the batch runs again on the new connection. So a write is never lost and never
  applied twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import asyncpg

from supervisor.logging import get_logger
from supervisor.store.queued import PendingOp, QueuedOp

__all__ = ["BatchAttempt", "Op", "PendingOp", "connection_lost", "try_batch"]

T_co = TypeVar("T_co", covariant=True)

_log = get_logger("supervisor.store")

#: Errors that mean the connection (not the statement) failed.
_LOST: Final = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
)


def connection_lost(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """True when *exc* (raised on *conn*) means the connection is gone."""
    return conn.is_closed() or isinstance(exc, _LOST)


class Op(QueuedOp[T_co]):
    """One queued write: run in a batch by the committer on the writer connection."""

    __slots__ = ("_fn",)

    def __init__(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T_co]],
        on_commit: Callable[[T_co], None] | None = None,
    ) -> None:
        super().__init__(on_commit)
        self._fn = fn

    async def execute(self, conn: asyncpg.Connection) -> bool:
        """Run the op; False when it raised (its error is kept). A deadlock or serialization
        failure, or a lost connection, is the batch's, not the op's: it propagates (the batch
        runs again)."""
        try:
            self._result = (await self._fn(conn),)
        except asyncpg.TransactionRollbackError:
            raise
        except Exception as exc:  # handed to this op's caller, never to its neighbours
            if connection_lost(exc, conn):
                raise
            self.error = exc
            return False
        return True


@dataclass(slots=True)
class BatchAttempt:
    """What a batch's run knows when its connection drops: the transaction id read just
    before ``COMMIT`` (None: the commit was never sent, so nothing was written)."""

    xid: int | None = None


async def try_batch(
    conn: asyncpg.Connection, batch: list[Op[object]], attempt: BatchAttempt
) -> None:
    """Run *batch* in one transaction (see the module docstring)."""
    tx = conn.transaction()
    await tx.start()
    try:
        failed = False
        for op in batch:
            if not await op.execute(conn):
                failed = True
                break
        if failed:
            await tx.rollback()
            if len(batch) == 1:
                return
            tx = conn.transaction()
            await tx.start()
            for op in batch:
                op.reset()
                savepoint = conn.transaction()
                await savepoint.start()
                if await op.execute(conn):
                    await savepoint.commit()
                else:
                    await savepoint.rollback()
        attempt.xid = int(await conn.fetchval("SELECT txid_current()"))
        await tx.commit()
    except BaseException:
        if not conn.is_closed() and conn.is_in_transaction():
            # a connection that goes meanwhile is rolled back by the server
            with contextlib.suppress(Exception):
                await tx.rollback()
        raise
