"""Reading what a crash storm's daemon left behind: its ledgers' ``turn`` entries and its log.

`supervisor.demo.crash` runs the storm; these checks judge what it left (and are tested on their
own, on hand-made ledgers and logs, so that a checker that cannot fail is noticed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from sandbox.policy.lifecycle import FINAL_STATES

__all__ = [
    "FINAL_STATUSES",
    "LedgerTurnEntries",
    "check_daemon_log",
    "check_turn_entries",
    "read_turn_entries",
]

FINAL_STATUSES: Final = frozenset(s.value for s in FINAL_STATES)

_SEVERE: Final = re.compile(r'"level":\s*"(error|critical)"')


@dataclass(slots=True)
class LedgerTurnEntries:
    """The ``turn`` entries of one turn number: exec statuses and seqs, evidence seqs."""

    exec_statuses: list[str] = field(default_factory=list)
    exec_seqs: list[int] = field(default_factory=list)
    evidence_seqs: list[int] = field(default_factory=list)

    def final_exec(self) -> list[tuple[int, str]]:
        return [
            (seq, status)
            for seq, status in zip(self.exec_seqs, self.exec_statuses, strict=True)
            if status in FINAL_STATUSES
        ]

    def final_evidence(self) -> list[int]:
        """Evidence entries whose exec partner (same position among this turn's entries) is
        final: the two entries of a turn ending are written as a pair."""
        return [
            seq
            for seq, status in zip(self.evidence_seqs, self.exec_statuses, strict=False)
            if status in FINAL_STATUSES
        ]


def _jsonl(path: Path, problems: list[str]) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                problems.append(f"{path.name} line {number} is not JSON: {line[:120]!r}")
                continue
            if isinstance(entry, dict):
                yield entry


def read_turn_entries(
    session_dir: Path, problems: list[str]
) -> tuple[dict[int, LedgerTurnEntries], int]:
    """The ``turn`` entries of a session's two ledgers by turn number, and the number of
    entries read; unreadable lines are added to *problems*."""
    ledger_dir = session_dir / "ledger"
    by_turn: dict[int, LedgerTurnEntries] = {}
    count = 0
    for entry in _jsonl(ledger_dir / "exec.jsonl", problems):
        count += 1
        if entry.get("kind") == "turn":
            t = by_turn.setdefault(int(entry["turn_number"]), LedgerTurnEntries())
            t.exec_statuses.append(str(entry.get("status")))
            t.exec_seqs.append(int(entry.get("seq", -1)))
    for entry in _jsonl(ledger_dir / "evidence.jsonl", problems):
        count += 1
        if entry.get("kind") == "turn":
            t = by_turn.setdefault(int(entry["turn_number"]), LedgerTurnEntries())
            t.evidence_seqs.append(int(entry.get("seq", -1)))
    return by_turn, count


def check_daemon_log(path: Path) -> list[str]:
    """Every traceback in the daemon's JSON log (an ``exception`` field, or a ``Traceback``
    anywhere, also on a line a SIGKILL cut short) and every event at level error or critical;
    each names the event, its ids and the traceback's last line. Warnings are expected (a
    restart rolls turns forward and restores ledger lines)."""
    problems: list[str] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return [f"cannot read {path}: {exc}"]
    for number, line in enumerate(text.splitlines(), start=1):
        suspect = "Traceback" in line or '"exception"' in line
        if not suspect and not _SEVERE.search(line):
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            if suspect:
                problems.append(f"{path.name} line {number}: {line[:300]}")
            continue
        if not isinstance(event, dict):
            continue
        if not suspect and event.get("level") not in {"error", "critical"}:
            continue
        exception = str(event.get("exception") or "").strip()
        last = exception.splitlines()[-1] if exception else str(event.get("error") or "")
        ids = ", ".join(
            f"{k} {event[k]}" for k in ("turn_id", "turn_number", "executor_id") if k in event
        )
        problems.append(
            f"{path.name} line {number}: {event.get('level')} {event.get('logger')} "
            f"{event.get('event')!r}{' (' + ids + ')' if ids else ''}"
            + (f": {last}" if last else "")
        )
    return problems


def check_turn_entries(
    turns: Iterable[Mapping[str, Any]], by_number: Mapping[int, LedgerTurnEntries]
) -> tuple[list[str], list[str]]:
    """Compare the store's turns (``turn.get`` dicts) with their ledger entries; returns
    ``(duplicates, missing)``: final turns with more than one final exec or evidence entry,
    and final turns without exactly one of each (or with unpaired entries, or whose final
    ledger status is not the store's state), plus ledger turn numbers no turn has."""
    duplicates: list[str] = []
    missing: list[str] = []
    known: set[int] = set()
    for turn in sorted(turns, key=lambda t: int(t["turn_id"])):
        number = int(turn["turn_number"])
        known.add(number)
        if not turn["final"]:
            continue  # the caller reports it as lost
        name = (
            f"turn {turn['turn_id']} (turn_number {number}, key {turn['idempotency_key']}, "
            f"{turn['state']})"
        )
        entries = by_number.get(number, LedgerTurnEntries())
        finals = entries.final_exec()
        evidence = entries.final_evidence()
        if len(entries.exec_seqs) != len(entries.evidence_seqs):
            missing.append(
                f"{name}: {len(entries.exec_seqs)} exec turn entries (seqs {entries.exec_seqs}) "
                f"but {len(entries.evidence_seqs)} evidence turn entries "
                f"(seqs {entries.evidence_seqs})"
            )
        for what, seqs in (("exec", [seq for seq, _ in finals]), ("evidence", evidence)):
            if not seqs:
                missing.append(
                    f"{name}: no final entry in the {what} ledger "
                    f"(exec statuses {entries.exec_statuses})"
                )
            elif len(seqs) > 1:
                duplicates.append(
                    f"{name}: {len(seqs)} final entries in the {what} ledger (seqs {seqs}, "
                    f"exec statuses {[status for _, status in finals]}, "
                    f"{len(turn['attempts'])} attempts in the store)"
                )
        if finals and finals[-1][1] != turn["state"]:
            missing.append(
                f"{name}: the exec ledger's final status is {finals[-1][1]} (statuses "
                f"{[status for _, status in finals]}), the store's state is {turn['state']}"
            )
    for number in sorted(set(by_number) - known):
        entries = by_number[number]
        missing.append(
            f"turn_number {number} has ledger entries (exec statuses {entries.exec_statuses}, "
            f"seqs {entries.exec_seqs}) but no acknowledged turn"
        )
    return duplicates, missing
