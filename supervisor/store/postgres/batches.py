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
  applied twice. A statement that reads ``txid_current()`` itself hands it over (`note_xid`),
  which saves that round trip: the hot ops (accept, finish: `one_trip`) do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, TypeVar

import asyncpg

from supervisor.logging import get_logger
from supervisor.store.grouping import Accept, Finish, Plan, plan
from supervisor.store.queued import PendingOp, QueuedOp, withdraw_batch
from supervisor.store.sealing import LineSeal

__all__ = [
    "BatchAttempt",
    "GroupedRun",
    "Op",
    "PendingOp",
    "batch_error",
    "connection_lost",
    "note_xid",
    "try_batch",
]

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
        *,
        accept: Accept | None = None,
        finish: Finish | None = None,
        touches: int | None = None,
        lines: LineSeal | None = None,
    ) -> None:
        super().__init__(on_commit, accept=accept, finish=finish, touches=touches, lines=lines)
        self._fn = fn

    async def execute(self, conn: asyncpg.Connection) -> bool:
        """Run the op; False when it raised (its error is kept). A deadlock or serialization
        failure, or a lost connection, is the batch's, not the op's: it propagates (the batch
        runs again)."""
        try:
            self._result = (await self._fn(conn),)
        except Exception as exc:  # handed to this op's caller, never to its neighbours
            if batch_error(exc, conn):
                raise
            self.error = exc
            self.withdraw()  # its savepoint (or the batch) rolls back: so do its lines
            return False
        return True


@dataclass(slots=True)
class BatchAttempt:
    """What a batch's run knows when its connection drops: the transaction id read just
    before ``COMMIT`` (None: the commit was never sent, so nothing was written)."""

    xid: int | None = None
    #: the transaction id a statement of the batch already read (`note_xid`)
    seen_xid: int | None = None


#: The batch being run in this task (its ops run in it, one after another).
_RUNNING: ContextVar[BatchAttempt | None] = ContextVar("hunter_pg_batch", default=None)


def note_xid(xid: int) -> None:
    """A statement of the running batch read its transaction's id (``txid_current()``, the
    top-level id also inside a savepoint): the batch need not ask for it before committing."""
    attempt = _RUNNING.get()
    if attempt is not None:
        attempt.seen_xid = xid


#: Runs a batch's groups (`supervisor.store.postgres.many.run_grouped`); False when an op
#: failed (the batch then runs op by op).
GroupedRun = Callable[[asyncpg.Connection, Plan[Op[object]]], Awaitable[bool]]


def batch_error(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """True when *exc* is the batch's (a deadlock, a serialization failure, a lost
    connection: the batch runs again), not one op's."""
    return isinstance(exc, asyncpg.TransactionRollbackError) or connection_lost(exc, conn)


async def _in_order(conn: asyncpg.Connection, batch: list[Op[object]]) -> bool:
    for op in batch:
        if not await op.execute(conn):
            return False
    return True


async def try_batch(
    conn: asyncpg.Connection,
    batch: list[Op[object]],
    attempt: BatchAttempt,
    *,
    run_grouped: GroupedRun | None = None,
) -> None:
    """Run *batch* in one transaction (see the module docstring); its accepts and endings as
    groups (*run_grouped*, when `grouping.plan` allows), else op by op in order."""
    attempt.seen_xid = None
    running = _RUNNING.set(attempt)
    tx = conn.transaction()
    try:
        await tx.start()
        grouped = plan(batch) if run_grouped is not None else None
        if grouped is not None and run_grouped is not None:
            failed = not await run_grouped(conn, grouped)
        else:
            failed = not await _in_order(conn, batch)
        if failed:
            await tx.rollback()
            withdraw_batch(batch)  # the rerun seals again what it commits
            attempt.seen_xid = None  # that transaction's id: the rerun gets another
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
        xid = attempt.seen_xid
        if xid is None:
            xid = int(await conn.fetchval("SELECT txid_current()"))
        attempt.xid = xid
        await tx.commit()
    except BaseException:
        if not conn.is_closed() and conn.is_in_transaction():
            # a connection that goes meanwhile is rolled back by the server
            with contextlib.suppress(Exception):
                await tx.rollback()
        if attempt.xid is None:  # COMMIT never sent: nothing was written, nor are its lines
            withdraw_batch(batch)
        raise
    finally:
        _RUNNING.reset(running)
