"""Rows of the turn store's tables as records, and the JSON of the stored mappings.

Both engines select their columns in the order of the SQLite engine's column lists
(`supervisor.store.sqlite.schema`: ``TURN_COLUMNS``, ``ATTEMPT_COLUMNS``,
``SESSION_COLUMNS``). A row that does not have the types or values its columns promise (a
state no hunter writes, a number where text belongs, JSON that does not parse) was written by
something else or damaged: it raises `StoreIntegrityError` naming the table, the row's key and
the field, and never becomes a record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final, TypeVar

import msgspec
import orjson

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import FINAL_STATES, TurnKind, TurnState
from supervisor.errors import StoreIntegrityError
from supervisor.store.protocol import (
    Accepted,
    Claim,
    NewTurn,
    SessionRecord,
    SessionState,
    TurnEnding,
    TurnRecord,
)
from supervisor.wire.turn_spec import TurnSpec, decode_spec

__all__ = [
    "accepted",
    "attempt_from_row",
    "attempt_row",
    "claim_of",
    "dumps",
    "ending_values",
    "loads",
    "session_from_row",
    "turn_from_row",
]

_EMPTY: Final[Mapping[str, object]] = MappingProxyType({})


def _default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def dumps(value: Mapping[str, object]) -> bytes:
    """JSON for a stored mapping (nested mappings and sets allowed)."""
    return orjson.dumps(value, default=_default)


def loads(blob: bytes) -> Mapping[str, object]:
    """A stored JSON object, read-only."""
    value = orjson.loads(blob)
    if not isinstance(value, dict):
        raise TypeError(f"stored JSON is a {type(value).__name__}, not an object")
    return MappingProxyType(value)


T = TypeVar("T")


class _Bad(Exception):
    """One field of a row is wrong (turned into `StoreIntegrityError` by the converter)."""


def _typed(value: object, kind: type[T], field: str) -> T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Bad(f"{field}: expected {kind.__name__}, found {type(value).__name__}")
    return value


def _key(row: Sequence[object]) -> object:
    return row[0] if row else None


def session_from_row(row: Sequence[object]) -> SessionRecord:
    """A `sessions` row (`SESSION_COLUMNS`) as a record."""
    try:
        return _session(row)
    except (_Bad, ValueError, TypeError) as exc:
        raise StoreIntegrityError("sessions", _key(row), str(exc)) from None


def _session(row: Sequence[object]) -> SessionRecord:
    sid, package, tier, work_order, workspace, state, opened, closed, turns, tenant, priority = row
    sid = _typed(sid, str, "session_id")
    package = _typed(package, str, "package_id")
    tier = _typed(tier, str, "tier")
    state = _typed(state, str, "state")
    opened = _typed(opened, int, "opened_us")
    turns = _typed(turns, int, "turns")
    return SessionRecord(
        session_id=sid,
        package_id=package,
        tier=tier,
        work_order_id=_text(work_order),
        workspace=_text(workspace),
        state=SessionState(state),
        opened_us=opened,
        closed_us=_int(closed),
        turns=turns,
        tenant=_text(tenant, "tenant"),
        priority=_int(priority, "priority"),
    )


def _text(value: object, field: str = "a text column") -> str | None:
    return None if value is None else _typed(value, str, field)


def _int(value: object, field: str = "an integer column") -> int | None:
    return None if value is None else _typed(value, int, field)


def attempt_from_row(row: Sequence[object]) -> AttemptRecord:
    """An `attempts` row (`ATTEMPT_COLUMNS`) as a record."""
    try:
        return _attempt(row)
    except (_Bad, ValueError, TypeError) as exc:
        key = f"{row[0]}/{row[2]}" if len(row) > 2 else _key(row)
        raise StoreIntegrityError("attempts", key, str(exc)) from None


def _attempt(row: Sequence[object]) -> AttemptRecord:
    extra = row[16]
    if extra is not None:
        extra = _typed(extra, bytes, "extra")
    attempt = _typed(row[2], int, "attempt")
    started = _typed(row[3], int, "started_us")
    return AttemptRecord(
        attempt=attempt,
        started_us=started,
        executor_id=_text(row[4]),
        instruction_id=_text(row[5]),
        finished_us=_int(row[6]),
        outcome=_text(row[7]),
        fault_type=_text(row[8]),
        exit_code=_int(row[9]),
        decision=_text(row[10]),
        reason_code=_text(row[11]),
        reason=_text(row[12]),
        detail=_text(row[13]),
        duration_ms=_int(row[14]),
        delay_ms=_int(row[15]),
        extra=_EMPTY if extra is None else loads(extra),
    )


def turn_from_row(
    row: Sequence[object],
    attempts: tuple[AttemptRecord, ...],
    *,
    spec: TurnSpec | None = None,
) -> TurnRecord:
    """A `turns` row (`TURN_COLUMNS`) and its attempts as a record (*spec*: the turn's spec
    when the caller has it already decoded)."""
    try:
        return _turn(row, attempts, spec)
    except (_Bad, ValueError, TypeError, msgspec.DecodeError) as exc:
        raise StoreIntegrityError("turns", _key(row), str(exc)) from None


def _turn(
    row: Sequence[object],
    attempts: tuple[AttemptRecord, ...],
    spec: TurnSpec | None,
) -> TurnRecord:
    raw_spec = _typed(row[4], bytes, "spec")
    result = None if row[16] is None else _typed(row[16], bytes, "result")
    turn_id = _typed(row[0], int, "turn_id")
    session_id = _typed(row[1], str, "session_id")
    number = _typed(row[2], int, "turn_number")
    kind = _typed(row[3], str, "kind")
    state = _typed(row[6], str, "state")
    attempt = _typed(row[7], int, "attempt")
    accepted = _typed(row[8], int, "accepted_us")
    updated = _typed(row[9], int, "updated_us")
    token = _typed(row[18], int, "token")
    return TurnRecord(
        turn_id=turn_id,
        session_id=session_id,
        turn_number=number,
        kind=TurnKind(kind),
        spec=decode_spec(raw_spec) if spec is None else spec,
        idempotency_key=_text(row[5]),
        state=TurnState(state),
        attempt=attempt,
        accepted_us=accepted,
        updated_us=updated,
        next_attempt_us=_int(row[10]),
        finished_us=_int(row[11]),
        verdict=_text(row[12]),
        reason_code=_text(row[13]),
        reason=_text(row[14]),
        fault_type=_text(row[15]),
        result=None if result is None else loads(result),
        attempts=attempts,
        owner=_text(row[17]),
        token=token,
    )


def attempt_row(turn_id: int, round_: int, a: AttemptRecord) -> tuple[object, ...]:
    """An attempt as the values of a row of ``attempts`` in `ATTEMPT_COLUMNS` order (both
    engines)."""
    return (
        turn_id,
        round_,
        a.attempt,
        a.started_us,
        a.executor_id,
        a.instruction_id,
        a.finished_us,
        a.outcome,
        a.fault_type,
        a.exit_code,
        a.decision,
        a.reason_code,
        a.reason,
        a.detail,
        a.duration_ms,
        a.delay_ms,
        dumps(a.extra) if a.extra else None,
    )


def ending_values(
    ending: TurnEnding, attempts: Sequence[AttemptRecord], now: int
) -> tuple[object, ...]:
    """The ending's columns, in the order every engine's finish binds them: state, attempt
    count, updated, finished (final states only), verdict, reason code, reason, fault type and
    result (SQLite's ``finish``, both of PostgreSQL's ways)."""
    return (
        ending.state.value,
        max((a.attempt for a in attempts), default=0),
        now,
        now if ending.state in FINAL_STATES else None,
        ending.verdict,
        ending.reason_code,
        ending.reason,
        ending.fault_type,
        dumps(ending.result),
    )


def claim_of(now: int, claim_for: str | None, lease_ms: int) -> tuple[int, int | None]:
    """A new turn's fencing token and lease end (none when it is not claimed)."""
    return (1, now + lease_ms * 1000) if claim_for is not None else (0, None)


def accepted(
    new: NewTurn, turn_id: int, number: int, now: int, *, claim_for: str | None, lease_ms: int
) -> Accepted:
    """A turn just accepted as turn *number* of its session, as a record built instead of
    read back (both engines), and its claim when it was claimed."""
    token, lease = claim_of(now, claim_for, lease_ms)
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
