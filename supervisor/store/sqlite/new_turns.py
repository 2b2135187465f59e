"""A new turn's row and the session's turn numbers it takes: what `accept` does for one turn
(`operations.accept`) and for a batch of them (`batches.accept_many`); its record is
`supervisor.store.rows.accepted`."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Final

import orjson

from supervisor.store.protocol import NewTurn
from supervisor.store.rows import claim_of
from supervisor.store.sqlite.turns_table import mark_session_bounds
from supervisor.wire.turn_spec import InstructionSpec, encode_spec

__all__ = ["INSERT_TURN", "insert_turns", "take_numbers", "take_numbers_many", "turn_values"]

INSERT_TURN: Final = (
    "INSERT INTO turns(session_id, turn_number, kind, command_type, spec, idempotency_key,"
    " state, accepted_us, updated_us, owner, token, lease_until_us)"
    " VALUES (?, ?, ?, ?, ?, ?, 'accepted', ?, ?, ?, ?, ?)"
)


def take_numbers(conn: sqlite3.Connection, session_id: str, count: int) -> int | None:
    """Take the open session's next *count* turn numbers in one statement; the first of them,
    or None when no open session matched (`operations.raise_not_open` says why)."""
    taken = conn.execute(
        "UPDATE sessions SET turns = turns + ? WHERE session_id = ? AND state = 'open'"
        " RETURNING turns",
        (count, session_id),
    ).fetchall()
    return int(taken[0][0]) - count + 1 if taken else None


#: Every open session of a pass takes its numbers in this one statement (its parameter: a
#: JSON object of session id -> count), instead of one statement per session.
_TAKE_MANY: Final = (
    "UPDATE sessions SET turns = turns + j.value FROM json_each(?) AS j"
    " WHERE sessions.session_id = j.key AND sessions.state = 'open'"
    " RETURNING sessions.session_id, sessions.turns"
)


def take_numbers_many(conn: sqlite3.Connection, counts: Mapping[str, int]) -> dict[str, int]:
    """`take_numbers` for several sessions at once (*counts*: how many numbers each takes):
    the first number each open session took; a session that is not open is left out."""
    taken = conn.execute(_TAKE_MANY, (orjson.dumps(dict(counts)).decode(),)).fetchall()
    return {str(sid): int(turns) - counts[str(sid)] + 1 for sid, turns in taken}


def insert_turns(
    conn: sqlite3.Connection, rows: Sequence[tuple[object, ...]]
) -> dict[tuple[str, int], int]:
    """Insert the rows (`turn_values` each) with one ``executemany`` and mark their sessions'
    bounds (`turns_table.mark_session_bounds`); the turn id of each by ``(session_id,
    turn_number)``. The ids are read back in one query: the table's ids only grow
    (AUTOINCREMENT), so the rows above the highest id given out before are these."""
    before = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'turns'").fetchone()
    conn.executemany(INSERT_TURN, rows)
    ids: dict[tuple[str, int], int] = {}
    bounds: dict[str, tuple[int, int]] = {}
    for sid, number, turn_id in conn.execute(
        "SELECT session_id, turn_number, turn_id FROM turns WHERE turn_id > ? ORDER BY turn_id",
        (0 if before is None else int(before[0]),),
    ):
        session_id, taken = str(sid), int(turn_id)
        ids[(session_id, int(number))] = taken
        first = bounds.get(session_id)
        bounds[session_id] = (taken if first is None else first[0], taken)
    mark_session_bounds(conn, bounds)
    return ids


def turn_values(
    new: NewTurn, number: int, now: int, claim_for: str | None, lease_ms: int
) -> tuple[object, ...]:
    """The values of `INSERT_TURN` for *new* as turn *number* of its session."""
    spec = new.spec
    command = spec.command_type.value if isinstance(spec, InstructionSpec) else None
    token, lease = claim_of(now, claim_for, lease_ms)
    return (
        new.session_id,
        number,
        new.kind.value,
        command,
        encode_spec(spec),
        new.idempotency_key,
        now,
        now,
        claim_for,
        token,
        lease,
    )
