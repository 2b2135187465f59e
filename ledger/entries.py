"""Ledger entries: the `LedgerEntry` value and the per-kind schema (seed 004 LedgerEntry).

Every entry has the chain fields ``v``, ``ledger_id``, ``seq``, ``previous_hash``, ``entry_hash``,
the writer's ``ts_us`` (integer microseconds since the epoch) and a ``kind``. A ledger's role is
the last part of its id (``<sid>/exec`` or ``<sid>/evidence``); the role and the kind decide the
required fields (`validate_record`). Unknown extra fields are allowed and hashed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ledger.chain import is_hex_hash
from ledger.errors import LedgerRecordError

__all__ = [
    "CHAIN_FIELDS",
    "KIND_CHECKPOINT",
    "KIND_SESSION_OPENED",
    "KIND_TURN",
    "KIND_VIOLATION",
    "VIOLATION_FIELDS",
    "LedgerEntry",
    "SealedLine",
    "ledger_role",
    "validate_ledger_id",
    "validate_record",
]

KIND_SESSION_OPENED: Final = "session_opened"
KIND_TURN: Final = "turn"
KIND_VIOLATION: Final = "capability_violation"
KIND_CHECKPOINT: Final = "checkpoint"

# Keys the writer sets; a record passed to append() must not contain them.
CHAIN_FIELDS: Final = frozenset({"v", "ledger_id", "seq", "previous_hash", "entry_hash", "ts_us"})

VIOLATION_FIELDS: Final = ("operation", "target", "capability", "detail", "timestamp_us")

_EXEC_TURN: Final = (
    ("session_id", str),
    ("turn_number", int),
    ("query_hash", str),
    ("result_hash", str),
    ("status", str),
)
_EVIDENCE_TURN: Final = (
    ("session_id", str),
    ("turn_number", int),
    ("declared_reads", list),
    ("declared_writes", list),
    ("external_calls", list),
    ("capability_violations", list),
)
_VIOLATION_ENTRY: Final = (
    ("session_id", str),
    ("turn_number", int),
    ("capability_violations", list),
)
_CHECKPOINT: Final = (("covers_seq", int), ("covers_hash", str), ("state", dict))


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One sealed entry as written (``fields`` is the whole entry, read-only)."""

    ledger_id: str
    seq: int
    kind: str
    ts_us: int
    previous_hash: str
    entry_hash: str
    fields: Mapping[str, object]

    @classmethod
    def from_dict(cls, entry: Mapping[str, object]) -> LedgerEntry:
        """Build from a parsed, already verified entry dict."""
        return cls(
            ledger_id=str(entry["ledger_id"]),
            seq=_int(entry["seq"]),
            kind=str(entry.get("kind", "")),
            ts_us=_int(entry.get("ts_us", 0)),
            previous_hash=str(entry["previous_hash"]),
            entry_hash=str(entry["entry_hash"]),
            fields=MappingProxyType(dict(entry)),
        )

    def get(self, key: str, default: object = None) -> object:
        """A field of the entry, or ``default``."""
        return self.fields.get(key, default)

    def to_dict(self) -> dict[str, object]:
        """A mutable copy of the whole entry."""
        return dict(self.fields)


@dataclass(frozen=True, slots=True)
class SealedLine:
    """One sealed entry's line exactly as it goes into the file (newline included).

    A store that makes a ledger line durable in its own transaction (the daemon's turn store)
    keeps these and writes them back to the file after a crash (`LedgerWriter.restore`).
    """

    ledger_id: str
    seq: int
    entry_hash: str
    line: bytes
    #: the hash of the line it chains onto, when known without parsing *line* (sealed here or
    #: read from a file; "" for a line read back from a store): a store checks the link. Not
    #: compared: it is in *line* already.
    previous_hash: str = field(default="", compare=False)


def _int(value: object) -> int:
    if type(value) is not int:
        msg = f"expected an integer, got {type(value).__name__}"
        raise TypeError(msg)
    return value


def ledger_role(ledger_id: str) -> str:
    """``exec``, ``evidence`` or another role: the part of the id after the last ``/``."""
    return ledger_id.rsplit("/", 1)[-1]


def validate_ledger_id(ledger_id: object) -> str:
    """Check a ledger id (non-empty printable ASCII without spaces) and return it."""
    if (
        type(ledger_id) is not str
        or not ledger_id
        or not ledger_id.isascii()
        or not ledger_id.isprintable()
        or " " in ledger_id
    ):
        raise LedgerRecordError("ledger_id", f"{ledger_id!r} is not a valid ledger id")
    return ledger_id


def _require(record: Mapping[str, object], spec: tuple[tuple[str, type], ...], what: str) -> None:
    for name, kind in spec:
        if name not in record:
            raise LedgerRecordError(name, f"required for {what}")
        value = record[name]
        if type(value) is not kind:
            raise LedgerRecordError(
                name, f"must be {kind.__name__} for {what}, got {type(value).__name__}"
            )


def _check_violations(value: object, *, non_empty: bool) -> None:
    assert isinstance(value, list)
    if non_empty and not value:
        raise LedgerRecordError("capability_violations", "must not be empty")
    for index, item in enumerate(value):
        where = f"capability_violations[{index}]"
        if not isinstance(item, dict):
            raise LedgerRecordError(where, "must be an object")
        for name in VIOLATION_FIELDS:
            if name not in item:
                raise LedgerRecordError(f"{where}.{name}", "required in a capability violation")
        for name in ("operation", "target", "capability", "detail"):
            if type(item[name]) is not str:
                raise LedgerRecordError(f"{where}.{name}", "must be str")
        if type(item["timestamp_us"]) is not int:
            raise LedgerRecordError(f"{where}.timestamp_us", "must be int (microseconds)")


def validate_record(ledger_id: str, record: Mapping[str, object]) -> None:
    """Check a normalized record's required fields for its kind and the ledger's role.

    Raises `LedgerRecordError` naming the field.
    """
    for name in CHAIN_FIELDS:
        if name in record:
            raise LedgerRecordError(name, "is set by the ledger writer, not by the record")
    kind = record.get("kind")
    if type(kind) is not str or not kind:
        raise LedgerRecordError("kind", "required: a non-empty string")
    role = ledger_role(ledger_id)
    if kind == KIND_SESSION_OPENED:
        _require(record, (("session_id", str),), "a session_opened entry")
    elif kind == KIND_TURN and role == "exec":
        _require(record, _EXEC_TURN, "an exec turn entry")
    elif kind == KIND_TURN and role == "evidence":
        _require(record, _EVIDENCE_TURN, "an evidence turn entry")
        _check_violations(record["capability_violations"], non_empty=False)
    elif kind == KIND_VIOLATION:
        _require(record, _VIOLATION_ENTRY, "a capability_violation entry")
        _check_violations(record["capability_violations"], non_empty=True)
    elif kind == KIND_CHECKPOINT:
        _require(record, _CHECKPOINT, "a checkpoint entry")
        if not is_hex_hash(record["covers_hash"]):
            raise LedgerRecordError("covers_hash", "must be 64 lowercase hex digits")
    if "turn_number" in record:
        turn = record["turn_number"]
        if type(turn) is not int or turn < 1:
            raise LedgerRecordError("turn_number", f"must be an int >= 1 (1-indexed), got {turn!r}")
    if "work_order_id" in record and type(record["work_order_id"]) is not str:
        raise LedgerRecordError("work_order_id", "must be str when present")
