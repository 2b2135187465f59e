"""The tools' structured results (pydantic models: the SDK derives each tool's output schema
from them), and how a turn becomes one, within the bytes the MCP session may still be given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import orjson
from pydantic import BaseModel, Field

from supervisor.client import DecisionRecord, LedgerEntry, Turn

__all__ = [
    "DecisionAnswer",
    "Escalation",
    "FileEntryModel",
    "FileListing",
    "FileRead",
    "LedgerHashes",
    "LedgerVerified",
    "PackageInfo",
    "PackageList",
    "Promoted",
    "SessionAnswer",
    "Text",
    "TurnOutcome",
    "Violation",
    "Write",
    "bounded_text",
    "outcome_of",
]

#: where an operator resolves an escalated turn (said in every escalation)
RESOLVE_WITH: Final = "hunter escalations resolve {turn_id} --retry|--terminate --reason TEXT"
CONSOLE: Final = "the operators' console (hunter console): Escalations, then turn {turn_id}"


class Text(BaseModel):
    """A stream's bytes as returned: ``truncated`` says some were left out, ``note`` why."""

    text: str
    total_bytes: int
    returned_bytes: int
    truncated: bool
    note: str | None = None


class Write(BaseModel):
    path: str
    area: str | None = None
    size: int | None = None
    sha256: str | None = None


class Promoted(BaseModel):
    path: str
    destination: str | None = None
    size: int | None = None
    sha256: str | None = None


class Violation(BaseModel):
    operation: str | None = None
    target: str | None = None
    capability: str | None = None
    detail: str | None = None


class Escalation(BaseModel):
    """The turn waits for a person: the agent cannot resolve it; it may wait (wait_turn)."""

    turn_id: int
    reason_code: str | None
    reason: str | None
    resolve_with: str
    console: str
    note: str = (
        "an operator decides (retry or terminate); call wait_turn to wait for the decision,"
        " or cancel_turn to give up on it"
    )


class LedgerHashes(BaseModel):
    """The turn's entries in its session's hash-chained ledgers."""

    exec_entry_hash: str | None = None
    evidence_entry_hash: str | None = None
    exec_seq: int | None = None
    evidence_seq: int | None = None


class TurnOutcome(BaseModel):
    """A turn as it stands: settled (final, or waiting for an operator) or still running."""

    turn_id: int
    session_id: str
    turn_number: int
    kind: str | None
    state: str
    final: bool
    settled: bool
    verdict: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    fault_type: str | None = None
    attempts: int = 0
    exit_code: int | None = None
    stdout: Text | None = None
    stderr: Text | None = None
    realized_writes: list[Write] = Field(default_factory=list)
    promoted_outputs: list[Promoted] = Field(default_factory=list)
    violations: list[Violation] = Field(default_factory=list)
    #: an instruction turn's executor answer (JSON, bounded) and its evidence's sha256
    executor_output: Text | None = None
    evidence_hash: str | None = None
    ledger: LedgerHashes | None = None
    waiting_for_operator: Escalation | None = None
    note: str | None = None


class PackageInfo(BaseModel):
    package_id: str
    allowed: bool
    version: str | None = None
    description: str | None = None
    capabilities: dict[str, object] | None = None
    limits: dict[str, object] | None = None
    problem: str | None = None


class PackageList(BaseModel):
    packages: list[PackageInfo]


class SessionAnswer(BaseModel):
    session_id: str
    package_id: str
    state: str
    workspace: str
    turns: int = 0


class FileRead(BaseModel):
    path: str
    size: int
    offset: int
    content: Text
    more: bool
    encoding: str = "utf-8 (undecodable bytes replaced)"


class FileEntryModel(BaseModel):
    path: str
    size: int


class FileListing(BaseModel):
    session_id: str
    files: list[FileEntryModel]
    truncated: bool


class DecisionAnswer(BaseModel):
    """A turn's decision record: its outcome, every attempt, who asked, its ledger entries."""

    outcome: TurnOutcome
    attempts: list[dict[str, object]]
    requested_by: dict[str, object] | None = None
    exec_entries: list[dict[str, object]]
    evidence_entries: list[dict[str, object]]


class LedgerVerified(BaseModel):
    session_id: str
    ok: bool
    ledgers: list[dict[str, object]]
    problem: str | None = None


def bounded_text(raw: bytes, allowance: int, *, cut_before: bool, note: str | None) -> Text:
    """*raw* within *allowance* bytes (the last ones when *cut_before*), decoded."""
    kept = raw if len(raw) <= allowance else (raw[-allowance:] if cut_before else raw[:allowance])
    if allowance == 0 and raw:
        kept = b""
    truncated = len(kept) < len(raw)
    if truncated:
        extra = (
            f"{len(raw) - len(kept)} of {len(raw)} bytes left out"
            f" ({'the first ones' if cut_before else 'the last ones'}): the MCP session's"
            " output limit"
        )
        note = f"{note}; {extra}" if note else extra
    return Text(
        text=kept.decode("utf-8", "replace"),
        total_bytes=len(raw),
        returned_bytes=len(kept),
        truncated=truncated or note is not None,
        note=note,
    )


def _strings(value: object) -> list[Mapping[str, object]]:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return []
    return [v for v in value if isinstance(v, Mapping)]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ledger(record: DecisionRecord) -> LedgerHashes | None:
    def last(entries: Sequence[LedgerEntry]) -> LedgerEntry | None:
        return entries[-1] if entries else None

    exec_entry, evidence_entry = last(record.exec), last(record.evidence)
    if exec_entry is None and evidence_entry is None:
        return None
    return LedgerHashes(
        exec_entry_hash=exec_entry.entry_hash if exec_entry else None,
        evidence_entry_hash=evidence_entry.entry_hash if evidence_entry else None,
        exec_seq=exec_entry.seq if exec_entry else None,
        evidence_seq=evidence_entry.seq if evidence_entry else None,
    )


def _daemon_cut(result: Mapping[str, object], name: str) -> str | None:
    attempts = _strings(result.get("attempts"))
    if attempts and attempts[-1].get(f"{name}_truncated"):
        return f"the daemon kept only part of {name} (the package's output limit)"
    return None


def outcome_of(
    turn: Turn, record: DecisionRecord | None, allowance: int, *, note: str | None = None
) -> tuple[TurnOutcome, int]:
    """The structured result of *turn* (its *record* once settled), spending at most
    *allowance* bytes of stdout, stderr and executor output; and the bytes spent."""
    result: Mapping[str, object] = turn.result or {}
    outcome = TurnOutcome(
        turn_id=turn.turn_id,
        session_id=turn.session_id,
        turn_number=turn.turn_number,
        kind=turn.kind,
        state=turn.state,
        final=turn.final,
        settled=turn.settled,
        verdict=turn.verdict,
        reason_code=turn.reason_code,
        reason=turn.reason,
        fault_type=turn.fault_type,
        attempts=turn.attempt,
        exit_code=_int(result.get("exit_code")),
        ledger=_ledger(record) if record is not None else None,
        evidence_hash=_str(result.get("evidence_hash")),
        note=note,
    )
    spent = 0
    if turn.kind == "process" and turn.settled:
        out_raw = str(result.get("stdout") or "").encode()
        err_raw = str(result.get("stderr") or "").encode()
        # stderr first gets what it needs up to half; stdout the rest (its tail matters most)
        err_share = min(len(err_raw), allowance // 2)
        out_share = min(len(out_raw), allowance - err_share)
        err_share = min(len(err_raw), allowance - out_share)
        outcome.stdout = bounded_text(
            out_raw, out_share, cut_before=True, note=_daemon_cut(result, "stdout")
        )
        outcome.stderr = bounded_text(
            err_raw, err_share, cut_before=True, note=_daemon_cut(result, "stderr")
        )
        spent = outcome.stdout.returned_bytes + outcome.stderr.returned_bytes
        outcome.realized_writes = [
            Write(
                path=str(w.get("path")),
                area=_str(w.get("area")),
                size=_int(w.get("size")),
                sha256=_str(w.get("sha256")),
            )
            for w in _strings(result.get("realized_writes"))
        ]
        outcome.promoted_outputs = [
            Promoted(
                path=str(p.get("path")),
                destination=_str(p.get("destination")),
                size=_int(p.get("size")),
                sha256=_str(p.get("sha256")),
            )
            for p in _strings(result.get("promoted_outputs"))
        ]
        outcome.violations = [
            Violation(
                operation=_str(v.get("operation")),
                target=_str(v.get("target")),
                capability=_str(v.get("capability")),
                detail=_str(v.get("detail")),
            )
            for v in _strings(result.get("violations"))
        ]
    elif turn.kind == "instruction" and turn.settled and "output" in result:
        raw = orjson.dumps(result.get("output"))
        outcome.executor_output = bounded_text(raw, allowance, cut_before=False, note=None)
        spent = outcome.executor_output.returned_bytes
    if turn.state == "escalated":
        outcome.waiting_for_operator = Escalation(
            turn_id=turn.turn_id,
            reason_code=turn.reason_code,
            reason=turn.reason,
            resolve_with=RESOLVE_WITH.format(turn_id=turn.turn_id),
            console=CONSOLE.format(turn_id=turn.turn_id),
        )
    return outcome, spent
