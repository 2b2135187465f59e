"""The SQLite engine's writer: its connection, and where and how a batch of writes commits.

The committer (`supervisor.store.committer`) takes the queued ops as a batch; the writer runs
it in one transaction (one fsync), each op all-or-nothing: the ops run without savepoints
first, and a batch in which one fails runs again with a SAVEPOINT per op. Accepts and endings
run as groups when `grouping.plan` allows (`batches.accept_many`, `batches.finish_many`).

**Where a batch commits: adaptive.** On a fast disk a batch (its statements and the WAL's
fsync, a few hundred microseconds) is cheapest run right on the event loop: a worker thread's
wake-up and the GIL hand-offs of each SQLite call cost more than the sync itself, and the next
batch gathers while this one runs anyway. A slow disk must not stall the loop, though: the
writer keeps an average of batch durations and moves the batches to its worker thread (its own
`anyio.CapacityLimiter` of 1: commits never queue behind other blocking work) while it is above
``inline_limit_s`` (1 ms by default), back once it falls under half of it. ``inline_limit_s=0``
always uses the thread. Results go back by plain attribute writes read after the batch: no
futures, no cross-thread callbacks.

Apart from the engine's facade because this is how SQLite commits (its locks, its thread, its
timing), which changes for reasons the `TurnStore` methods never see.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Final, TypeVar

import anyio
import anyio.to_thread

from supervisor.errors import IntakeClosedError
from supervisor.stages import stage_costs
from supervisor.store.grouping import Accept, Finish, plan
from supervisor.store.queued import QueuedOp, withdraw_batch
from supervisor.store.sealing import LineSeal
from supervisor.store.sqlite.batches import accept_many, finish_many

__all__ = ["SqliteOp", "Writer"]

T_co = TypeVar("T_co", covariant=True)

#: how long the worker thread waits for another connection's write lock (as the schema sets)
_BUSY_TIMEOUT_MS = 10_000

_COSTS: Final = stage_costs()


class SqliteOp(QueuedOp[T_co]):
    """One queued write: run in a batch on the commit thread (or the loop)."""

    __slots__ = ("_fn",)

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], T_co],
        on_commit: Callable[[T_co], None] | None = None,
        stage: str = "store",
        *,
        accept: Accept | None = None,
        finish: Finish | None = None,
        touches: int | None = None,
        lines: LineSeal | None = None,
    ) -> None:
        super().__init__(
            on_commit, stage, accept=accept, finish=finish, touches=touches, lines=lines
        )
        self._fn = fn

    def execute(self, conn: sqlite3.Connection) -> bool:
        """Run the op; False when it raised (its error is kept)."""
        started = _COSTS.clock()
        try:
            self._result = (self._fn(conn),)
        except Exception as exc:  # handed to this op's caller, never to its neighbours
            self.error = exc
            self.withdraw()  # its savepoint (or the batch) rolls back: so do its lines
            return False
        finally:
            _COSTS.add(self.stage, _COSTS.clock() - started)
        return True


class Writer:
    """The writer connection and its batches (the committer's `BatchRunner`)."""

    def __init__(self, where: str, *, inline_limit_s: float = 0.001) -> None:
        self._where = where
        self._inline_limit_s = inline_limit_s
        #: running average of a batch's duration (seconds); starts inline when allowed
        self._batch_s = 0.0
        self._inline_batches = 0
        self._waits_for_lock = True
        self.conn: sqlite3.Connection | None = None
        #: the commit thread's token (also the one that opens and closes the connections)
        self.limiter = anyio.CapacityLimiter(1)
        #: the last batch ran on the loop: the committer yields once its callers are told
        self.checkpoint_after = False

    def close(self) -> None:
        """On the commit thread: close the connection."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _commit_inline(self) -> bool:
        limit = self._inline_limit_s
        if limit <= 0:
            return False
        # hysteresis: leave the loop above the limit, come back under half of it
        return self._batch_s < (limit if self._inline_batches else limit / 2)

    async def run_batch(self, batch: list[SqliteOp[object]]) -> None:
        """On the loop when batches are quick, else (or when another process holds the write
        lock) on the commit thread."""
        inline = self._commit_inline()
        started = time.perf_counter()
        try:
            if inline and self._run_batch(batch, wait=False):
                self._inline_batches += 1
            else:  # on the worker thread (also when another process holds the write lock)
                inline = False
                await anyio.to_thread.run_sync(self._run_batch, batch, limiter=self.limiter)
        finally:
            elapsed = time.perf_counter() - started
            self._batch_s = 0.8 * self._batch_s + 0.2 * elapsed
            if not inline:
                self._inline_batches = 0
            self.checkpoint_after = inline

    def _run_batch(self, batch: list[SqliteOp[object]], *, wait: bool = True) -> bool:
        """Run *batch* in one transaction, each op all-or-nothing; True when it ran.

        With ``wait=False`` (on the event loop) it never waits for the database's write lock:
        when another connection holds it, nothing is run and the answer is False (the caller
        runs the batch on the worker thread, which waits).

        Optimistic: the ops run back to back without savepoints (two statements fewer per
        op). Ops fail rarely (a stale claim, an illegal move, a duplicate); when one does, the
        transaction is rolled back and the batch runs again with a savepoint per op, so the
        failing op rolls back alone and its neighbours commit.
        """
        conn = self.conn
        if conn is None:
            raise IntakeClosedError(f"turn store {self._where} is closed")
        if wait != self._waits_for_lock:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS if wait else 0}")
            self._waits_for_lock = wait
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if wait or exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                raise
            return False
        try:
            grouped = plan(batch)
            if grouped is not None:
                if not _run_grouped(conn, grouped.accepts, grouped.others, grouped.endings):
                    conn.execute("ROLLBACK")
                    withdraw_batch(batch)
                    conn.execute("BEGIN IMMEDIATE")
                    _run_one_by_one(conn, batch)
            elif len(batch) == 1:
                if not batch[0].execute(conn):
                    conn.execute("ROLLBACK")
                    return True
            elif not all(op.execute(conn) for op in batch):
                conn.execute("ROLLBACK")
                withdraw_batch(batch)
                conn.execute("BEGIN IMMEDIATE")
                _run_one_by_one(conn, batch)
            started = _COSTS.clock()
            conn.execute("COMMIT")
            _COSTS.add("commit", _COSTS.clock() - started, 0)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            withdraw_batch(batch)  # nothing of the batch was written: nor are its lines
            raise
        return True


def _run_one_by_one(conn: sqlite3.Connection, batch: list[SqliteOp[object]]) -> None:
    """Each op with a savepoint of its own: a failing op rolls back alone."""
    for op in batch:
        op.reset()
        conn.execute("SAVEPOINT op")
        if not op.execute(conn):
            conn.execute("ROLLBACK TO op")
        conn.execute("RELEASE op")


def _run_grouped(
    conn: sqlite3.Connection,
    accepts: list[SqliteOp[object]],
    others: list[SqliteOp[object]],
    endings: list[SqliteOp[object]],
) -> bool:
    """The batch's accepts at once, its other ops in order, then its endings at once; False
    when anything failed that needs the one-by-one way (the caller rolls back and runs
    that)."""
    if accepts:
        started = _COSTS.clock()
        try:
            taken = accept_many(conn, [op.accept for op in accepts if op.accept is not None])
        except Exception:
            return False
        finally:
            _COSTS.add("store", _COSTS.clock() - started, len(accepts))
        for op, got in zip(accepts, taken, strict=True):
            op.settle(got)
    if not all(op.execute(conn) for op in others):
        return False
    if not endings:
        return True
    started = _COSTS.clock()
    try:
        outcomes = finish_many(conn, [op.finish for op in endings if op.finish is not None])
    except Exception:  # e.g. a ledger line that differs from the kept one
        return False
    finally:
        _COSTS.add("commit", _COSTS.clock() - started, len(endings))
    for op, outcome in zip(endings, outcomes, strict=True):
        op.settle(outcome)
    return True
