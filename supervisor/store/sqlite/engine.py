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
* **Group commit.** Callers put a `writer.SqliteOp` on the committer's stream and wait on
  its `anyio.Event` (`supervisor.store.committer`, shared with PostgreSQL); the committer takes
  everything queued (up to ``max_batch``) and the `writer.Writer` runs it in one transaction
  (one fsync), on the loop or on its commit thread (`writer`: adaptive); while it commits, the
  next batch gathers in the stream. A caller cancelled while its op is still queued marks it
  abandoned and the committer skips it; once the op is in a batch, the caller's cancellation
  only means it does not read the result (the write is all or nothing, as ever).
* The SQL, its checks (fencing, `check_move`) and the hot path's shortcuts are in `operations`
  and `batches`; the tables, the version check and the connections in `schema`; the grouping
  plan and the fencing rules are shared with PostgreSQL (`supervisor.store.grouping`,
  `supervisor.store.fencing`), and so are the argument checks (`supervisor.store.requests`).
  What is left here is the facade: each `TurnStore` method queues or reads its operation.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread

import supervisor.store.sqlite.operations as ops
from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import IntakeClosedError
from supervisor.store.committer import Committer
from supervisor.store.fencing import check_ending
from supervisor.store.grouping import NEW_TURN, Accept, Finish
from supervisor.store.lifetime import running
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
from supervisor.store.queued import PendingOp
from supervisor.store.requests import check_lease, turn_filter
from supervisor.store.sealing import LineSeal, as_seal
from supervisor.store.sqlite.schema import open_connections
from supervisor.store.sqlite.writer import SqliteOp, Writer

__all__ = ["SqliteTurnStore", "open_sqlite_store"]

T = TypeVar("T")


class SqliteTurnStore:
    """`TurnStore` on one SQLite file (see the module docstring for its lifetime).

    Construct it inside the event loop (it makes anyio primitives); it does no I/O until `run`.
    """

    def __init__(self, path: Path, *, max_batch: int = 512, inline_limit_s: float = 0.001) -> None:
        self.path = path
        self._writer = Writer(str(path), inline_limit_s=inline_limit_s)
        self._committer = Committer(
            self._writer, where=str(path), opener="open_sqlite_store", max_batch=max_batch
        )
        self._submit = self._committer.submit
        self._check_open = self._committer.check_open
        self._reader: sqlite3.Connection | None = None
        # Own thread token: reads never queue behind a commit's fsync.
        self._read_limiter = anyio.CapacityLimiter(1)

    # -- lifetime -------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the file, report started, then commit batches until `aclose` or cancellation."""
        committer = self._committer
        committer.begin()
        try:
            self._writer.conn, self._reader = await anyio.to_thread.run_sync(
                open_connections, self.path, limiter=self._writer.limiter
            )
        except BaseException:
            committer.shut()
            raise
        committer.opened()
        try:
            task_status.started()
            await committer.run()
        finally:
            committer.stop()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._writer.close, limiter=self._writer.limiter)
                await anyio.to_thread.run_sync(self._close_reader, limiter=self._read_limiter)
            committer.shut()

    async def aclose(self) -> None:
        """Commit what is queued, close the file; later calls raise `IntakeClosedError`."""
        await self._committer.aclose()

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def statistics(self) -> StoreStatistics:
        committer = self._committer
        return StoreStatistics(
            engine="sqlite",
            commits=committer.commits,
            operations=committer.operations,
            largest_batch=committer.largest,
            stale_writes_refused=committer.stale,
        )

    # -- writes and reads -----------------------------------------------------------------

    async def _write(
        self, fn: Callable[[sqlite3.Connection], T], *, finish_lines: LineSeal | None = None
    ) -> T:
        op = SqliteOp(fn, lines=finish_lines)
        self._submit(op)
        return await PendingOp(op).result()

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
        check_lease(lease_ms)
        op = SqliteOp(
            lambda c: ops.accept(c, new, claim_for, lease_ms),
            accept=None if new.idempotency_key is not None else Accept(new, claim_for, lease_ms),
            touches=NEW_TURN,
        )
        self._submit(op)
        return PendingOp(op)

    async def find_turn(self, session_id: str, idempotency_key: str) -> TurnRecord | None:
        return await self._read(lambda c: ops.find_turn(c, session_id, idempotency_key))

    async def claim(
        self, owner: str, *, limit: int, lease_ms: int, only: ClaimFilter | None = None
    ) -> list[Claim]:
        check_lease(lease_ms)
        if limit <= 0:
            return []
        return await self._write(lambda c: ops.claim_turns(c, owner, limit, lease_ms, only))

    async def renew(self, claims: Sequence[Claim], *, lease_ms: int) -> list[Claim]:
        check_lease(lease_ms)
        if not claims:
            return []
        held = tuple(claims)
        return await self._write(lambda c: ops.renew(c, held, lease_ms))

    async def release(self, claim: Claim) -> None:
        """Give the turn up; a claim already lost is left alone (nothing to give up)."""
        await self._write(lambda c: ops.release(c, claim))

    async def recover(self, owner: str, *, lease_ms: int) -> list[Claim]:
        check_lease(lease_ms)
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
        op = SqliteOp(
            lambda c: ops.start_attempt(c, claim, attempt), on_commit, touches=claim.turn_id
        )
        self._submit(op)
        return PendingOp(op)

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
        op = SqliteOp(
            lambda c: ops.record_attempt(c, claim, attempt, next_attempt_us, started),
            touches=claim.turn_id,
        )
        self._submit(op)
        return PendingOp(op)

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
        op = SqliteOp(
            lambda c: ops.finish(c, claim, ending, records, seal=seal, started=started),
            stage="commit",
            finish=Finish(claim, ending, records, seal, started),
        )
        self._submit(op)
        return PendingOp(op)

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
        where = turn_filter(
            session_id=session_id,
            states=states,
            package_id=package_id,
            accepted_since_us=accepted_since_us,
            accepted_until_us=accepted_until_us,
            limit=limit,
        )
        return await self._read(lambda c: ops.list_turns(c, where, after_turn_id, limit))

    async def counts(self) -> dict[str, int]:
        return await self._read(ops.counts)


def open_sqlite_store(
    path: Path, *, max_batch: int = 512, inline_limit_s: float = 0.001
) -> AbstractAsyncContextManager[SqliteTurnStore]:
    """The store at *path* (created if needed), its committer running until the block ends."""
    return running(SqliteTurnStore(path, max_batch=max_batch, inline_limit_s=inline_limit_s))
