"""The PostgreSQL engine's reads: sessions, turns (with their attempts, read in one more
query) and the listings; and the helpers every PostgreSQL operation shares (the daemon's
clock, rows as tuples for the shared converters of `supervisor.store.rows`).

Apart from `operations` because a read changes nothing and checks nothing: it runs in a
read-only snapshot (`readers`), and the writes call it to answer with what they wrote.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import asyncpg

from sandbox.policy.attempt_record import AttemptRecord
from supervisor.errors import UnknownSessionError, UnknownTurnError
from supervisor.store.postgres.schema import ATTEMPT_COLUMNS, SESSION_COLUMNS, TURN_COLUMNS
from supervisor.store.postgres.turn_query import LIST_TURNS, list_turns_args
from supervisor.store.protocol import SessionRecord, SessionState, TurnPage, TurnRecord
from supervisor.store.rows import attempt_from_row, session_from_row, turn_from_row
from supervisor.store.turn_filter import TurnFilter

__all__ = [
    "attempts_of",
    "counts",
    "find_turn",
    "get_session",
    "get_turn",
    "list_sessions",
    "list_turns",
    "now_us",
    "row_values",
    "turns_from_rows",
]

Conn = asyncpg.Connection


def now_us() -> int:
    """The daemon's clock (leases compared across hosts assume clocks in sync)."""
    return time.time_ns() // 1000


def row_values(record: asyncpg.Record) -> tuple[object, ...]:
    return tuple(record.values())


# -- sessions -------------------------------------------------------------------------------------


async def get_session(conn: Conn, session_id: str) -> SessionRecord:
    row = await conn.fetchrow(
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = $1", session_id
    )
    if row is None:
        raise UnknownSessionError(session_id)
    return session_from_row(row_values(row))


async def list_sessions(conn: Conn, state: SessionState | None) -> list[SessionRecord]:
    rows = await conn.fetch(
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE $1::text IS NULL OR state = $1"
        " ORDER BY opened_us, session_id",
        None if state is None else state.value,
    )
    return [session_from_row(row_values(r)) for r in rows]


# -- reads of turns -------------------------------------------------------------------------------


async def attempts_of(conn: Conn, turn_id: int) -> tuple[AttemptRecord, ...]:
    rows = await conn.fetch(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE turn_id = $1 ORDER BY round, attempt",
        turn_id,
    )
    return tuple(attempt_from_row(row_values(r)) for r in rows)


async def turns_from_rows(conn: Conn, rows: Sequence[asyncpg.Record]) -> list[TurnRecord]:
    """Turn rows (`TURN_COLUMNS`) as records, their attempts read in one query."""
    if not rows:
        return []
    ids = [int(r[0]) for r in rows]
    found: dict[int, list[AttemptRecord]] = {}
    for a in await conn.fetch(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE turn_id = ANY($1::bigint[])"
        " ORDER BY turn_id, round, attempt",
        ids,
    ):
        found.setdefault(int(a[0]), []).append(attempt_from_row(row_values(a)))
    return [turn_from_row(row_values(r), tuple(found.get(int(r[0]), ()))) for r in rows]


async def get_turn(conn: Conn, turn_id: int) -> TurnRecord:
    row = await conn.fetchrow(f"SELECT {TURN_COLUMNS} FROM turns WHERE turn_id = $1", turn_id)
    if row is None:
        raise UnknownTurnError(turn_id)
    return turn_from_row(row_values(row), await attempts_of(conn, turn_id))


async def find_turn(conn: Conn, session_id: str, key: str) -> TurnRecord | None:
    row = await conn.fetchrow(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = $1 AND idempotency_key = $2",
        session_id,
        key,
    )
    if row is None:
        return None
    return turn_from_row(row_values(row), await attempts_of(conn, int(row[0])))


# -- listings -------------------------------------------------------------------------------------


async def list_turns(conn: Conn, where: TurnFilter, after: int, limit: int) -> TurnPage:
    rows = await conn.fetch(LIST_TURNS, *list_turns_args(where, after, limit + 1))
    more = len(rows) > limit
    turns = await turns_from_rows(conn, rows[:limit])
    return TurnPage(turns=tuple(turns), next_after=turns[-1].turn_id if more else None)


async def counts(conn: Conn) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*) FROM turns GROUP BY state")
    return {str(r[0]): int(r[1]) for r in rows}
