"""A pass's accepts and endings on PostgreSQL: one statement for all of them each.

`one_trip` made each write of a turn one statement; under load a batch of the committer still
held dozens of them, one round trip each. Here a batch's accepts (those without an
idempotency key) are one statement, and its endings one more, their values bound as arrays
(``unnest``): a busy pass costs ``BEGIN``, two statements and ``COMMIT`` however many turns it
holds. The checks are those of `one_trip`, per row:

* accepts: the sessions' counters move by the number of their turns in the batch (only while
  open) and the turns are numbered in their order (``row_number()``), inserted, and the
  unclaimed ones announced, all in the statement.
* endings: each turn's ``UPDATE`` is its fence (owner, token, the states from which the ending
  is legal, and no other daemon homing the session of its ledger lines, read ``FOR SHARE``);
  the attempts are written only for the turns that update returned, and only their ledger
  lines are sealed, after it, and kept by one more statement (`operations.put_ledger_lines`,
  which refuses a line that does not continue its chain): a refused ending never takes a seq.

A row the statement did not write (a closed session, a stale claim, an illegal move) is the
op's, not the batch's: the caller runs that op the long way (`operations`), which raises the
precise error or makes the write. The grouping itself (which ops may run this way and in what
order) is `supervisor.store.grouping`, the same for both engines.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

import asyncpg

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from supervisor.store.fencing import finish_from, with_start
from supervisor.store.grouping import Accept, Finish, Plan
from supervisor.store.postgres.batches import Op, batch_error, note_xid
from supervisor.store.postgres.one_trip import (
    ATTEMPT_TYPES,
    ATTEMPT_UPSERT,
    attempt_arrays,
)
from supervisor.store.postgres.operations import (
    WORK_CHANNEL,
    attempts_after,
    put_ledger_lines,
    row_values,
)
from supervisor.store.postgres.schema import ATTEMPT_COLUMNS, TURN_COLUMNS
from supervisor.store.protocol import Accepted, TurnRecord
from supervisor.store.rows import accepted, claim_of, ending_values, turn_from_row
from supervisor.store.sealing import sessions_of
from supervisor.wire.turn_spec import InstructionSpec, encode_spec

__all__ = ["accept_many", "finish_many", "run_grouped"]

Conn = asyncpg.Connection

_ACCEPT_MANY: Final = (
    "WITH v AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[],"
    " $5::text[], $6::bigint[], $7::bigint[]) WITH ORDINALITY"
    " AS v(session_id, kind, command_type, spec, owner, token, lease_until_us, ord)),"
    " c AS (SELECT session_id, count(*) AS n FROM v GROUP BY session_id),"
    " s AS (UPDATE sessions SET turns = sessions.turns + c.n FROM c"
    " WHERE sessions.session_id = c.session_id AND sessions.state = 'open'"
    " RETURNING sessions.session_id, sessions.turns - c.n AS before),"
    " i AS (INSERT INTO turns(session_id, turn_number, kind, command_type, spec,"
    " idempotency_key, state, accepted_us, updated_us, owner, token, lease_until_us)"
    " SELECT v.session_id, s.before + row_number() OVER (PARTITION BY v.session_id"
    " ORDER BY v.ord), v.kind, v.command_type, v.spec, NULL, 'accepted', $8, $8, v.owner,"
    " v.token, v.lease_until_us FROM v JOIN s ON s.session_id = v.session_id"
    " RETURNING turn_id, session_id, turn_number, owner),"
    " n AS (SELECT pg_notify($9, 'turn:' || i.turn_id) FROM i WHERE i.owner IS NULL)"
    " SELECT i.turn_id, i.session_id, i.turn_number, (SELECT count(*) FROM n), txid_current()"
    " FROM i"
)

#: ``TURN_COLUMNS`` of the updated table (the ending's values have columns of the same names)
_TURN_RETURNING: Final = ", ".join(f"turns.{c.strip()}" for c in TURN_COLUMNS.split(","))

_FINISH_MANY: Final = (
    "WITH v AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[],"
    " $5::text[], $6::text[], $7::text[], $8::text[], $9::bytea[], $10::text[], $11::bigint[],"
    " $12::text[], $13::text[]) AS v(turn_id, state, attempt, finished_us, verdict,"
    " reason_code, reason, fault_type, result, owner, token, states, home_session)),"
    " h AS (SELECT session_id, home FROM sessions WHERE session_id IN"
    " (SELECT home_session FROM v) ORDER BY session_id FOR SHARE),"
    " t AS (UPDATE turns SET state = v.state, attempt = greatest(turns.attempt, v.attempt),"
    " updated_us = $14, finished_us = v.finished_us, next_attempt_us = NULL,"
    " verdict = v.verdict, reason_code = v.reason_code, reason = v.reason,"
    " fault_type = v.fault_type, result = v.result, owner = NULL, lease_until_us = NULL"
    " FROM v WHERE turns.turn_id = v.turn_id AND turns.owner = v.owner"
    " AND turns.token = v.token AND turns.state = ANY(string_to_array(v.states, ','))"
    " AND NOT EXISTS (SELECT 1 FROM h WHERE h.session_id = v.home_session"
    " AND h.home IS NOT NULL AND h.home <> v.owner)"
    f" RETURNING {_TURN_RETURNING}),"
    f" a AS (INSERT INTO attempts({ATTEMPT_COLUMNS}) SELECT t.turn_id, t.round, u.attempt,"
    " u.started_us, u.executor_id, u.instruction_id, u.finished_us, u.outcome, u.fault_type,"
    " u.exit_code, u.decision, u.reason_code, u.reason, u.detail, u.duration_ms, u.delay_ms,"
    " u.extra FROM unnest($15::bigint[], "
    + ", ".join(f"${16 + i}::{kind}[]" for i, kind in enumerate(ATTEMPT_TYPES))
    + ") AS u(turn_id, attempt, started_us, executor_id, instruction_id, finished_us,"
    " outcome, fault_type, exit_code, decision, reason_code, reason, detail, duration_ms,"
    f" delay_ms, extra) JOIN t ON t.turn_id = u.turn_id{ATTEMPT_UPSERT} RETURNING 1)"
    " SELECT t.*, (SELECT count(*) FROM a), txid_current() FROM t"
)


async def accept_many(conn: Conn, items: Sequence[Accept]) -> list[Accepted | None]:
    """Accept every turn of *items* (none with an idempotency key) in one statement, numbered
    per session in their order; per item, what it got, or None when its session was not open
    (nothing written for it: the long way says which error)."""
    now = time.time_ns() // 1000
    columns: list[list[object]] = [[] for _ in range(7)]
    for item in items:
        new = item.new
        token, lease = claim_of(now, item.claim_for, item.lease_ms)
        spec = new.spec
        values = (
            new.session_id,
            new.kind.value,
            spec.command_type.value if isinstance(spec, InstructionSpec) else None,
            encode_spec(spec),
            item.claim_for,
            token,
            lease,
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    rows = await conn.fetch(_ACCEPT_MANY, *columns, now, WORK_CHANNEL)
    if rows:
        note_xid(int(rows[0][4]))
    numbers: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        numbers.setdefault(str(row[1]), []).append((int(row[2]), int(row[0])))
    for taken in numbers.values():
        taken.sort()  # numbered in the items' order (row_number over their ordinal)
    out: list[Accepted | None] = []
    handed: dict[str, int] = {}
    for item in items:
        sid = item.new.session_id
        got = numbers.get(sid)
        if got is None:
            out.append(None)
            continue
        index = handed.get(sid, 0)
        handed[sid] = index + 1
        number, turn_id = got[index]
        out.append(
            accepted(
                item.new,
                turn_id,
                number,
                now,
                claim_for=item.claim_for,
                lease_ms=item.lease_ms,
            )
        )
    return out


def _home_session(item: Finish) -> str | bool:
    """The turn's session, whose home must be the ending's daemon (lines or not); False when
    the ending's ledger lines append to another session too (it runs the long way)."""
    own = item.claim.turn.session_id
    if any(sid != own for sid in sessions_of(item.lines.ledger_ids)):
        return False
    return own


async def finish_many(conn: Conn, items: Sequence[Finish]) -> list[TurnRecord | None]:
    """End every turn of *items* (distinct turns) in one statement, then seal the ledger lines
    of those whose fence held and keep them in one more; per item, its record, or None when
    the statement wrote nothing for it (the long way decides). Raises ValueError when a ledger
    line does not continue its chain (the batch runs op by op)."""
    now = time.time_ns() // 1000
    turns: list[list[object]] = [[] for _ in range(13)]
    attempt_turns: list[int] = []
    written_all: list[AttemptRecord] = []
    wrote: dict[int, tuple[AttemptRecord, ...]] = {}
    for item in items:
        states = finish_from(item.ending.state, item.started is not None)
        home = _home_session(item)
        if not states or home is False:
            continue  # the long way
        claim = item.claim
        written = with_start(item.attempts, item.started)
        values = ending_values(item.ending, item.attempts, now)
        row = (
            claim.turn_id,
            values[0],
            values[1],
            values[3],
            *values[4:],
            claim.owner,
            claim.token,
            ",".join(states),
            home,
        )
        for column, value in zip(turns, row, strict=True):
            column.append(value)
        attempt_turns.extend(claim.turn_id for _ in written)
        written_all.extend(written)
        wrote[claim.turn_id] = written
    if not wrote:
        return [None] * len(items)
    rows = await conn.fetch(_FINISH_MANY, *turns, now, attempt_turns, *attempt_arrays(written_all))
    ended: dict[int, asyncpg.Record] = {int(r[0]): r for r in rows}
    if rows:
        note_xid(int(rows[0][22]))
        # the fences held for these: their lines take their seqs now, in the items' order
        lines: list[SealedLine] = []
        for item in items:
            if item.claim.turn_id in ended:
                lines.extend(item.lines.seal())
        await put_ledger_lines(conn, lines)
    out: list[TurnRecord | None] = []
    for item in items:
        done = ended.get(item.claim.turn_id)
        if done is None:
            out.append(None)
            continue
        attempts = await attempts_after(conn, done, wrote[item.claim.turn_id])
        out.append(turn_from_row(row_values(done)[:21], attempts, spec=item.claim.turn.spec))
    return out


async def run_grouped(conn: Conn, grouped: Plan[Op[object]]) -> bool:
    """The batch's accepts in one statement, its other ops in order, then its endings in one
    statement; an op the statements did not write runs the long way. False when an op failed
    (the caller rolls back and runs the batch op by op, each with a savepoint)."""
    if grouped.accepts:
        try:
            taken = await accept_many(conn, [op.accept for op in grouped.accepts if op.accept])
        except Exception as exc:
            if batch_error(exc, conn):
                raise
            return False
        for op, got in zip(grouped.accepts, taken, strict=True):
            if got is not None:
                op.settle(got)
            elif not await op.execute(conn):
                return False
    for op in grouped.others:
        if not await op.execute(conn):
            return False
    if not grouped.endings:
        return True
    try:
        outcomes = await finish_many(conn, [op.finish for op in grouped.endings if op.finish])
    except Exception as exc:  # e.g. a ledger line that differs from the kept one
        if batch_error(exc, conn):
            raise
        return False
    for op, outcome in zip(grouped.endings, outcomes, strict=True):
        if outcome is not None:
            op.settle(outcome)
        elif not await op.execute(conn):
            return False
    return True
