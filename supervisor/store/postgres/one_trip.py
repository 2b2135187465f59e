"""The writes every turn makes (accept, start, retry, finish), one statement (round trip) each.

A turn on PostgreSQL used to cost about fourteen statements, each a round trip and a parse of
the answer in the daemon: accept was a session update, an insert and a notify; finish was a
fence (``SELECT ... FOR UPDATE``), the attempts' upsert, the sessions' ``FOR SHARE`` home check,
the ledger lines, their heads, the turn's update and a read of its attempts. Here each is one
statement of data-modifying CTEs (which also reads the transaction id the batch needs before
its commit, `batches.note_xid`), in which every write depends on the one that proves the
right to make it:

* finish: the turn's ``UPDATE`` is the fence (its ``WHERE`` holds owner, token and the states
  from which the ending is a legal move, and that no session of the ledger lines is homed by
  another daemon, read ``FOR SHARE`` first: the same locks in the same order as the accept of a
  turn of that session). The attempts are written only from the row that update returned; the
  ledger lines are sealed after it came back, and kept by a second statement
  (`operations.put_ledger_lines`): a refused ending never takes a seq.
* retry: the same fenced ``UPDATE`` to waiting_retry feeds the attempt rows.
* start (an attempt that outlived the deferral, `supervisor/turns/starts.py`): the same
  fenced ``UPDATE`` to running feeds the attempt's row.
* accept: the session's counter ``UPDATE`` (only while it is open) feeds the turn's ``INSERT``,
  which feeds the ``pg_notify``.

When the statement returns no row nothing was written, and the caller runs the op the long way
(`operations`), which raises the precise error (unknown turn, stale claim, illegal move, stale
home, unknown or closed session) or, should the short way have refused a legal write, makes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import asyncpg

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnState
from supervisor.store.fencing import finish_from
from supervisor.store.postgres.batches import note_xid
from supervisor.store.postgres.schema import ATTEMPT_COLUMNS, TURN_COLUMNS
from supervisor.store.protocol import Claim, NewTurn, TurnEnding
from supervisor.store.rows import dumps, ending_values

__all__ = [
    "ATTEMPT_TYPES",
    "ATTEMPT_UPSERT",
    "accept_row",
    "attempt_arrays",
    "finish_row",
]

Conn = asyncpg.Connection

#: How an attempt row already kept (its start) takes the newer values (shared with the long way).
ATTEMPT_UPSERT: Final = (
    " ON CONFLICT (turn_id, round, attempt) DO UPDATE SET started_us = excluded.started_us,"
    " executor_id = excluded.executor_id, instruction_id = excluded.instruction_id,"
    " finished_us = excluded.finished_us, outcome = excluded.outcome,"
    " fault_type = excluded.fault_type, exit_code = excluded.exit_code,"
    " decision = excluded.decision, reason_code = excluded.reason_code,"
    " reason = excluded.reason, detail = excluded.detail, duration_ms = excluded.duration_ms,"
    " delay_ms = excluded.delay_ms, extra = excluded.extra"
)

#: The SQL types of `attempt_arrays`' arrays, in `ATTEMPT_COLUMNS` order after turn and round.
ATTEMPT_TYPES: Final = (
    "bigint", "bigint", "text", "text", "bigint", "text", "text", "bigint", "text", "text",
    "text", "text", "bigint", "bigint", "bytea",
)  # fmt: skip
_ATTEMPT_FIELDS: Final = (
    "attempt", "started_us", "executor_id", "instruction_id", "finished_us", "outcome",
    "fault_type", "exit_code", "decision", "reason_code", "reason", "detail", "duration_ms",
    "delay_ms",
)  # fmt: skip


def _attempt_rows(first: int) -> str:
    """The CTE ``a``: upsert the attempt rows bound as arrays from parameter *first* on, for
    the turn ``t`` returned (nothing when the fenced update returned no row)."""
    arrays = ", ".join(f"${first + i}::{kind}[]" for i, kind in enumerate(ATTEMPT_TYPES))
    return (
        f"a AS (INSERT INTO attempts({ATTEMPT_COLUMNS}) SELECT t.turn_id, t.round, u.*"
        f" FROM t, unnest({arrays}) AS u{ATTEMPT_UPSERT} RETURNING 1)"
    )


def attempt_arrays(attempts: Sequence[AttemptRecord]) -> list[list[object]]:
    """*attempts* as the arrays `_attempt_rows` binds."""
    out: list[list[object]] = [[getattr(a, name) for a in attempts] for name in _ATTEMPT_FIELDS]
    out.append([dumps(a.extra) if a.extra else None for a in attempts])
    return out


_RETRY: Final = (
    "WITH t AS (UPDATE turns SET state = 'waiting_retry', attempt = greatest(attempt, $1),"
    " updated_us = $2, next_attempt_us = $3 WHERE turn_id = $4 AND owner = $5 AND token = $6"
    f" AND state = ANY($7::text[]) RETURNING {TURN_COLUMNS}),"
    f" {_attempt_rows(8)}"
    " SELECT t.*, (SELECT count(*) FROM a), txid_current() FROM t"
)

_FINISH: Final = (
    "WITH h AS (SELECT session_id, home FROM sessions WHERE session_id = ANY($29::text[])"
    " ORDER BY session_id FOR SHARE),"
    " t AS (UPDATE turns SET state = $1, attempt = greatest(attempt, $2), updated_us = $3,"
    " finished_us = $4, next_attempt_us = NULL, verdict = $5, reason_code = $6, reason = $7,"
    " fault_type = $8, result = $9, owner = NULL, lease_until_us = NULL"
    " WHERE turn_id = $10 AND owner = $11 AND token = $12 AND state = ANY($13::text[])"
    " AND NOT EXISTS (SELECT 1 FROM h WHERE h.home IS NOT NULL AND h.home <> $11)"
    f" RETURNING {TURN_COLUMNS}),"
    f" {_attempt_rows(14)}"
    " SELECT t.*, (SELECT count(*) FROM a), txid_current() FROM t"
)

_START: Final = (
    "WITH t AS (UPDATE turns SET state = 'running', attempt = $1, updated_us = $2,"
    " next_attempt_us = NULL WHERE turn_id = $3 AND owner = $4 AND token = $5"
    f" AND state = ANY($6::text[]) RETURNING {TURN_COLUMNS}),"
    f" a AS (INSERT INTO attempts({ATTEMPT_COLUMNS})"
    " SELECT t.turn_id, t.round, $1, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,"
    f" $19, $20 FROM t{ATTEMPT_UPSERT} RETURNING 1)"
    " SELECT t.*, (SELECT count(*) FROM a), txid_current() FROM t"
)

_ACCEPT: Final = (
    "WITH s AS (UPDATE sessions SET turns = turns + 1 WHERE session_id = $1 AND state = 'open'"
    " RETURNING turns),"
    " i AS (INSERT INTO turns(session_id, turn_number, kind, command_type, spec,"
    " idempotency_key, state, accepted_us, updated_us, owner, token, lease_until_us)"
    " SELECT $1, s.turns, $2, $3, $4, $5, 'accepted', $6, $6, $7, $8, $9 FROM s"
    " RETURNING turn_id, turn_number),"
    " n AS (SELECT pg_notify($10, 'turn:' || i.turn_id) FROM i WHERE $7::text IS NULL)"
    " SELECT i.turn_id, i.turn_number, (SELECT count(*) FROM n), txid_current() FROM i"
)


async def finish_row(
    conn: Conn,
    claim: Claim,
    ending: TurnEnding,
    *,
    attempts: tuple[AttemptRecord, ...],
    written: tuple[AttemptRecord, ...],
    sessions: Sequence[str],
    started: bool,
    now: int,
) -> asyncpg.Record | None:
    """The finished turn's row (`TURN_COLUMNS`), or None when nothing was written (the long
    way decides). *written*: the attempt rows to upsert; *sessions*: those the ending's ledger
    lines append to (none of them may be homed by another daemon); *started*: an attempt start
    not written before comes with the ending. The caller seals and keeps the ledger lines once
    this row came back: the fence held."""
    states = finish_from(ending.state, started)
    if not states:
        return None
    row = await conn.fetchrow(
        _FINISH,
        *ending_values(ending, attempts, now),
        claim.turn_id,
        claim.owner,
        claim.token,
        list(states),
        *attempt_arrays(written),
        list(sessions),
    )
    if row is None:
        return None
    note_xid(int(row[22]))
    return row


async def start_row(
    conn: Conn, claim: Claim, attempt: AttemptRecord, *, now: int
) -> asyncpg.Record | None:
    """The running turn's row (`TURN_COLUMNS`) once *attempt* started, or None when nothing
    was written (the long way decides)."""
    row = await conn.fetchrow(
        _START,
        attempt.attempt,
        now,
        claim.turn_id,
        claim.owner,
        claim.token,
        list(finish_from(TurnState.RUNNING, False)),
        attempt.started_us,
        attempt.executor_id,
        attempt.instruction_id,
        attempt.finished_us,
        attempt.outcome,
        attempt.fault_type,
        attempt.exit_code,
        attempt.decision,
        attempt.reason_code,
        attempt.reason,
        attempt.detail,
        attempt.duration_ms,
        attempt.delay_ms,
        dumps(attempt.extra) if attempt.extra else None,
    )
    if row is None:
        return None
    note_xid(int(row[22]))
    return row


async def retry_row(
    conn: Conn,
    claim: Claim,
    *,
    attempt: AttemptRecord,
    written: tuple[AttemptRecord, ...],
    next_attempt_us: int,
    started: bool,
    now: int,
) -> asyncpg.Record | None:
    """The turn's row (`TURN_COLUMNS`) once *attempt* failed and waits for its retry (the rows
    *written*, its deferred start included), or None when nothing was written."""
    states = finish_from(TurnState.WAITING_RETRY, started)
    if not states:
        return None
    row = await conn.fetchrow(
        _RETRY,
        attempt.attempt,
        now,
        next_attempt_us,
        claim.turn_id,
        claim.owner,
        claim.token,
        list(states),
        *attempt_arrays(written),
    )
    if row is None:
        return None
    note_xid(int(row[22]))
    return row


async def accept_row(
    conn: Conn,
    new: NewTurn,
    *,
    blob: bytes,
    command: str | None,
    now: int,
    claim_for: str | None,
    token: int,
    lease: int | None,
    channel: str,
) -> tuple[int, int] | None:
    """(turn id, turn number) of the accepted turn, or None when the session is not open
    (nothing written: the long way says which error). Unclaimed turns are announced on
    *channel* in the same statement."""
    row = await conn.fetchrow(
        _ACCEPT,
        new.session_id,
        new.kind.value,
        command,
        blob,
        new.idempotency_key,
        now,
        claim_for,
        token,
        lease,
        channel,
    )
    if row is None:
        return None
    note_xid(int(row[3]))
    return int(row[0]), int(row[1])
