"""A new turn's row, the session's turn numbers it takes, and its record: what `accept` does
for one turn (`operations.accept`) and for a batch of them (`batches.accept_many`)."""

from __future__ import annotations

import sqlite3
from typing import Final

from sandbox.policy.lifecycle import TurnState
from supervisor.store.protocol import Accepted, Claim, NewTurn, TurnRecord
from supervisor.wire.turn_spec import InstructionSpec, encode_spec

__all__ = ["INSERT_TURN", "accepted", "take_numbers", "turn_values"]

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


def _claim_of(now: int, claim_for: str | None, lease_ms: int) -> tuple[int, int | None]:
    return (1, now + lease_ms * 1000) if claim_for is not None else (0, None)


def turn_values(
    new: NewTurn, number: int, now: int, claim_for: str | None, lease_ms: int
) -> tuple[object, ...]:
    """The values of `INSERT_TURN` for *new* as turn *number* of its session."""
    spec = new.spec
    command = spec.command_type.value if isinstance(spec, InstructionSpec) else None
    token, lease = _claim_of(now, claim_for, lease_ms)
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


def accepted(
    new: NewTurn, turn_id: int, number: int, now: int, *, claim_for: str | None, lease_ms: int
) -> Accepted:
    """The new turn as a record (built here instead of read back), and its claim."""
    token, lease = _claim_of(now, claim_for, lease_ms)
    turn = TurnRecord(
        turn_id=turn_id,
        session_id=new.session_id,
        turn_number=number,
        kind=new.kind,
        spec=new.spec,
        idempotency_key=new.idempotency_key,
        state=TurnState.ACCEPTED,
        attempt=0,
        accepted_us=now,
        updated_us=now,
        owner=claim_for,
        token=token,
    )
    if claim_for is None or lease is None:
        return Accepted(turn=turn, created=True)
    claim = Claim(turn=turn, owner=claim_for, token=token, lease_until_us=lease)
    return Accepted(turn=turn, created=True, claim=claim)
