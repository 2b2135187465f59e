"""The PostgreSQL engine's connections: their session timeouts, the renewal connection, and
read transactions that end with their read.

Design notes
------------
* **Timeouts follow the lease** (`Timeouts.for_lease`, the daemon's ``store.lease_ms``). Every
  connection runs with ``lock_timeout`` and ``idle_in_transaction_session_timeout`` set when it
  connects (startup parameters: no round trip). The lease is the store's *lease_ms* when given;
  else it is learnt from the leases the daemon claims and renews with (`SessionSettings.learn`:
  30 s until its first claim round, right after it starts), and each connection takes the new
  values (``SET``) before its next use:

  - the writer: ``lock_timeout`` lease/4, so that a batch blocked by another daemon's rows gives
    up and runs again (`batches`: a lock timeout is the batch's error, never an op's) instead of
    queueing the daemon's writes behind it; ``idle_in_transaction_session_timeout`` lease/2, so
    that a daemon paused inside a transaction (``SIGSTOP``, a starved event loop) loses its
    connection, and with it its row locks, well before its leases run out and the others take
    its sessions over (`fleet_ops.claim_homes` skips locked rows); ``statement_timeout`` one
    lease (at least 1 s): a statement running longer holds its rows past a lease;
  - the readers: the same lock and idle timeouts; no ``statement_timeout`` (a read locks no
    row, and ``hunter ledger export`` reads whole ledgers);
  - the renewal connection: ``lock_timeout`` and ``statement_timeout`` lease/4 (the statement
    timeout bounds a statement that waits for several rows in turn). A renewal renews the rows
    nobody holds at once, then waits for the others a quarter lease at most
    (`operations.renew_held`): whoever holds one is a batch that gives up after a quarter
    lease too, or a paused daemon whose connection the server cuts after half a lease. Rounds
    start a third of a lease after the last one ended, so a row held for half a lease at most
    cannot make two rounds in a row miss it, and a lease cannot run out over it;
  - the ``LISTEN`` connection: the lock and idle timeouts (it never opens a transaction).

  The floors keep a tiny lease from making every wait an error.
* **Renewal never waits behind writes.** Lease renewals of turn claims and session homes, and
  the daemon's heartbeat, run on a connection of their own (`RenewalConnection`), one
  statement at a time outside any transaction, not through the committer: a slow or blocked
  batch cannot delay them. A renewal skips the rows another transaction has locked and waits
  for them at most ``lock_timeout`` (`operations.renew`, `fleet_ops.renew_homes`). A lost
  connection is reconnected with backoff (50 ms doubling to 2 s) and the statement sent again
  (a renewal is idempotent), as a batch waits through an outage.
* **Reads end their transaction.** `read_only` sends ``BEGIN``/``COMMIT`` itself instead of
  using asyncpg's ``Connection.transaction()``: a read cancelled while its statement ran (a
  caller's timeout) used to leave the reader inside its transaction, with asyncpg's own record
  of it cleared, so every later read on that connection failed with "cannot use
  Connection.transaction() in a manually started transaction" (a keyed ``turn.submit``'s
  look-up answered an internal error). A read that does not end with ``COMMIT`` is rolled back
  (shielded, bounded), or its connection closed, before the connection is used again.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import anyio
import asyncpg

from supervisor.errors import IntakeClosedError
from supervisor.logging import get_logger
from supervisor.store.postgres.batches import connection_lost

__all__ = [
    "RenewalConnection",
    "Role",
    "SessionSettings",
    "Timeouts",
    "end_transaction",
    "read_only",
]

T = TypeVar("T")

_log = get_logger("supervisor.store")

#: Which connection of the store a session's settings are for.
Role = Literal["writer", "reader", "renewal", "listener"]

#: How long a rollback of an abandoned read may take before its connection is closed instead.
_ROLLBACK_S: Final = 2.0
#: The lease assumed until one is known (``store.lease_ms``'s default).
DEFAULT_LEASE_MS: Final = 30_000
#: Leases shorter than this (a test's lease of a few milliseconds) teach nothing: the shortest
#: ``store.lease_ms`` a daemon accepts.
_SHORTEST_LEASE_MS: Final = 300


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The session timeouts of the store's connections, in milliseconds (0: none)."""

    lock_ms: int
    idle_ms: int
    statement_ms: int
    renew_lock_ms: int
    renew_statement_ms: int

    @classmethod
    def for_lease(cls, lease_ms: int) -> Timeouts:
        """The timeouts for a fleet whose leases last *lease_ms* (see the module docstring)."""
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        return cls(
            lock_ms=max(50, lease_ms // 4),
            idle_ms=max(100, lease_ms // 2),
            statement_ms=max(1_000, lease_ms),
            renew_lock_ms=max(50, lease_ms // 4),
            renew_statement_ms=max(200, lease_ms // 4),
        )

    def settings(self, role: Role) -> dict[str, str]:
        """The startup parameters (asyncpg's ``server_settings``) of a connection in *role*."""
        lock, statement = self.lock_ms, 0
        if role == "writer":
            statement = self.statement_ms
        elif role == "renewal":
            lock, statement = self.renew_lock_ms, self.renew_statement_ms
        return {
            "lock_timeout": str(lock),
            "idle_in_transaction_session_timeout": str(self.idle_ms),
            "statement_timeout": str(statement),
            # the batch's row locks go with its BEGIN as literals (`batches.lock_rows_sql`)
            "standard_conforming_strings": "on",
        }


class SessionSettings:
    """The timeouts of the store's connections (`Timeouts`), from a fixed lease or from the one
    the daemon renews with, and which connection still runs with older values."""

    def __init__(self, lease_ms: int | None) -> None:
        self.fixed = lease_ms is not None
        self.lease_ms = DEFAULT_LEASE_MS if lease_ms is None else lease_ms
        self.timeouts = Timeouts.for_lease(self.lease_ms)
        self._generation = 0
        self._applied: weakref.WeakKeyDictionary[asyncpg.Connection, int] = (
            weakref.WeakKeyDictionary()
        )

    def for_connect(self, role: Role) -> dict[str, str]:
        """The startup parameters of a new connection in *role* (`connected` records them)."""
        return self.timeouts.settings(role)

    def connected(self, conn: asyncpg.Connection) -> None:
        self._applied[conn] = self._generation

    def learn(self, lease_ms: int) -> None:
        """The daemon claims or renews with *lease_ms*: the timeouts follow it, unless the
        store was given its lease (or *lease_ms* is a test's few milliseconds)."""
        if self.fixed or lease_ms < _SHORTEST_LEASE_MS or lease_ms == self.lease_ms:
            return
        self.lease_ms = lease_ms
        self.timeouts = Timeouts.for_lease(lease_ms)
        self._generation += 1
        _log.info("store_timeouts", lease_ms=lease_ms, **self.timeouts.settings("writer"))

    async def apply(self, conn: asyncpg.Connection, role: Role) -> None:
        """Give *conn* the present values if it runs with older ones (outside a transaction
        only: a ``SET`` inside one would end with it)."""
        if self._applied.get(conn) == self._generation or conn.is_in_transaction():
            return
        values = self.timeouts.settings(role)
        await conn.execute("; ".join(f"SET {name} = '{value}'" for name, value in values.items()))
        self._applied[conn] = self._generation


async def end_transaction(conn: asyncpg.Connection) -> None:
    """Roll back whatever transaction *conn* may still be in (shielded, at most a few
    seconds); close the connection when that does not work, so it is never used inside a
    transaction nobody owns."""
    with anyio.move_on_after(_ROLLBACK_S, shield=True), contextlib.suppress(Exception):
        if not conn.is_closed():
            await conn.execute("ROLLBACK")
            return
    conn.terminate()  # it failed, or took too long: nobody uses this connection again


async def read_only(
    conn: asyncpg.Connection, fn: Callable[[asyncpg.Connection], Awaitable[T]]
) -> T:
    """*fn* in one read-only ``REPEATABLE READ`` transaction (one snapshot) on *conn*; the
    transaction ends whatever happens (see the module docstring)."""
    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    ended = False
    try:
        result = await fn(conn)
        await conn.execute("COMMIT")
        ended = True
        return result
    finally:
        if not ended:
            await end_transaction(conn)


class RenewalConnection:
    """The connection lease renewals and heartbeats run on, one statement at a time."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        *,
        where: str,
        is_open: Callable[[], bool],
        prepare: Callable[[asyncpg.Connection], Awaitable[None]],
    ) -> None:
        self._connect = connect
        self._prepare = prepare
        self._where = where
        self._is_open = is_open
        self._conn: asyncpg.Connection | None = None
        self._lock = anyio.Lock()
        #: the last error that cost the connection ("" while none did)
        self.last_error = ""

    async def start(self) -> None:
        self._conn = await self._connect()

    async def run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """*fn* on the renewal connection, outside any transaction (each statement commits
        on its own); again on a new connection after the connection was lost."""
        async with self._lock:
            delay = 0.05
            while True:
                conn = await self._connected()
                try:
                    await self._prepare(conn)
                    return await fn(conn)
                except Exception as exc:
                    if not connection_lost(exc, conn):
                        if conn.is_in_transaction():
                            await end_transaction(conn)
                        raise
                    self._lost(conn, exc)
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _connected(self) -> asyncpg.Connection:
        delay = 0.05
        while self._conn is None or self._conn.is_closed():
            if not self._is_open():
                raise IntakeClosedError(f"turn store {self._where} is closed")
            try:
                self._conn = await self._connect()
            except Exception as exc:  # still down: wait and try again
                self._lost(None, exc)
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)
        return self._conn

    def _lost(self, conn: asyncpg.Connection | None, exc: BaseException) -> None:
        if conn is not None:
            conn.terminate()
            self._conn = None
        error = f"{type(exc).__name__}: {exc}"
        if error != self.last_error:
            _log.warning("store_renewal_connection_lost", store=self._where, error=error)
        self.last_error = error

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            with anyio.fail_after(5):
                await conn.close()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            conn.terminate()
