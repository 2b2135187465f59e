"""The checker: what a nemesis run's history and end state say, read after the run.

Inputs: the history file (`tests.storms.history`), a snapshot of the store read after the fleet
settled (`read_store`: the ``turns`` table, every ``ledger_lines`` line, ``ledger_heads``), the
ledger files on every daemon's root (live sessions and the copies moved aside to
``planes/<tier>/stale/``), the run records the process turns promoted into the workspaces, each
daemon's log, the server's log, what each daemon answered about each acknowledged turn, and the
exit codes of ``hunter ledger verify --store`` (`CliResult`). Each check is a pure function of
those, so that hand-made inputs can prove a check fails when it should
(``tests/storms/test_nemesis.py``).

The checks (`Verdict.checks`, by name):

``acknowledged``
    every acknowledged turn is in the store and final; every answer under one key names the
    same turn and at most one of them says ``created: true``; the store holds one turn per
    key; a submission the daemon refused (``fail``) left no turn behind.
``answers``
    every daemon, asked through the client after the run, gives each acknowledged turn the
    store's final state.
``ledger-store``
    in the store's lines: each chain whole (seqs 1..n, each ``previous_hash`` the hash before),
    its head in ``ledger_heads``; exactly one final ``turn`` entry in the exec ledger and one
    ``turn`` entry per ending (and per escalation) in the evidence ledger for every final turn,
    none for a turn not ended, none for a turn number the store has no turn for.
``ledger-files``
    every line of every ledger file on every root, stale copies included, is the store's line
    at its seq (same entry hash); no file holds two final entries of one turn;
    ``hunter ledger verify --root ROOT --store`` exits 0 on every root and on an export.
``double-runs``
    each process turn's record in its workspace has one line (one run promoted), the record's
    hash is the one the final evidence entry says was promoted, and a record exists exactly for
    the process turns that succeeded.
``logs``
    no traceback and no event at level error or critical in any daemon's log except the
    expected ones (`EXPECTED_ERRORS`); no daemon exited by itself or uncleanly at the end.
``takeover``
    every measured takeover (after a kill or a pause) finished within the bound, by another
    daemon homing the sessions, not by the faulted daemon coming back.
``deadlocks``
    the server's log has no ``deadlock detected``.

Figures reported beside the checks: turns acknowledged and final, the longest a control call
waited for its answer, the takeover times, the server's errors by message.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import orjson

from ledger.verify import session_ledger_paths
from tests.storms.crash_checks import ANYIO_READ_RACE, FINAL_STATUSES, LedgerTurnEntries
from tests.storms.history import Op

__all__ = [
    "EXPECTED_ERRORS",
    "Check",
    "CliResult",
    "LedgerLine",
    "StoreSnapshot",
    "StoreTurn",
    "Takeover",
    "Verdict",
    "check_acknowledged",
    "check_answers",
    "check_deadlocks",
    "check_ledger_files",
    "check_ledger_store",
    "check_logs",
    "check_run_records",
    "check_takeovers",
    "longest_call",
    "read_store",
]

#: error-level events a fault is expected to cause, each with why; anything else at error or
#: critical level is a finding
EXPECTED_ERRORS: Final[Mapping[str, str]] = {
    "store_unavailable": "the server restarted, or the daemon's proxy black-holed it",
    ANYIO_READ_RACE: "anyio's read race, logged by asyncio (tests.storms.crash_checks)",
}
#: warnings that say a fault was noticed and handled; counted, not findings
NOTICED: Final = (
    "claim_lost",
    "stale_result_refused",
    "session_home_lost",
    "session_adopted",
    "store_reconnected",
)
_LISTED: Final = 12


@dataclass(slots=True)
class Check:
    """One check's findings (``problems``: each a failure) and remarks (``notes``)."""

    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: problems by kind (``duplicate``, ``mismatch``, ``double-run``, ...), for the summary
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str, *, kind: str = "other") -> None:
        self.problems.append(problem)
        self.kinds[kind] += 1


@dataclass(frozen=True, slots=True)
class StoreTurn:
    turn_id: int
    session_id: str
    turn_number: int
    kind: str
    key: str | None
    state: str

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATUSES


@dataclass(frozen=True, slots=True)
class LedgerLine:
    seq: int
    entry_hash: str
    entry: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """What the store holds after the run."""

    turns: Sequence[StoreTurn]
    #: ledger id (``<sid>/exec``, ``<sid>/evidence``) -> its lines in seq order
    lines: Mapping[str, Sequence[LedgerLine]]
    #: ledger id -> (seq, entry hash) of ``ledger_heads``
    heads: Mapping[str, tuple[int, str]]

    def by_id(self) -> dict[int, StoreTurn]:
        return {t.turn_id: t for t in self.turns}


@dataclass(frozen=True, slots=True)
class CliResult:
    """One ``hunter ledger ...`` command of the checker: what, its exit code, its output."""

    what: str
    code: int
    output: str


@dataclass(frozen=True, slots=True)
class Takeover:
    fault: str
    target: str
    sessions: int
    seconds: float
    how: str


async def read_store(dsn: str) -> StoreSnapshot:
    """Read the turns, every ledger line and the ledger heads (one connection, no proxy)."""
    conn = await asyncpg.connect(dsn)
    try:
        turns = [
            StoreTurn(
                turn_id=int(r["turn_id"]),
                session_id=str(r["session_id"]),
                turn_number=int(r["turn_number"]),
                kind=str(r["kind"]),
                key=r["idempotency_key"],
                state=str(r["state"]),
            )
            for r in await conn.fetch(
                "SELECT turn_id, session_id, turn_number, kind, idempotency_key, state"
                " FROM turns ORDER BY turn_id"
            )
        ]
        lines: dict[str, list[LedgerLine]] = {}
        for r in await conn.fetch(
            "SELECT ledger_id, seq, entry_hash, line FROM ledger_lines ORDER BY ledger_id, seq"
        ):
            lines.setdefault(str(r["ledger_id"]), []).append(
                LedgerLine(int(r["seq"]), str(r["entry_hash"]), orjson.loads(bytes(r["line"])))
            )
        heads = {
            str(r["ledger_id"]): (int(r["seq"]), str(r["entry_hash"]))
            for r in await conn.fetch("SELECT ledger_id, seq, entry_hash FROM ledger_heads")
        }
    finally:
        await conn.close()
    return StoreSnapshot(turns=turns, lines=lines, heads=heads)


def _listed(check: Check, problems: Iterable[str]) -> None:
    check.problems.extend(problems)


# -- the history against the store -----------------------------------------------------------


def check_acknowledged(ops: Sequence[Op], store: StoreSnapshot) -> Check:
    """The ``acknowledged`` check (module docstring)."""
    check = Check("acknowledged")
    turns = store.by_id()
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    store_keys: dict[str, list[StoreTurn]] = {}
    for kept in store.turns:
        if kept.key is not None:
            store_keys.setdefault(kept.key, []).append(kept)
    for key, calls in sorted(by_key.items()):
        acks = [op for op in calls if op.type == "ok" and op.turn_id is not None]
        ids = sorted({op.turn_id for op in acks if op.turn_id is not None})
        held = store_keys.get(key, [])
        if len(ids) > 1:
            check.add(
                kind="duplicate",
                problem=f"key {key}: acknowledged as different turns {ids} "
                f"({', '.join(f'{op.daemon}#{op.attempt}->{op.turn_id}' for op in acks)})",
            )
        if len(held) > 1:
            check.add(
                f"key {key}: the store holds {len(held)} turns {[t.turn_id for t in held]}",
                kind="duplicate",
            )
        created = [op for op in acks if op.created]
        if len(created) > 1:
            check.add(
                kind="duplicate",
                problem=f"key {key}: {len(created)} submissions answered created=true "
                f"({', '.join(f'{op.daemon}#{op.attempt}->{op.turn_id}' for op in created)})",
            )
        if not acks:
            refused = [op for op in calls if op.type == "fail"]
            if held and refused and len(refused) == len(calls):
                check.add(
                    kind="refused-accepted",
                    problem=f"key {key}: every submission was refused ({refused[-1].code}) but the "
                    f"store holds turn {held[0].turn_id}",
                )
            elif held:
                check.notes.append(
                    f"key {key}: never acknowledged (last: {calls[-1].code or calls[-1].type}), "
                    f"the store holds turn {held[0].turn_id} ({held[0].state})"
                )
            continue
        for turn_id in ids:
            turn = turns.get(turn_id)
            if turn is None:
                check.add(
                    kind="lost",
                    problem=f"key {key}: acknowledged turn {turn_id} is not in the store",
                )
            elif not turn.final:
                check.add(
                    kind="lost",
                    problem=f"key {key}: acknowledged turn {turn_id} is not final ({turn.state})",
                )
            elif held and turn.turn_id not in {t.turn_id for t in held}:
                check.add(
                    kind="lost",
                    problem=f"key {key}: acknowledged turn {turn_id}, the store's key names "
                    f"{[t.turn_id for t in held]}",
                )
    return check


def check_answers(
    answers: Mapping[str, Mapping[int, str]], store: StoreSnapshot, acknowledged: Iterable[int]
) -> Check:
    """The ``answers`` check: *answers* is daemon -> turn id -> state (or an error text)."""
    check = Check("answers")
    turns = store.by_id()
    for daemon, seen in sorted(answers.items()):
        wrong = []
        for turn_id in sorted(set(acknowledged)):
            turn = turns.get(turn_id)
            state = seen.get(turn_id, "(not asked)")
            if turn is None or state != turn.state:
                wrong.append(f"turn {turn_id}: {state}, store {turn.state if turn else 'absent'}")
        if wrong:
            check.add(
                kind="answer",
                problem=f"daemon {daemon} disagrees with the store on {len(wrong)} turns: "
                + "; ".join(wrong[:5]),
            )
    return check


# -- ledgers ---------------------------------------------------------------------------------


def _turn_entries(
    lines: Sequence[LedgerLine], into: dict[int, LedgerTurnEntries], *, exec_: bool
) -> None:
    for line in lines:
        entry = line.entry
        if entry.get("kind") != "turn" or "turn_number" not in entry:
            continue
        t = into.setdefault(int(entry["turn_number"]), LedgerTurnEntries())
        if exec_:
            t.exec_statuses.append(str(entry.get("status")))
            t.exec_seqs.append(line.seq)
        else:
            t.evidence_seqs.append(line.seq)


def ledger_entries(store: StoreSnapshot) -> dict[str, dict[int, LedgerTurnEntries]]:
    """Session id -> turn number -> its ``turn`` entries in the store's two ledgers."""
    sessions: dict[str, dict[int, LedgerTurnEntries]] = {}
    for ledger_id, lines in store.lines.items():
        sid, _, which = ledger_id.rpartition("/")
        _turn_entries(lines, sessions.setdefault(sid, {}), exec_=which == "exec")
    return sessions


def check_ledger_store(store: StoreSnapshot) -> Check:
    """The ``ledger-store`` check (module docstring)."""
    check = Check("ledger-store")
    for ledger_id, lines in sorted(store.lines.items()):
        previous: str | None = None
        for expected, line in enumerate(lines, start=1):
            if line.seq != expected:
                check.add(
                    kind="mismatch", problem=f"{ledger_id}: seq {line.seq} where {expected} was due"
                )
                break
            if previous is not None and line.entry.get("previous_hash") != previous:
                check.add(
                    kind="mismatch",
                    problem=f"{ledger_id} seq {line.seq}: previous_hash does not link to "
                    f"seq {line.seq - 1}",
                )
            previous = line.entry_hash
        head = store.heads.get(ledger_id)
        last = (lines[-1].seq, lines[-1].entry_hash) if lines else None
        if head != last:
            check.add(
                kind="mismatch",
                problem=f"{ledger_id}: ledger_heads says {head}, its last line {last}",
            )
    for ledger_id in sorted(set(store.heads) - set(store.lines)):
        check.add(kind="mismatch", problem=f"{ledger_id}: a head in ledger_heads but no line")
    entries = ledger_entries(store)
    known: dict[str, set[int]] = {}
    for turn in store.turns:
        known.setdefault(turn.session_id, set()).add(turn.turn_number)
        got = entries.get(turn.session_id, {}).get(turn.turn_number, LedgerTurnEntries())
        name = (
            f"turn {turn.turn_id} (session {turn.session_id} #{turn.turn_number}, {turn.kind}, "
            f"{turn.state})"
        )
        finals = got.final_exec()
        if not turn.final:
            if finals:
                check.add(
                    kind="mismatch",
                    problem=f"{name}: not ended, but {len(finals)} final exec entries (seqs "
                    f"{[s for s, _ in finals]}, statuses {[st for _, st in finals]})",
                )
            continue
        if len(finals) != 1:
            check.add(
                f"{name}: {len(finals)} final exec entries (seqs {[s for s, _ in finals]}, "
                f"statuses {[st for _, st in finals]})",
                kind="duplicate" if finals else "mismatch",
            )
        elif finals[0][1] != turn.state:
            check.add(
                kind="mismatch", problem=f"{name}: the exec ledger's final status is {finals[0][1]}"
            )
        due = len(got.exec_statuses) - len(finals) + 1
        if len(got.evidence_seqs) != due:
            check.add(
                f"{name}: {len(got.evidence_seqs)} evidence entries (seqs {got.evidence_seqs}), "
                f"{due} due",
                kind="duplicate" if len(got.evidence_seqs) > due else "mismatch",
            )
    for sid, by_number in sorted(entries.items()):
        for number in sorted(set(by_number) - known.get(sid, set())):
            check.add(
                kind="mismatch", problem=f"session {sid} #{number}: ledger entries but no turn"
            )
    return check


def ledger_dirs(root: Path) -> list[Path]:
    """Every session directory with ledger files on *root*: live ones and stale copies."""
    found = [*root.glob("planes/*/sessions/*"), *root.glob("planes/*/stale/*")]
    return sorted(d for d in found if (d / "ledger").is_dir())


def _file_lines(path: Path) -> Iterable[tuple[int, dict[str, Any] | None, bytes]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            yield number, None, raw
            continue
        yield number, entry if isinstance(entry, dict) else None, raw


_CLI_FINE: Final = ("ok ", "-- ", "store: ", "warning: ", "to compare a session")


def cli_findings(output: str) -> list[str]:
    """What a ``hunter ledger verify`` found wrong: its output without the lines that say
    something is fine (``ok``, ``--`` notes, the ``store:`` summary), the count line last."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    found = [ln for ln in lines if not ln.startswith(_CLI_FINE) and "ledgers intact" not in ln]
    return found + [ln for ln in lines if "ledgers intact" in ln and " 0 targets failed" not in ln]


def check_ledger_files(
    roots: Mapping[str, Path], store: StoreSnapshot, cli: Sequence[CliResult]
) -> Check:
    """The ``ledger-files`` check (module docstring)."""
    check = Check("ledger-files")
    by_seq = {
        ledger_id: {line.seq: line.entry_hash for line in lines}
        for ledger_id, lines in store.lines.items()
    }
    files = 0
    for name, root in sorted(roots.items()):
        for session_dir in ledger_dirs(root):
            where = f"{name}:{session_dir.relative_to(root)}"
            for path in session_ledger_paths(session_dir):
                files += 1
                finals: Counter[int] = Counter()
                for number, entry, raw in _file_lines(path):
                    if entry is None:
                        check.add(
                            kind="mismatch",
                            problem=f"{where}/{path.name} line {number} is not a JSON "
                            f"entry: {raw[:80]!r}",
                        )
                        continue
                    ledger_id, seq = str(entry.get("ledger_id")), int(entry.get("seq", -1))
                    kept = by_seq.get(ledger_id, {}).get(seq)
                    if kept is None:
                        check.add(
                            kind="mismatch",
                            problem=f"{where}/{path.name} seq {seq} (turn_number "
                            f"{entry.get('turn_number')}, {entry.get('status', entry.get('kind'))})"
                            f": not in the store",
                        )
                    elif kept != entry.get("entry_hash"):
                        check.add(
                            kind="mismatch",
                            problem=f"{where}/{path.name} seq {seq} (turn_number "
                            f"{entry.get('turn_number')}, {entry.get('status', entry.get('kind'))})"
                            f": differs from the store's line at that seq",
                        )
                    if (
                        path.name.startswith("exec")
                        and entry.get("kind") == "turn"
                        and entry.get("status") in FINAL_STATUSES
                    ):
                        finals[int(entry["turn_number"])] += 1
                for number, count in sorted(finals.items()):
                    if count > 1:
                        check.add(
                            kind="duplicate",
                            problem=f"{where}/{path.name}: {count} final entries for "
                            f"turn_number {number}",
                        )
    check.notes.append(f"{files} ledger files compared with the store")
    for result in cli:
        if result.code != 0:
            shown = cli_findings(result.output)
            more = f" (and {len(shown) - 4} more)" if len(shown) > 4 else ""
            check.add(
                kind="mismatch",
                problem=f"{result.what} exited {result.code}: "
                + ("; ".join(shown[:4]) or result.output.strip()[-300:])
                + more,
            )
    return check


# -- the process turns' run records ------------------------------------------------------------


def _promoted_hash(store: StoreSnapshot, turn: StoreTurn, name: str) -> str | None:
    """The sha256 the final evidence entry of *turn* says it promoted for *name*."""
    hashes = [
        str(out.get("sha256"))
        for line in store.lines.get(f"{turn.session_id}/evidence", ())
        if line.entry.get("kind") == "turn" and line.entry.get("turn_number") == turn.turn_number
        for out in line.entry.get("promoted_outputs") or ()
        if isinstance(out, Mapping) and out.get("path") == name
    ]
    return hashes[-1] if hashes else None


def check_run_records(
    workspaces: Mapping[str, Path], roots: Mapping[str, Path], store: StoreSnapshot
) -> Check:
    """The ``double-runs`` check; *workspaces*: session id -> its workspace."""
    check = Check("double-runs")
    root_names = {str(path): name for name, path in roots.items()}
    process = {t.key: t for t in store.turns if t.kind == "process" and t.key is not None}
    seen: set[str] = set()
    for sid, workspace in sorted(workspaces.items()):
        for record in sorted(workspace.glob("run-*.log")):
            key = record.name[len("run-") : -len(".log")]
            seen.add(key)
            data = record.read_bytes()
            runs = [ln.split() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
            where = []
            for run in runs:
                out_dir = Path(run[2]) if len(run) > 2 else Path("?")
                where.append(root_names.get(str(out_dir.parent.parent), str(out_dir)))
            turn = process.get(key)
            name = f"key {key} (turn {turn.turn_id if turn else '?'}, session {sid})"
            if len(runs) != 1:
                check.add(
                    kind="double-run",
                    problem=f"{name}: ran to completion {len(runs)} times, on daemons {where}",
                )
            if turn is None:
                check.add(
                    kind="run-record",
                    problem=f"{name}: a run record but no process turn in the store",
                )
                continue
            if turn.state != "succeeded":
                check.add(
                    kind="run-record",
                    problem=f"{name}: a run was promoted, the turn ended {turn.state}",
                )
            promoted = _promoted_hash(store, turn, record.name)
            actual = hashlib.sha256(data).hexdigest()
            if promoted != actual:
                check.add(
                    kind="run-record",
                    problem=f"{name}: the workspace record (runs on {where}) is not what the "
                    "final evidence entry says was promoted "
                    f"({'none' if promoted is None else promoted[:12]})",
                )
    for key, turn in sorted(process.items()):
        if turn.state == "succeeded" and key not in seen:
            check.add(
                kind="run-record",
                problem=f"key {key} (turn {turn.turn_id}): succeeded, no run record",
            )
    check.notes.append(f"{len(seen)} run records of {len(process)} process turns")
    return check


# -- logs, takeovers, deadlocks, latency --------------------------------------------------------


@dataclass(slots=True)
class LogFindings:
    tracebacks: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    expected: Counter[str] = field(default_factory=Counter)
    noticed: Counter[str] = field(default_factory=Counter)


def scan_log(name: str, text: str) -> LogFindings:
    """The tracebacks, error events and noticed faults of one daemon's log (JSON lines; a line
    that is not JSON counts when it says ``Traceback``)."""
    found = LogFindings()
    pending_plain: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict):
            if "Traceback" in line:
                pending_plain.append(f"{name} log line {number}: {line[:200]}")
            elif pending_plain and line and not line.startswith(" "):
                # the last line of a plain traceback: the exception itself
                pending_plain[-1] += f" ... {line[:200]}"
            continue
        what = str(event.get("event", ""))
        level = str(event.get("level", ""))
        exception = str(event.get("exception") or "").strip()
        if what in NOTICED:
            found.noticed[what] += 1
        if exception or "Traceback" in line:
            last = exception.splitlines()[-1] if exception else line[:200]
            ids = ", ".join(f"{k} {event[k]}" for k in ("turn_id", "session_id") if k in event)
            shown_ids = f" ({ids})" if ids else ""
            found.tracebacks.append(
                f"{name} log line {number}: {level} {what!r}{shown_ids}: {last}"
            )
        elif level in {"error", "critical"}:
            if any(what.startswith(prefix) for prefix in EXPECTED_ERRORS):
                found.expected[what] += 1
            else:
                detail = str(event.get("error") or event.get("reason") or "")[:200]
                found.unexpected.append(
                    f"{name} log line {number}: {level} {what!r}"
                    + (f": {detail}" if detail else "")
                )
    found.tracebacks.extend(pending_plain)
    return found


_FOLD: Final = re.compile(r"SES-[0-9TZ.]+-[0-9a-f]+|/\S+|\b[0-9a-f]{8,}\b|\d+")


def grouped(lines: Sequence[str]) -> list[str]:
    """*lines* (``<daemon> log line N: ...``) grouped by their shape (ids, paths and numbers
    folded): each group once, with its count and its first line."""
    groups: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        daemon, _, rest = line.partition(" log line ")
        _, _, what = rest.partition(": ")
        groups.setdefault((daemon, _FOLD.sub("#", what)), []).append(line)
    return [
        (f"x{len(found)}, first: {found[0]}" if len(found) > 1 else found[0])
        for found in groups.values()
    ]


def check_logs(
    logs: Mapping[str, Path], exits: Mapping[str, int | None]
) -> tuple[Check, LogFindings]:
    """The ``logs`` check; *exits*: each daemon's exit code at the final SIGTERM (None: it was
    not running: it died by itself)."""
    check = Check("logs")
    total = LogFindings()
    for name, path in sorted(logs.items()):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            check.add(kind="log", problem=f"cannot read daemon {name}'s log: {exc}")
            continue
        found = scan_log(name, text)
        total.tracebacks += found.tracebacks
        total.unexpected += found.unexpected
        total.expected.update(found.expected)
        total.noticed.update(found.noticed)
    for line in grouped(total.tracebacks):
        check.add(f"traceback: {line}", kind="traceback")
    for line in grouped(total.unexpected):
        check.add(f"error event: {line}", kind="error-event")
    for name, code in sorted(exits.items()):
        if code is None:
            check.add(
                kind="exit", problem=f"daemon {name} was not running at the end (it died by itself)"
            )
        elif code != 0:
            check.add(kind="exit", problem=f"daemon {name} exited {code} at the final SIGTERM")
    if total.expected:
        check.notes.append(
            "expected error events: "
            + ", ".join(
                f"{k} x{v} ({EXPECTED_ERRORS.get(k, '')})" for k, v in total.expected.items()
            )
        )
    if total.noticed:
        check.notes.append(
            "faults noticed: " + ", ".join(f"{k} x{v}" for k, v in sorted(total.noticed.items()))
        )
    return check, total


def takeovers(events: Sequence[Mapping[str, Any]]) -> list[Takeover]:
    return [
        Takeover(
            fault=str(e.get("f")),
            target=str(e.get("target")),
            sessions=int(e.get("sessions", 0)),
            seconds=float(e.get("seconds", 0.0)),
            how=str(e.get("how")),
        )
        for e in events
        if e.get("type") == "takeover"
    ]


def check_takeovers(measured: Sequence[Takeover], *, bound_s: float) -> Check:
    """The ``takeover`` check: each within *bound_s*, by another daemon."""
    check = Check("takeover")
    for t in measured:
        line = (
            f"{t.fault} of daemon {t.target} ({t.sessions} sessions): {t.how} after "
            f"{t.seconds:.2f} s"
        )
        if t.sessions and (t.how != "taken over" or t.seconds > bound_s):
            check.add(
                kind="slow-takeover", problem=f"slow takeover: {line} (bound {bound_s:.1f} s)"
            )
        else:
            check.notes.append(line)
    return check


_DEADLOCK: Final = "deadlock detected"
_SERVER_ERROR: Final = re.compile(r"\b(ERROR|FATAL|PANIC):\s+(.*)$")


def server_errors(text: str) -> Counter[str]:
    """The server log's ERROR/FATAL/PANIC messages, by message (numbers and quoted values
    folded, so that one kind of error counts as one)."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SERVER_ERROR.search(line)
        if match:
            message = re.sub(r'"[^"]*"|\d+', "#", match.group(2))[:120]
            found[f"{match.group(1)}: {message}"] += 1
    return found


def check_deadlocks(server_log: str) -> tuple[Check, int]:
    check = Check("deadlocks")
    count = server_log.count(_DEADLOCK)
    if count:
        check.add(kind="deadlock", problem=f"the server log has {count} '{_DEADLOCK}'")
    return check, count


def longest_call(ops: Sequence[Op], *, ended: float) -> tuple[float, Op | None]:
    """The longest a call waited for its answer (one never answered: until *ended*)."""
    best, which = 0.0, None
    for op in ops:
        waited = (op.completed if op.completed is not None else ended) - op.invoked
        if waited > best:
            best, which = waited, op
    return best, which


# -- the verdict --------------------------------------------------------------------------------


@dataclass(slots=True)
class Verdict:
    """Every check of one run and its figures; `ok` when no check found a problem."""

    seed: int
    checks: list[Check]
    acknowledged: int
    final: int
    calls: int
    errors: int
    takeovers: list[Takeover]
    longest_call_s: float
    longest_call: str
    deadlocks: int
    server_errors: Counter[str]
    faults: list[str]
    tracebacks: int
    unexpected_errors: int
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    @property
    def duplicates(self) -> int:
        """Turns ended twice (in the store's ledger or a file) and keys that made two turns."""
        return sum(c.kinds["duplicate"] for c in self.checks)

    @property
    def ledger_mismatches(self) -> int:
        return sum(c.kinds["mismatch"] for c in self.checks)

    @property
    def double_runs(self) -> int:
        return sum(c.kinds["double-run"] for c in self.checks)

    def summary(self) -> str:
        times = ", ".join(
            f"{t.fault} {t.target} {t.seconds:.1f}s"
            + ("" if t.how == "taken over" else f" ({t.how})")
            for t in self.takeovers
        )
        failing = [c.name for c in self.checks if not c.ok]
        return (
            f"seed {self.seed}: {'OK' if self.ok else 'FAILED (' + ', '.join(failing) + ')'}; "
            f"turns acknowledged {self.acknowledged}, final {self.final}; "
            f"duplicates {self.duplicates}; ledger mismatches {self.ledger_mismatches}; "
            f"double runs {self.double_runs}; tracebacks {self.tracebacks}; "
            f"unexpected error events {self.unexpected_errors}; takeovers [{times or 'none'}]; "
            f"longest unanswered call {self.longest_call_s:.2f} s ({self.longest_call}); "
            f"deadlocks {self.deadlocks}; calls {self.calls} ({self.errors} errors); "
            f"faults {len(self.faults)}; {self.elapsed_s:.0f} s"
        )

    def details(self, *, limit: int = _LISTED) -> list[str]:
        """Each check's problems (at most *limit* each) and notes, for a report."""
        out = [f"faults: {'; '.join(self.faults) or 'none'}"]
        for c in self.checks:
            out.append(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {len(c.problems)} problems")
            out += [f"    {p}" for p in c.problems[:limit]]
            if len(c.problems) > limit:
                out.append(f"    ... and {len(c.problems) - limit} more")
            out += [f"    ({n})" for n in c.notes[:limit]]
        if self.server_errors:
            out.append(
                "server errors: "
                + "; ".join(f"{m} x{n}" for m, n in self.server_errors.most_common(8))
            )
        return out
