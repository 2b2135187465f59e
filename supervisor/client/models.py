"""What the client library returns: frozen, typed values decoded from the daemon's answers.

Each is a msgspec Struct read from the answer's JSON object (docs/control-protocol.md section 5):
fields the daemon adds in a later release are ignored, fields an older daemon does not send
take their defaults. No I/O here.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "FINAL_STATES",
    "SETTLED_STATES",
    "Attempt",
    "DecisionRecord",
    "Executor",
    "LedgerCheck",
    "LedgerEntry",
    "Session",
    "Turn",
]

#: States a turn does not leave (docs/control-protocol.md section 5).
FINAL_STATES: Final = frozenset({"succeeded", "failed", "terminated", "cancelled"})
#: States a waiter stops at: final, or parked for an operator.
SETTLED_STATES: Final = FINAL_STATES | {"escalated"}


class _Value(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded answer: immutable; unknown fields ignored."""


class Attempt(_Value, frozen=True):
    """One attempt of a turn (section 5.2)."""

    attempt: int
    executor_id: str | None = None
    instruction_id: str | None = None
    started_us: int | None = None
    finished_us: int | None = None
    outcome: str | None = None
    fault_type: str | None = None
    exit_code: int | None = None
    decision: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    detail: str | None = None
    duration_ms: int | None = None
    delay_ms: int | None = None
    extra: dict[str, object] = msgspec.field(default_factory=dict)


class Turn(_Value, frozen=True):
    """A turn: the whole record (section 5.1), or its outcome only when asked for compact
    answers (section 5.4: ``evidence_hash`` set, ``spec``, ``result`` and ``attempts`` empty)."""

    turn_id: int
    session_id: str
    turn_number: int
    state: str
    attempt: int = 0
    verdict: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    fault_type: str | None = None
    kind: str | None = None
    spec: dict[str, object] | None = None
    idempotency_key: str | None = None
    accepted_us: int | None = None
    updated_us: int | None = None
    next_attempt_us: int | None = None
    finished_us: int | None = None
    result: dict[str, object] | None = None
    attempts: tuple[Attempt, ...] = ()
    owner: str | None = None
    evidence_hash: str | None = None

    @property
    def final(self) -> bool:
        """The turn reached a state it does not leave."""
        return self.state in FINAL_STATES

    @property
    def settled(self) -> bool:
        """Final, or parked for an operator's decision (escalated)."""
        return self.state in SETTLED_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"


class Session(_Value, frozen=True):
    """A session (section 5.3)."""

    session_id: str
    package_id: str
    state: str
    tier: str = "default"
    work_order_id: str | None = None
    workspace: str | None = None
    opened_us: int | None = None
    closed_us: int | None = None
    turns: int = 0
    tenant: str | None = None
    priority: int | None = None


class Executor(_Value, frozen=True):
    """An executor the daemon knows (``executors.list``)."""

    executor_id: str
    status: str
    commands: tuple[str, ...] = ()
    slots: int = 0
    in_flight: int = 0
    uid: int | None = None
    pid: int | None = None
    connected_at_us: int | None = None
    quarantined_until_us: int | None = None
    software: str = ""
    detail: str = ""


class LedgerEntry(_Value, frozen=True):
    """One of a turn's ledger entries as ``turn.get`` shows it (its hashes and what they seal)."""

    seq: int
    kind: str
    ts_us: int | None = None
    entry_hash: str | None = None
    previous_hash: str | None = None
    query_hash: str | None = None
    result_hash: str | None = None
    status: str | None = None


class DecisionRecord(_Value, frozen=True):
    """A turn's whole decision record: the turn with its attempts, decisions and reasons, and
    its entries in the session's exec and evidence ledgers."""

    turn: Turn
    exec: tuple[LedgerEntry, ...] = ()
    evidence: tuple[LedgerEntry, ...] = ()


class LedgerCheck(_Value, frozen=True):
    """The outcome of ``ledger.verify``: ``ok`` when every ledger checked verified."""

    ok: bool
    ledgers: tuple[dict[str, object], ...] = ()
    failures: tuple[dict[str, object], ...] = ()
