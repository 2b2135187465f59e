"""The turn store's operations on SQLite: each a plain function of a connection, run by the
engine inside a transaction (writes on the commit thread, reads on the read thread).

Design notes
------------
* Every operation checks before it writes: a fenced write compares the claim's owner and token
  with the row (`StaleClaimError`), a state change goes through `check_move`
  (`IllegalTransition`); the engine's SAVEPOINT is only a second line of defence.
* The hot path (accept + claim, start_attempt, finish) runs one statement per step where it can
  (``UPDATE ... RETURNING``) and builds records from what it wrote rather than reading back.
  The sqlite3 module keeps every statement prepared (the SQL texts are constants, or built from
  a few shapes for claim filters and listings).
* ``now`` is read inside each operation, on the commit thread, so leases and backoffs are
  compared with the time the transaction really runs.
* Rows come back as the sqlite3 module returns them; the converters below assert the types the
  column lists in `schema` promise.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, NoReturn

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
    dumps,
    ending_values,
    session_from_row,
    turn_from_row,
)
from supervisor.store.sealing import EMPTY, LineSeal
from supervisor.store.sqlite.new_turns import INSERT_TURN, take_numbers, turn_values
from supervisor.store.sqlite.schema import (
    ATTEMPT_COLUMNS,
    SESSION_COLUMNS,
    TURN_COLUMNS,
    UNFINISHED,
)
from supervisor.store.sqlite.turn_query import turn_conditions
from supervisor.store.sqlite.turns_table import mark_session_bounds
from supervisor.store.turn_filter import TurnFilter

__all__ = [
    "PUT_ATTEMPT",
    "accept",
    "claim_turns",
    "close_session",
    "counts",
    "find_turn",
    "finish",
    "get_session",
    "get_turn",
    "list_sessions",
    "list_turns",
    "now_us",
    "open_session",
    "put_ledger_lines",
    "raise_not_open",
    "record_attempt",
    "recover",
    "release",
    "renew",
    "resolve",
    "start_attempt",
]

#: a row as the sqlite3 module returns it (typed by the column lists in `schema`)
_Row = tuple[Any, ...]

_UNFINISHED_SQL: Final = f"state IN ({', '.join(repr(s) for s in UNFINISHED)})"
_RESOLVED: Final = {
    Resolution.RETRY: TurnState.ACCEPTED,
    Resolution.TERMINATE: TurnState.TERMINATED,
    Resolution.CANCEL: TurnState.CANCELLED,
}


def now_us() -> int:
    return time.time_ns() // 1000


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


# -- operations (each runs on a connection inside a transaction) -------------------------------


def open_session(conn: sqlite3.Connection, new: NewSession) -> SessionRecord:
    try:
        rows = conn.execute(
            f"INSERT INTO sessions({SESSION_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, 'open', ?, NULL, 0, ?, ?)"
            f" RETURNING {SESSION_COLUMNS}",
            (
                new.session_id,
                new.package_id,
                new.tier,
                new.work_order_id,
                new.workspace,
                now_us(),
                new.tenant,
                new.priority,
            ),
        ).fetchall()
    except sqlite3.IntegrityError:
        raise ValueError(f"session {new.session_id!r} already exists") from None
    return session_from_row(rows[0])


def close_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord:
    rows = conn.execute(
        "UPDATE sessions SET state = 'closed', closed_us = ? WHERE session_id = ?"
        f" AND state = 'open' RETURNING {SESSION_COLUMNS}",
        (now_us(), session_id),
    ).fetchall()
    return session_from_row(rows[0]) if rows else get_session(conn, session_id)


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord:
    row = conn.execute(
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None:
        raise UnknownSessionError(session_id)
    return session_from_row(row)


def list_sessions(conn: sqlite3.Connection, state: SessionState | None) -> list[SessionRecord]:
    sql = f"SELECT {SESSION_COLUMNS} FROM sessions"
    args: tuple[str, ...] = ()
    if state is not None:
        sql += " WHERE state = ?"
        args = (state.value,)
    rows = conn.execute(sql + " ORDER BY opened_us, session_id", args).fetchall()
    return [session_from_row(r) for r in rows]


def _attempts_of(conn: sqlite3.Connection, turn_id: int) -> tuple[AttemptRecord, ...]:
    rows = conn.execute(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE turn_id = ? ORDER BY round, attempt",
        (turn_id,),
    ).fetchall()
    return tuple(attempt_from_row(r) for r in rows)


def _turns_from_rows(conn: sqlite3.Connection, rows: list[_Row]) -> list[TurnRecord]:
    """Turn rows (`TURN_COLUMNS`) as records, their attempts read in a few queries."""
    found: dict[int, list[AttemptRecord]] = {}
    ids = [int(r[0]) for r in rows]
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        for a in conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE turn_id IN ({_marks(chunk)})"
            " ORDER BY turn_id, round, attempt",
            chunk,
        ):
            found.setdefault(int(a[0]), []).append(attempt_from_row(a))
    return [turn_from_row(r, tuple(found.get(int(r[0]), ()))) for r in rows]


def get_turn(conn: sqlite3.Connection, turn_id: int) -> TurnRecord:
    row = conn.execute(f"SELECT {TURN_COLUMNS} FROM turns WHERE turn_id = ?", (turn_id,)).fetchone()
    if row is None:
        raise UnknownTurnError(turn_id)
    return turn_from_row(row, _attempts_of(conn, turn_id))


def find_turn(conn: sqlite3.Connection, session_id: str, key: str) -> TurnRecord | None:
    row = conn.execute(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = ? AND idempotency_key = ?",
        (session_id, key),
    ).fetchone()
    return None if row is None else turn_from_row(row, _attempts_of(conn, int(row[0])))


def accept(
    conn: sqlite3.Connection, new: NewTurn, claim_for: str | None, lease_ms: int
) -> Accepted:
    if new.idempotency_key is not None:
        first = find_turn(conn, new.session_id, new.idempotency_key)
        if first is not None:
            return Accepted(turn=first, created=False)
    number = take_numbers(conn, new.session_id, 1)
    if number is None:
        raise_not_open(conn, new.session_id)
    now = now_us()
    cur = conn.execute(INSERT_TURN, turn_values(new, number, now, claim_for, lease_ms))
    turn_id = cur.lastrowid
    assert turn_id is not None
    mark_session_bounds(conn, {new.session_id: (turn_id, turn_id)})
    return accepted(new, turn_id, number, now, claim_for=claim_for, lease_ms=lease_ms)


def raise_not_open(conn: sqlite3.Connection, session_id: str) -> NoReturn:
    """No open session *session_id* took a turn number: say why."""
    get_session(conn, session_id)  # raises UnknownSessionError
    raise SessionClosedError(session_id)


def _claims(conn: sqlite3.Connection, rows: list[_Row]) -> list[Claim]:
    rows = sorted(rows, key=lambda r: int(r[0]))  # RETURNING promises no order
    return [
        Claim(turn=t, owner=str(r[17]), token=t.token, lease_until_us=int(r[19]))
        for t, r in zip(_turns_from_rows(conn, rows), rows, strict=True)
    ]


def claim_turns(
    conn: sqlite3.Connection, owner: str, limit: int, lease_ms: int, only: ClaimFilter | None
) -> list[Claim]:
    now = now_us()
    where = [
        _UNFINISHED_SQL,
        "((owner IS NULL AND (state != 'waiting_retry' OR coalesce(next_attempt_us, 0) <= ?))"
        " OR (owner IS NOT NULL AND lease_until_us < ?))",
    ]
    args: list[object] = [owner, now + lease_ms * 1000, now, now]
    if only is not None:
        kinds = sorted(k.value for k in only.kinds)
        where.append(f"kind IN ({_marks(kinds)})")
        args.extend(kinds)
        if only.command_types is not None:
            types = sorted(only.command_types)
            where.append(f"(kind != 'instruction' OR command_type IN ({_marks(types)}))")
            args.extend(types)
        if only.process_sessions is not None:
            sessions = sorted(only.process_sessions)
            where.append(f"(kind != 'process' OR session_id IN ({_marks(sessions)}))")
            args.extend(sessions)
        if only.sessions is not None:
            homed = sorted(only.sessions)
            where.append(f"session_id IN ({_marks(homed)})")
            args.extend(homed)
    args.append(limit)
    rows = conn.execute(
        "UPDATE turns SET owner = ?, token = token + 1, lease_until_us = ? WHERE turn_id IN"
        f" (SELECT turn_id FROM turns WHERE {' AND '.join(where)} ORDER BY turn_id LIMIT ?)"
        f" RETURNING {TURN_COLUMNS}",
        args,
    ).fetchall()
    return _claims(conn, rows)


def recover(conn: sqlite3.Connection, owner: str, lease_ms: int) -> list[Claim]:
    rows = conn.execute(
        "UPDATE turns SET owner = ?, token = token + 1, lease_until_us = ?"
        f" WHERE {_UNFINISHED_SQL} RETURNING {TURN_COLUMNS}",
        (owner, now_us() + lease_ms * 1000),
    ).fetchall()
    return _claims(conn, rows)


def renew(conn: sqlite3.Connection, claims: tuple[Claim, ...], lease_ms: int) -> list[Claim]:
    until = now_us() + lease_ms * 1000
    kept: list[Claim] = []
    for claim in claims:
        cur = conn.execute(
            "UPDATE turns SET lease_until_us = ? WHERE turn_id = ? AND owner = ? AND token = ?",
            (until, claim.turn_id, claim.owner, claim.token),
        )
        if cur.rowcount:
            kept.append(replace(claim, lease_until_us=until))
    return kept


def release(conn: sqlite3.Connection, claim: Claim) -> None:
    conn.execute(
        "UPDATE turns SET owner = NULL, lease_until_us = NULL"
        " WHERE turn_id = ? AND owner = ? AND token = ?",
        (claim.turn_id, claim.owner, claim.token),
    )


def _fence(conn: sqlite3.Connection, claim: Claim) -> tuple[TurnState, int]:
    """The turn's state and round, if *claim* still holds it (`fencing.fence`)."""
    return fence(
        claim,
        conn.execute(
            "SELECT state, owner, token, round FROM turns WHERE turn_id = ?", (claim.turn_id,)
        ).fetchone(),
    )


PUT_ATTEMPT: Final = (
    f"INSERT OR REPLACE INTO attempts({ATTEMPT_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _put_attempts(
    conn: sqlite3.Connection, turn_id: int, round_: int, attempts: Sequence[AttemptRecord]
) -> None:
    rows = [attempt_row(turn_id, round_, a) for a in attempts]
    if len(rows) == 1:  # the usual case: one statement, no executemany machinery
        conn.execute(PUT_ATTEMPT, rows[0])
    elif rows:
        conn.executemany(PUT_ATTEMPT, rows)


def _after_write(
    conn: sqlite3.Connection,
    claim: Claim,
    rows: list[_Row],
    attempts: tuple[AttemptRecord, ...] | None,
) -> Claim:
    row = rows[0]
    turn = turn_from_row(row, _attempts_of(conn, claim.turn_id) if attempts is None else attempts)
    return Claim(turn=turn, owner=claim.owner, token=claim.token, lease_until_us=int(row[19]))


def start_attempt(conn: sqlite3.Connection, claim: Claim, attempt: AttemptRecord) -> Claim:
    state, round_ = _fence(conn, claim)
    check_move(state, TurnState.RUNNING, turn_id=claim.turn_id)
    rows = conn.execute(
        "UPDATE turns SET state = 'running', attempt = ?, updated_us = ?, next_attempt_us = NULL"
        f" WHERE turn_id = ? RETURNING {TURN_COLUMNS}",
        (attempt.attempt, now_us(), claim.turn_id),
    ).fetchall()
    _put_attempts(conn, claim.turn_id, round_, (attempt,))
    # A turn's first attempt ever: its attempts are this one (no read back).
    first = state is TurnState.ACCEPTED and round_ == 0
    return _after_write(conn, claim, rows, (stored_attempt(attempt),) if first else None)


def record_attempt(
    conn: sqlite3.Connection,
    claim: Claim,
    attempt: AttemptRecord,
    next_attempt_us: int,
    started: AttemptRecord | None = None,
) -> Claim:
    state, round_ = _fence(conn, claim)
    state = started_move(state, started, claim.turn_id)
    check_move(state, TurnState.WAITING_RETRY, turn_id=claim.turn_id)
    _put_attempts(conn, claim.turn_id, round_, with_start((attempt,), started))
    rows = conn.execute(
        "UPDATE turns SET state = 'waiting_retry', attempt = max(attempt, ?), updated_us = ?,"
        f" next_attempt_us = ? WHERE turn_id = ? RETURNING {TURN_COLUMNS}",
        (attempt.attempt, now_us(), next_attempt_us, claim.turn_id),
    ).fetchall()
    return _after_write(conn, claim, rows, None)


def finish(
    conn: sqlite3.Connection,
    claim: Claim,
    ending: TurnEnding,
    attempts: tuple[AttemptRecord, ...],
    *,
    seal: LineSeal = EMPTY,
    started: AttemptRecord | None = None,
) -> TurnRecord:
    state, round_ = _fence(conn, claim)
    state = started_move(state, started, claim.turn_id)
    check_move(state, ending.state, turn_id=claim.turn_id)
    _put_attempts(conn, claim.turn_id, round_, with_start(attempts, started))
    lines = seal.seal()  # the fence held: the lines take their seqs now, in this transaction
    if lines:
        put_ledger_lines(conn, lines)
    now = now_us()
    rows = conn.execute(
        "UPDATE turns SET state = ?, attempt = max(attempt, ?), updated_us = ?, finished_us = ?,"
        " next_attempt_us = NULL, verdict = ?, reason_code = ?, reason = ?, fault_type = ?,"
        " result = ?, owner = NULL, lease_until_us = NULL"
        f" WHERE turn_id = ? RETURNING {TURN_COLUMNS}",
        (*ending_values(ending, attempts, now), claim.turn_id),
    ).fetchall()
    # The spec never changes: the claim's copy saves parsing it again.
    return turn_from_row(rows[0], _attempts_of(conn, claim.turn_id), spec=claim.turn.spec)


def put_ledger_lines(conn: sqlite3.Connection, lines: Sequence[SealedLine]) -> None:
    """Keep sealed ledger lines (a line already kept under the same seq must be the same line:
    two different lines for one seq would fork the chain)."""
    for x in lines:
        kept = conn.execute(
            "INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(ledger_id, seq) DO NOTHING RETURNING seq",
            (x.ledger_id, x.seq, x.entry_hash, x.line),
        ).fetchone()
        if kept is None:
            row = conn.execute(
                "SELECT entry_hash FROM ledger_lines WHERE ledger_id = ? AND seq = ?",
                (x.ledger_id, x.seq),
            ).fetchone()
            if row is not None and row[0] != x.entry_hash:
                raise LedgerForkError(x.ledger_id, x.seq, "already has a different line")


def ledger_lines(conn: sqlite3.Connection, ledger_ids: Sequence[str]) -> list[SealedLine]:
    out: list[SealedLine] = []
    for ledger_id in ledger_ids:
        out.extend(
            SealedLine(ledger_id, int(seq), str(digest), bytes(line))
            for seq, digest, line in conn.execute(
                "SELECT seq, entry_hash, line FROM ledger_lines WHERE ledger_id = ? ORDER BY seq",
                (ledger_id,),
            )
        )
    return out


def trim_ledger_lines(conn: sqlite3.Connection, synced: Mapping[str, int]) -> int:
    trimmed = 0
    for ledger_id, seq in synced.items():
        trimmed += conn.execute(
            "DELETE FROM ledger_lines WHERE ledger_id = ? AND seq <= ?", (ledger_id, seq)
        ).rowcount
    return trimmed


def resolve(
    conn: sqlite3.Connection,
    turn_id: int,
    resolution: Resolution,
    seal: LineSeal = EMPTY,
    result: Mapping[str, object] | None = None,
) -> TurnRecord:
    """Carry out a decision on an escalated turn (the reasons recorded: `RESOLUTION_REASONS`;
    *result*, when given, replaces the turn's: who decided)."""
    row = conn.execute("SELECT state FROM turns WHERE turn_id = ?", (turn_id,)).fetchone()
    if row is None:
        raise UnknownTurnError(turn_id)
    state = TurnState(row[0])
    if state is not TurnState.ESCALATED:
        raise NotEscalatedError(turn_id, state.value)
    target = _RESOLVED[resolution]
    check_move(state, target, turn_id=turn_id)
    now = now_us()
    stored = None if result is None else dumps(result)
    if target is TurnState.ACCEPTED:
        # A fresh attempt budget: a new round whose attempts count from 1 again.
        sql = (
            "UPDATE turns SET state = 'accepted', round = round + 1, attempt = 0,"
            " updated_us = ?, next_attempt_us = NULL, finished_us = NULL, verdict = NULL,"
            " reason_code = NULL, reason = NULL, fault_type = NULL, result = ?"
            f" WHERE turn_id = ? RETURNING {TURN_COLUMNS}"
        )
        args: tuple[object, ...] = (now, stored, turn_id)
    else:
        code, why = RESOLUTION_REASONS[resolution]
        sql = (
            "UPDATE turns SET state = ?, updated_us = ?, finished_us = ?, verdict = 'TERMINATE',"
            " reason_code = ?, reason = ?, result = coalesce(?, result)"
            f" WHERE turn_id = ? RETURNING {TURN_COLUMNS}"
        )
        args = (target.value, now, now, code, why, stored, turn_id)
    rows = conn.execute(sql, args).fetchall()
    lines = seal.seal()  # the turn was escalated and moves: its lines take their seqs now
    if lines:
        put_ledger_lines(conn, lines)
    return turn_from_row(rows[0], _attempts_of(conn, turn_id))


def list_turns(conn: sqlite3.Connection, where: TurnFilter, after: int, limit: int) -> TurnPage:
    conditions, args = turn_conditions(where, after)
    args.append(limit + 1)
    rows = conn.execute(
        f"SELECT {TURN_COLUMNS} FROM turns WHERE {conditions} ORDER BY turn_id LIMIT ?", args
    ).fetchall()
    more = len(rows) > limit
    turns = _turns_from_rows(conn, rows[:limit])
    return TurnPage(turns=tuple(turns), next_after=turns[-1].turn_id if more else None)


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {
        str(state): int(n)
        for state, n in conn.execute("SELECT state, count(*) FROM turns GROUP BY state")
    }
