"""The accepts and the endings of one pass as one set of statements (the turn core's hot path
on SQLite).

`accept_many` accepts the batch's new turns with one statement for the numbers of all their
sessions, one ``executemany`` for their rows and one query for their ids, however many
sessions the pass holds: what `operations.accept` does for one turn with two statements.

`operations.finish` ends one turn with six statements (the fence, the attempts, two ledger
lines, the update, the attempts read back). Under load a batch of the committer holds dozens
of endings; `finish_many` ends them all with one statement per step: one fence read for every
turn, one ``executemany`` each for the attempts, the ledger lines and the updates, and the rows
read back in two queries. Same checks, same rows, same records as `operations.finish`.

An ending the checks refuse (a stale claim, an illegal move, an unknown turn) gets its error
and writes nothing; the others go on. A failure after the first write (a ledger line that
differs from the one kept at its seq) raises: the engine rolls the batch back and runs it
again op by op, where each op fails alone (`SqliteTurnStore._run_batch`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import FINAL_STATES
from supervisor.store.fencing import FenceRow, check_finish, stored_attempt, with_start
from supervisor.store.grouping import Accept, Finish
from supervisor.store.protocol import Accepted, TurnRecord
from supervisor.store.rows import (
    accepted,
    attempt_from_row,
    attempt_row,
    ending_values,
    loads,
    turn_from_row,
)
from supervisor.store.sqlite.new_turns import insert_turns, take_numbers_many, turn_values
from supervisor.store.sqlite.operations import (
    PUT_ATTEMPT,
    now_us,
    put_ledger_lines,
    raise_not_open,
)
from supervisor.store.sqlite.schema import ATTEMPT_COLUMNS, TURN_COLUMNS

__all__ = ["accept_many", "finish_many"]

_CHUNK: Final = 500  # bound parameters per IN (...) list

_PUT_LINE: Final = (
    "INSERT INTO ledger_lines(ledger_id, seq, entry_hash, line) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(ledger_id, seq) DO NOTHING"
)
_END: Final = (
    "UPDATE turns SET state = ?, attempt = max(attempt, ?), updated_us = ?, finished_us = ?,"
    " next_attempt_us = NULL, verdict = ?, reason_code = ?, reason = ?, fault_type = ?,"
    " result = ?, owner = NULL, lease_until_us = NULL WHERE turn_id = ?"
)


def accept_many(conn: sqlite3.Connection, items: Sequence[Accept]) -> list[Accepted | Exception]:
    """Accept every turn of *items* in the open transaction, numbered per session in their
    order; per item, what it got (the error of a session that is unknown or closed)."""
    by_session: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_session.setdefault(item.new.session_id, []).append(index)
    results: dict[int, Accepted | Exception] = {}
    now = now_us()
    firsts = take_numbers_many(conn, {sid: len(indexes) for sid, indexes in by_session.items()})
    rows: list[tuple[object, ...]] = []
    numbered: list[tuple[int, int]] = []  # (index in items, turn number), in the rows' order
    for session_id, indexes in by_session.items():
        first = firsts.get(session_id)
        if first is None:
            try:
                raise_not_open(conn, session_id)
            except Exception as exc:  # every accept of that session gets it
                results.update(dict.fromkeys(indexes, exc))
            continue
        for i, n in zip(indexes, range(first, first + len(indexes)), strict=True):
            item = items[i]
            rows.append(turn_values(item.new, n, now, item.claim_for, item.lease_ms))
            numbered.append((i, n))
    if rows:
        ids = insert_turns(conn, rows)
        for i, n in numbered:
            item = items[i]
            results[i] = accepted(
                item.new,
                ids[(item.new.session_id, n)],
                n,
                now,
                claim_for=item.claim_for,
                lease_ms=item.lease_ms,
            )
    return [results[i] for i in range(len(items))]


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _chunks(ids: Sequence[int]) -> list[Sequence[int]]:
    return [ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)]


def finish_many(conn: sqlite3.Connection, items: Sequence[Finish]) -> list[TurnRecord | Exception]:
    """End every turn of *items* (distinct turns) in the open transaction; per item, its
    record or the error that refused it. Raises when the batch must run op by op instead."""
    ids = [f.claim.turn_id for f in items]
    fences: dict[int, tuple[str, str | None, int, int, int]] = {}
    for chunk in _chunks(ids):
        for turn_id, state, owner, token, round_, attempt in conn.execute(
            f"SELECT turn_id, state, owner, token, round, attempt FROM turns WHERE turn_id IN"
            f" ({_marks(len(chunk))})",
            chunk,
        ):
            fences[int(turn_id)] = (str(state), owner, int(token), int(round_), int(attempt))
    results: list[TurnRecord | Exception | None] = []
    ended: list[int] = []  # read back
    built: list[tuple[int, Finish, tuple[object, ...], int]] = []  # built from what is known
    attempt_rows: list[tuple[object, ...]] = []
    lines: list[SealedLine] = []
    updates: list[tuple[object, ...]] = []
    now = now_us()
    for f in items:
        claim = f.claim
        fence = fences.get(claim.turn_id)
        try:
            round_ = _checked(f, fence)
        except Exception as exc:  # refused: this ending writes nothing
            results.append(exc)
            continue
        assert fence is not None
        written = with_start(f.attempts, f.started)
        values = (*ending_values(f.ending, f.attempts, now), claim.turn_id)
        numbers = {a.attempt for a in written}
        if round_ == 0 and numbers >= set(range(1, fence[4] + 1)):
            # Its first round, and these rows replace every attempt row it has: the record
            # is known without reading it back (the usual ending, on the hot path).
            built.append((len(results), f, values, fence[4]))
        else:
            ended.append(len(results))
        results.append(None)  # the record, once built or read back
        attempt_rows.extend(attempt_row(claim.turn_id, round_, a) for a in written)
        lines.extend(f.lines.seal())  # its fence held: its lines take their seqs now
        updates.append(values)
    if attempt_rows:
        conn.executemany(PUT_ATTEMPT, attempt_rows)
    if lines:
        before = conn.total_changes
        conn.executemany(_PUT_LINE, [(x.ledger_id, x.seq, x.entry_hash, x.line) for x in lines])
        if conn.total_changes - before != len(lines):  # some were kept before: the same?
            put_ledger_lines(conn, lines)  # raises ValueError on a different line
    if updates:
        conn.executemany(_END, updates)
    if ended:
        back = _read_back(conn, [items[i] for i in ended])
        for index, turn in zip(ended, back, strict=True):
            results[index] = turn
    for index, f, values, stored_attempt_number in built:
        results[index] = _known(f, values, stored_attempt_number, now)
    return [r for r in results if r is not None]


def _known(
    f: Finish, values: tuple[object, ...], stored_attempt_number: int, now: int
) -> TurnRecord:
    """The ended turn as `_read_back` would read it: the claim's turn with the ending's columns
    (*values*, as bound to `_END`) and its attempts as stored."""
    turn = f.claim.turn
    ending = f.ending
    attempt = values[1]
    blob = values[8]
    assert isinstance(attempt, int)
    assert isinstance(blob, bytes)
    return TurnRecord(
        turn_id=turn.turn_id,
        session_id=turn.session_id,
        turn_number=turn.turn_number,
        kind=turn.kind,
        spec=turn.spec,
        idempotency_key=turn.idempotency_key,
        state=ending.state,
        attempt=max(stored_attempt_number, attempt),
        accepted_us=turn.accepted_us,
        updated_us=now,
        next_attempt_us=None,
        finished_us=now if ending.state in FINAL_STATES else None,
        verdict=ending.verdict,
        reason_code=ending.reason_code,
        reason=ending.reason,
        fault_type=ending.fault_type,
        result=loads(blob),
        attempts=tuple(
            stored_attempt(a)
            for a in sorted(with_start(f.attempts, f.started), key=lambda a: a.attempt)
        ),
        owner=None,
        token=f.claim.token,
    )


def _checked(f: Finish, fence: tuple[str, str | None, int, int, int] | None) -> int:
    """The checks of `operations.finish` (`fencing.check_finish`); the turn's round."""
    row: FenceRow | None = None if fence is None else fence[:4]
    return check_finish(f.claim, row, f.ending, f.started)


def _read_back(conn: sqlite3.Connection, items: Sequence[Finish]) -> list[TurnRecord]:
    """The ended turns as records (their rows and attempts in a few queries)."""
    ids = [f.claim.turn_id for f in items]
    rows: dict[int, tuple[object, ...]] = {}
    attempts: dict[int, list[AttemptRecord]] = {}
    for chunk in _chunks(ids):
        marks = _marks(len(chunk))
        for row in conn.execute(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE turn_id IN ({marks})", chunk
        ):
            rows[int(row[0])] = row
        for row in conn.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE turn_id IN ({marks})"
            " ORDER BY turn_id, round, attempt",
            chunk,
        ):
            attempts.setdefault(int(row[0]), []).append(attempt_from_row(row))
    return [
        turn_from_row(
            rows[f.claim.turn_id],
            tuple(attempts.get(f.claim.turn_id, ())),
            spec=f.claim.turn.spec,
        )
        for f in items
    ]
