"""The embedded SQLite engine of the `TurnStore` seam (one daemon owns the file).

Lifetime
--------
Use it as a context manager, which runs the committer in its own task group::

    async with open_sqlite_store(root / "state" / "turns.sqlite3") as store:
        ...

or start its committer in the daemon's task group and close it on the way out::

    store = SqliteTurnStore(path)
    await task_group.start(store.run)  # opens the file (schema check) before it returns
    ...
    await store.aclose()  # commits what is queued, then closes; later calls raise

`aclose` lets the queued writes commit, then closes both connections; every later call raises
`IntakeClosedError`. Cancelling `run` (the task group ends) fails the writes still queued with
`IntakeClosedError`; a batch already in the database finishes first (it is shielded), so no
caller is left not knowing whether its write happened. Calling the store before `run` started
is a programming error (`RuntimeError`).

Design notes
------------
* **A method returns only after its transaction committed** (WAL, ``synchronous=FULL``, see
  `schema`). Writes go through one committer task; reads use a second connection on their own
  thread (WAL readers see every committed transaction and never wait for the writer).
* **Group commit.** Callers put an `_Op` on a memory object stream and wait on its
  `anyio.Event`. The committer takes everything queued (up to ``max_batch``) and runs it in one
  transaction (one fsync), on the loop or in one `anyio.to_thread.run_sync` call on its own
  `anyio.CapacityLimiter` of 1 (see below); while it commits, the next batch gathers in the
  stream. A failing op rolls back alone and raises to its own caller only: the ops run without
  savepoints first, and a batch in which one fails runs again with a SAVEPOINT per op.
  Results go back by plain attribute writes read after the batch, then ``Event.set()`` in the
  event loop: no futures, no cross-thread callbacks. A caller cancelled while its op is still queued
  marks it abandoned and the committer skips it; once the op is in a batch, the caller's
  cancellation only means it does not read the result (the write is all or nothing, as ever).
* The SQL, its checks (fencing, `check_move`) and the hot path's shortcuts are in `operations`;
  the tables, the version check and the connections in `schema`.
* **Where a batch commits: adaptive.** On a fast disk a batch (its statements and the WAL's
  fsync, a few hundred microseconds) is cheapest run right on the event loop: a worker thread's
  wake-up and the GIL hand-offs of each SQLite call cost more than the sync itself, and the
  next batch gathers while this one runs anyway. A slow disk must not stall the loop, though:
  the committer keeps an average of batch durations and moves the batches to its worker thread
  while it is above ``inline_limit_s`` (1 ms by default), back once it falls under half of it.
  ``inline_limit_s=0`` always uses the thread.
* About 650 lines (the class about 470), past the usual 600/400: the `TurnStore` methods are
  one-line delegations kept in one class with the committer whose state they queue onto (the
  grouping plan and the fencing rules are shared with PostgreSQL in `supervisor.store.grouping`
  and `supervisor.store.fencing`; the SQL is in `operations` and `batches`).
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

import supervisor.store.sqlite.operations as ops
from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import IntakeClosedError, StaleClaimError
from supervisor.logging import get_logger
from supervisor.stages import stage_costs
from supervisor.store.fencing import check_ending
from supervisor.store.grouping import NEW_TURN, Accept, Finish, plan
from supervisor.store.protocol import (
    Accepted,
    Claim,
    ClaimFilter,
    NewSession,
    NewTurn,
    PendingWrite,
    Resolution,
    SessionRecord,
    SessionState,
    StoreStatistics,
    TurnEnding,
    TurnPage,
    TurnRecord,
)
from supervisor.store.queued import PendingOp, QueuedOp, withdraw_batch
from supervisor.store.sealing import LineSeal, as_seal
from supervisor.store.sqlite.batches import accept_many, finish_many
from supervisor.store.sqlite.schema import open_connections
from supervisor.store.turn_filter import TurnFilter

__all__ = ["SqliteTurnStore", "open_sqlite_store"]

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


_log = get_logger("supervisor.store")
#: how long the worker thread waits for another connection's write lock (as the schema sets)
_BUSY_TIMEOUT_MS = 10_000


_COSTS: Final = stage_costs()


class _Op(QueuedOp[T_co]):
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


class SqliteTurnStore:
    """`TurnStore` on one SQLite file (see the module docstring for its lifetime).

    Construct it inside the event loop (it makes anyio primitives); it does no I/O until `run`.
    """

    def __init__(self, path: Path, *, max_batch: int = 512, inline_limit_s: float = 0.001) -> None:
        self.path = path
        self._max_batch = max_batch
        self._inline_limit_s = inline_limit_s
        #: running average of a batch's duration (seconds); starts inline when allowed
        self._batch_s = 0.0
        self._inline_batches = 0
        self._waits_for_lock = True
        self._send, self._receive = anyio.create_memory_object_stream[_Op[object]](math.inf)
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        # Own thread tokens: commits never queue behind other blocking work, reads never
        # queue behind a commit's fsync.
        self._write_limiter = anyio.CapacityLimiter(1)
        self._read_limiter = anyio.CapacityLimiter(1)
        self._state = "new"  # new -> open -> closed
        self._stopped = anyio.Event()
        self._commits = 0
        self._operations = 0
        self._largest = 0
        self._stale = 0

    # -- lifetime -------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the file, report started, then commit batches until `aclose` or cancellation."""
        if self._state != "new":
            raise RuntimeError(f"turn store {self.path}: run() was already called")
        self._state = "starting"
        try:
            self._writer, self._reader = await anyio.to_thread.run_sync(
                open_connections, self.path, limiter=self._write_limiter
            )
        except BaseException:
            self._shut()
            raise
        if self._state == "starting":  # not closed meanwhile
            self._state = "open"
        try:
            task_status.started()
            await self._commit_loop()
        finally:
            self._state = "closed"
            self._send.close()
            for op in self._drain():
                op.fail(IntakeClosedError(f"turn store {self.path} stopped"))
                op.complete()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._close_writer, limiter=self._write_limiter)
                await anyio.to_thread.run_sync(self._close_reader, limiter=self._read_limiter)
            self._shut()

    async def aclose(self) -> None:
        """Commit what is queued, close the file; later calls raise `IntakeClosedError`."""
        if self._state in {"new", "closed"}:
            self._shut()
            return
        self._state = "closing"
        self._send.close()  # the commit loop drains the stream, then ends
        await self._stopped.wait()

    def _shut(self) -> None:
        self._state = "closed"
        self._send.close()
        self._receive.close()
        self._stopped.set()

    def _drain(self) -> list[_Op[object]]:
        left: list[_Op[object]] = []
        while True:
            try:
                left.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return left

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _check_open(self) -> None:
        if self._state == "open":
            return
        if self._state in {"new", "starting"}:
            raise RuntimeError(
                f"turn store {self.path} is not running: start its run() in a task group or"
                " use open_sqlite_store()"
            )
        raise IntakeClosedError(f"turn store {self.path} is closed")

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            engine="sqlite",
            commits=self._commits,
            operations=self._operations,
            largest_batch=self._largest,
            stale_writes_refused=self._stale,
        )

    # -- the committer --------------------------------------------------------------------

    def _enqueue(
        self,
        fn: Callable[[sqlite3.Connection], T],
        on_commit: Callable[[T], None] | None = None,
        stage: str = "store",
        *,
        accept: Accept | None = None,
        finish: Finish | None = None,
        touches: int | None = None,
        lines: LineSeal | None = None,
    ) -> _Op[T]:
        self._check_open()
        op = _Op(fn, on_commit, stage, accept=accept, finish=finish, touches=touches, lines=lines)
        try:
            self._send.send_nowait(op)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise IntakeClosedError(f"turn store {self.path} is closed") from None
        return op

    async def _write(
        self, fn: Callable[[sqlite3.Connection], T], *, finish_lines: LineSeal | None = None
    ) -> T:
        return await PendingOp(self._enqueue(fn, lines=finish_lines)).result()

    async def _commit_loop(self) -> None:
        async for first in self._receive:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            live = [op for op in batch if not op.abandoned]
            if live:
                # Shielded: a batch that reached the database finishes and its callers learn
                # the outcome.
                with anyio.CancelScope(shield=True):
                    await self._commit(live)

    def _commit_inline(self) -> bool:
        limit = self._inline_limit_s
        if limit <= 0:
            return False
        # hysteresis: leave the loop above the limit, come back under half of it
        return self._batch_s < (limit if self._inline_batches else limit / 2)

    async def _commit(self, batch: list[_Op[object]]) -> None:
        inline = self._commit_inline()
        started = time.perf_counter()
        try:
            if inline and self._run_batch(batch, wait=False):
                self._inline_batches += 1
            else:  # on the worker thread (also when another process holds the write lock)
                inline = False
                await anyio.to_thread.run_sync(self._run_batch, batch, limiter=self._write_limiter)
        except Exception as exc:  # the transaction failed: nothing of the batch was written
            for op in batch:
                op.fail(exc)
        else:
            self._commits += 1
            self._operations += len(batch)
            self._largest = max(self._largest, len(batch))
            self._stale += sum(isinstance(op.error, StaleClaimError) for op in batch)
        finally:
            elapsed = time.perf_counter() - started
            self._batch_s = 0.8 * self._batch_s + 0.2 * elapsed
            if not inline:
                self._inline_batches = 0
            for op in batch:
                op.complete()
                op.committed()
            if inline:
                await anyio.lowlevel.checkpoint()  # let the loop serve what arrived meanwhile

    def _run_batch(self, batch: list[_Op[object]], *, wait: bool = True) -> bool:
        """Run *batch* in one transaction, each op all-or-nothing; True when it ran.

        With ``wait=False`` (on the event loop) it never waits for the database's write lock:
        when another connection holds it, nothing is run and the answer is False (the caller
        runs the batch on the worker thread, which waits).

        Optimistic: the ops run back to back without savepoints (two statements fewer per
        op). Ops fail rarely (a stale claim, an illegal move, a duplicate); when one does, the
        transaction is rolled back and the batch runs again with a savepoint per op, so the
        failing op rolls back alone and its neighbours commit.
        """
        conn = self._writer
        if conn is None:
            raise IntakeClosedError(f"turn store {self.path} is closed")
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
                if not self._run_grouped(conn, grouped.accepts, grouped.others, grouped.endings):
                    conn.execute("ROLLBACK")
                    withdraw_batch(batch)
                    conn.execute("BEGIN IMMEDIATE")
                    self._run_one_by_one(conn, batch)
            elif len(batch) == 1:
                if not batch[0].execute(conn):
                    conn.execute("ROLLBACK")
                    return True
            elif not all(op.execute(conn) for op in batch):
                conn.execute("ROLLBACK")
                withdraw_batch(batch)
                conn.execute("BEGIN IMMEDIATE")
                self._run_one_by_one(conn, batch)
            started = _COSTS.clock()
            conn.execute("COMMIT")
            _COSTS.add("commit", _COSTS.clock() - started, 0)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            withdraw_batch(batch)  # nothing of the batch was written: nor are its lines
            raise
        return True

    @staticmethod
    def _run_one_by_one(conn: sqlite3.Connection, batch: list[_Op[object]]) -> None:
        """Each op with a savepoint of its own: a failing op rolls back alone."""
        for op in batch:
            op.reset()
            conn.execute("SAVEPOINT op")
            if not op.execute(conn):
                conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")

    @staticmethod
    def _run_grouped(
        conn: sqlite3.Connection,
        accepts: list[_Op[object]],
        others: list[_Op[object]],
        endings: list[_Op[object]],
    ) -> bool:
        """The batch's accepts at once, its other ops in order, then its endings at once;
        False when anything failed that needs the one-by-one way (the caller rolls back and
        runs that)."""
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

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        return await anyio.to_thread.run_sync(self._run_read, fn, limiter=self._read_limiter)

    def _run_read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """On the read thread: *fn* in one read transaction (one consistent snapshot)."""
        conn = self._reader
        if conn is None:
            raise IntakeClosedError(f"turn store {self.path} is closed")
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")

    # -- sessions -------------------------------------------------------------------------

    async def open_session(self, new: NewSession) -> SessionRecord:
        return await self._write(lambda c: ops.open_session(c, new))

    async def close_session(self, session_id: str) -> SessionRecord:
        return await self._write(lambda c: ops.close_session(c, session_id))

    async def get_session(self, session_id: str) -> SessionRecord:
        return await self._read(lambda c: ops.get_session(c, session_id))

    async def list_sessions(self, *, state: SessionState | None = None) -> list[SessionRecord]:
        return await self._read(lambda c: ops.list_sessions(c, state))

    # -- acceptance and claims ------------------------------------------------------------

    async def accept(
        self, new: NewTurn, *, claim_for: str | None = None, lease_ms: int = 30_000
    ) -> Accepted:
        return await self.accept_soon(new, claim_for=claim_for, lease_ms=lease_ms).result()

    def accept_soon(
        self, new: NewTurn, *, claim_for: str | None = None, lease_ms: int = 30_000
    ) -> PendingWrite[Accepted]:
        _check_lease(lease_ms)
        op = self._enqueue(
            lambda c: ops.accept(c, new, claim_for, lease_ms),
            accept=None if new.idempotency_key is not None else Accept(new, claim_for, lease_ms),
            touches=NEW_TURN,
        )
        return PendingOp(op)

    async def find_turn(self, session_id: str, idempotency_key: str) -> TurnRecord | None:
        return await self._read(lambda c: ops.find_turn(c, session_id, idempotency_key))

    async def claim(
        self, owner: str, *, limit: int, lease_ms: int, only: ClaimFilter | None = None
    ) -> list[Claim]:
        _check_lease(lease_ms)
        if limit <= 0:
            return []
        return await self._write(lambda c: ops.claim_turns(c, owner, limit, lease_ms, only))

    async def renew(self, claims: Sequence[Claim], *, lease_ms: int) -> list[Claim]:
        _check_lease(lease_ms)
        if not claims:
            return []
        held = tuple(claims)
        return await self._write(lambda c: ops.renew(c, held, lease_ms))

    async def release(self, claim: Claim) -> None:
        """Give the turn up; a claim already lost is left alone (nothing to give up)."""
        await self._write(lambda c: ops.release(c, claim))

    async def recover(self, owner: str, *, lease_ms: int) -> list[Claim]:
        _check_lease(lease_ms)
        return await self._write(lambda c: ops.recover(c, owner, lease_ms))

    # -- fenced writes --------------------------------------------------------------------

    async def start_attempt(self, claim: Claim, attempt: AttemptRecord) -> Claim:
        return await self._write(lambda c: ops.start_attempt(c, claim, attempt))

    def start_attempt_soon(
        self,
        claim: Claim,
        attempt: AttemptRecord,
        *,
        on_commit: Callable[[Claim], None] | None = None,
    ) -> PendingWrite[Claim]:
        return PendingOp(
            self._enqueue(
                lambda c: ops.start_attempt(c, claim, attempt), on_commit, touches=claim.turn_id
            )
        )

    async def record_attempt(
        self,
        claim: Claim,
        attempt: AttemptRecord,
        *,
        next_attempt_us: int,
        started: AttemptRecord | None = None,
    ) -> Claim:
        pending = self.record_attempt_soon(
            claim, attempt, next_attempt_us=next_attempt_us, started=started
        )
        return await pending.result()

    def record_attempt_soon(
        self,
        claim: Claim,
        attempt: AttemptRecord,
        *,
        next_attempt_us: int,
        started: AttemptRecord | None = None,
    ) -> PendingWrite[Claim]:
        return PendingOp(
            self._enqueue(
                lambda c: ops.record_attempt(c, claim, attempt, next_attempt_us, started),
                touches=claim.turn_id,
            )
        )

    async def finish(
        self,
        claim: Claim,
        ending: TurnEnding,
        attempts: Sequence[AttemptRecord] = (),
        *,
        ledger_lines: Sequence[SealedLine] | LineSeal = (),
        started: AttemptRecord | None = None,
    ) -> TurnRecord:
        pending = self.finish_soon(
            claim, ending, attempts, ledger_lines=ledger_lines, started=started
        )
        return await pending.result()

    def finish_soon(
        self,
        claim: Claim,
        ending: TurnEnding,
        attempts: Sequence[AttemptRecord] = (),
        *,
        ledger_lines: Sequence[SealedLine] | LineSeal = (),
        started: AttemptRecord | None = None,
    ) -> PendingWrite[TurnRecord]:
        check_ending(ending)
        records = tuple(attempts)
        seal = as_seal(ledger_lines)
        return PendingOp(
            self._enqueue(
                lambda c: ops.finish(c, claim, ending, records, seal=seal, started=started),
                stage="commit",
                finish=Finish(claim, ending, records, seal, started),
            )
        )

    # -- ledger lines ---------------------------------------------------------------------

    async def ledger_lines(self, ledger_ids: Sequence[str]) -> list[SealedLine]:
        ids = tuple(ledger_ids)
        return await self._read(lambda c: ops.ledger_lines(c, ids))

    @property
    def keeps_ledgers(self) -> bool:
        """One daemon: the ledger files are the record; kept lines go once synced."""
        return False

    async def trim_ledger_lines(self, synced: Mapping[str, int]) -> int:
        marks = dict(synced)
        if not marks:
            return 0
        return await self._write(lambda c: ops.trim_ledger_lines(c, marks))

    # -- escalations ----------------------------------------------------------------------

    async def resolve_escalation(
        self,
        turn_id: int,
        resolution: Resolution,
        *,
        ledger_lines: Sequence[SealedLine] | LineSeal = (),
        result: Mapping[str, object] | None = None,
    ) -> TurnRecord:
        seal = as_seal(ledger_lines)
        return await self._write(
            lambda c: ops.resolve(c, turn_id, resolution, seal, result), finish_lines=seal
        )

    # -- reads ----------------------------------------------------------------------------

    async def get_turn(self, turn_id: int) -> TurnRecord:
        return await self._read(lambda c: ops.get_turn(c, turn_id))

    async def list_turns(
        self,
        *,
        session_id: str | None = None,
        states: frozenset[TurnState] | None = None,
        package_id: str | None = None,
        accepted_since_us: int | None = None,
        accepted_until_us: int | None = None,
        after_turn_id: int = 0,
        limit: int = 500,
    ) -> TurnPage:
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        where = TurnFilter(
            session_id=session_id,
            states=states,
            package_id=package_id,
            accepted_since_us=accepted_since_us,
            accepted_until_us=accepted_until_us,
        )
        return await self._read(lambda c: ops.list_turns(c, where, after_turn_id, limit))

    async def counts(self) -> dict[str, int]:
        return await self._read(ops.counts)


@asynccontextmanager
async def open_sqlite_store(
    path: Path, *, max_batch: int = 512, inline_limit_s: float = 0.001
) -> AsyncIterator[SqliteTurnStore]:
    """The store at *path* (created if needed), its committer running until the block ends."""
    store = SqliteTurnStore(path, max_batch=max_batch, inline_limit_s=inline_limit_s)
    # Errors (the file's, the block's) are raised again below, outside the task group, so
    # callers see them as themselves rather than wrapped in an exception group.
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        try:
            await tg.start(store.run)
        except Exception as exc:
            failed = exc
        else:
            try:
                yield store
            except Exception as exc:
                failed = exc
            finally:
                with anyio.CancelScope(shield=True):
                    await store.aclose()
    if failed is not None:
        raise failed


def _check_lease(lease_ms: int) -> None:
    if lease_ms < 0:
        raise ValueError(f"lease_ms must not be negative, got {lease_ms}")
