"""A new turn's row and the session's turn numbers it takes: what `accept` does for one turn
(`operations.accept`) and for a batch of them (`batches.accept_many`); its record is
`supervisor.store.rows.accepted`."""

from __future__ import annotations

import sqlite3
from typing import Final

from supervisor.store.protocol import NewTurn
from supervisor.store.rows import claim_of
from supervisor.wire.turn_spec import InstructionSpec, encode_spec

__all__ = ["INSERT_TURN", "take_numbers", "turn_values"]

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
