"""Tests of ledger.entries: the per-kind schema (seed 004 LedgerEntry)."""

from __future__ import annotations

import pytest

from ledger.entries import (
    LedgerEntry,
    ledger_role,
    validate_ledger_id,
    validate_record,
)
from ledger.errors import LedgerRecordError

_VIOLATION = {
    "operation": "write",
    "target": "/etc/passwd",
    "capability": "write",
    "detail": "",
    "timestamp_us": 1,
}


def _evidence_turn(**changes: object) -> dict[str, object]:
    record: dict[str, object] = {
        "kind": "turn",
        "session_id": "S",
        "turn_number": 1,
        "declared_reads": [],
        "declared_writes": [],
        "external_calls": [],
        "capability_violations": [],
    }
    record.update(changes)
    return record


def test_roles() -> None:
    """The role is the last part of the ledger id."""
    assert ledger_role("SES-1/exec") == "exec"
    assert ledger_role("SES-1/evidence") == "evidence"
    assert ledger_role("plain") == "plain"


def test_ledger_id_validation() -> None:
    """Ledger ids are non-empty printable ASCII without spaces."""
    assert validate_ledger_id("SES-1/exec") == "SES-1/exec"
    for bad in ("", "a b", "é", "a\nb", 3):
        with pytest.raises(LedgerRecordError, match=r"^ledger_id: "):
            validate_ledger_id(bad)


def test_evidence_turn_requires_fields() -> None:
    """Evidence turns need reads, writes, calls and violations (FR-RT-007/017)."""
    validate_record("S/evidence", _evidence_turn(work_order_id="WO-1", extra_field=1))
    record = _evidence_turn()
    del record["declared_writes"]
    with pytest.raises(LedgerRecordError, match=r"^declared_writes: required for an evidence turn"):
        validate_record("S/evidence", record)
    with pytest.raises(LedgerRecordError, match=r"^work_order_id: must be str when present$"):
        validate_record("S/evidence", _evidence_turn(work_order_id=5))


def test_turn_number_is_one_indexed() -> None:
    """turn_number 0 is refused."""
    with pytest.raises(LedgerRecordError, match=r"^turn_number: must be an int >= 1"):
        validate_record("S/evidence", _evidence_turn(turn_number=0))


def test_violation_fields_checked() -> None:
    """Capability violations carry operation, target, capability, detail, timestamp_us."""
    record = {
        "kind": "capability_violation",
        "session_id": "S",
        "turn_number": 2,
        "capability_violations": [_VIOLATION],
    }
    validate_record("S/evidence", record)
    broken = {**_VIOLATION}
    del broken["capability"]
    with pytest.raises(
        LedgerRecordError, match=r"^capability_violations\[0\]\.capability: required"
    ):
        validate_record("S/evidence", {**record, "capability_violations": [broken]})
    with pytest.raises(LedgerRecordError, match=r"^capability_violations: must not be empty$"):
        validate_record("S/evidence", {**record, "capability_violations": []})
    with pytest.raises(LedgerRecordError, match=r"timestamp_us: must be int"):
        validate_record(
            "S/evidence",
            {**record, "capability_violations": [{**_VIOLATION, "timestamp_us": "now"}]},
        )


def test_exec_turn_type_checked() -> None:
    """Exec turns' fields have types."""
    with pytest.raises(LedgerRecordError, match=r"^status: must be str for an exec turn entry"):
        validate_record(
            "S/exec",
            {
                "kind": "turn",
                "session_id": "S",
                "turn_number": 1,
                "query_hash": "q",
                "result_hash": "r",
                "status": 3,
            },
        )


def test_kind_required_and_checkpoint_checked() -> None:
    """Every record has a kind; checkpoints need covers_seq/hash and state."""
    with pytest.raises(LedgerRecordError, match=r"^kind: required"):
        validate_record("L", {"x": 1})
    with pytest.raises(LedgerRecordError, match=r"^covers_hash: must be 64 lowercase hex"):
        validate_record(
            "L", {"kind": "checkpoint", "covers_seq": 0, "covers_hash": "x", "state": {}}
        )


def test_entry_from_dict() -> None:
    """LedgerEntry exposes chain fields and a read-only view of all fields."""
    entry = LedgerEntry.from_dict(
        {
            "ledger_id": "L",
            "seq": 1,
            "kind": "k",
            "ts_us": 5,
            "previous_hash": "p",
            "entry_hash": "h",
            "x": [1],
        }
    )
    assert (entry.seq, entry.kind, entry.get("x"), entry.get("nope", 0)) == (1, "k", [1], 0)
    with pytest.raises(TypeError):
        entry.fields["x"] = 2  # type: ignore[index]
