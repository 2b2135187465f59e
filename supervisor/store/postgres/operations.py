"""The turn store's operations on PostgreSQL: each an async function of a connection, run by the
engine inside a transaction (writes in the committer's batch transaction, reads in a read-only
one).

Design notes
------------
* The rules are the SQLite engine's, checked the same way before anything is written: a fenced
  write locks the turn's row (``SELECT ... FOR NO KEY UPDATE``) and compares the claim's owner and
  token (`StaleClaimError`); a state change goes through `check_move` (`IllegalTransition`).
  The row lock matters here: another daemon's claim of the same turn waits (or, with
  ``SKIP LOCKED``, passes it by) until this write commits, so a check and its write see the
  same row.
* **Claims** pick the oldest claimable rows with ``FOR NO KEY UPDATE SKIP LOCKED`` (a
  materialized CTE, so the pick runs once) and update those: two daemons claiming at once take
  different turns and never wait for each other. Every claim adds one to the row's token.
* **The lock order: sessions by id, then turns by id**, in every statement that may wait for a
  row, so that no two transactions wait for each other in a cycle. A batch of several ops takes
  every such lock first, in that order (`batches.LOCK_ROWS`, with its ``BEGIN``); a batch of
  one op takes them in its statements, each in that order. The statements here and in
  `fleet_ops`, with what they lock:

  - accept (`one_trip`; `many`, whose batches always lock first): the session (its counter),
    then it inserts the new turn;
  - keyed accept (`_ACCEPT_KEYED`): the session (``FOR NO KEY UPDATE``), then it inserts the
    turn unless its key was taken meanwhile (``ON CONFLICT DO NOTHING``);
  - start, retry, the long way's fence, release, resolve, request_resolution: the turn;
  - finish (`one_trip`, `many`): the sessions of its ledger lines (``FOR SHARE``, by id), then
    the turn;
  - claim_turns, recover: turns, ``SKIP LOCKED`` (never waits);
  - renew (the renewal connection, no transaction): turns by id, ``SKIP LOCKED``, then the rows
    it skipped, by id, waiting at most that connection's ``lock_timeout`` (`renew_held`);
  - open_session: a new row; close_session: the session;
  - home_session, release_home: the session; claim_homes: sessions, ``SKIP LOCKED``;
    renew_homes: sessions by id, as renew; anchor_ledger_lines: the sessions of its lines
    (``FOR SHARE``, by id);
  - heartbeat, forget_daemon: the daemon's own row of ``daemons`` (no other writer).

  A statement that locks with ``SKIP LOCKED`` never waits, so it may run anywhere in a batch.
  Every lock is ``FOR NO KEY UPDATE`` (or ``FOR SHARE``), never ``FOR UPDATE``: the rows' keys
  never change, and a batch that locked a row first never needs a stronger lock on it later.
* ``now`` is the daemon's clock, read in each operation (as the SQLite engine does). Leases
  compared across hosts therefore assume clocks in sync to well under a lease.
* Every SQL text is a constant, or one of a few shapes (filters pass arrays, never spliced
  values), so asyncpg's per-connection statement cache keeps each prepared.
* About 850 lines, past the usual 600: one function per protocol operation (each hot write
  tries its one statement from `one_trip` first and keeps the long way here), kept side by side
  with the SQLite engine's `operations` so the two read alike; splitting it would scatter the
  fencing and lifecycle checks the operations share.
* Rows come back as `asyncpg.Record`; they are handed to the shared converters
  (`supervisor.store.rows`) as tuples, whose asserts check the column types.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

import asyncpg

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState, check_move
from supervisor.errors import (
    LedgerForkError,
    NotEscalatedError,
    SessionClosedError,
    UnknownSessionError,
    UnknownTurnError,
)
from supervisor.store.fencing import fence, started_move, stored_attempt, with_start
from supervisor.store.fleet import StaleHomeError
from supervisor.store.postgres.batches import note_xid
from supervisor.store.postgres.one_trip import (
    ATTEMPT_UPSERT,
    accept_row,
    finish_row,
    retry_row,
    start_row,
)
from supervisor.store.postgres.schema import (
    ATTEMPT_COLUMNS,
    SESSION_COLUMNS,
    TURN_COLUMNS,
    UNFINISHED,
)
from supervisor.store.postgres.turn_query import LIST_TURNS, list_turns_args
from supervisor.store.protocol import (
    RESOLUTION_REASONS,
    Accepted,
    Claim,
    ClaimFilter,
    NewSession,
    NewTurn,
    Resolution,
    SessionRecord,
    SessionState,
    TurnEnding,
    TurnPage,
    TurnRecord,
)
from supervisor.store.rows import (
    accepted,
    attempt_from_row,
    attempt_row,
    claim_of,
    dumps,
    ending_values,
    session_from_row,
    turn_from_row,
)
from supervisor.store.sealing import EMPTY, LineSeal, sessions_of
from supervisor.store.turn_filter import TurnFilter
from supervisor.wire.turn_spec import InstructionSpec, encode_spec

__all__ = [
    "WORK_CHANNEL",
    "accept",
    "attempts_after",
    "check_homes",
    "claim_turns",
    "close_session",
    "counts",
    "find_turn",
    "finish",
    "get_session",
    "get_turn",
    "ledger_lines",
    "list_sessions",
    "list_turns",
    "open_session",
    "record_attempt",
    "recover",
    "release",
    "renew",
    "renew_held",
    "resolve",
    "row_values",
    "start_attempt",
    "trim_ledger_lines",
    "with_start",
]

Conn = asyncpg.Connection

#: The ``LISTEN`` channel on which a daemon signals work another daemon may take.
WORK_CHANNEL: Final = "hunter_work"

_UNFINISHED_SQL: Final = f"state IN ({', '.join(repr(s) for s in UNFINISHED)})"
#: ``TURN_COLUMNS`` of the updated table, in an ``UPDATE ... FROM`` that joins another
_TURN_RETURNING: Final = ", ".join(f"turns.{c.strip()}" for c in TURN_COLUMNS.split(","))
_RESOLVED: Final = {
    Resolution.RETRY: TurnState.ACCEPTED,
    Resolution.TERMINATE: TurnState.TERMINATED,
    Resolution.CANCEL: TurnState.CANCELLED,
}


def _now_us() -> int:
    return time.time_ns() // 1000


def row_values(record: asyncpg.Record) -> tuple[object, ...]:
    return tuple(record.values())


# -- sessions -------------------------------------------------------------------------------------


async def open_session(conn: Conn, new: NewSession) -> SessionRecord:
    row = await conn.fetchrow(
        f"INSERT INTO sessions({SESSION_COLUMNS})"
        " VALUES ($1, $2, $3, $4, $5, 'open', $6, NULL, 0, $7, $8)"
        f" ON CONFLICT (session_id) DO NOTHING RETURNING {SESSION_COLUMNS}",
        new.session_id,
        new.package_id,
        new.tier,
        new.work_order_id,
        new.workspace,
        _now_us(),
        new.tenant,
        new.priority,
    )
    if row is None:
        raise ValueError(f"session {new.session_id!r} already exists")
    return session_from_row(row_values(row))


async def close_session(conn: Conn, session_id: str) -> SessionRecord:
    row = await conn.fetchrow(
        "UPDATE sessions SET state = 'closed', closed_us = $1 WHERE session_id = $2"
        f" AND state = 'open' RETURNING {SESSION_COLUMNS}",
        _now_us(),
        session_id,
    )
    return (
        session_from_row(row_values(row))
        if row is not None
        else await get_session(conn, session_id)
    )


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


async def _attempts_of(conn: Conn, turn_id: int) -> tuple[AttemptRecord, ...]:
    rows = await conn.fetch(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE turn_id = $1 ORDER BY round, attempt",
        turn_id,
    )
    return tuple(attempt_from_row(row_values(r)) for r in rows)


async def _turns_from_rows(conn: Conn, rows: Sequence[asyncpg.Record]) -> list[TurnRecord]:
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
    return turn_from_row(row_values(row), await _attempts_of(conn, turn_id))


async def find_turn(conn: Conn, session_id: str, key: str) -> TurnRecord | None:
    row = await conn.fetchrow(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = $1 AND idempotency_key = $2",
        session_id,
        key,
    )
    if row is None:
        return None
    return turn_from_row(row_values(row), await _attempts_of(conn, int(row[0])))


# -- acceptance and claims ------------------------------------------------------------------------


#: A keyed accept: the session's row locked (waiting for any other accept of the session, which
#: holds it until it commits), then the turn inserted unless its key is taken meanwhile
#: (``ON CONFLICT DO NOTHING`` sees a row committed after this statement's snapshot); the
#: session's counter moves only when the turn was inserted, so no number is skipped. No turn
#: and a locked session row: the key was taken by another daemon's accept (the caller reads
#: that first turn with its next statement, whose snapshot holds it).
_ACCEPT_KEYED: Final = (
    "WITH s AS (SELECT turns FROM sessions WHERE session_id = $1 AND state = 'open'"
    " FOR NO KEY UPDATE),"
    " i AS (INSERT INTO turns(session_id, turn_number, kind, command_type, spec,"
    " idempotency_key, state, accepted_us, updated_us, owner, token, lease_until_us)"
    " SELECT $1, s.turns + 1, $2, $3, $4, $5, 'accepted', $6, $6, $7, $8, $9 FROM s"
    " ON CONFLICT (session_id, idempotency_key) DO NOTHING RETURNING turn_id, turn_number),"
    " u AS (UPDATE sessions SET turns = i.turn_number FROM i WHERE sessions.session_id = $1"
    " RETURNING 1),"
    " n AS (SELECT pg_notify($10, 'turn:' || i.turn_id) FROM i WHERE $7::text IS NULL)"
    " SELECT (SELECT turn_id FROM i), (SELECT turn_number FROM i), (SELECT count(*) FROM s),"
    " (SELECT count(*) FROM u), (SELECT count(*) FROM n), txid_current()"
)


async def accept(conn: Conn, new: NewTurn, claim_for: str | None, lease_ms: int) -> Accepted:
    """Accept *new*; a turn of the session with the same idempotency key, accepted before or
    meanwhile (here or by another daemon: every accept of a session holds its row), comes back
    instead (``created=False``), never a unique violation."""
    now = _now_us()
    blob = encode_spec(new.spec)
    command = new.spec.command_type.value if isinstance(new.spec, InstructionSpec) else None
    if new.idempotency_key is not None:
        return await _accept_keyed(
            conn,
            new,
            new.idempotency_key,
            blob=blob,
            command=command if isinstance(command, str) else None,
            now=now,
            claim_for=claim_for,
            lease_ms=lease_ms,
        )
    token, lease = claim_of(now, claim_for, lease_ms)
    # one statement: the counter, the insert and (unclaimed) the notify (one_trip.py)
    row = await accept_row(
        conn,
        new,
        blob=blob,
        command=command if isinstance(command, str) else None,
        now=now,
        claim_for=claim_for,
        token=token,
        lease=lease,
        channel=WORK_CHANNEL,
    )
    if row is None:
        await get_session(conn, new.session_id)  # raises UnknownSessionError
        raise SessionClosedError(new.session_id)
    turn_id, number = row
    return accepted(new, int(turn_id), int(number), now, claim_for=claim_for, lease_ms=lease_ms)


async def _accept_keyed(
    conn: Conn,
    new: NewTurn,
    key: str,
    *,
    blob: bytes,
    command: str | None,
    now: int,
    claim_for: str | None,
    lease_ms: int,
) -> Accepted:
    first = await find_turn(conn, new.session_id, key)  # a retried submit: no lock at all
    if first is not None:
        return Accepted(turn=first, created=False)
    token, lease = claim_of(now, claim_for, lease_ms)
    row = await conn.fetchrow(
        _ACCEPT_KEYED,
        new.session_id,
        new.kind.value,
        command,
        blob,
        key,
        now,
        claim_for,
        token,
        lease,
        WORK_CHANNEL,
    )
    assert row is not None
    note_xid(int(row[5]))
    if row[0] is not None:
        number = int(row[1])
        return accepted(new, int(row[0]), number, now, claim_for=claim_for, lease_ms=lease_ms)
    if int(row[2]) == 0:
        await get_session(conn, new.session_id)  # raises UnknownSessionError
        raise SessionClosedError(new.session_id)
    # the key was taken by an accept that committed while this one waited for the session
    first = await find_turn(conn, new.session_id, key)
    if first is None:  # pragma: no cover - the unique key names a committed turn
        raise AssertionError(f"turn with key {key!r} of session {new.session_id} not found")
    return Accepted(turn=first, created=False)


async def _claims(conn: Conn, rows: Sequence[asyncpg.Record]) -> list[Claim]:
    ordered = sorted(rows, key=lambda r: int(r[0]))  # RETURNING promises no order
    return [
        Claim(turn=t, owner=str(r[17]), token=t.token, lease_until_us=int(r[19]))
        for t, r in zip(await _turns_from_rows(conn, ordered), ordered, strict=True)
    ]


async def claim_turns(
    conn: Conn, owner: str, limit: int, lease_ms: int, only: ClaimFilter | None
) -> list[Claim]:
    now = _now_us()
    where = [
        _UNFINISHED_SQL,
        "((owner IS NULL AND (state <> 'waiting_retry' OR coalesce(next_attempt_us, 0) <= $3))"
        " OR (owner IS NOT NULL AND lease_until_us < $3))",
    ]
    args: list[object] = [owner, now + lease_ms * 1000, now, limit]
    if only is not None:
        args.append(sorted(k.value for k in only.kinds))
        where.append(f"kind = ANY(${len(args)}::text[])")
        if only.command_types is not None:
            args.append(sorted(only.command_types))
            where.append(f"(kind <> 'instruction' OR command_type = ANY(${len(args)}::text[]))")
        if only.process_sessions is not None:
            args.append(sorted(only.process_sessions))
            where.append(f"(kind <> 'process' OR session_id = ANY(${len(args)}::text[]))")
        if only.sessions is not None:
            args.append(sorted(only.sessions))
            where.append(f"session_id = ANY(${len(args)}::text[])")
    rows = await conn.fetch(
        "WITH c AS MATERIALIZED (SELECT turn_id FROM turns"
        f" WHERE {' AND '.join(where)} ORDER BY turn_id LIMIT $4 FOR NO KEY UPDATE SKIP LOCKED)"
        " UPDATE turns SET owner = $1, token = token + 1, lease_until_us = $2 FROM c"
        f" WHERE turns.turn_id = c.turn_id RETURNING {_TURN_RETURNING}",
        *args,
    )
    return await _claims(conn, rows)


async def recover(conn: Conn, owner: str, lease_ms: int) -> list[Claim]:
    """Every unfinished turn this owner held, nobody holds, or whose lease expired (the shared
    engine's reading of a restart: another daemon's live claims are left alone)."""
    now = _now_us()
    rows = await conn.fetch(
        f"WITH c AS MATERIALIZED (SELECT turn_id FROM turns WHERE {_UNFINISHED_SQL}"
        " AND (owner IS NULL OR owner = $1 OR lease_until_us < $3) ORDER BY turn_id"
        " FOR NO KEY UPDATE SKIP LOCKED)"
        " UPDATE turns SET owner = $1, token = token + 1, lease_until_us = $2 FROM c"
        f" WHERE turns.turn_id = c.turn_id RETURNING {_TURN_RETURNING}",
        owner,
        now + lease_ms * 1000,
        now,
    )
    return await _claims(conn, rows)


#: The claims' rows still held (owner and token), locked by id (``{wait}``: ``SKIP LOCKED``
#: or waiting), given the new lease; the answer lists every held row with whether it was.
_RENEW: Final = (
    "WITH held AS (SELECT * FROM unnest($2::bigint[], $3::text[], $4::bigint[])"
    " AS h(turn_id, owner, token)),"
    " l AS (SELECT t.turn_id FROM turns t JOIN held h ON t.turn_id = h.turn_id"
    " AND t.owner = h.owner AND t.token = h.token ORDER BY t.turn_id FOR NO KEY UPDATE OF t"
    "{wait}),"
    " u AS (UPDATE turns SET lease_until_us = $1 FROM l WHERE turns.turn_id = l.turn_id"
    " RETURNING turns.turn_id)"
    " SELECT t.turn_id, u.turn_id IS NOT NULL FROM turns t JOIN held h ON t.turn_id = h.turn_id"
    " AND t.owner = h.owner AND t.token = h.token LEFT JOIN u ON u.turn_id = t.turn_id"
)
_RENEW_SKIPPING: Final = _RENEW.format(wait=" SKIP LOCKED")
_RENEW_WAITING: Final = _RENEW.format(wait="")


async def renew(conn: Conn, claims: tuple[Claim, ...], lease_ms: int) -> list[Claim]:
    """The claims still held, renewed (a claim whose row stays locked by another transaction
    comes back as it was: `renew_held`); runs outside a transaction."""
    until = _now_us() + lease_ms * 1000
    renewed, busy = await renew_held(
        conn,
        (_RENEW_SKIPPING, _RENEW_WAITING),
        until,
        ids=[c.turn_id for c in claims],
        owners=[c.owner for c in claims],
        tokens=[c.token for c in claims],
    )
    return [
        replace(c, lease_until_us=until) if c.turn_id in renewed else c
        for c in claims
        if c.turn_id in renewed or c.turn_id in busy
    ]


async def renew_held(
    conn: Conn,
    statements: tuple[str, str],
    until: int,
    *,
    ids: Sequence[object],
    owners: Sequence[str],
    tokens: Sequence[int],
) -> tuple[set[object], set[object]]:
    """Renew leases on the renewal connection, outside a transaction (each statement commits
    by itself): the rows nobody else has locked at once (*statements*' first, ``SKIP
    LOCKED``), then the others, waiting for them at most the connection's ``lock_timeout``
    (the second). (renewed, held but not renewed): a row still locked by another transaction
    then (the daemon's own batch writing it, a paused daemon's until the server cuts its
    connection) is still held as far as anyone knows, and the next round renews it; a row
    held by nobody's claim or home any more is in neither."""
    skipping, waiting = statements
    rows = await conn.fetch(skipping, until, list(ids), list(owners), list(tokens))
    renewed = {r[0] for r in rows if r[1]}
    busy = {r[0] for r in rows if not r[1]}
    if not busy:
        return renewed, busy
    keep = [i for i, key in enumerate(ids) if key in busy]
    try:
        again = await conn.fetch(
            waiting,
            until,
            [ids[i] for i in keep],
            [owners[i] for i in keep],
            [tokens[i] for i in keep],
        )
    except (asyncpg.exceptions.LockNotAvailableError, asyncpg.exceptions.QueryCanceledError):
        return renewed, busy  # still locked: renewed next round
    # waiting, every row still held was locked and renewed; one its lock holder took is gone
    return renewed | {r[0] for r in again if r[1]}, set()


async def release(conn: Conn, claim: Claim) -> None:
    await conn.execute(
        "UPDATE turns SET owner = NULL, lease_until_us = NULL"
        " WHERE turn_id = $1 AND owner = $2 AND token = $3",
        claim.turn_id,
        claim.owner,
        claim.token,
    )


# -- fenced writes --------------------------------------------------------------------------------


async def _fence(conn: Conn, claim: Claim) -> tuple[TurnState, int]:
    """The turn's state and round, if *claim* still holds it (`fencing.fence`); the row stays
    locked until the transaction ends."""
    row = await conn.fetchrow(
        "SELECT state, owner, token, round FROM turns WHERE turn_id = $1 FOR NO KEY UPDATE",
        claim.turn_id,
    )
    return fence(claim, None if row is None else (row[0], row[1], row[2], row[3]))


_PUT_ATTEMPT: Final = (
    f"INSERT INTO attempts({ATTEMPT_COLUMNS})"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
    f"{ATTEMPT_UPSERT}"
)


async def _put_attempts(
    conn: Conn, turn_id: int, round_: int, attempts: Sequence[AttemptRecord]
) -> None:
    rows = [attempt_row(turn_id, round_, a) for a in attempts]
    if len(rows) == 1:
        await conn.execute(_PUT_ATTEMPT, *rows[0])
    elif rows:
        await conn.executemany(_PUT_ATTEMPT, rows)


async def attempts_after(
    conn: Conn, row: asyncpg.Record, written: tuple[AttemptRecord, ...]
) -> tuple[AttemptRecord, ...]:
    """The turn's attempts once *written* are upserted: without reading them back when the
    turn is in its first round and *written* holds attempts 1..n, n its attempt count."""
    numbers = sorted(a.attempt for a in written)
    if int(row[20]) == 0 and numbers == list(range(1, int(row[7]) + 1)):
        return tuple(stored_attempt(a) for a in sorted(written, key=lambda a: a.attempt))
    return await _attempts_of(conn, int(row[0]))


def _claim_after(claim: Claim, row: asyncpg.Record, attempts: tuple[AttemptRecord, ...]) -> Claim:
    turn = turn_from_row(row_values(row), attempts, spec=claim.turn.spec)
    return Claim(turn=turn, owner=claim.owner, token=claim.token, lease_until_us=int(row[19]))


async def start_attempt(conn: Conn, claim: Claim, attempt: AttemptRecord) -> Claim:
    started = await start_row(conn, claim, attempt, now=_now_us())
    if started is not None:  # one statement (one_trip.py)
        return _claim_after(claim, started, await attempts_after(conn, started, (attempt,)))
    # the long way: the precise error, or the write the one statement would not make
    state, round_ = await _fence(conn, claim)
    check_move(state, TurnState.RUNNING, turn_id=claim.turn_id)
    row = await conn.fetchrow(
        "UPDATE turns SET state = 'running', attempt = $1, updated_us = $2,"
        f" next_attempt_us = NULL WHERE turn_id = $3 RETURNING {TURN_COLUMNS}",
        attempt.attempt,
        _now_us(),
        claim.turn_id,
    )
    assert row is not None
    await _put_attempts(conn, claim.turn_id, round_, (attempt,))
    first = state is TurnState.ACCEPTED and round_ == 0
    attempts = (stored_attempt(attempt),) if first else await _attempts_of(conn, claim.turn_id)
    return _claim_after(claim, row, attempts)


async def record_attempt(
    conn: Conn,
    claim: Claim,
    attempt: AttemptRecord,
    next_attempt_us: int,
    started: AttemptRecord | None = None,
) -> Claim:
    written = with_start((attempt,), started)
    waiting = await retry_row(
        conn,
        claim,
        attempt=attempt,
        written=written,
        next_attempt_us=next_attempt_us,
        started=started is not None,
        now=_now_us(),
    )
    if waiting is not None:  # one statement (one_trip.py)
        return _claim_after(claim, waiting, await attempts_after(conn, waiting, written))
    # the long way: the precise error, or the write the one statement would not make
    state, round_ = await _fence(conn, claim)
    state = started_move(state, started, claim.turn_id)
    check_move(state, TurnState.WAITING_RETRY, turn_id=claim.turn_id)
    await _put_attempts(conn, claim.turn_id, round_, written)
    row = await conn.fetchrow(
        "UPDATE turns SET state = 'waiting_retry', attempt = greatest(attempt, $1),"
        f" updated_us = $2, next_attempt_us = $3 WHERE turn_id = $4 RETURNING {TURN_COLUMNS}",
        attempt.attempt,
        _now_us(),
        next_attempt_us,
        claim.turn_id,
    )
    assert row is not None
    return _claim_after(claim, row, await _attempts_of(conn, claim.turn_id))


async def finish(
    conn: Conn,
    claim: Claim,
    ending: TurnEnding,
    attempts: tuple[AttemptRecord, ...],
    *,
    seal: LineSeal = EMPTY,
    started: AttemptRecord | None = None,
) -> TurnRecord:
    """End the turn under *claim*; its ledger lines are sealed once the fence held (the turn's
    row updated under owner and token, its sessions' homes read ``FOR SHARE``), in this
    transaction, and kept only if they continue their chains."""
    written = with_start(attempts, started)
    now = _now_us()
    ended = await finish_row(
        conn,
        claim,
        ending,
        attempts=attempts,
        written=written,
        # the turn's session too: an ending of a session homed elsewhere is refused, lines or not
        sessions=sessions_of((*seal.ledger_ids, f"{claim.turn.session_id}/exec")),
        started=started is not None,
        now=now,
    )
    if ended is not None:
        await put_ledger_lines(conn, seal.seal())
        return turn_from_row(
            row_values(ended), await attempts_after(conn, ended, written), spec=claim.turn.spec
        )
    # the long way: the precise error, or the write the one statement would not make (the
    # sessions lock first, then the turn: the order of every writer)
    await check_homes(
        conn, claim.owner, sessions_of((*seal.ledger_ids, f"{claim.turn.session_id}/exec"))
    )
    state, round_ = await _fence(conn, claim)
    state = started_move(state, started, claim.turn_id)
    check_move(state, ending.state, turn_id=claim.turn_id)
    await _put_attempts(conn, claim.turn_id, round_, written)
    await put_ledger_lines(conn, seal.seal())
    row = await conn.fetchrow(
        "UPDATE turns SET state = $1, attempt = greatest(attempt, $2), updated_us = $3,"
        " finished_us = $4, next_attempt_us = NULL, verdict = $5, reason_code = $6,"
        " reason = $7, fault_type = $8, result = $9, owner = NULL, lease_until_us = NULL"
        f" WHERE turn_id = $10 RETURNING {TURN_COLUMNS}",
        *ending_values(ending, attempts, now),
        claim.turn_id,
    )
    assert row is not None
    return turn_from_row(
        row_values(row), await _attempts_of(conn, claim.turn_id), spec=claim.turn.spec
    )


# -- ledger lines ---------------------------------------------------------------------------------


#: Keep lines that continue their chains, in one statement: a line already kept under its seq
#: must be the same line (an anchoring round re-sends lines the store has: kept once), and a line
#: whose predecessor is kept, or comes in the same call, must link to it by its previous hash.
#: Nothing is written when one line fails (the caller raises); the heads move forward only.
#: The kept neighbours of each line are read by a LATERAL range over the primary key (at most two
#: rows per line): a plain join on ``seq IN (w.seq, w.seq - 1)`` lets the planner hash-join every
#: kept line of the ledger (a scan that grows with the ledger, and with every turn it holds).
_PUT_LINES: Final = (
    "WITH w AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[],"
    " $5::text[]) AS w(ledger_id, seq, entry_hash, line, previous_hash)),"
    " k AS (SELECT l.ledger_id, l.seq, l.entry_hash FROM w CROSS JOIN LATERAL"
    " (SELECT x.ledger_id, x.seq, x.entry_hash FROM ledger_lines x"
    " WHERE x.ledger_id = w.ledger_id AND x.seq BETWEEN w.seq - 1 AND w.seq"
    " ORDER BY x.seq LIMIT 2) l),"
    " known AS (SELECT ledger_id, seq, entry_hash FROM k"
    " UNION ALL SELECT ledger_id, seq, entry_hash FROM w),"
    " bad AS (SELECT w.ledger_id, w.seq, 'fork' AS why"
    " FROM w JOIN k ON k.ledger_id = w.ledger_id AND k.seq = w.seq"
    " AND k.entry_hash <> w.entry_hash"
    " UNION ALL SELECT w.ledger_id, w.seq, 'link'"
    " FROM w JOIN known p ON p.ledger_id = w.ledger_id AND p.seq = w.seq - 1"
    " WHERE w.previous_hash <> '' AND p.entry_hash <> w.previous_hash),"
    " ins AS (INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line)"
    " SELECT ledger_id, seq, entry_hash, line FROM w WHERE NOT EXISTS (SELECT 1 FROM bad)"
    " ON CONFLICT (ledger_id, seq) DO NOTHING RETURNING ledger_id, seq, entry_hash),"
    " hd AS (INSERT INTO ledger_heads(ledger_id, seq, entry_hash)"
    " SELECT DISTINCT ON (ledger_id) ledger_id, seq, entry_hash FROM ins"
    " ORDER BY ledger_id, seq DESC ON CONFLICT (ledger_id) DO UPDATE"
    " SET seq = excluded.seq, entry_hash = excluded.entry_hash"
    " WHERE ledger_heads.seq < excluded.seq RETURNING 1)"
    " SELECT b.ledger_id, b.seq, b.why, (SELECT count(*) FROM ins), (SELECT count(*) FROM hd)"
    " FROM (SELECT * FROM bad UNION ALL SELECT NULL, NULL, NULL) b"
    " ORDER BY b.ledger_id NULLS LAST, b.seq LIMIT 1"
)


async def put_ledger_lines(conn: Conn, lines: Sequence[SealedLine]) -> int:
    """Keep sealed ledger lines in one statement (see `_PUT_LINES`); how many were new.
    ValueError, with nothing written, when a line does not continue its chain: a different
    line at its seq (a fork) or a previous hash other than its predecessor's."""
    if not lines:
        return 0
    row = await conn.fetchrow(
        _PUT_LINES,
        [x.ledger_id for x in lines],
        [x.seq for x in lines],
        [x.entry_hash for x in lines],
        [x.line for x in lines],
        [x.previous_hash for x in lines],
    )
    assert row is not None
    if row[0] is not None:
        detail = (
            "already has a different line"
            if row[2] == "fork"
            else "refuses a line whose previous hash is not the hash of the line before it"
            " (it does not continue the chain)"
        )
        raise LedgerForkError(str(row[0]), int(row[1]), detail)
    return int(row[3])


async def check_homes(conn: Conn, owner: str, sessions: Sequence[str]) -> None:
    """Lock the rows of *sessions* (sorted: the order every writer locks them in; ``FOR
    SHARE``: a home cannot change hands meanwhile, and appends to one session are serialised
    across daemons); `StaleHomeError` when one is homed by another daemon. A session nobody
    homes (a store used without a fleet, or a home released) passes."""
    if not sessions:
        return
    rows = await conn.fetch(
        "SELECT session_id, home FROM sessions WHERE session_id = ANY($1::text[])"
        " ORDER BY session_id FOR SHARE",
        sorted(sessions),
    )
    for row in rows:
        home = row[1]
        if home is not None and home != owner:
            raise StaleHomeError(str(row[0]), owner=owner, home=str(home))


async def ledger_lines(conn: Conn, ledger_ids: Sequence[str]) -> list[SealedLine]:
    rows = await conn.fetch(
        "SELECT l.ledger_id, l.seq, l.entry_hash, l.line FROM ledger_lines l"
        " JOIN unnest($1::text[]) WITH ORDINALITY AS wanted(ledger_id, n)"
        " ON l.ledger_id = wanted.ledger_id ORDER BY wanted.n, l.seq",
        list(ledger_ids),
    )
    return [SealedLine(str(r[0]), int(r[1]), str(r[2]), bytes(r[3])) for r in rows]


async def trim_ledger_lines(conn: Conn, synced: Mapping[str, int]) -> int:
    status = await conn.execute(
        "DELETE FROM ledger_lines l USING unnest($1::text[], $2::bigint[]) AS s(ledger_id, seq)"
        " WHERE l.ledger_id = s.ledger_id AND l.seq <= s.seq",
        list(synced),
        list(synced.values()),
    )
    return int(status.rsplit(" ", 1)[-1])


# -- escalations ----------------------------------------------------------------------------------


async def resolve(
    conn: Conn,
    turn_id: int,
    resolution: Resolution,
    seal: LineSeal = EMPTY,
    result: Mapping[str, object] | None = None,
) -> TurnRecord:
    """Carry out a decision on an escalated turn (the reasons recorded: `RESOLUTION_REASONS`;
    *result*, when given, replaces the turn's: who decided)."""
    state_value = await conn.fetchval(
        "SELECT state FROM turns WHERE turn_id = $1 FOR NO KEY UPDATE", turn_id
    )
    if state_value is None:
        raise UnknownTurnError(turn_id)
    state = TurnState(state_value)
    if state is not TurnState.ESCALATED:
        raise NotEscalatedError(turn_id, state.value)
    target = _RESOLVED[resolution]
    check_move(state, target, turn_id=turn_id)
    now = _now_us()
    stored = None if result is None else dumps(result)
    if target is TurnState.ACCEPTED:
        # A fresh attempt budget: a new round whose attempts count from 1 again.
        row = await conn.fetchrow(
            "UPDATE turns SET state = 'accepted', round = round + 1, attempt = 0,"
            " updated_us = $1, next_attempt_us = NULL, finished_us = NULL, verdict = NULL,"
            " reason_code = NULL, reason = NULL, fault_type = NULL, result = $3,"
            " resolution = NULL, resolution_by = NULL"
            f" WHERE turn_id = $2 RETURNING {TURN_COLUMNS}",
            now,
            turn_id,
            stored,
        )
        await conn.execute("SELECT pg_notify($1, $2)", WORK_CHANNEL, f"turn:{turn_id}")
    else:
        code, why = RESOLUTION_REASONS[resolution]
        row = await conn.fetchrow(
            "UPDATE turns SET state = $1, updated_us = $2, finished_us = $2,"
            " verdict = 'TERMINATE', reason_code = $3, reason = $4,"
            " result = coalesce($6::bytea, result), resolution = NULL, resolution_by = NULL"
            " WHERE turn_id = $5"
            f" RETURNING {TURN_COLUMNS}",
            target.value,
            now,
            code,
            why,
            turn_id,
            stored,
        )
    assert row is not None
    await put_ledger_lines(conn, seal.seal())  # the turn moved: its lines take their seqs now
    return turn_from_row(row_values(row), await _attempts_of(conn, turn_id))


# -- listings -------------------------------------------------------------------------------------


async def list_turns(conn: Conn, where: TurnFilter, after: int, limit: int) -> TurnPage:
    rows = await conn.fetch(LIST_TURNS, *list_turns_args(where, after, limit + 1))
    more = len(rows) > limit
    turns = await _turns_from_rows(conn, rows[:limit])
    return TurnPage(turns=tuple(turns), next_after=turns[-1].turn_id if more else None)


async def counts(conn: Conn) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*) FROM turns GROUP BY state")
    return {str(r[0]): int(r[1]) for r in rows}
