"""Rows of the turn store's tables as records, and the JSON of the stored mappings.

Both engines select their columns in the order of the SQLite engine's column lists
(`supervisor.store.sqlite.schema`: ``TURN_COLUMNS``, ``ATTEMPT_COLUMNS``,
``SESSION_COLUMNS``). A row that does not have the types its columns promise is a bug or a
hostile file: the asserts stop it before it becomes a record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

import orjson

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.store.protocol import SessionRecord, SessionState, TurnRecord

__all__ = ["attempt_from_row", "dumps", "loads", "session_from_row", "turn_from_row"]

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


def session_from_row(row: Sequence[object]) -> SessionRecord:
    sid, package, tier, work_order, workspace, state, opened, closed, turns = row
    assert isinstance(sid, str)
    assert isinstance(package, str)
    assert isinstance(tier, str)
    assert isinstance(state, str)
    assert isinstance(opened, int)
    assert isinstance(turns, int)
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
    )


def _text(value: object) -> str | None:
    assert value is None or isinstance(value, str)
    return value


def _int(value: object) -> int | None:
    assert value is None or isinstance(value, int)
    return value


def attempt_from_row(row: Sequence[object]) -> AttemptRecord:
    """An `attempts` row (`ATTEMPT_COLUMNS`) as a record."""
    extra = row[16]
    assert extra is None or isinstance(extra, bytes)
    attempt, started = row[2], row[3]
    assert isinstance(attempt, int)
    assert isinstance(started, int)
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
    spec: Mapping[str, object] | None = None,
) -> TurnRecord:
    """A `turns` row (`TURN_COLUMNS`) and its attempts as a record (*spec*: the turn's spec
    when the caller has it already parsed)."""
    raw_spec, result = row[4], row[16]
    assert isinstance(raw_spec, bytes)
    assert result is None or isinstance(result, bytes)
    turn_id, session_id, number, kind, state = row[0], row[1], row[2], row[3], row[6]
    assert isinstance(turn_id, int)
    assert isinstance(session_id, str)
    assert isinstance(number, int)
    assert isinstance(kind, str)
    assert isinstance(state, str)
    attempt, accepted, updated, token = row[7], row[8], row[9], row[18]
    assert isinstance(attempt, int)
    assert isinstance(accepted, int)
    assert isinstance(updated, int)
    assert isinstance(token, int)
    return TurnRecord(
        turn_id=turn_id,
        session_id=session_id,
        turn_number=number,
        kind=TurnKind(kind),
        spec=loads(raw_spec) if spec is None else spec,
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
