"""The PostgreSQL engine's queued writes and how a batch of them commits.

Design notes
------------
* **One transaction per batch**, each op all-or-nothing: ops run without savepoints; when one
  raises, the transaction is rolled back and the batch runs again with a savepoint per op, so a
  failing op never takes its neighbours with it. A deadlock, a serialization failure, a lock
  timeout or a statement timeout (`connections.Timeouts`) is the batch's, not an op's: the
  whole batch runs again (`PostgresTurnStore`).
* **The transaction is the committer's own**: ``BEGIN``, ``SAVEPOINT``, ``COMMIT`` and
  ``ROLLBACK`` are sent as statements (not through asyncpg's ``Connection.transaction()``, whose
  bookkeeping a failed rollback leaves behind), a transaction some failure left open is rolled
  back before the next batch begins, and a ``COMMIT`` the server answers with ``ROLLBACK`` (the
  transaction had failed) fails the batch instead of passing for a commit.
* **Rows are locked in one order: sessions by id, then turns by id.** Each op names the rows it
  writes and may wait for (`RowLocks`: an accept its session, a fenced write its turn, an
  ending its turn and the sessions of its ledger lines, a home write its session). A batch of
  more than one op first locks all of them in that order, in one statement sent with its
  ``BEGIN`` (`lock_rows_sql`: no round trip of its own), so that no later statement of the
  batch waits for a row while holding a row that comes after it (the ops run grouped, accepts
  first and endings last, or in their queued order: neither is that order). A batch of one op
  needs none: each op's statements lock in that order by themselves. The other statements
  either write rows no other transaction can hold (a new turn, its attempts, the ledger lines
  of a session whose row the batch holds) or lock with ``SKIP LOCKED`` and so never wait
  (claims, home claims, recovery). Renewals run on their own connection
  (`connections.RenewalConnection`) and lock in the same order. Two transactions that take
  their locks in one order cannot wait for each other in a cycle, so PostgreSQL never has a
  deadlock to break (each one costs ``deadlock_timeout``, 1 s, before it is seen).
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

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, TypeVar

import asyncpg

from supervisor.logging import get_logger
from supervisor.store.grouping import Accept, Finish, Plan, plan
from supervisor.store.queued import PendingOp, QueuedOp, withdraw_batch
from supervisor.store.sealing import LineSeal, sessions_of

__all__ = [
    "LOCK_ROWS",
    "BatchAttempt",
    "GroupedRun",
    "Op",
    "PendingOp",
    "RowLocks",
    "batch_error",
    "batch_locks",
    "connection_lost",
    "lock_rows_sql",
    "note_xid",
    "rerun_error",
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
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
    # the server ended the session (an idle-in-transaction timeout's FATAL) between two
    # statements and asyncpg had not yet seen the socket close: "cannot switch to state ...;
    # another operation (2) is in progress"; the connection is of no further use
    asyncpg.exceptions.InternalClientError,
)

#: Errors after which the whole batch runs again on the same connection: PostgreSQL broke a
#: deadlock or a serialization conflict, or a lock or statement timeout ended a wait.
_RERUN: Final = (
    asyncpg.TransactionRollbackError,
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,
)


def connection_lost(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """True when *exc* (raised on *conn*) means the connection is gone."""
    return conn.is_closed() or isinstance(exc, _LOST)


@dataclass(frozen=True, slots=True)
class RowLocks:
    """The rows an op writes and may wait for: sessions and turns, by id."""

    sessions: tuple[str, ...] = ()
    turns: tuple[int, ...] = ()


def _derived_locks(
    accept: Accept | None, finish: Finish | None, touches: int | None
) -> RowLocks | None:
    """The rows of an accept (its session), an ending (the sessions of its ledger lines and
    its turn) or a fenced write of one turn (*touches*)."""
    if accept is not None:
        return RowLocks(sessions=(accept.new.session_id,))
    if finish is not None:
        return RowLocks(
            sessions=tuple(sessions_of(finish.lines.ledger_ids)), turns=(finish.claim.turn_id,)
        )
    if touches is not None and touches >= 0:
        return RowLocks(turns=(touches,))
    return None


class Op(QueuedOp[T_co]):
    """One queued write: run in a batch by the committer on the writer connection."""

    __slots__ = ("_fn", "locks")

    def __init__(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T_co]],
        on_commit: Callable[[T_co], None] | None = None,
        *,
        accept: Accept | None = None,
        finish: Finish | None = None,
        touches: int | None = None,
        lines: LineSeal | None = None,
        locks: RowLocks | None = None,
    ) -> None:
        super().__init__(on_commit, accept=accept, finish=finish, touches=touches, lines=lines)
        self._fn = fn
        #: the rows the batch locks for it first (`batch_locks`); None: none it waits for
        self.locks = locks if locks is not None else _derived_locks(accept, finish, touches)

    async def execute(self, conn: asyncpg.Connection) -> bool:
        """Run the op; False when it raised (its error is kept). A deadlock, a serialization
        failure, a lock or statement timeout, or a lost connection is the batch's, not the
        op's: it propagates (the batch runs again)."""
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


def rerun_error(exc: BaseException) -> bool:
    """True when the batch runs again after *exc* on the same connection (a deadlock, a
    serialization failure, a lock or statement timeout)."""
    return isinstance(exc, _RERUN)


def batch_error(exc: BaseException, conn: asyncpg.Connection) -> bool:
    """True when *exc* is the batch's (a deadlock, a serialization failure, a lock or
    statement timeout, a lost connection: the batch runs again), not one op's."""
    return rerun_error(exc) or connection_lost(exc, conn)


#: Lock the rows of a batch in the one order: its sessions by id, then its turns by id (the
#: turns' scan waits for the sessions' count, so every session is locked first). ``FOR NO KEY
#: UPDATE`` is what the ops' own ``UPDATE``s take (and stronger than an ending's ``FOR
#: SHARE``), so no op of the batch needs a stronger lock later. Sent with ``BEGIN`` in one
#: simple query, so its values are literals (`lock_rows_sql`).
LOCK_ROWS: Final = (
    "WITH s AS (SELECT session_id FROM sessions WHERE session_id = ANY({sessions}::text[])"
    " ORDER BY session_id FOR NO KEY UPDATE),"
    " t AS (SELECT turn_id FROM turns WHERE turn_id = ANY({turns}::bigint[])"
    " AND (SELECT count(*) FROM s) >= 0 ORDER BY turn_id FOR NO KEY UPDATE)"
    " SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM t)"
)


def _literal(text: str) -> str:
    """*text* as an SQL string literal (the writer runs with ``standard_conforming_strings``
    on, `connections.Timeouts.settings`: a backslash is an ordinary character)."""
    return "'" + text.replace("'", "''") + "'"


def lock_rows_sql(sessions: Sequence[str], turns: Sequence[int]) -> str:
    """`LOCK_ROWS` for these rows."""
    return LOCK_ROWS.format(
        sessions=f"ARRAY[{', '.join(_literal(s) for s in sessions)}]",
        turns=f"ARRAY[{', '.join(str(int(t)) for t in turns)}]",
    )


def _lockable(session_id: str) -> bool:
    """A session id that can name a row (one that cannot is left to its op, which fails
    alone)."""
    if "\x00" in session_id:
        return False
    try:
        session_id.encode()
    except UnicodeEncodeError:
        return False
    return True


def batch_locks(batch: Sequence[Op[object]]) -> tuple[list[str], list[int]] | None:
    """The sessions and turns a batch locks first (sorted), or None when it need not: a batch
    of one op, or one whose ops name no row."""
    if len(batch) < 2:
        return None
    sessions: set[str] = set()
    turns: set[int] = set()
    for op in batch:
        if op.locks is not None:
            sessions.update(s for s in op.locks.sessions if _lockable(s))
            turns.update(op.locks.turns)
    if not sessions and not turns:
        return None
    return sorted(sessions), sorted(turns)


async def _begin(conn: asyncpg.Connection, batch: list[Op[object]]) -> None:
    """Begin the batch's transaction and lock its rows (`batch_locks`), one round trip. A
    transaction some failure left open on the connection is rolled back first: nothing of it
    was acknowledged."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")
    rows = batch_locks(batch)
    await conn.execute("BEGIN" if rows is None else f"BEGIN; {lock_rows_sql(*rows)}")


async def _commit(conn: asyncpg.Connection, attempt: BatchAttempt) -> None:
    """``COMMIT``; one the server answers with ``ROLLBACK`` (the transaction had failed) is
    not taken for a commit."""
    status = await conn.execute("COMMIT")
    if status != "COMMIT":
        attempt.xid = None
        raise asyncpg.exceptions.InFailedSQLTransactionError(
            f"the batch's transaction failed; COMMIT answered {status}"
        )


async def _rollback(conn: asyncpg.Connection) -> None:
    """End a failed batch's transaction; a connection that cannot is closed (and the batch's
    outcome read back after reconnecting, as after any lost connection)."""
    try:
        await conn.execute("ROLLBACK")
    except Exception:
        conn.terminate()


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
    try:
        await _begin(conn, batch)
        grouped = plan(batch) if run_grouped is not None else None
        if grouped is not None and run_grouped is not None:
            failed = not await run_grouped(conn, grouped)
        else:
            failed = not await _in_order(conn, batch)
        if failed:
            await conn.execute("ROLLBACK")
            withdraw_batch(batch)  # the rerun seals again what it commits
            attempt.seen_xid = None  # that transaction's id: the rerun gets another
            if len(batch) == 1:
                return
            await _begin(conn, batch)
            for op in batch:
                op.reset()
                await conn.execute("SAVEPOINT op")
                if await op.execute(conn):
                    await conn.execute("RELEASE SAVEPOINT op")
                else:
                    await conn.execute("ROLLBACK TO SAVEPOINT op; RELEASE SAVEPOINT op")
        xid = attempt.seen_xid
        if xid is None:
            xid = int(await conn.fetchval("SELECT txid_current()"))
        attempt.xid = xid
        await _commit(conn, attempt)
    except BaseException:
        if not conn.is_closed() and conn.is_in_transaction():
            # a connection that goes meanwhile is rolled back by the server
            await _rollback(conn)
        if attempt.xid is None:  # COMMIT never sent: nothing was written, nor are its lines
            withdraw_batch(batch)
        raise
    finally:
        _RUNNING.reset(running)
