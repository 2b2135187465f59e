"""How the PostgreSQL engine opens a connection: the DSN, the session settings of the
connection's role (`connections.SessionSettings`), and the count of round trips.

Apart from the connections' users (the writer, the readers, the renewal and ``LISTEN``
connections) because each of them opens and reopens its own and they must all open alike.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import asyncpg

from supervisor.store.postgres.connections import Role, SessionSettings

__all__ = ["Connector", "close_quietly", "describe_dsn"]


def describe_dsn(dsn: str) -> str:
    """Which server, database and user a DSN names, for messages (never the password)."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    host = parts.hostname or (query.get("host") or ["(default host)"])[0]
    port = parts.port or (query.get("port") or ["5432"])[0]
    database = parts.path.lstrip("/") or "(default database)"
    user = parts.username or (query.get("user") or ["(default user)"])[0]
    return f"postgresql database {database} on {host}:{port} as {user}"


class Connector:
    """Opens the store's connections; counts the statements sent on them (`round_trips`)."""

    def __init__(self, dsn: str, settings: SessionSettings, *, timeout_s: float) -> None:
        self._dsn = dsn
        self._settings = settings
        self._timeout_s = timeout_s
        #: statements sent on the counted connections (every one but the ``LISTEN`` one)
        self.round_trips = 0

    async def connect(self, role: Role, *, counted: bool = True) -> asyncpg.Connection:
        """A connection with the session settings of its *role* (`connections.Timeouts`);
        its statements are counted (round trips) unless it is the ``LISTEN`` one."""
        conn = await asyncpg.connect(
            self._dsn,
            timeout=self._timeout_s,
            server_settings=self._settings.for_connect(role),
        )
        self._settings.connected(conn)
        if counted:
            conn.add_query_logger(self._count_round_trip)
        return conn

    def _count_round_trip(self, _query: object) -> None:
        self.round_trips += 1


async def close_quietly(conn: asyncpg.Connection | None) -> None:
    """Close *conn* (within 5 s); one that cannot close cleanly is terminated."""
    if conn is None:
        return
    try:
        await conn.close(timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        conn.terminate()
