"""After a crash: put the session ledger files and the store back in step, before any turn runs.

A turn's ending and its two ledger lines commit together in the store (`TurnStore.finish`); the
files get the lines from their writers and are synced later, in rounds. A crash can leave the
two sides apart in two ways, and this module closes both:

* **The files lost lines the store kept** (a power loss before the files were synced): the
  store's kept lines are written back (`LedgerWriter.restore` checks that each one continues the
  chain), and then trimmed.
* **The files hold a turn's final entry, the store does not have the ending.** A turn's lines
  are sealed by the store once the ending's fence held and stay out of the files until it has
  committed them (`SessionLedgers.turn_lines`, `supervisor.store.sealing`); a failed commit
  takes them back. So neither a crash nor a refused ending leaves this any more; a file written
  by an earlier release may still hold such an entry.
  The turn is ended from its entry instead of being run again (running it again would write a
  second final entry for one turn), with its attempts restored from the entries (outcome,
  decision, reason code, finish time), and with its evidence entry rebuilt from the exec entry
  if the evidence file lacks it (`evidence_entry_rebuilt`): a turn never ends without both.
  Only final statuses count: an ``escalated`` entry is not an ending (the turn runs again and
  writes its real ending later).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import anyio.to_thread
import orjson

from ledger import KIND_TURN
from ledger.verify import session_ledger_paths
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import FINAL_STATES, LEGAL_MOVES, TurnState
from supervisor.logging import get_logger
from supervisor.store.protocol import Claim, TurnEnding, TurnStore
from supervisor.store.sealing import EMPTY, LineSeal
from supervisor.turns.sessions import DaemonSessions, SessionLike

__all__ = ["LedgerEnding", "catch_up_ledgers", "endings_in_ledger", "roll_forward"]

#: the reason recorded on a turn ended from its ledger entry
ROLLED_FORWARD = (
    "ended from its ledger entry after a crash: the entry was written, the store's commit of the"
    " ending was not"
)
#: the detail of an attempt record restored from a turn's ledger entries
RESTORED = "restored from the turn's ledger entries after a crash"


@dataclass(frozen=True, slots=True)
class LedgerEntryRef:
    """Where an entry sits in its ledger."""

    seq: int
    entry_hash: str


@dataclass(frozen=True, slots=True)
class LedgerEnding:
    """The decision a final exec entry records for one turn, with what the turn's entries say
    of its attempts (the evidence entry's ``external_calls`` of an instruction turn, the exec
    entry's ``attempts`` of a process turn)."""

    turn_number: int
    state: TurnState
    verdict: str | None
    reason_code: str | None
    fault_type: str | None
    result_hash: str | None
    #: when the exec entry was sealed (µs since the epoch)
    sealed_us: int = 0
    #: the attempts as the entries list them (plain mappings, as written)
    attempts: tuple[Mapping[str, object], ...] = ()
    #: whether the exec entry is a process turn's (its attempts are numbered by the runtime)
    process: bool = False
    #: False when the evidence ledger lacks the turn's entry (the crash came between the two
    #: files' writes): the roll-forward rebuilds it from the exec entry
    evidence_found: bool = True
    exec_entry: LedgerEntryRef | None = None
    query_hash: str | None = None
    #: who decided the ending (a cancel, an operator's terminate), as the exec entry records
    #: it (`supervisor.turns.decisions`); None when no person did
    decided_by: Mapping[str, object] | None = None

    def to_ending(self) -> TurnEnding:
        decided = {} if self.decided_by is None else {"decided_by": dict(self.decided_by)}
        return TurnEnding(
            state=self.state,
            verdict=self.verdict or ("SUCCEED" if self.state is TurnState.SUCCEEDED else None),
            reason_code=self.reason_code or "RECOVERED_FROM_LEDGER",
            reason=ROLLED_FORWARD,
            fault_type=self.fault_type,
            result={"recovered_from_ledger": True, "result_hash": self.result_hash, **decided},
        )

    def attempt_records(
        self, first: int, started_us: int, running: AttemptRecord | None = None
    ) -> tuple[AttemptRecord, ...]:
        """The turn's attempts restored from its entries, so that a rolled-forward turn reads
        like any other (outcome, decision, reason code, finish time). *first*: the number the
        store gave the attempt that was running; a process turn's runtime numbers its own
        attempts from 1. An entry that lists none gives one attempt holding the decision (with
        the executor and instruction of the attempt that was *running*, when the store knew
        them)."""
        finished = self.sealed_us or started_us
        out: list[AttemptRecord] = []
        for i, item in enumerate(self.attempts):
            number = first + i if self.process else _int(item.get("attempt")) or first + i
            duration = _int(item.get("duration_ms"))
            ended = _int(item.get("finished_us")) or finished
            began = _int(item.get("started_us")) or (
                ended - duration * 1000 if duration is not None else started_us
            )
            out.append(
                AttemptRecord(
                    attempt=number,
                    started_us=began,
                    executor_id=_text(item.get("executor_id")),
                    instruction_id=_text(item.get("instruction_id")),
                    finished_us=ended,
                    outcome=_text(item.get("outcome")),
                    fault_type=_text(item.get("fault_type")),
                    exit_code=_int(item.get("exit_code")),
                    decision=_text(item.get("decision")) or _text(item.get("verdict")),
                    reason_code=_text(item.get("reason_code")),
                    reason=_text(item.get("reason")),
                    detail=RESTORED,
                    duration_ms=duration,
                    delay_ms=_int(item.get("delay_ms")),
                )
            )
        if not out or not out[-1].finished:
            ending = self.to_ending()
            out.append(
                AttemptRecord(
                    attempt=out[-1].attempt + 1 if out else first,
                    started_us=started_us,
                    executor_id=None if running is None or out else running.executor_id,
                    instruction_id=None if running is None or out else running.instruction_id,
                    finished_us=finished,
                    outcome="SUCCESS"
                    if self.state is TurnState.SUCCEEDED
                    else "FAULT"
                    if self.fault_type
                    else "FAILURE",
                    fault_type=self.fault_type,
                    decision=ending.verdict,
                    reason_code=ending.reason_code,
                    reason=ROLLED_FORWARD,
                    detail=RESTORED,
                )
            )
        return tuple(out)

    def evidence_record(self, session_id: str) -> dict[str, object]:
        """The evidence entry a crash kept from the files, rebuilt from the exec entry (it says
        so, and names the exec entry it was rebuilt from)."""
        ref = self.exec_entry
        decided = {} if self.decided_by is None else {"decided_by": dict(self.decided_by)}
        return {
            **decided,
            "kind": KIND_TURN,
            "session_id": session_id,
            "turn_number": self.turn_number,
            "declared_reads": [],
            "declared_writes": [],
            "external_calls": [dict(a) for a in self.attempts if not self.process],
            "capability_violations": [],
            "rebuilt_from_exec_entry": {
                "seq": ref.seq if ref else None,
                "entry_hash": ref.entry_hash if ref else None,
                "reason": "the crash came after the exec entry reached its file and before the"
                " evidence entry did",
            },
        }


def _mapping(value: object) -> Mapping[str, object] | None:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def _turn_entries(data: bytes, wanted: set[int]) -> dict[int, list[dict[str, object]]]:
    """The ``turn`` entries of *wanted* turn numbers in a ledger file's bytes, in order. Lines
    that do not parse are skipped here: verifying is the writer's and `hunter ledger verify`'s
    job."""
    found: dict[int, list[dict[str, object]]] = {}
    for raw in data.splitlines():
        if b'"turn_number"' not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(entry, dict) or entry.get("kind") != KIND_TURN:
            continue
        number = entry.get("turn_number")
        if type(number) is int and number in wanted:
            found.setdefault(number, []).append(entry)
    return found


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def endings_in_ledger(exec_path: Path, turn_numbers: Collection[int]) -> dict[int, LedgerEnding]:
    """The last final ``turn`` entry of each of *turn_numbers* in the session's exec ledger at
    *exec_path*, with what its evidence ledger (beside it) says of the turn (blocking; a missing
    file has none). The daemon writes a turn's two entries in pairs (one per escalation, one
    for the ending), so an evidence ledger with fewer of the turn's entries than the exec
    ledger lacks the ending's."""
    wanted = set(turn_numbers)
    if not wanted:
        return {}
    exec_entries = _turn_entries(_read(exec_path), wanted)
    if not exec_entries:
        return {}
    evidence_entries = _turn_entries(
        _read(session_ledger_paths(exec_path.parent)[1]), set(exec_entries)
    )
    found: dict[int, LedgerEnding] = {}
    for number, entries in exec_entries.items():
        entry = entries[-1]
        try:
            state = TurnState(str(entry.get("status")))
        except ValueError:
            continue
        if state not in FINAL_STATES:
            continue
        evidence = evidence_entries.get(number, [])
        complete = len(evidence) >= len(entries)
        process = isinstance(entry.get("attempts"), list)
        listed = (
            entry.get("attempts")
            if process
            else (evidence[-1].get("external_calls") if complete else None)
        )
        attempts = (
            tuple(a for a in listed if isinstance(a, dict)) if isinstance(listed, list) else ()
        )
        seq, digest = entry.get("seq"), entry.get("entry_hash")
        found[number] = LedgerEnding(
            turn_number=number,
            state=state,
            verdict=_text(entry.get("verdict")),
            reason_code=_text(entry.get("reason_code")),
            fault_type=_text(entry.get("fault_type")),
            result_hash=_text(entry.get("result_hash")),
            sealed_us=_int(entry.get("ts_us")) or 0,
            attempts=attempts,
            process=process,
            evidence_found=complete,
            exec_entry=LedgerEntryRef(seq, digest)
            if type(seq) is int and isinstance(digest, str)
            else None,
            query_hash=_text(entry.get("query_hash")),
            decided_by=_mapping(entry.get("decided_by")),
        )
    return found


async def catch_up_ledgers(store: TurnStore, sessions: DaemonSessions, session: SessionLike) -> int:
    """Write back the kept lines the session's files lost, then trim them; how many."""
    log = get_logger("supervisor.turns.recovery")
    lines = await store.ledger_lines(session.ledger_ids)
    if not lines:
        return 0
    appended = await sessions.restore(session, lines)
    marks: dict[str, int] = {}
    for line in lines:
        marks[line.ledger_id] = max(marks.get(line.ledger_id, 0), line.seq)
    await store.trim_ledger_lines(marks)
    if appended:
        log.warning(
            "ledger_lines_restored",
            session_id=session.session_id,
            lines=appended,
            kept=len(lines),
        )
    return appended


async def roll_forward(
    store: TurnStore, sessions: DaemonSessions, claims: list[Claim]
) -> list[Claim]:
    """End every recovered turn whose final entry is already in its session's exec ledger;
    return the claims left to run."""
    by_session: dict[str, list[Claim]] = {}
    for claim in claims:
        by_session.setdefault(claim.turn.session_id, []).append(claim)
    left: list[Claim] = []
    for session_id, held in by_session.items():
        session = sessions.get(session_id)
        if session is None:
            left.extend(held)
            continue
        numbers = [c.turn.turn_number for c in held]
        endings: Mapping[int, LedgerEnding] = await anyio.to_thread.run_sync(
            endings_in_ledger, session.exec_ledger_path, numbers
        )
        for claim in held:
            found = endings.get(claim.turn.turn_number)
            if found is None:
                left.append(claim)
                continue
            await _end_from_ledger(store, sessions, session, claim, found)
    return left


async def _end_from_ledger(
    store: TurnStore,
    sessions: DaemonSessions,
    session: SessionLike,
    claim: Claim,
    found: LedgerEnding,
) -> None:
    """End *claim*'s turn as its final exec entry says, with its attempts restored from the
    entries, and its evidence entry rebuilt when the crash kept it from the file."""
    log = get_logger("supervisor.turns.recovery")
    turn = claim.turn
    running = [a for a in turn.attempts if not a.finished]
    first = running[0].attempt if running else turn.attempt + 1
    started_us = running[0].started_us if running else turn.accepted_us
    attempts = found.attempt_records(first, started_us, running[0] if running else None)
    started = None
    if found.state not in LEGAL_MOVES[turn.state]:
        # Its start had not been written (it rides with the outcome): the entry proves the
        # attempt ran, so the ending carries its start.
        started = AttemptRecord(attempt=attempts[0].attempt, started_us=attempts[0].started_us)
    if found.decided_by is None:  # an entry of an older release: the store's record knows it
        stored = (turn.result or {}).get("decided_by")
        if isinstance(stored, Mapping):
            found = replace(found, decided_by=dict(stored))
    lines: LineSeal = EMPTY
    if not found.evidence_found:
        lines = session.evidence_lines(found.evidence_record(session.session_id))
        log.error(
            "evidence_entry_rebuilt",
            session_id=session.session_id,
            turn_id=claim.turn_id,
            turn_number=found.turn_number,
            reason="the exec entry reached its file, the evidence entry did not",
        )
    try:
        await store.finish(claim, found.to_ending(), attempts, ledger_lines=lines, started=started)
    except Exception as exc:  # not run again either: that would write a second ending
        log.exception(
            "turn_roll_forward_failed",
            session_id=session.session_id,
            turn_id=claim.turn_id,
            error=f"{type(exc).__name__}: {exc}",
        )
        return
    if lines.lines:  # committed (a refused ending's were withdrawn or never sealed)
        sessions.flush(session.session_id, lines.lines)
    log.warning(
        "turn_rolled_forward",
        session_id=session.session_id,
        turn_id=claim.turn_id,
        turn_number=found.turn_number,
        state=found.state.value,
        attempts=len(attempts),
    )
