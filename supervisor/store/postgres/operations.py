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
* The reads (sessions, turns, listings) are in `reads`, the claims and renewals in `claims`,
  the ledger lines and the homes their appends hold in `ledger_lines`; this module keeps the
  writes that move a turn or a session (accept, the fenced writes, resolve), each hot write
  trying its one statement from `one_trip` first and keeping the long way here, and it is the
  one namespace the engine calls (``ops.X``: it re-exports the others).
* Rows come back as `asyncpg.Record`; they are handed to the shared converters
  (`supervisor.store.rows`) as tuples, whose asserts check the column types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import asyncpg

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState, check_move
from supervisor.errors import NotEscalatedError, SessionClosedError, UnknownTurnError
from supervisor.store.fencing import fence, started_move, stored_attempt, with_start
from supervisor.store.postgres.batches import note_xid
from supervisor.store.postgres.claims import claim_turns, recover, release, renew, renew_held
from supervisor.store.postgres.ledger_lines import (
    check_homes,
    ledger_lines,
    put_ledger_lines,
    trim_ledger_lines,
)
from supervisor.store.postgres.one_trip import (
    ATTEMPT_UPSERT,
    accept_row,
    finish_row,
    retry_row,
    start_row,
)
from supervisor.store.postgres.reads import (
    attempts_of,
    counts,
    find_turn,
    get_session,
    get_turn,
    list_sessions,
    list_turns,
    now_us,
    row_values,
)
from supervisor.store.postgres.schema import ATTEMPT_COLUMNS, SESSION_COLUMNS, TURN_COLUMNS
from supervisor.store.protocol import (
    RESOLUTION_REASONS,
    Accepted,
    Claim,
    NewSession,
    NewTurn,
    Resolution,
    SessionRecord,
    TurnEnding,
    TurnRecord,
)
from supervisor.store.rows import (
    accepted,
    attempt_row,
    claim_of,
    dumps,
    ending_values,
    session_from_row,
    turn_from_row,
)
from supervisor.store.sealing import EMPTY, LineSeal, sessions_of
from supervisor.wire.turn_spec import InstructionSpec, encode_spec

# The engine calls every operation through this module (``ops.X``); the reads, the claims and
# the ledger lines live in modules of their own and are re-exported here.
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
    "put_ledger_lines",
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

_RESOLVED: Final = {
    Resolution.RETRY: TurnState.ACCEPTED,
    Resolution.TERMINATE: TurnState.TERMINATED,
    Resolution.CANCEL: TurnState.CANCELLED,
}


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
        now_us(),
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
        now_us(),
        session_id,
    )
    return (
        session_from_row(row_values(row))
        if row is not None
        else await get_session(conn, session_id)
    )


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
    now = now_us()
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
    return await attempts_of(conn, int(row[0]))


def _claim_after(claim: Claim, row: asyncpg.Record, attempts: tuple[AttemptRecord, ...]) -> Claim:
    turn = turn_from_row(row_values(row), attempts, spec=claim.turn.spec)
    return Claim(turn=turn, owner=claim.owner, token=claim.token, lease_until_us=int(row[19]))


async def start_attempt(conn: Conn, claim: Claim, attempt: AttemptRecord) -> Claim:
    started = await start_row(conn, claim, attempt, now=now_us())
    if started is not None:  # one statement (one_trip.py)
        return _claim_after(claim, started, await attempts_after(conn, started, (attempt,)))
    # the long way: the precise error, or the write the one statement would not make
    state, round_ = await _fence(conn, claim)
    check_move(state, TurnState.RUNNING, turn_id=claim.turn_id)
    row = await conn.fetchrow(
        "UPDATE turns SET state = 'running', attempt = $1, updated_us = $2,"
        f" next_attempt_us = NULL WHERE turn_id = $3 RETURNING {TURN_COLUMNS}",
        attempt.attempt,
        now_us(),
        claim.turn_id,
    )
    assert row is not None
    await _put_attempts(conn, claim.turn_id, round_, (attempt,))
    first = state is TurnState.ACCEPTED and round_ == 0
    attempts = (stored_attempt(attempt),) if first else await attempts_of(conn, claim.turn_id)
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
        now=now_us(),
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
        now_us(),
        next_attempt_us,
        claim.turn_id,
    )
    assert row is not None
    return _claim_after(claim, row, await attempts_of(conn, claim.turn_id))


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
    now = now_us()
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
        row_values(row), await attempts_of(conn, claim.turn_id), spec=claim.turn.spec
    )


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
    now = now_us()
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
    return turn_from_row(row_values(row), await attempts_of(conn, turn_id))
