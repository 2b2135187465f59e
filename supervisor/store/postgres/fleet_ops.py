"""The `FleetStore` operations on PostgreSQL (session homes, heartbeats, anchored ledgers,
resolutions asked of a home): each an async function of a connection, run by the engine in a
transaction, like `supervisor.store.postgres.operations`.

A session's home is fenced like a turn's claim: the owner and a token that only grows, on the
session's row. Ledger writes lock the rows of the sessions they append to (``FOR SHARE``), so a
home cannot change hands while a line is being kept, and appends to one session are serialised
across daemons.

Design notes
------------
* **Home claims never wait and never stop short.** `claim_homes` picks the open sessions whose
  home lapsed with ``FOR NO KEY UPDATE SKIP LOCKED`` in a materialized CTE (run once; ``LIMIT``
  counts the rows it locked, not the ones it skipped) and takes them in one statement. A row
  another transaction holds is skipped for this round only: a paused daemon's transaction is
  cut by the server after ``idle_in_transaction_session_timeout`` (half a lease,
  `connections.Timeouts`), before its homes lapse, so the next round takes every one of them.
* **Renewals** (`renew_homes`, the heartbeat) run on the renewal connection, outside any
  transaction: the sessions' rows by id, ``SKIP LOCKED`` first, then the skipped ones waiting
  at most that connection's ``lock_timeout`` (`operations.renew_held`).
* The lock order of every statement here is listed in `operations`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Final

import asyncpg

from ledger.entries import SealedLine
from sandbox.policy.lifecycle import TurnState
from supervisor.errors import NotEscalatedError, SessionClosedError, UnknownTurnError
from supervisor.store.fleet import DaemonRecord, LedgerHead, SessionHome, StaleHomeError
from supervisor.store.postgres.operations import (
    WORK_CHANNEL,
    check_homes,
    get_session,
    get_turn,
    put_ledger_lines,
    renew_held,
)
from supervisor.store.postgres.schema import SESSION_COLUMNS, TURN_COLUMNS
from supervisor.store.protocol import Resolution, TurnRecord
from supervisor.store.rows import dumps, loads, session_from_row, turn_from_row
from supervisor.store.sealing import sessions_of

__all__ = [
    "anchor_ledger_lines",
    "claim_homes",
    "daemons",
    "forget_daemon",
    "heartbeat",
    "home_session",
    "ledger_heads",
    "pending_resolutions",
    "release_home",
    "renew_homes",
    "request_resolution",
    "session_homes",
    "waiting_turns",
]

Conn = asyncpg.Connection

_HOME_COLUMNS: Final = f"{SESSION_COLUMNS}, home, home_token, home_until_us"
#: ``_HOME_COLUMNS`` of the updated table, in an ``UPDATE ... FROM`` that joins another
_HOME_RETURNING: Final = ", ".join(f"sessions.{c.strip()}" for c in _HOME_COLUMNS.split(","))


def _now_us() -> int:
    return time.time_ns() // 1000


def _home(row: asyncpg.Record) -> SessionHome:
    values = tuple(row.values())
    return SessionHome(
        session=session_from_row(values[:-3]),
        owner=str(values[-3]),
        token=int(values[-2]),
        lease_until_us=int(values[-1]),
    )


async def home_session(conn: Conn, session_id: str, owner: str, lease_ms: int) -> SessionHome:
    now = _now_us()
    row = await conn.fetchrow(
        "UPDATE sessions SET home = $2, home_token = home_token + 1, home_until_us = $3"
        " WHERE session_id = $1 AND state = 'open'"
        " AND (home IS NULL OR home = $2 OR home_until_us < $4)"
        f" RETURNING {_HOME_COLUMNS}",
        session_id,
        owner,
        now + lease_ms * 1000,
        now,
    )
    if row is not None:
        return _home(row)
    record = await get_session(conn, session_id)  # UnknownSessionError when absent
    if record.state.value != "open":
        raise SessionClosedError(session_id)
    home = await conn.fetchval("SELECT home FROM sessions WHERE session_id = $1", session_id)
    raise StaleHomeError(session_id, owner=owner, home=None if home is None else str(home))


#: An instruction turn that waits to run: not final, not escalated, held by nobody's live claim.
_WAITING_SQL: Final = (
    "t.kind = 'instruction' AND t.state IN ('accepted', 'waiting_retry', 'running')"
    " AND (t.owner IS NULL OR t.lease_until_us < $3)"
)


async def claim_homes(
    conn: Conn,
    owner: str,
    lease_ms: int,
    limit: int,
    packages: frozenset[str] | None,
    *,
    serves: frozenset[str] | None = None,
) -> list[SessionHome]:
    now = _now_us()
    # A session never homed yet (home_token 0) is left to the daemon that opened it for one
    # lease: its row is committed before that daemon homes it (`home_session`), and taking it
    # in between would refuse the opener's first ledger lines. A released home is taken at once,
    # unless it was handed over (released with a reservation, `home_until_us` in the future):
    # until then only a daemon serving every command type of its waiting turns takes it.
    rows = await conn.fetch(
        "WITH c AS MATERIALIZED (SELECT s.session_id FROM sessions s WHERE s.state = 'open'"
        " AND ((s.home IS NULL AND (s.home_token > 0 OR s.opened_us < $3 - $6::bigint)"
        " AND (s.home_until_us IS NULL OR s.home_until_us < $3 OR NOT EXISTS (SELECT 1 FROM"
        f" turns t WHERE t.session_id = s.session_id AND {_WAITING_SQL}"
        " AND NOT t.command_type = ANY($7::text[]))))"
        " OR s.home_until_us < $3)"
        " AND ($5::text[] IS NULL OR s.package_id = ANY($5::text[]))"
        " ORDER BY s.opened_us, s.session_id LIMIT $4 FOR NO KEY UPDATE OF s SKIP LOCKED)"
        " UPDATE sessions SET home = $1, home_token = home_token + 1, home_until_us = $2"
        f" FROM c WHERE sessions.session_id = c.session_id RETURNING {_HOME_RETURNING}",
        owner,
        now + lease_ms * 1000,
        now,
        limit,
        None if packages is None else sorted(packages),
        lease_ms * 1000,
        sorted(serves or ()),
    )
    return [_home(r) for r in rows]


async def session_homes(conn: Conn, session_ids: tuple[str, ...] | None) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT session_id, home FROM sessions WHERE home IS NOT NULL AND state = 'open'"
        " AND ($1::text[] IS NULL OR session_id = ANY($1::text[]))",
        None if session_ids is None else list(session_ids),
    )
    return {str(r[0]): str(r[1]) for r in rows}


async def waiting_turns(
    conn: Conn, owner: str, session_ids: tuple[str, ...]
) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT DISTINCT t.session_id, t.command_type FROM turns t"
        " WHERE t.session_id = ANY($1::text[]) AND t.command_type IS NOT NULL"
        " AND t.kind = 'instruction' AND t.state IN ('accepted', 'waiting_retry', 'running')"
        " AND (t.owner IS NULL OR t.owner = $2 OR t.lease_until_us < $3)"
        " ORDER BY 1, 2",
        list(session_ids),
        owner,
        _now_us(),
    )
    return [(str(r[0]), str(r[1])) for r in rows]


#: The homes' rows still held (owner and token, open), locked by id (``{wait}``: ``SKIP
#: LOCKED`` or waiting), given the new lease; the answer lists every held row with whether it was.
_RENEW_HOMES: Final = (
    "WITH held AS (SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[])"
    " AS h(session_id, owner, token)),"
    " l AS (SELECT s.session_id FROM sessions s JOIN held h ON s.session_id = h.session_id"
    " AND s.home = h.owner AND s.home_token = h.token AND s.state = 'open'"
    " ORDER BY s.session_id FOR NO KEY UPDATE OF s{wait}),"
    " u AS (UPDATE sessions SET home_until_us = $1 FROM l"
    " WHERE sessions.session_id = l.session_id RETURNING sessions.session_id)"
    " SELECT s.session_id, u.session_id IS NOT NULL FROM sessions s JOIN held h"
    " ON s.session_id = h.session_id AND s.home = h.owner AND s.home_token = h.token"
    " AND s.state = 'open' LEFT JOIN u ON u.session_id = s.session_id"
)
_RENEW_HOMES_SKIPPING: Final = _RENEW_HOMES.format(wait=" SKIP LOCKED")
_RENEW_HOMES_WAITING: Final = _RENEW_HOMES.format(wait="")


async def renew_homes(
    conn: Conn, homes: tuple[SessionHome, ...], lease_ms: int
) -> list[SessionHome]:
    """The homes still held, renewed (one whose row stays locked by another transaction comes
    back as it was: `operations.renew_held`); runs outside a transaction."""
    until = _now_us() + lease_ms * 1000
    renewed, busy = await renew_held(
        conn,
        (_RENEW_HOMES_SKIPPING, _RENEW_HOMES_WAITING),
        until,
        ids=[h.session_id for h in homes],
        owners=[h.owner for h in homes],
        tokens=[h.token for h in homes],
    )
    return [
        replace(h, lease_until_us=until) if h.session_id in renewed else h
        for h in homes
        if h.session_id in renewed or h.session_id in busy
    ]


async def release_home(conn: Conn, home: SessionHome, reserve_ms: int | None = None) -> None:
    reserved = None if reserve_ms is None else _now_us() + reserve_ms * 1000
    status = await conn.execute(
        "UPDATE sessions SET home = NULL, home_until_us = $4"
        " WHERE session_id = $1 AND home = $2 AND home_token = $3",
        home.session_id,
        home.owner,
        home.token,
        reserved,
    )
    if reserved is not None and status.endswith(" 1"):  # handed over: wake the others
        await conn.execute("SELECT pg_notify($1, $2)", WORK_CHANNEL, f"home:{home.session_id}")


async def anchor_ledger_lines(conn: Conn, owner: str, lines: tuple[SealedLine, ...]) -> None:
    await check_homes(conn, owner, sessions_of(x.ledger_id for x in lines))
    await put_ledger_lines(conn, lines)


async def ledger_heads(conn: Conn, ledger_ids: tuple[str, ...] | None) -> list[LedgerHead]:
    rows = await conn.fetch(
        "SELECT ledger_id, seq, entry_hash FROM ledger_heads"
        " WHERE $1::text[] IS NULL OR ledger_id = ANY($1::text[]) ORDER BY ledger_id",
        None if ledger_ids is None else list(ledger_ids),
    )
    return [LedgerHead(ledger_id=str(r[0]), seq=int(r[1]), entry_hash=str(r[2])) for r in rows]


async def heartbeat(
    conn: Conn, owner: str, *, host: str, pid: int, started_us: int, info: Mapping[str, object]
) -> None:
    await conn.execute(
        "INSERT INTO daemons(owner, host, pid, started_us, heartbeat_us, info)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (owner) DO UPDATE"
        " SET heartbeat_us = excluded.heartbeat_us, info = excluded.info",
        owner,
        host,
        pid,
        started_us,
        _now_us(),
        dumps(info),
    )


async def daemons(conn: Conn) -> list[DaemonRecord]:
    rows = await conn.fetch(
        "SELECT d.owner, d.host, d.pid, d.started_us, d.heartbeat_us, d.info,"
        " (SELECT count(*) FROM turns t WHERE t.owner = d.owner),"
        " (SELECT count(*) FROM sessions s WHERE s.home = d.owner AND s.state = 'open')"
        " FROM daemons d ORDER BY d.heartbeat_us DESC"
    )
    return [
        DaemonRecord(
            owner=str(r[0]),
            host=str(r[1]),
            pid=int(r[2]),
            started_us=int(r[3]),
            heartbeat_us=int(r[4]),
            info=loads(bytes(r[5])),
            turns_held=int(r[6]),
            sessions_homed=int(r[7]),
        )
        for r in rows
    ]


async def forget_daemon(conn: Conn, owner: str) -> None:
    await conn.execute("DELETE FROM daemons WHERE owner = $1", owner)


async def request_resolution(
    conn: Conn,
    turn_id: int,
    resolution: Resolution,
    decided_by: Mapping[str, object] | None = None,
) -> TurnRecord:
    state = await conn.fetchval(
        "SELECT state FROM turns WHERE turn_id = $1 FOR NO KEY UPDATE", turn_id
    )
    if state is None:
        raise UnknownTurnError(turn_id)
    if state != TurnState.ESCALATED.value:
        raise NotEscalatedError(turn_id, str(state))
    await conn.execute(
        "UPDATE turns SET resolution = $2, resolution_by = $3 WHERE turn_id = $1",
        turn_id,
        resolution.value,
        None if decided_by is None else dumps(decided_by),
    )
    await conn.execute("SELECT pg_notify($1, $2)", WORK_CHANNEL, f"resolution:{turn_id}")
    return await get_turn(conn, turn_id)


async def pending_resolutions(
    conn: Conn, session_ids: tuple[str, ...]
) -> list[tuple[TurnRecord, Resolution, Mapping[str, object] | None]]:
    rows = await conn.fetch(
        f"SELECT {TURN_COLUMNS}, resolution, resolution_by FROM turns"
        " WHERE resolution IS NOT NULL AND state = 'escalated'"
        " AND session_id = ANY($1::text[]) ORDER BY turn_id",
        list(session_ids),
    )
    found: list[tuple[TurnRecord, Resolution, Mapping[str, object] | None]] = []
    for row in rows:
        values = tuple(row.values())
        by = values[-1]
        found.append(
            (
                turn_from_row(values[:-2], ()),
                Resolution(str(values[-2])),
                None if by is None else loads(bytes(by)),
            )
        )
    return found
