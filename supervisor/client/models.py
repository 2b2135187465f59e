"""What the client library returns: frozen, typed values decoded from the daemon's answers.

Each is a msgspec Struct read from the answer's JSON object (docs/control-protocol.md section 5):
fields the daemon adds in a later release are ignored, fields an older daemon does not send
take their defaults. ``to_dict()`` gives a value back as the daemon's answer had it (the fields
this release knows), for printing or storing as JSON. No I/O here.
"""

from __future__ import annotations

from typing import Final

import msgspec

from supervisor.wire.turn_spec import RequestedBy

__all__ = [
    "FINAL_STATES",
    "SETTLED_STATES",
    "Attempt",
    "DecidedBy",
    "DecisionRecord",
    "EvidenceSlice",
    "Executor",
    "ExecutorPage",
    "LedgerCheck",
    "LedgerEntry",
    "Session",
    "SessionInfo",
    "Turn",
    "TurnPage",
]

#: States a turn does not leave (docs/control-protocol.md section 5).
FINAL_STATES: Final = frozenset(
    {
        "succeeded",
        "failed",
        "timeout",
        "violation",
        "exhausted",
        "terminated",
        "cancelled",
        "rejected",
    }
)
#: States a waiter stops at: final, or parked for an operator.
SETTLED_STATES: Final = FINAL_STATES | {"escalated"}
#: The fields of the compact turn object (section 5.4), exactly these.
_COMPACT_FIELDS: Final = (
    "turn_id",
    "session_id",
    "turn_number",
    "state",
    "verdict",
    "reason_code",
    "attempt",
    "evidence_hash",
)


class _Value(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded answer: immutable; unknown fields ignored."""

    def to_dict(self) -> dict[str, object]:
        """The value as plain JSON data (dicts, lists, strings, numbers, None), as the
        daemon's answer had it: to print or store as JSON."""
        data: dict[str, object] = msgspec.json.decode(msgspec.json.encode(self))
        return data


class DecidedBy(_Value, frozen=True):
    """Who took a person's decision (``escalations.resolve``, ``turn.cancel``, ``drain``) and
    why (section 6, "Decisions"): ``uid`` and ``pid`` of the caller as the kernel told the
    daemon (None only for a request that came through no Unix socket), the ``operator`` name
    the client gave (by default the user name of that uid), the ``reason`` (None when none
    was given), the ``action`` (``retry``, ``terminate``, ``cancel``, ``drain``) and when."""

    action: str
    operator: str
    at_us: int
    uid: int | None = None
    pid: int | None = None
    reason: str | None = None


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
    #: how long it waited for a slot before it ran, in milliseconds (None: not known)
    queued_ms: int | None = None


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

    @property
    def compact(self) -> bool:
        """The answer was the compact object (section 5.4; the whole one always has ``kind``)."""
        return self.kind is None

    @property
    def decided_by(self) -> DecidedBy | None:
        """Who decided the turn's cancel, terminate or retry, and why (``result.decided_by``);
        None when no person did (or the answer was compact)."""
        value = (self.result or {}).get("decided_by")
        return msgspec.convert(value, DecidedBy) if isinstance(value, dict) else None

    def to_dict(self) -> dict[str, object]:
        """The turn object as the daemon sent it: the whole one of section 5.1 (with
        ``final``), or when it was `compact` the compact one of 5.4."""
        data = super().to_dict()
        if self.compact:
            return {name: data[name] for name in _COMPACT_FIELDS}
        del data["evidence_hash"]
        data["final"] = self.final
        return data


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
    #: milliseconds since the executor's last frame, a heartbeat or an answer (None: not
    #: known, e.g. gone)
    heartbeat_age_ms: int | None = None


class LedgerEntry(_Value, frozen=True, omit_defaults=True):
    """One of a turn's ledger entries as ``turn.get`` shows it (its hashes and what they seal).
    A field the entry does not have is None, and left out of `to_dict` as the daemon leaves it
    out: ``query_hash``, ``result_hash`` and ``status`` are an exec ``turn`` entry's,
    ``decided_by`` an evidence entry's of an ending a person decided, ``requested_by`` an
    evidence entry's of a turn asked for through a front end (`hunter mcp`)."""

    seq: int
    kind: str
    ts_us: int | None = None
    entry_hash: str | None = None
    previous_hash: str | None = None
    query_hash: str | None = None
    result_hash: str | None = None
    status: str | None = None
    decided_by: DecidedBy | None = None
    requested_by: RequestedBy | None = None


class DecisionRecord(_Value, frozen=True):
    """A turn's whole decision record: the turn with its attempts, decisions and reasons, and
    its entries in the session's exec and evidence ledgers."""

    turn: Turn
    exec: tuple[LedgerEntry, ...] = ()
    evidence: tuple[LedgerEntry, ...] = ()

    def ledger_dict(self) -> dict[str, list[dict[str, object]]]:
        """``turn.get``'s ``ledger``: ``{"exec": [...], "evidence": [...]}``, each entry as
        plain JSON data (`LedgerEntry.to_dict`)."""
        return {
            "exec": [entry.to_dict() for entry in self.exec],
            "evidence": [entry.to_dict() for entry in self.evidence],
        }

    def to_dict(self) -> dict[str, object]:
        """``turn.get``'s answer: ``{"turn": ..., "ledger": ...}`` (`ledger_dict`)."""
        return {"turn": self.turn.to_dict(), "ledger": self.ledger_dict()}


class LedgerCheck(_Value, frozen=True):
    """The outcome of ``ledger.verify``: ``ok`` when every ledger checked verified; each
    ledger checked (``ledger_id``, ``entries``, ...), each failure (``session_id``,
    ``error``), and in a fleet the sessions checked elsewhere (``session_id``, ``home``,
    ``detail``: another daemon homes them, or none does now); section 6, ``ledger.verify``."""

    ok: bool
    ledgers: tuple[dict[str, object], ...] = ()
    failures: tuple[dict[str, object], ...] = ()
    elsewhere: tuple[dict[str, object], ...] = ()


class SessionInfo(_Value, frozen=True):
    """``session.get``: a session, and its package's manifest as installed on the daemon's root
    now (``package``: id, version, capabilities, limits, env_allow; None and
    ``package_problem`` saying why when it is gone or invalid)."""

    session: Session
    package: dict[str, object] | None = None
    package_problem: str | None = None


class EvidenceSlice(_Value, frozen=True):
    """``turn.evidence``: *data*, the bytes from *offset* of the evidence a turn's executor
    sent (*size* in all, named by *sha256*); *more*: bytes follow."""

    sha256: str | None
    size: int
    offset: int
    data: bytes
    more: bool


class TurnPage(_Value, frozen=True):
    """A page of ``turns.list``: *turns* oldest first; *next_after*: pass it as ``after`` for
    the next page (None: this is the last)."""

    turns: tuple[Turn, ...]
    next_after: int | None = None


class ExecutorPage(_Value, frozen=True):
    """A page of ``executors.list`` by id; *next_after* as for `TurnPage`."""

    executors: tuple[Executor, ...]
    next_after: str | None = None
