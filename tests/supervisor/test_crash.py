"""A real crash test: the daemon SIGKILLed at random moments under a mixed stream of turns.

The storm is `tests.storms.crash` (``scripts/crash_storm.py --mixed`` runs a long one): a
real ``hunter serve``, real chaos executor processes that reconnect, clients submitting
instruction turns and sandboxed process turns with idempotency keys (resubmitting after each
restart), a seeded killer. Afterwards
every acknowledged turn must be final, every key must name one turn, every final turn the
store has must have exactly one final entry in each of its session's two ledgers, every turn a
restart rolled forward (ended from its ledger entry) must show attempts that ended, the ledgers
must verify and the daemon log must hold no traceback (nor error event), and after the final
clean stop no process of the storm's sandbox uids, no turn cgroup and no scratch file may be
left. ``HUNTER_CRASH_SEED`` picks another seed.

The checker itself is tested on hand-made ledger entries and turn records below (no daemon);
the ledger pair check on files written by the real ledger writer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import SessionLedgers, session_dir_for, verify_root
from sandbox.confine.cgroups import detect_layout
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnKind, TurnState
from sandbox.runtime.runtime import cgroup_prefix_for
from supervisor.store.protocol import TurnRecord
from supervisor.turns.recovery import ROLLED_FORWARD
from tests.storms.crash import (
    LedgerTurnEntries,
    StormConfig,
    StormReport,
    check_daemon_log,
    check_ledger_pairs,
    check_leftovers,
    check_rolled_forward,
    check_turn_entries,
    format_violations,
    read_turn_entries,
    rolled_forward,
    run_storm,
    storm_uids,
)
from tests.storms.crash_checks import ANYIO_READ_RACE, count_log_events
from tests.storms.starvation import BusyLoops
from tests.turn_requests import READ_SPEC

SEED = int(os.environ.get("HUNTER_CRASH_SEED", "7"))
CI_STORM = StormConfig(
    kills=6, turns=300, seed=SEED, submitters=8, settle_s=20.0, storm_limit_s=40.0, mixed=True
)


@pytest.fixture
def root() -> Iterator[Path]:
    """A fresh root others can traverse, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="hh-crash-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _listing(report: StormReport, lines: list[str]) -> str:
    shown = "\n  ".join(lines[:40])
    more = f"\n  ... and {len(lines) - 40} more" if len(lines) > 40 else ""
    return f"{report.summary()}\n  {shown}{more}"


@pytest.mark.slow
@pytest.mark.parametrize("starve", [0, 2], ids=["idle", "starved"])
async def test_sigkill_storm_loses_nothing(
    root: Path,
    capsys: pytest.CaptureFixture[str],
    headline: Callable[[str, str], None],
    starve: int,
) -> None:
    """SIGKILL the daemon 6 times under 300 mixed turns, on an idle machine and with two
    busy-loop processes taking the CPU (a noisy neighbour): nothing acknowledged is lost, one
    turn per key, exactly one final ledger pair per turn, rolled-forward turns show ended
    attempts, ledgers verify, no traceback in the log, nothing left behind after the clean
    stop."""
    progress: list[str] = []
    busy = BusyLoops(starve)
    busy.start()
    try:
        with anyio.fail_after(55 if not starve else 110):
            report = await run_storm(root, CI_STORM, show=progress.append)
    finally:
        busy.stop()
    headline("crash" if not starve else "crash, starved", report.summary())
    with capsys.disabled():
        print(f"\n{report.summary()}")
    print("\n".join(progress + list(format_violations(report))))
    assert report.kinds["process"] >= CI_STORM.turns // 5, report.summary()

    assert report.kills >= 6, _listing(report, report.storm)
    assert report.acknowledged == CI_STORM.turns, _listing(report, report.storm)
    assert not report.storm, _listing(report, report.storm)
    assert not report.lost, "acknowledged turns lost or stuck:\n" + _listing(report, report.lost)
    assert not report.idempotency, "idempotency broken:\n" + _listing(report, report.idempotency)
    assert not report.ledger_duplicates, (
        "turns with more than one final ledger entry:\n"
        + _listing(report, report.ledger_duplicates)
    )
    assert not report.ledger_missing, "final turns without their ledger pair:\n" + _listing(
        report, report.ledger_missing
    )
    assert not report.ledger_pairs, (
        "final turns without exactly one entry in each of their session's ledgers:\n"
        + _listing(report, report.ledger_pairs)
    )
    assert not report.rolled_forward_attempts, (
        "rolled-forward turns with an attempt that never ended:\n"
        + _listing(report, report.rolled_forward_attempts)
    )
    assert not report.verification, "ledgers do not verify:\n" + _listing(
        report, report.verification
    )
    assert not report.log, "tracebacks or errors in the daemon log:\n" + _listing(
        report, report.log
    )
    assert not report.leftovers, "left behind after the clean stop:\n" + _listing(
        report, report.leftovers
    )
    assert report.ok, _listing(report, report.violations)  # a category not asserted above
    after = verify_root(root, workers=1)
    assert after.ok, after.errors


# -- the checker, on hand-made entries -------------------------------------------------------


def _turn(turn_id: int, state: str = "succeeded", *, final: bool = True) -> dict[str, Any]:
    return {
        "turn_id": turn_id,
        "turn_number": turn_id,
        "idempotency_key": f"k{turn_id}",
        "state": state,
        "final": final,
        "attempts": [{}],
    }


def _entries(*statuses: str, evidence: int | None = None) -> LedgerTurnEntries:
    seqs = list(range(2, 2 + len(statuses)))
    count = len(statuses) if evidence is None else evidence
    return LedgerTurnEntries(
        exec_statuses=list(statuses), exec_seqs=seqs, evidence_seqs=list(range(2, 2 + count))
    )


def test_checker_accepts_one_final_pair_and_an_escalation_before_it() -> None:
    turns = [_turn(1), _turn(2, "terminated")]
    entries = {1: _entries("succeeded"), 2: _entries("escalated", "terminated")}
    assert check_turn_entries(turns, entries) == ([], [])


def test_checker_names_a_turn_with_two_final_pairs() -> None:
    duplicates, missing = check_turn_entries(
        [_turn(1), _turn(3)], {1: _entries("succeeded"), 3: _entries("succeeded", "succeeded")}
    )
    assert missing == []
    assert len(duplicates) == 2  # one for exec, one for evidence
    assert all(line.startswith("turn 3 (turn_number 3, key k3, succeeded)") for line in duplicates)
    assert "2 final entries in the exec ledger (seqs [2, 3]" in duplicates[0]


def test_checker_names_missing_unpaired_and_contradicting_entries() -> None:
    turns = [_turn(1), _turn(2), _turn(3, "failed"), _turn(4, "running", final=False)]
    entries = {
        2: _entries("succeeded", evidence=0),
        3: _entries("succeeded"),
        9: _entries("succeeded"),
    }
    duplicates, missing = check_turn_entries(turns, entries)
    assert duplicates == []
    text = "\n".join(missing)
    assert "turn 1 (turn_number 1, key k1, succeeded): no final entry in the exec ledger" in text
    assert "turn 1 (turn_number 1, key k1, succeeded): no final entry in the evidence" in text
    assert "turn 2 (turn_number 2, key k2, succeeded): 1 exec turn entries" in text
    assert "turn 3 (turn_number 3, key k3, failed): the exec ledger's final status is" in text
    assert "turn_number 9 has ledger entries" in text
    assert "turn 4" not in text  # not final: reported as lost by the storm, not here


def test_read_turn_entries_pairs_exec_and_evidence(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "exec.jsonl").write_text(
        '{"kind":"session_opened","seq":1}\n'
        '{"kind":"turn","turn_number":1,"status":"escalated","seq":2}\n'
        '{"kind":"turn","turn_number":1,"status":"terminated","seq":3}\n'
    )
    (ledger / "evidence.jsonl").write_text(
        '{"kind":"session_opened","seq":1}\n'
        '{"kind":"turn","turn_number":1,"seq":2}\n'
        '{"kind":"turn","turn_number":1,"seq":3}\n'
        "not json\n"
    )
    problems: list[str] = []
    by_number, count = read_turn_entries(tmp_path, problems)
    assert count == 6
    assert by_number[1].final_exec() == [(3, "terminated")]
    assert by_number[1].final_evidence() == [3]
    assert problems == ["evidence.jsonl line 4 is not JSON: b'not json\\n'"]


def _exec_record(session_id: str, number: int, status: str) -> dict[str, object]:
    return {
        "kind": "turn",
        "session_id": session_id,
        "turn_number": number,
        "query_hash": "0" * 64,
        "result_hash": "1" * 64,
        "status": status,
    }


def _evidence_record(session_id: str, number: int) -> dict[str, object]:
    return {
        "kind": "turn",
        "session_id": session_id,
        "turn_number": number,
        "declared_reads": [],
        "declared_writes": [],
        "external_calls": [],
        "capability_violations": [],
    }


def _stored(session_id: str, turn_id: int, number: int, state: str) -> dict[str, Any]:
    return {"turn_id": turn_id, "session_id": session_id, "turn_number": number, "state": state}


def test_ledger_pair_check_on_real_ledgers(tmp_path: Path) -> None:
    """Written by the real ledger writer: complete pairs (one after an escalation) pass; a turn
    in the exec ledger only, a doubled evidence entry, an evidence-only turn and a session
    without ledgers are named with the session, turn, turn number and ledger file."""
    sid, other, bare = "SES-crash-a", "SES-crash-b", "SES-crash-c"
    with SessionLedgers.create(root=tmp_path, tier="default", session_id=sid) as ledgers:
        for number, status in ((1, "succeeded"), (2, "escalated"), (2, "terminated")):
            ledgers.record_turn(
                turn_number=number, query_hash="0" * 64, result_hash="1" * 64, status=status
            )
        ledgers.exec.append(_exec_record(sid, 3, "succeeded"))  # the operator's finding
    with SessionLedgers.create(root=tmp_path, tier="default", session_id=other) as ledgers:
        ledgers.record_turn(
            turn_number=1, query_hash="0" * 64, result_hash="1" * 64, status="failed"
        )
        ledgers.evidence.append(_evidence_record(other, 1))
        ledgers.evidence.append(_evidence_record(other, 2))
    dirs = {s: session_dir_for(tmp_path, "default", s) for s in (sid, other, bare)}
    evidence_a = dirs[sid] / "ledger" / "evidence.jsonl"
    exec_b, evidence_b = (dirs[other] / "ledger" / n for n in ("exec.jsonl", "evidence.jsonl"))
    turns = [
        _stored(sid, 1, 1, "succeeded"),
        _stored(sid, 2, 2, "terminated"),
        _stored(sid, 3, 3, "succeeded"),
        _stored(sid, 4, 4, "running"),  # not final: not checked (the storm reports it as lost)
        _stored(other, 5, 1, "failed"),
        _stored(other, 6, 2, "succeeded"),
        _stored(bare, 7, 1, "succeeded"),
        _stored(bare, 8, 2, "succeeded"),
        _stored("SES-unknown", 9, 1, "succeeded"),
    ]
    assert check_ledger_pairs(turns[:2], dirs) == []
    problems = check_ledger_pairs(turns, dirs)
    assert problems == [
        f"session {sid} turn 3 (turn_number 3, succeeded): evidence entry missing: "
        f"{evidence_a} holds 0 turn entries for turn_number 3 (seqs []), 1 expected: one for "
        "its ending",
        f"session {other} turn 5 (turn_number 1, failed): evidence entry doubled: "
        f"{evidence_b} holds 2 turn entries for turn_number 1 (seqs [2, 3]), 1 expected: one "
        "for its ending",
        f"session {other} turn 6 (turn_number 2, succeeded): exec entry missing: {exec_b} "
        "holds no final turn entry for turn_number 2 (its turn entries there: statuses [], "
        "seqs [])",
        f"session {bare}: ledger {dirs[bare] / 'ledger' / 'exec.jsonl'} is missing (none of "
        "the session's final turns can have its entry there)",
        f"session {bare}: ledger {dirs[bare] / 'ledger' / 'evidence.jsonl'} is missing (none "
        "of the session's final turns can have its entry there)",
        "session SES-unknown turn 9 (turn_number 1, succeeded): the directory of session "
        "SES-unknown is not known",
    ]
    # an escalation whose evidence entry is gone leaves the ending without its own
    with SessionLedgers.open(root=tmp_path, tier="default", session_id=sid) as ledgers:
        ledgers.exec.append(_exec_record(sid, 5, "escalated"))
        ledgers.record_turn(
            turn_number=5, query_hash="0" * 64, result_hash="1" * 64, status="succeeded"
        )
    assert check_ledger_pairs([_stored(sid, 10, 5, "succeeded")], dirs) == [
        f"session {sid} turn 10 (turn_number 5, succeeded): evidence entry missing: "
        f"{evidence_a} holds 1 turn entries for turn_number 5 (seqs [5]), 2 expected: one for "
        "its ending and 1 for its non-final exec entries (statuses ['escalated'])"
    ]


def _turn_record(
    turn_id: int, *, attempt: int, attempts: tuple[AttemptRecord, ...], **fields: Any
) -> dict[str, object]:
    """A turn as the control API gives it (`TurnRecord.to_dict`)."""
    return TurnRecord(
        turn_id=turn_id,
        session_id="SES-crash-a",
        turn_number=turn_id,
        kind=TurnKind.INSTRUCTION,
        spec=READ_SPEC,
        idempotency_key=f"k{turn_id}",
        state=TurnState.SUCCEEDED,
        attempt=attempt,
        accepted_us=1_000,
        updated_us=2_000,
        finished_us=2_000,
        verdict="SUCCEED",
        attempts=attempts,
        **fields,
    ).to_dict()


def test_rolled_forward_check_names_an_attempt_that_never_ended() -> None:
    """A rolled-forward turn whose attempt record has no outcome, decision, reason code or
    finish time, or whose attempt count is 0, is named; one restored from its entry is not, nor
    is an unfinished attempt of a turn that was not rolled forward."""
    unfinished = AttemptRecord(
        attempt=1, started_us=1_000, detail="recovered from the ledger after a crash"
    )
    ended = AttemptRecord(
        attempt=1,
        started_us=1_000,
        finished_us=1_500,
        outcome="SUCCESS",
        decision="SUCCEED",
        reason_code="RECOVERED_FROM_LEDGER",
    )
    rolled = {"reason": ROLLED_FORWARD, "reason_code": "RECOVERED_FROM_LEDGER"}
    turns = [
        _turn_record(1, attempt=0, attempts=(unfinished,), **rolled),  # the operator's finding
        _turn_record(2, attempt=1, attempts=(ended,), **rolled),
        _turn_record(3, attempt=1, attempts=(unfinished,), reason="done"),
        _turn_record(4, attempt=1, attempts=(), **rolled),
    ]
    assert [t["turn_id"] for t in rolled_forward(turns)] == [1, 2, 4]
    assert check_rolled_forward(turns[1:3]) == []
    name = "session SES-crash-a turn {0} (turn_number {0}, succeeded), rolled forward "
    name += "(RECOVERED_FROM_LEDGER)"
    assert check_rolled_forward(turns) == [
        f"{name.format(1)}: its attempt count is 0, not at least 1",
        f"{name.format(1)}: attempt 1 has no outcome (nor fault type), decision, reason code, "
        "finish time: an attempt that never ended",
        f"{name.format(4)}: it has no attempt record",
    ]
    faulted = AttemptRecord(
        attempt=1,
        started_us=1_000,
        finished_us=1_500,
        fault_type="CRASH",
        decision="RETRY",
        reason_code="EXECUTOR_CRASHED",
    )
    assert check_rolled_forward([_turn_record(5, attempt=1, attempts=(faulted,), **rolled)]) == []


def test_daemon_log_check_finds_tracebacks_and_errors(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text(
        '{"level":"warning","logger":"supervisor.turns.recovery","event":"turn_rolled_forward"}\n'
        '{"level":"error","logger":"supervisor.turns","event":"turn_failed","turn_id":5,'
        '"exception":"Traceback (most recent call last):\\n  ...\\nKeyError: 3"}\n'
        '{"level":"error","logger":"supervisor.turns.sessions","event":"session_resume_failed",'
        '"error":"gone"}\n'
        '{"level":"info","event":"cut by a SIGKILL\n'
        "Traceback (most recent call last):\n"
    )
    problems = check_daemon_log(log)
    assert problems == [
        "daemon.log line 2: error supervisor.turns 'turn_failed' (turn_id 5): KeyError: 3",
        "daemon.log line 3: error supervisor.turns.sessions 'session_resume_failed': gone",
        "daemon.log line 5: Traceback (most recent call last):",
    ]


def test_leftover_check_finds_processes_and_scratch_files(tmp_path: Path) -> None:
    """A live process of a storm uid and a file in a scratch dir are named; empty scratch
    dirs, other uids' processes and zombies-to-be are not."""
    root = tmp_path / "r"
    sid = "SES-20260101T000000.000000Z-0123456789abcdef"
    (root / "tmp" / sid).mkdir(parents=True)
    (root / "output" / sid).mkdir(parents=True)
    assert check_leftovers(root, storm_uids(root)) == []
    (root / "output" / sid / "report.txt").write_text("x")
    uid = storm_uids(root)[3]
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as a storm uid")
    stray = subprocess.Popen(["sleep", "30"], user=uid, group=uid)
    try:
        problems = check_leftovers(root, storm_uids(root))
    finally:
        stray.kill()
        stray.wait()
    assert any(
        line.startswith(f"process {stray.pid} (sleep 30) runs as uid(s) [{uid}]")
        for line in problems
    ), problems
    assert f"scratch dir {root / 'output' / sid} is not empty: report.txt" in problems
    assert len(problems) == 2, problems
    assert check_leftovers(root.parent / "other", storm_uids(root.parent / "other")) == []


def test_leftover_check_finds_a_turn_cgroup_of_the_root(tmp_path: Path) -> None:
    """A ``hunter-turns`` leaf named with the root's prefix is named; another root's is not."""
    root = tmp_path / "r"
    parents = detect_layout().leaf_parents()
    if not parents:
        pytest.skip("no cgroup hierarchy to create turn leaves in")
    leaf = parents[0] / f"{cgroup_prefix_for(root)}SES-test-0a0b0c"
    other = parents[0] / f"{cgroup_prefix_for(tmp_path / 'other')}SES-test-0a0b0c"
    leaf.mkdir()
    other.mkdir()
    try:
        assert check_leftovers(root, storm_uids(root)) == [f"cgroup leaf {leaf} is left"]
    finally:
        leaf.rmdir()
        other.rmdir()
    assert check_leftovers(root, storm_uids(root)) == []


def test_daemon_log_check_tolerates_only_what_it_is_told(tmp_path: Path) -> None:
    """The known anyio read race is left out when tolerated, and counted; nothing else is."""
    log = tmp_path / "daemon.log"
    log.write_text(
        '{"level":"error","logger":"asyncio","event":"Exception in callback '
        'Future.set_result(None)\\nhandle: <Handle Future.set_result(None)>",'
        '"exception":"Traceback (most recent call last):\\nInvalidStateError: invalid state"}\n'
        '{"level":"error","logger":"supervisor.turns","event":"turn_failed"}\n'
    )
    assert len(check_daemon_log(log)) == 2
    assert check_daemon_log(log, tolerated=[ANYIO_READ_RACE]) == [
        "daemon.log line 2: error supervisor.turns 'turn_failed'"
    ]
    assert count_log_events(log, ANYIO_READ_RACE) == 1
    assert count_log_events(log, "turn_") == 1
