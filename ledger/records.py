"""The records a session writes to its two ledgers, built from the caller's fields.

A session opens with a ``session_opened`` record in each ledger; every turn writes a ``turn``
record to each (the exec record the request's and result's hashes, the evidence record what the
turn declared and called); a capability violation writes a ``capability_violation`` record to
the evidence ledger. The fields of each kind are spelled here once, whichever way the session
writes them (`SessionLedgers`: blocking, async, or checked for a caller's commit); a caller's
extra fields may add to a record, never replace what the session sets.

Pure: no I/O, no clock (the session passes the violation's timestamp).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ledger.entries import KIND_SESSION_OPENED, KIND_TURN, KIND_VIOLATION
from ledger.errors import LedgerRecordError

__all__ = ["merge", "opened_record", "turn_records", "violation_record"]


def _items(values: Iterable[object]) -> list[object]:
    return [dict(value) if isinstance(value, Mapping) else value for value in values]


def merge(record: dict[str, object], extra: Mapping[str, object] | None) -> dict[str, object]:
    """Add *extra* to *record* (in place); raises `LedgerRecordError` for a field it sets."""
    if extra:
        for key, value in extra.items():
            if key in record:
                raise LedgerRecordError(key, "conflicts with a field the session ledger sets")
            record[key] = value
    return record


def opened_record(
    *,
    session_id: str,
    tier: str,
    work_order_id: str | None,
    extra: Mapping[str, object] | None,
) -> dict[str, object]:
    """The ``session_opened`` record that starts both ledgers."""
    record: dict[str, object] = {
        "kind": KIND_SESSION_OPENED,
        "session_id": session_id,
        "tier": tier,
    }
    if work_order_id is not None:
        record["work_order_id"] = work_order_id
    return merge(record, extra)


def turn_records(
    *,
    session_id: str,
    turn_number: int,
    query_hash: str,
    result_hash: str,
    status: str,
    declared_reads: Iterable[object],
    declared_writes: Iterable[object],
    external_calls: Iterable[object],
    capability_violations: Iterable[Mapping[str, object]],
    work_order_id: str | None,
    exec_extra: Mapping[str, object] | None,
    evidence_extra: Mapping[str, object] | None,
) -> tuple[dict[str, object], dict[str, object]]:
    """A turn's exec and evidence records (*work_order_id* goes to the evidence record)."""
    exec_record = merge(
        {
            "kind": KIND_TURN,
            "session_id": session_id,
            "turn_number": turn_number,
            "query_hash": query_hash,
            "result_hash": result_hash,
            "status": status,
        },
        exec_extra,
    )
    evidence_record: dict[str, object] = {
        "kind": KIND_TURN,
        "session_id": session_id,
        "turn_number": turn_number,
        "declared_reads": _items(declared_reads),
        "declared_writes": _items(declared_writes),
        "external_calls": _items(external_calls),
        "capability_violations": _items(capability_violations),
    }
    if work_order_id is not None:
        evidence_record["work_order_id"] = work_order_id
    merge(evidence_record, evidence_extra)
    return exec_record, evidence_record


def violation_record(
    *,
    session_id: str,
    turn_number: int,
    operation: str,
    target: str,
    capability: str,
    detail: str,
    work_order_id: str | None,
    timestamp_us: int,
) -> dict[str, object]:
    """A ``capability_violation`` evidence record holding one violation."""
    violation = {
        "operation": operation,
        "target": target,
        "capability": capability,
        "detail": detail,
        "timestamp_us": timestamp_us,
    }
    record: dict[str, object] = {
        "kind": KIND_VIOLATION,
        "session_id": session_id,
        "turn_number": turn_number,
        "capability_violations": [violation],
    }
    if work_order_id is not None:
        record["work_order_id"] = work_order_id
    return record
