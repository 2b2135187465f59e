"""The PostgreSQL engine of the `TurnStore` seam: several daemons (hosts) on one database.

Lifetime
--------
As the SQLite engine's: a context manager that runs the committer in its own task group::

    async with open_postgres_store("postgresql://hunter@db/hunter") as store:
        ...

or ``await task_group.start(store.run)`` (connects, checks or migrates the schema, then
reports started) and ``await store.aclose()`` (lets the queued writes commit, then closes the
connections; every later call raises `IntakeClosedError`). Cancelling `run` fails the writes
still queued with `IntakeClosedError`; a batch already sent finishes first (it is shielded).
asyncpg runs on asyncio only, so the store does too.

Design notes
------------
* **A method returns only after its transaction committed** (the server's ``fsync`` and
  ``synchronous_commit`` decide what that survives; keep both on).
* **One writer connection, group commit.** Callers put an `Op` on a memory object stream and
  wait on its `anyio.Event`; one committer task takes everything queued (up to ``max_batch``) and
  runs it in one transaction on the one writer connection, in the order issued. So the writes
  of one daemon commit in order (`start_attempt_soon` relies on it), and a batch costs one
  commit (one WAL flush) however many turns it carries. Ops run back to back first; when one
  fails, the transaction is rolled back and the batch runs again with a SAVEPOINT per op, so
  the failing op rolls back alone and raises to its own caller only.
* **Other daemons** write the same rows through their own committers. Fenced writes lock the
  turn's row, claims skip locked rows; every batch locks its rows in one order (sessions by
  id, then turns by id: `batches`), so no two daemons' batches wait for each other in a cycle.
  A lock timeout, a statement timeout, or a deadlock or serialization failure (PostgreSQL aborts
  one transaction) makes this committer run the whole batch again: a lock or statement
  timeout for up to two leases, the others a few times, before failing its ops.
* **Renewals have a connection of their own** (`connections.RenewalConnection`): lease
  renewals of turn claims and session homes and the heartbeat never queue behind the
  committer's batches. Every connection runs with lock and idle-in-transaction timeouts below
  the lease (`connections.Timeouts`, from *lease_ms*), so a paused daemon's locks go before
  its leases lapse.
* **Reads** use a few other connections (idle ones wait in a memory object stream), each
  read in one read-only ``REPEATABLE READ`` transaction (one snapshot), so they never wait
  behind a commit; a read that does not end (cancelled, failed) is rolled back before its
  connection serves another (`connections.read_only`).
* A caller cancelled while its op is still queued marks it abandoned and the committer skips
  it; once the op is in a batch the write happens or not as a whole, as ever.
* **Outages.** A lost connection never fails a write: the committer reconnects with backoff
  and runs the batch again unless its transaction is found committed (`batches`). Reads retry
  on a new connection for about 10 s, then raise `StoreUnavailableError`. `statistics` says
  whether the server is reachable.
* The SQL and its checks are in `operations` (the fleet's in `fleet_ops`); the tables and
  versions in `schema`; the queued ops and one batch's transaction in `batches`.
* About 950 lines (the class about 750), past the usual 600/400: the `TurnStore` and
  `FleetStore` methods are one-line delegations kept in one class (one connection set, one
  committer); the committer and the connection handling around it (reconnects, the
  lost-commit check, the renewal connection, the timeouts) share its state. What does not
  need it is in `connections` and `batches`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import anyio.lowlevel
import asyncpg

import supervisor.store.postgres.operations as ops
from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import IntakeClosedError, StaleClaimError, StoreUnavailableError
from supervisor.logging import get_logger
from supervisor.store.fencing import check_ending
from supervisor.store.fleet import DaemonRecord, LedgerHead, SessionHome
from supervisor.store.grouping import NEW_TURN, Accept, Finish
from supervisor.store.postgres import fleet_ops
from supervisor.store.postgres.batches import (
    BatchAttempt,
    Op,
    PendingOp,
    RowLocks,
    connection_lost,
    rerun_error,
    try_batch,
)
from supervisor.store.postgres.connections import (
    RenewalConnection,
    Role,
    SessionSettings,
    Timeouts,
    end_transaction,
    read_only,
)
from supervisor.store.postgres.many import run_grouped
from supervisor.store.postgres.schema import check_schema, migrate
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
from supervisor.store.queued import withdraw_batch
from supervisor.store.sealing import LineSeal, as_seal, sessions_of
from supervisor.store.turn_filter import TurnFilter

__all__ = ["PostgresTurnStore", "describe_dsn", "migrate_database", "open_postgres_store"]

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")

_log = get_logger("supervisor.store")
#: how often a batch aborted by a deadlock or serialization failure runs again
_BATCH_RETRIES = 5
#: how often a read is tried, on a new connection after the first one was lost
_READ_TRIES = 3


def describe_dsn(dsn: str) -> str:
    """Which server, database and user a DSN names, for messages (never the password)."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    host = parts.hostname or (query.get("host") or ["(default host)"])[0]
    port = parts.port or (query.get("port") or ["5432"])[0]
    database = parts.path.lstrip("/") or "(default database)"
    user = parts.username or (query.get("user") or ["(default user)"])[0]
    return f"postgresql database {database} on {host}:{port} as {user}"


class PostgresTurnStore:
    """`TurnStore` on one PostgreSQL database, shared by several daemons.

    *migrate*: create or upgrade the schema when opening (the tests, an embedded setup); when
    False (a daemon in production) a database not yet migrated, or migrated by a newer hunter,
    raises `SchemaVersionError` from `run`, saying what to do.
    *lease_ms*: the fleet's lease (``store.lease_ms``), from which the connections' lock, idle
    and statement timeouts follow (`connections.Timeouts.for_lease`); None: the lease the
    daemon claims and renews with (`connections.SessionSettings.learn`).
    Construct it inside the event loop; it does no I/O until `run`.
    """

    def __init__(
        self,
        dsn: str,
        *,
        migrate: bool = True,
        max_batch: int = 256,
        read_connections: int = 2,
        connect_timeout_s: float = 10.0,
        lease_ms: int | None = None,
    ) -> None:
        self._dsn = dsn
        self._settings = SessionSettings(lease_ms)
        self.where = describe_dsn(dsn)
        self._migrate = migrate
        self._max_batch = max_batch
        self._read_connections = read_connections
        self._connect_timeout_s = connect_timeout_s
        self._send, self._receive = anyio.create_memory_object_stream[Op[object]](math.inf)
        self._writer: asyncpg.Connection | None = None
        #: idle read connections (a connection runs one query at a time: taken, used, put back)
        self._readers: list[asyncpg.Connection] = []
        self._idle_send, self._idle_receive = anyio.create_memory_object_stream[asyncpg.Connection](
            math.inf
        )
        self._state = "new"  # new -> starting -> open -> closing -> closed
        self._stopped = anyio.Event()
        self._commits = 0
        self._operations = 0
        self._largest = 0
        self._stale = 0
        self._retried_batches = 0
        self._work = anyio.Event()
        self._listener: asyncpg.Connection | None = None
        #: the writer's connection is down since this monotonic time (None: it is up)
        self._down_since: float | None = None
        self._outages = 0
        self._last_error = ""
        self._round_trips = 0
        #: turn -> this store's writes of it queued or in a batch (`renew` reads it)
        self._writing: Counter[int] = Counter()
        self._renewals = RenewalConnection(
            lambda: self._connect("renewal"),
            where=self.where,
            is_open=lambda: self._state in {"starting", "open", "closing"},
            prepare=lambda conn: self._settings.apply(conn, "renewal"),
        )

    # -- lifetime -------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, check (or migrate) the schema, report started, then commit batches until
        `aclose` or cancellation."""
        if self._state != "new":
            raise RuntimeError(f"turn store {self.where}: run() was already called")
        self._state = "starting"
        try:
            self._writer = await self._connect("writer")
            if self._migrate:
                # a migration may wait for another's (its advisory lock) and take long
                await self._writer.execute("SET lock_timeout = 0; SET statement_timeout = 0")
                await migrate(self._writer, self.where)
                await self._writer.execute("RESET lock_timeout; RESET statement_timeout")
            else:
                await check_schema(self._writer, self.where)
            for _ in range(self._read_connections):
                reader = await self._connect("reader")
                self._readers.append(reader)
                self._idle_send.send_nowait(reader)
            await self._renewals.start()
            self._listener = await self._connect("listener", counted=False)
            await self._listener.add_listener(ops.WORK_CHANNEL, self._notified)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._close_connections()
            self._shut()
            raise
        if self._state == "starting":
            self._state = "open"
        try:
            task_status.started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keep_listener, name="store-listener")
                await self._commit_loop()
                tg.cancel_scope.cancel()
        finally:
            self._state = "closed"
            self._send.close()
            for op in self._drain():
                op.fail(IntakeClosedError(f"turn store {self.where} stopped"))
                op.complete()
            with anyio.CancelScope(shield=True):
                await self._close_connections()
            self._shut()

    async def aclose(self) -> None:
        """Commit what is queued, close the connections; later calls raise
        `IntakeClosedError`."""
        if self._state in {"new", "closed"}:
            self._shut()
            return
        self._state = "closing"
        self._send.close()
        await self._stopped.wait()

    async def _close_connections(self) -> None:
        conns = [self._writer, *self._readers, self._listener]
        self._listener = None
        self._writer = None
        self._readers = []
        self._idle_send.close()
        for conn in conns:
            if conn is None:
                continue
            try:
                await conn.close(timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                conn.terminate()
        await self._renewals.aclose()

    async def _connect(self, role: Role, *, counted: bool = True) -> asyncpg.Connection:
        """A connection with the session settings of its *role* (`connections.Timeouts`);
        its statements are counted (round trips) unless it is the ``LISTEN`` one."""
        conn = await asyncpg.connect(
            self._dsn,
            timeout=self._connect_timeout_s,
            server_settings=self._settings.for_connect(role),
        )
        self._settings.connected(conn)
        if counted:
            conn.add_query_logger(self._count_round_trip)
        return conn

    @property
    def timeouts(self) -> Timeouts:
        """The connections' timeouts now (`connections.Timeouts`)."""
        return self._settings.timeouts

    def _count_round_trip(self, _query: object) -> None:
        self._round_trips += 1

    def _shut(self) -> None:
        self._state = "closed"
        self._send.close()
        self._receive.close()
        self._idle_send.close()
        self._idle_receive.close()
        self._stopped.set()

    def _drain(self) -> list[Op[object]]:
        left: list[Op[object]] = []
        while True:
            try:
                left.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return left

    def _check_open(self) -> None:
        if self._state == "open":
            return
        if self._state in {"new", "starting"}:
            raise RuntimeError(
                f"turn store {self.where} is not running: start its run() in a task group or"
                " use open_postgres_store()"
            )
        raise IntakeClosedError(f"turn store {self.where} is closed")

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            engine="postgres",
            commits=self._commits,
            operations=self._operations,
            largest_batch=self._largest,
            stale_writes_refused=self._stale,
            available=self._down_since is None,
            outages=self._outages,
            last_error=self._last_error,
            round_trips=self._round_trips,
        )

    # -- the committer --------------------------------------------------------------------

    def _enqueue(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T]],
        on_commit: Callable[[T], None] | None = None,
        *,
        accept: Accept | None = None,
        finish: Finish | None = None,
        touches: int | None = None,
        lines: LineSeal | None = None,
        locks: RowLocks | None = None,
    ) -> Op[T]:
        self._check_open()
        op = Op(
            fn, on_commit, accept=accept, finish=finish, touches=touches, lines=lines, locks=locks
        )
        try:
            self._send.send_nowait(op)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise IntakeClosedError(f"turn store {self.where} is closed") from None
        self._writing.update(op.locks.turns if op.locks is not None else ())
        return op

    def _landed(self, op: Op[object]) -> None:
        """The committer is done with *op* (or skipped it): its turns are no longer written."""
        for turn_id in op.locks.turns if op.locks is not None else ():
            self._writing[turn_id] -= 1
            if self._writing[turn_id] <= 0:
                del self._writing[turn_id]

    async def _write(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        lines: LineSeal | None = None,
        locks: RowLocks | None = None,
    ) -> T:
        return await PendingOp(self._enqueue(fn, lines=lines, locks=locks)).result()

    async def _commit_loop(self) -> None:
        async for first in self._receive:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            live = [op for op in batch if not op.abandoned]
            for op in batch:
                if op.abandoned:
                    self._landed(op)
            if live:
                with anyio.CancelScope(shield=True):
                    await self._commit(live)

    async def _commit(self, batch: list[Op[object]]) -> None:
        try:
            await self._run_batch(batch)
        except Exception as exc:  # the transaction failed: nothing of the batch was written
            for op in batch:
                op.fail(exc)
        else:
            self._commits += 1
            self._operations += len(batch)
            self._largest = max(self._largest, len(batch))
            self._stale += sum(isinstance(op.error, StaleClaimError) for op in batch)
        finally:
            for op in batch:
                self._landed(op)
                op.complete()
                op.committed()
        await anyio.lowlevel.checkpoint()

    async def _run_batch(self, batch: list[Op[object]]) -> None:
        """Run *batch* in one transaction, each op all-or-nothing; again, whole, after a
        deadlock or serialization failure, a lock or statement timeout, and after a lost
        connection whose transaction did not commit (`batches`: never lost, never applied
        twice)."""
        retries = 0
        began = time.monotonic()
        while True:
            conn = await self._connected_writer()
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
                    self._retried_batches += 1
                    for op in batch:
                        op.reset()
                    await anyio.sleep(0.001 * 2 ** min(retries, 8))
                    continue
                if not connection_lost(exc, conn):
                    withdraw_batch(batch)  # the server refused the batch: nothing committed
                    raise
                self._writer_lost(conn, exc)
                if attempt.xid is not None and await self._committed(attempt.xid):
                    self._writer_up()
                    return  # the COMMIT landed; only its answer was lost
                withdraw_batch(batch)  # it did not: the lines it sealed leave their chains
                for op in batch:
                    op.reset()
                continue
            self._writer_up()
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
            store=self.where,
            error=f"{type(exc).__name__}: {exc}",
            tries=retries,
            waited_s=round(waited_s, 3),
        )
        return waited_s > 2 * self._settings.lease_ms / 1000 and retries >= _BATCH_RETRIES

    async def _connected_writer(self) -> asyncpg.Connection:
        """The writer's connection, reconnecting with backoff (50 ms doubling to 2 s) while
        the server is unreachable; the batch waits (nothing acknowledged is lost meanwhile)."""
        delay = 0.05
        while self._writer is None or self._writer.is_closed():
            if self._state not in {"open", "closing"}:
                raise IntakeClosedError(f"turn store {self.where} is closed")
            try:
                self._writer = await self._connect("writer")
            except Exception as exc:  # still down: wait and try again
                self._writer_lost(None, exc)
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)
        return self._writer

    async def _committed(self, xid: int) -> bool:
        """Whether transaction *xid* (its answer lost with the connection) committed.

        A server that crashed and came back may not know *xid* at all ("transaction ID ... is
        in the future"): its id was handed out, but no commit record of it survived the crash
        (replaying one would have moved the server's next id past it), so it did not commit.
        """
        conn = await self._connected_writer()
        try:
            status = await conn.fetchval("SELECT txid_status($1)", xid)
        except asyncpg.InvalidParameterValueError as exc:
            if "in the future" not in str(exc):
                raise
            return False
        return bool(status == "committed")

    def _writer_lost(self, conn: asyncpg.Connection | None, exc: BaseException) -> None:
        if conn is not None:
            conn.terminate()
            self._writer = None
        self._last_error = f"{type(exc).__name__}: {exc}"
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._outages += 1
            _log.error("store_unavailable", store=self.where, error=self._last_error)

    def _writer_up(self) -> None:
        if self._down_since is not None:
            down_s = time.monotonic() - self._down_since
            self._down_since = None
            _log.warning("store_reconnected", store=self.where, down_s=round(down_s, 3))

    async def _keep_listener(self) -> None:
        """Keep the ``LISTEN`` connection up (reconnecting every second while it is down);
        polling covers the notifications missed meanwhile."""
        while True:
            await anyio.sleep(1.0)
            if self._listener is not None and not self._listener.is_closed():
                continue
            try:
                listener = await self._connect("listener", counted=False)
                await listener.add_listener(ops.WORK_CHANNEL, self._notified)
            except Exception as exc:  # still down
                self._last_error = f"{type(exc).__name__}: {exc}"
                continue
            self._listener = listener
            self._work.set()  # look for what was missed

    async def _read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        self._check_open()
        try:
            conn = await self._idle_receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise IntakeClosedError(f"turn store {self.where} is closed") from None
        try:
            for tries in range(_READ_TRIES):
                try:
                    await self._settings.apply(conn, "reader")
                    return await read_only(conn, fn)
                except Exception as exc:
                    if not connection_lost(exc, conn) or tries == _READ_TRIES - 1:
                        raise
                    conn = await self._reconnect_reader(conn, exc)
            raise AssertionError("unreachable")
        finally:
            if not conn.is_closed() and conn.is_in_transaction():
                await end_transaction(conn)  # never handed on inside a transaction
            # when closing, the connection is being closed instead
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._idle_send.send_nowait(conn)

    async def _reconnect_reader(
        self, old: asyncpg.Connection, exc: BaseException
    ) -> asyncpg.Connection:
        """A new connection in place of a lost reader (reads are retried: they change
        nothing). Gives up with `StoreUnavailableError` after about 10 s."""
        old.terminate()
        delay = 0.05
        deadline = time.monotonic() + 10
        while True:
            try:
                conn = await self._connect("reader")
            except Exception as again:
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(
                        f"turn store {self.where} is unreachable: {again}"
                    ) from exc
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            self._readers = [conn if r is old else r for r in self._readers]
            return conn

    # -- sessions -------------------------------------------------------------------------

    async def open_session(self, new: NewSession) -> SessionRecord:
        return await self._write(lambda c: ops.open_session(c, new))

    async def close_session(self, session_id: str) -> SessionRecord:
        return await self._write(
            lambda c: ops.close_session(c, session_id), locks=RowLocks(sessions=(session_id,))
        )

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
            locks=RowLocks(sessions=(new.session_id,)),
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
        self._settings.learn(lease_ms)
        return await self._write(lambda c: ops.claim_turns(c, owner, limit, lease_ms, only))

    async def renew(self, claims: Sequence[Claim], *, lease_ms: int) -> list[Claim]:
        """On the renewal connection, never behind a batch; a claim whose row another
        transaction holds past the renewal's lock timeout comes back not renewed (still held:
        the next round renews it; `operations.renew`), and so does one a write of this store
        still in flight ends or releases."""
        _check_lease(lease_ms)
        if not claims:
            return []
        self._settings.learn(lease_ms)
        held = tuple(claims)
        writing = {c.turn_id for c in held if c.turn_id in self._writing}
        kept = await self._renew(lambda c: ops.renew(c, held, lease_ms))
        # A claim this store's own write (its ending, its release) gave up while the renewal
        # ran is not "lost": that write's caller learns its outcome, and the next round, with
        # nothing in flight, tells a claim another daemon took. (Through the committer, a
        # renewal was answered only after every write queued before it.)
        writing.update(c.turn_id for c in held if c.turn_id in self._writing)
        found = {c.turn_id: c for c in kept}
        if writing <= found.keys():
            return kept
        return [found.get(c.turn_id, c) for c in held if c.turn_id in found or c.turn_id in writing]

    async def _renew(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        self._check_open()
        return await self._renewals.run(fn)

    async def release(self, claim: Claim) -> None:
        """Give the turn up; a claim already lost is left alone (nothing to give up)."""
        await self._write(lambda c: ops.release(c, claim), locks=RowLocks(turns=(claim.turn_id,)))

    async def recover(self, owner: str, *, lease_ms: int) -> list[Claim]:
        _check_lease(lease_ms)
        return await self._write(lambda c: ops.recover(c, owner, lease_ms))

    # -- fenced writes --------------------------------------------------------------------

    async def start_attempt(self, claim: Claim, attempt: AttemptRecord) -> Claim:
        return await self._write(
            lambda c: ops.start_attempt(c, claim, attempt), locks=RowLocks(turns=(claim.turn_id,))
        )

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
                finish=Finish(claim, ending, records, seal, started),
            )
        )

    # -- ledger lines ---------------------------------------------------------------------

    async def ledger_lines(self, ledger_ids: Sequence[str]) -> list[SealedLine]:
        ids = tuple(ledger_ids)
        return await self._read(lambda c: ops.ledger_lines(c, ids))

    @property
    def keeps_ledgers(self) -> bool:
        """The shared store is the ledger of record: it keeps every line (see `FleetStore`)."""
        return True

    async def trim_ledger_lines(self, synced: Mapping[str, int]) -> int:
        """Nothing is dropped: the lines are the anchored ledgers every daemon rebuilds from."""
        return 0

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
            lambda c: ops.resolve(c, turn_id, resolution, seal, result),
            lines=seal,
            locks=RowLocks(turns=(turn_id,)),
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

    # -- the fleet (`supervisor.store.fleet.FleetStore`) ----------------------------------

    async def home_session(self, session_id: str, owner: str, *, lease_ms: int) -> SessionHome:
        _check_lease(lease_ms)
        return await self._write(
            lambda c: fleet_ops.home_session(c, session_id, owner, lease_ms),
            locks=RowLocks(sessions=(session_id,)),
        )

    async def claim_homes(
        self,
        owner: str,
        *,
        lease_ms: int,
        limit: int,
        packages: frozenset[str] | None,
        serves: frozenset[str] | None = None,
    ) -> list[SessionHome]:
        _check_lease(lease_ms)
        self._settings.learn(lease_ms)  # every claim round of a fleet's daemon
        return await self._write(
            lambda c: fleet_ops.claim_homes(c, owner, lease_ms, limit, packages, serves=serves)
        )

    async def renew_homes(
        self, homes: Sequence[SessionHome], *, lease_ms: int
    ) -> list[SessionHome]:
        held = tuple(homes)
        if not held:
            return []
        self._settings.learn(lease_ms)
        return await self._renew(lambda c: fleet_ops.renew_homes(c, held, lease_ms))

    async def release_home(self, home: SessionHome, *, reserve_ms: int | None = None) -> None:
        if reserve_ms is not None:
            _check_lease(reserve_ms)
        await self._write(
            lambda c: fleet_ops.release_home(c, home, reserve_ms),
            locks=RowLocks(sessions=(home.session_id,)),
        )

    async def session_homes(self, session_ids: Sequence[str] | None = None) -> dict[str, str]:
        ids = None if session_ids is None else tuple(session_ids)
        return await self._read(lambda c: fleet_ops.session_homes(c, ids))

    async def waiting_turns(self, owner: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        ids = tuple(session_ids)
        if not ids:
            return []
        return await self._read(lambda c: fleet_ops.waiting_turns(c, owner, ids))

    async def anchor_ledger_lines(self, owner: str, lines: Sequence[SealedLine]) -> None:
        kept = tuple(lines)
        if kept:
            await self._write(
                lambda c: fleet_ops.anchor_ledger_lines(c, owner, kept),
                locks=RowLocks(sessions=tuple(sessions_of(x.ledger_id for x in kept))),
            )

    async def ledger_heads(self, ledger_ids: Sequence[str] | None = None) -> list[LedgerHead]:
        ids = None if ledger_ids is None else tuple(ledger_ids)
        return await self._read(lambda c: fleet_ops.ledger_heads(c, ids))

    async def heartbeat(
        self, owner: str, *, host: str, pid: int, started_us: int, info: Mapping[str, object]
    ) -> None:
        await self._renew(
            lambda c: fleet_ops.heartbeat(
                c, owner, host=host, pid=pid, started_us=started_us, info=info
            )
        )

    async def daemons(self) -> list[DaemonRecord]:
        return await self._read(fleet_ops.daemons)

    async def forget_daemon(self, owner: str) -> None:
        await self._write(lambda c: fleet_ops.forget_daemon(c, owner))

    async def request_resolution(
        self,
        turn_id: int,
        resolution: Resolution,
        *,
        decided_by: Mapping[str, object] | None = None,
    ) -> TurnRecord:
        return await self._write(
            lambda c: fleet_ops.request_resolution(c, turn_id, resolution, decided_by),
            locks=RowLocks(turns=(turn_id,)),
        )

    async def pending_resolutions(
        self, session_ids: Sequence[str]
    ) -> list[tuple[TurnRecord, Resolution, Mapping[str, object] | None]]:
        ids = tuple(session_ids)
        if not ids:
            return []
        return await self._read(lambda c: fleet_ops.pending_resolutions(c, ids))

    async def wait_for_work(self, timeout_s: float) -> bool:
        """Sleep until a ``NOTIFY`` on the work channel or *timeout_s* (polling is the
        fallback: a notification lost with a dropped listener connection strands nothing)."""
        with anyio.move_on_after(timeout_s):
            await self._work.wait()
            self._work = anyio.Event()
            return True
        return False

    def _notified(self, *_: object) -> None:
        self._work.set()


@asynccontextmanager
async def open_postgres_store(
    dsn: str,
    *,
    migrate: bool = True,
    max_batch: int = 256,
    read_connections: int = 2,
    lease_ms: int | None = None,
) -> AsyncIterator[PostgresTurnStore]:
    """The store on *dsn*, its committer running until the block ends; *lease_ms*: the
    fleet's lease (``store.lease_ms``), which the connections' timeouts follow (None: the
    lease the daemon renews with)."""
    store = PostgresTurnStore(
        dsn,
        migrate=migrate,
        max_batch=max_batch,
        read_connections=read_connections,
        lease_ms=lease_ms,
    )
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


async def migrate_database(dsn: str, *, timeout_s: float = 10.0) -> tuple[int | None, int]:
    """Apply the schema migrations to *dsn* (what ``hunter store migrate`` will run):
    ``(version found, version now)``."""
    conn = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        return await migrate(conn, describe_dsn(dsn))
    finally:
        await conn.close()


def _check_lease(lease_ms: int) -> None:
    if lease_ms < 0:
        raise ValueError(f"lease_ms must not be negative, got {lease_ms}")
