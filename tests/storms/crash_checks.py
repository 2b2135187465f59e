"""Reading what a crash storm's daemon left behind: its ledgers' ``turn`` entries, its turns'
records (rolled-forward turns must carry a finished attempt), its log, and what a clean stop
must not leave (processes of the sandbox uids, turn cgroups, scratch files).

`tests.storms.crash` runs the storm; these checks judge what it left (and are tested on their
own, on hand-made ledgers and logs, so that a checker that cannot fail is noticed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from ledger.verify import session_ledger_paths
from sandbox.confine.procs import LEAF_PARENT, process_uids
from sandbox.policy.lifecycle import FINAL_STATES
from sandbox.runtime.leftovers import AREAS
from sandbox.runtime.runtime import cgroup_prefix_for
from supervisor.turns.recovery import ROLLED_FORWARD

__all__ = [
    "ANYIO_READ_RACE",
    "FINAL_STATUSES",
    "LedgerTurnEntries",
    "check_daemon_log",
    "check_ledger_pairs",
    "check_leftovers",
    "check_rolled_forward",
    "check_turn_entries",
    "count_log_events",
    "read_turn_entries",
    "rolled_forward",
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


#: asyncio's report of an anyio race: anyio 4.16's asyncio backend registers ``f.set_result``
#: itself as the reader/writer callback of a UNIX socket (``_RawSocketMixin._wait_until_readable``
#: and ``_writable``, ``UNIXSocketListener.accept``); when the waiting task is cancelled in the
#: loop iteration in which the socket became ready, the queued callback raises
#: ``InvalidStateError`` and asyncio logs it at error level. The wait was cancelled anyway;
#: nothing is lost. The executor chaos suite provokes it (connections cut while reading).
ANYIO_READ_RACE: Final = "Exception in callback Future.set_result(None)"


def check_daemon_log(path: Path, *, tolerated: Iterable[str] = ()) -> list[str]:
    """Every traceback in the daemon's JSON log (an ``exception`` field, or a ``Traceback``
    anywhere, also on a line a SIGKILL cut short) and every event at level error or critical;
    each names the event, its ids and the traceback's last line. Warnings are expected (a
    restart rolls turns forward and restores ledger lines). Events whose name starts with
    one of *tolerated* (e.g. `ANYIO_READ_RACE`) are left out."""
    skip = tuple(tolerated)
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
        if skip and str(event.get("event", "")).startswith(skip):
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


def _turn_name(turn: Mapping[str, Any]) -> str:
    return (
        f"session {turn['session_id']} turn {turn['turn_id']} "
        f"(turn_number {turn['turn_number']}, {turn['state']})"
    )


def _session_entries(
    session_id: str, session_dir: Path, problems: list[str]
) -> dict[int, LedgerTurnEntries] | None:
    """The ``turn`` entries of one session's ledgers, or None (and a problem) when one of its
    two ledger files is missing."""
    absent = [path for path in session_ledger_paths(session_dir) if not path.is_file()]
    if absent:
        problems.extend(
            f"session {session_id}: ledger {path} is missing (none of the session's final "
            f"turns can have its entry there)"
            for path in absent
        )
        return None
    unreadable: list[str] = []
    by_number, _ = read_turn_entries(session_dir, unreadable)
    problems.extend(f"session {session_id}: {line}" for line in unreadable)
    return by_number


def check_ledger_pairs(
    turns: Iterable[Mapping[str, Any]], session_dirs: Mapping[str, Path]
) -> list[str]:
    """Every turn in a final state (``state`` in `FINAL_STATUSES`; *turns* are ``turn.get`` /
    ``turns.list`` dicts, any sessions) must have exactly one final ``turn`` entry for its
    turn_number in its session's exec ledger and exactly one ``turn`` entry for its ending in
    the evidence ledger (*session_dirs*: session id -> session directory).

    An evidence entry carries no status: the daemon writes a turn's exec and evidence entries
    as a pair for each ending and each escalation, so the evidence ledger must hold one entry
    per non-final exec entry of the turn (its escalations) plus one for the ending. Returns
    one problem per missing or doubled entry, naming the session, turn id, turn number and the
    ledger file; a session whose ledger file is missing or has a line that is not JSON is named
    once. Each session's files are read once."""
    problems: list[str] = []
    read: dict[str, dict[int, LedgerTurnEntries] | None] = {}
    for turn in sorted(turns, key=lambda t: int(t["turn_id"])):
        if str(turn["state"]) not in FINAL_STATUSES:
            continue
        session_id = str(turn["session_id"])
        number = int(turn["turn_number"])
        name = _turn_name(turn)
        session_dir = session_dirs.get(session_id)
        if session_dir is None:
            problems.append(f"{name}: the directory of session {session_id} is not known")
            continue
        if session_id not in read:
            read[session_id] = _session_entries(session_id, session_dir, problems)
        by_number = read[session_id]
        if by_number is None:
            continue  # a ledger file is missing: named once for the session
        exec_path, evidence_path = session_ledger_paths(session_dir)
        entries = by_number.get(number, LedgerTurnEntries())
        finals = entries.final_exec()
        if not finals:
            problems.append(
                f"{name}: exec entry missing: {exec_path} holds no final turn entry for "
                f"turn_number {number} (its turn entries there: statuses "
                f"{entries.exec_statuses}, seqs {entries.exec_seqs})"
            )
        elif len(finals) > 1:
            problems.append(
                f"{name}: exec entry doubled: {exec_path} holds {len(finals)} final turn "
                f"entries for turn_number {number} (seqs {[seq for seq, _ in finals]}, statuses "
                f"{[status for _, status in finals]})"
            )
        escalations = len(entries.exec_statuses) - len(finals)
        expected = escalations + 1
        held = len(entries.evidence_seqs)
        if held != expected:
            problems.append(
                f"{name}: evidence entry {'missing' if held < expected else 'doubled'}: "
                f"{evidence_path} holds {held} turn entries for turn_number {number} (seqs "
                f"{entries.evidence_seqs}), {expected} expected: one for its ending"
                + (
                    f" and {escalations} for its non-final exec entries (statuses "
                    f"{[s for s in entries.exec_statuses if s not in FINAL_STATUSES]})"
                    if escalations
                    else ""
                )
            )
    return problems


def rolled_forward(turns: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The turns a restarted daemon ended from their ledger entry (the ending's ``reason`` is
    `supervisor.turns.recovery.ROLLED_FORWARD`), by turn id."""
    return sorted(
        (t for t in turns if t.get("reason") == ROLLED_FORWARD), key=lambda t: int(t["turn_id"])
    )


def check_rolled_forward(turns: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every rolled-forward turn among *turns* (``turn.get`` / ``turns.list`` dicts, with their
    ``attempts``; see `rolled_forward`) must show attempts that ended, as ``hunter turn show``
    reads them: an attempt count (``attempt``) of at least 1, at least one attempt record, and
    on every attempt record an outcome (or a fault type), a decision, a reason code and a
    finish time. Returns one problem per turn and failing item, naming the session, turn id
    and turn number."""
    problems: list[str] = []
    for turn in rolled_forward(turns):
        name = f"{_turn_name(turn)}, rolled forward ({turn.get('reason_code')})"
        count = turn.get("attempt")
        if not isinstance(count, int) or count < 1:
            problems.append(f"{name}: its attempt count is {count!r}, not at least 1")
        attempts: list[Mapping[str, Any]] = list(turn.get("attempts") or [])
        if not attempts:
            problems.append(f"{name}: it has no attempt record")
        for attempt in attempts:
            lacking = [
                what
                for what, present in (
                    (
                        "outcome (nor fault type)",
                        attempt.get("outcome") or attempt.get("fault_type"),
                    ),
                    ("decision", attempt.get("decision")),
                    ("reason code", attempt.get("reason_code")),
                    ("finish time", attempt.get("finished_us")),
                )
                if not present
            ]
            if lacking:
                problems.append(
                    f"{name}: attempt {attempt.get('attempt')} has no {', '.join(lacking)}: "
                    f"an attempt that never ended"
                )
    return problems


def _turn_leaf_parents() -> list[Path]:
    """The ``hunter-turns`` directories beneath this process's cgroups (a daemon it started
    without moving it has the same ones), without creating any."""
    mounts: dict[str, Path] = {}  # "" for cgroup v2, else the v1 controller
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
        own = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    except OSError:
        return []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if rfields[0] == "cgroup2":
            mounts.setdefault("", point)
        elif rfields[0] == "cgroup":
            for option in rfields[2].split(","):
                mounts.setdefault(option, point)
    parents: list[Path] = []
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            mount = mounts.get(controller)
            if mount is not None:
                parent = mount / parts[2].lstrip("/") / LEAF_PARENT
                if parent.is_dir() and parent not in parents:
                    parents.append(parent)
    return parents


def check_leftovers(root: Path, uids: range) -> list[str]:
    """What a stopped daemon on *root* left behind that it should not have: a live process
    running as one of *uids* (the storm's sandbox uid range; zombies are not counted), a turn
    cgroup leaf of the root (``hunter-turns/<prefix>...``), or any entry in a session's
    scratch dirs (``tmp/<sid>``, ``output/<sid>``)."""
    problems: list[str] = []
    with os.scandir("/proc") as entries:
        pids = [int(e.name) for e in entries if e.name.isdigit()]
    for pid in pids:
        info = process_uids(pid)
        if info is None:
            continue
        found, zombie, cgroups = info
        if zombie or not any(uid in uids for uid in found):
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        except OSError:
            cmdline = b"?"
        problems.append(
            f"process {pid} ({cmdline.decode(errors='replace')[:80]}) runs as uid(s) "
            f"{sorted(u for u in found if u in uids)}, cgroups {list(cgroups)}"
        )
    prefix = cgroup_prefix_for(root)
    for parent in _turn_leaf_parents():
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            continue
        problems.extend(
            f"cgroup leaf {parent / name} is left" for name in names if name.startswith(prefix)
        )
    for area in AREAS:
        base = root / area
        try:
            sessions = sorted(os.listdir(base))
        except FileNotFoundError:
            continue
        for session in sessions:
            path = base / session
            if not path.is_dir() or path.is_symlink():
                problems.append(f"{path} is left (not a directory)")
                continue
            left = sorted(os.listdir(path))
            if left:
                shown = ", ".join(left[:5]) + (
                    f" and {len(left) - 5} more" if len(left) > 5 else ""
                )
                problems.append(f"scratch dir {path} is not empty: {shown}")
    return problems


def count_log_events(path: Path, prefix: str) -> int:
    """How many lines of the daemon's JSON log hold an event whose name starts with *prefix*."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    needle = orjson.dumps(prefix).decode()[:-1]  # '"<prefix>' as JSON writes it
    return sum(needle in line for line in text.splitlines())
