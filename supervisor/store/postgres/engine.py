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
* **One writer connection, group commit.** Callers put an `Op` on the committer's stream
  (`supervisor.store.committer`, shared with SQLite) and wait on its `anyio.Event`; the
  committer takes everything queued (up to ``max_batch``) and the `writer.Writer` runs it in
  one transaction on the one writer connection, in the order issued. So the writes of one
  daemon commit in order (`start_attempt_soon` relies on it), and a batch costs one commit
  (one WAL flush) however many turns it carries. Ops run back to back first; when one fails,
  the transaction is rolled back and the batch runs again with a SAVEPOINT per op, so the
  failing op rolls back alone and raises to its own caller only.
* **Other daemons** write the same rows through their own committers. Fenced writes lock the
  turn's row, claims skip locked rows; every batch locks its rows in one order (sessions by
  id, then turns by id: `batches`), so no two daemons' batches wait for each other in a cycle.
  A lock timeout, a statement timeout, or a deadlock or serialization failure makes the writer
  run the whole batch again (`writer`).
* **Renewals have a connection of their own** (`connections.RenewalConnection`): lease
  renewals of turn claims and session homes and the heartbeat never queue behind the
  committer's batches. Every connection runs with lock and idle-in-transaction timeouts below
  the lease (`connections.Timeouts`, from *lease_ms*), so a paused daemon's locks go before
  its leases lapse.
* **Reads** use a few other connections (`readers`), each read in one read-only snapshot, so
  they never wait behind a commit.
* A caller cancelled while its op is still queued marks it abandoned and the committer skips
  it; once the op is in a batch the write happens or not as a whole, as ever.
* **Outages.** A lost connection never fails a write (`writer`: reconnects, the lost-commit
  check); reads retry on a new connection for about 10 s, then raise `StoreUnavailableError`.
  `statistics` says whether the server is reachable.
* The SQL and its checks are in `operations` (the fleet's in `fleet_ops`); the tables and
  versions in `schema`; the queued ops and one batch's transaction in `batches`; the
  ``LISTEN`` connection in `listener`. What is left here is the facade: each `TurnStore` and
  `FleetStore` method queues, reads or renews its operation, and the store's lifetime that
  starts and closes the pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import anyio
import anyio.abc
import asyncpg

import supervisor.store.postgres.operations as ops
from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.store.fencing import check_ending
from supervisor.store.fleet import DaemonRecord, LedgerHead, SessionHome
from supervisor.store.grouping import NEW_TURN, Accept, Finish
from supervisor.store.lifetime import running
from supervisor.store.postgres.batches import Op, PendingOp, RowLocks
from supervisor.store.postgres.channels import StoreChannels
from supervisor.store.postgres.connections import SessionSettings, Timeouts
from supervisor.store.postgres.connector import describe_dsn
from supervisor.store.postgres.fleet_front import PostgresFleet
from supervisor.store.postgres.schema import migrate
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
from supervisor.store.requests import check_lease, turn_filter
from supervisor.store.sealing import LineSeal, as_seal

__all__ = ["PostgresTurnStore", "describe_dsn", "migrate_database", "open_postgres_store"]

T = TypeVar("T")


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
        self._settings = settings = SessionSettings(lease_ms)
        self.where = where = describe_dsn(dsn)
        self._migrate = migrate
        self._channels = channels = StoreChannels(
            dsn,
            settings,
            where=where,
            max_batch=max_batch,
            read_connections=read_connections,
            connect_timeout_s=connect_timeout_s,
        )
        self._committer = channels.committer
        self._writer = channels.writer
        self._listener = channels.listener
        self._write = channels.write
        self._read = channels.read
        self._renew = channels.renew
        self._enqueue = channels.enqueue
        self._writing = channels.writing
        self._fleet = PostgresFleet(channels)

    # -- lifetime -------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, check (or migrate) the schema, report started, then commit batches until
        `aclose` or cancellation."""
        committer = self._committer
        committer.begin()
        try:
            await self._channels.start(migrate=self._migrate)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._channels.close()
            self._shut()
            raise
        committer.opened()
        try:
            task_status.started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._listener.keep, name="store-listener")
                await committer.run()
                tg.cancel_scope.cancel()
        finally:
            committer.stop()
            with anyio.CancelScope(shield=True):
                await self._channels.close()
            self._shut()

    async def aclose(self) -> None:
        """Commit what is queued, close the connections; later calls raise
        `IntakeClosedError`."""
        if self._committer.state in {"new", "closed"}:
            self._channels.readers.shut()
        await self._committer.aclose()

    def _shut(self) -> None:
        self._channels.readers.shut()
        self._committer.shut()

    @property
    def timeouts(self) -> Timeouts:
        """The connections' timeouts now (`connections.Timeouts`)."""
        return self._settings.timeouts

    def statistics(self) -> StoreStatistics:
        committer, outages = self._committer, self._writer.outages
        return StoreStatistics(
            engine="postgres",
            commits=committer.commits,
            operations=committer.operations,
            largest_batch=committer.largest,
            stale_writes_refused=committer.stale,
            available=outages.down_since is None,
            outages=outages.count,
            last_error=outages.last_error,
            round_trips=self._channels.connector.round_trips,
        )

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
        check_lease(lease_ms)
        op = Op(
            lambda c: ops.accept(c, new, claim_for, lease_ms),
            accept=None if new.idempotency_key is not None else Accept(new, claim_for, lease_ms),
            touches=NEW_TURN,
            locks=RowLocks(sessions=(new.session_id,)),
        )
        self._enqueue(op)
        return PendingOp(op)

    async def find_turn(self, session_id: str, idempotency_key: str) -> TurnRecord | None:
        return await self._read(lambda c: ops.find_turn(c, session_id, idempotency_key))

    async def claim(
        self, owner: str, *, limit: int, lease_ms: int, only: ClaimFilter | None = None
    ) -> list[Claim]:
        check_lease(lease_ms)
        if limit <= 0:
            return []
        self._settings.learn(lease_ms)
        return await self._write(lambda c: ops.claim_turns(c, owner, limit, lease_ms, only))

    async def renew(self, claims: Sequence[Claim], *, lease_ms: int) -> list[Claim]:
        """On the renewal connection, never behind a batch; a claim whose row another
        transaction holds past the renewal's lock timeout comes back not renewed (still held:
        the next round renews it; `operations.renew`), and so does one a write of this store
        still in flight ends or releases."""
        check_lease(lease_ms)
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

    async def release(self, claim: Claim) -> None:
        """Give the turn up; a claim already lost is left alone (nothing to give up)."""
        await self._write(lambda c: ops.release(c, claim), locks=RowLocks(turns=(claim.turn_id,)))

    async def recover(self, owner: str, *, lease_ms: int) -> list[Claim]:
        check_lease(lease_ms)
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
        op = Op(lambda c: ops.start_attempt(c, claim, attempt), on_commit, touches=claim.turn_id)
        self._enqueue(op)
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
        op = Op(
            lambda c: ops.record_attempt(c, claim, attempt, next_attempt_us, started),
            touches=claim.turn_id,
        )
        self._enqueue(op)
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
        op = Op(
            lambda c: ops.finish(c, claim, ending, records, seal=seal, started=started),
            finish=Finish(claim, ending, records, seal, started),
        )
        self._enqueue(op)
        return PendingOp(op)

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

    # -- the fleet (`supervisor.store.fleet.FleetStore`: `fleet_front`) -------------------

    async def home_session(self, session_id: str, owner: str, *, lease_ms: int) -> SessionHome:
        return await self._fleet.home_session(session_id, owner, lease_ms=lease_ms)

    async def claim_homes(
        self,
        owner: str,
        *,
        lease_ms: int,
        limit: int,
        packages: frozenset[str] | None,
        serves: frozenset[str] | None = None,
    ) -> list[SessionHome]:
        return await self._fleet.claim_homes(
            owner, lease_ms=lease_ms, limit=limit, packages=packages, serves=serves
        )

    async def renew_homes(
        self, homes: Sequence[SessionHome], *, lease_ms: int
    ) -> list[SessionHome]:
        return await self._fleet.renew_homes(homes, lease_ms=lease_ms)

    async def release_home(self, home: SessionHome, *, reserve_ms: int | None = None) -> None:
        await self._fleet.release_home(home, reserve_ms=reserve_ms)

    async def session_homes(self, session_ids: Sequence[str] | None = None) -> dict[str, str]:
        return await self._fleet.session_homes(session_ids)

    async def waiting_turns(self, owner: str, session_ids: Sequence[str]) -> list[tuple[str, str]]:
        return await self._fleet.waiting_turns(owner, session_ids)

    async def anchor_ledger_lines(self, owner: str, lines: Sequence[SealedLine]) -> None:
        await self._fleet.anchor_ledger_lines(owner, lines)

    async def ledger_heads(self, ledger_ids: Sequence[str] | None = None) -> list[LedgerHead]:
        return await self._fleet.ledger_heads(ledger_ids)

    async def heartbeat(
        self, owner: str, *, host: str, pid: int, started_us: int, info: Mapping[str, object]
    ) -> None:
        await self._fleet.heartbeat(owner, host=host, pid=pid, started_us=started_us, info=info)

    async def daemons(self) -> list[DaemonRecord]:
        return await self._fleet.daemons()

    async def forget_daemon(self, owner: str) -> None:
        await self._fleet.forget_daemon(owner)

    async def request_resolution(
        self,
        turn_id: int,
        resolution: Resolution,
        *,
        decided_by: Mapping[str, object] | None = None,
    ) -> TurnRecord:
        return await self._fleet.request_resolution(turn_id, resolution, decided_by=decided_by)

    async def pending_resolutions(
        self, session_ids: Sequence[str]
    ) -> list[tuple[TurnRecord, Resolution, Mapping[str, object] | None]]:
        return await self._fleet.pending_resolutions(session_ids)

    async def wait_for_work(self, timeout_s: float) -> bool:
        """Sleep until a ``NOTIFY`` on the work channel or *timeout_s* (polling is the
        fallback: a notification lost with a dropped listener connection strands nothing)."""
        return await self._listener.wait(timeout_s)


def open_postgres_store(
    dsn: str,
    *,
    migrate: bool = True,
    max_batch: int = 256,
    read_connections: int = 2,
    lease_ms: int | None = None,
) -> AbstractAsyncContextManager[PostgresTurnStore]:
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
    return running(store)


async def migrate_database(dsn: str, *, timeout_s: float = 10.0) -> tuple[int | None, int]:
    """Apply the schema migrations to *dsn* (what ``hunter store migrate`` will run):
    ``(version found, version now)``."""
    conn = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        return await migrate(conn, describe_dsn(dsn))
    finally:
        await conn.close()
