"""After a crash: put the session ledger files and the store back in step, before any turn runs.

A turn's ending and its two ledger lines commit together in the store (`TurnStore.finish`); the
files get the lines from their writers and are synced later, in rounds. A crash can leave the
two sides apart in two ways, and this module closes both:

* **The files lost lines the store kept** (a power loss before the files were synced): the
  store's kept lines are written back (`LedgerWriter.restore` checks that each one continues the
  chain), and then trimmed.
* **The files hold a turn's final entry, the store does not have the ending** (the line reached
  the file, or the sandbox runtime wrote and synced it, and the daemon died before the store's
  commit): the turn is ended from its entry instead of being run again. Running it again would
  write a second final entry for one turn. Only final statuses count: an ``escalated`` entry is
  not an ending (the turn runs again and writes its real ending later).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread
import orjson

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import FINAL_STATES, LEGAL_MOVES, TurnState
from supervisor.logging import get_logger
from supervisor.store.protocol import Claim, TurnEnding, TurnStore
from supervisor.turns.sessions import DaemonSessions, SessionLike

__all__ = ["LedgerEnding", "catch_up_ledgers", "endings_in_ledger", "roll_forward"]

#: the reason recorded on a turn ended from its ledger entry
ROLLED_FORWARD = (
    "ended from its ledger entry after a crash: the entry was written, the store's commit of the"
    " ending was not"
)


@dataclass(frozen=True, slots=True)
class LedgerEnding:
    """The decision a final exec entry records for one turn."""

    turn_number: int
    state: TurnState
    verdict: str | None
    reason_code: str | None
    fault_type: str | None
    result_hash: str | None

    def to_ending(self) -> TurnEnding:
        return TurnEnding(
            state=self.state,
            verdict=self.verdict or ("SUCCEED" if self.state is TurnState.SUCCEEDED else None),
            reason_code=self.reason_code or "RECOVERED_FROM_LEDGER",
            reason=ROLLED_FORWARD,
            fault_type=self.fault_type,
            result={"recovered_from_ledger": True, "result_hash": self.result_hash},
        )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def endings_in_ledger(path: Path, turn_numbers: Collection[int]) -> dict[int, LedgerEnding]:
    """The last final ``turn`` entry of each of *turn_numbers* in the exec ledger at *path*
    (blocking; a missing file has none). Lines that do not parse are skipped here: verifying
    the file is the writer's and `hunter ledger verify`'s job."""
    wanted = set(turn_numbers)
    found: dict[int, LedgerEnding] = {}
    if not wanted:
        return found
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return found
    for raw in data.splitlines():
        if b'"turn_number"' not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(entry, dict) or entry.get("kind") != "turn":
            continue
        number = entry.get("turn_number")
        if not isinstance(number, int) or number not in wanted:
            continue
        try:
            state = TurnState(str(entry.get("status")))
        except ValueError:
            continue
        if state not in FINAL_STATES:
            continue
        found[number] = LedgerEnding(
            turn_number=number,
            state=state,
            verdict=_text(entry.get("verdict")),
            reason_code=_text(entry.get("reason_code")),
            fault_type=_text(entry.get("fault_type")),
            result_hash=_text(entry.get("result_hash")),
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
    log = get_logger("supervisor.turns.recovery")
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
            started = None
            if found.state not in LEGAL_MOVES[claim.turn.state]:
                # Its start had not been written (it rides with the outcome): the entry proves
                # the attempt ran, so the ending carries its start.
                started = AttemptRecord(
                    attempt=claim.turn.attempt + 1,
                    started_us=claim.turn.accepted_us,
                    detail="recovered from the ledger after a crash",
                )
            try:
                await store.finish(claim, found.to_ending(), started=started)
            except Exception as exc:  # not run again either: that would write a second ending
                log.exception(
                    "turn_roll_forward_failed",
                    session_id=session_id,
                    turn_id=claim.turn_id,
                    error=f"{type(exc).__name__}: {exc}",
                )
                continue
            log.warning(
                "turn_rolled_forward",
                session_id=session_id,
                turn_id=claim.turn_id,
                turn_number=found.turn_number,
                state=found.state.value,
            )
    return left
