"""A turn's one durable step, and putting files and store back in step after a crash.

The turn core runs over a real SQLite store, real session ledgers and a scripted hub (the rig of
`test_core.py`); "crash" means the daemon's task group is cancelled mid-turn, or files are put
back to an older copy, as a power loss would leave them. `endings_in_ledger` is also read on
files the real ledger writer wrote, and the roll-forward is run on a real daemon
(`supervisor.demo.stack.DemoStack`, as the crash storm runs it) SIGKILLed with a turn in flight.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from ledger import InlineSyncer, LedgerEntry, SessionLedgers, session_dir_for, verify_session_dir
from sandbox.policy.lifecycle import TurnState
from supervisor.control.client import ControlClient
from supervisor.demo.stack import DemoStack, prepare_root
from supervisor.turns.recovery import RESTORED, ROLLED_FORWARD, LedgerEntryRef, endings_in_ledger
from tests.storms.crash import CRASH_CONFIG, check_daemon_log, check_rolled_forward
from tests.storms.crash_checks import count_log_events
from tests.supervisor.turns.test_core import FakeHub, _instruction, _open, _run, _verify, rig
from tests.turn_requests import submitted


def _ledger_dir(root: Path, sid: str) -> Path:
    return root / "planes" / "default" / "sessions" / sid / "ledger"


def _turn_entries(root: Path, sid: str, which: str) -> list[dict[str, object]]:
    path = _ledger_dir(root, sid) / f"{which}.jsonl"
    entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [e for e in entries if e["kind"] == "turn"]


async def test_ending_and_lines_commit_together_then_files_catch_up(tmp_path: Path) -> None:
    """The ending's commit keeps both lines in the store; a sync round makes the files durable
    and trims them; readers of the files see the entries at once."""
    async with rig(tmp_path, ledger_sync_interval_s=0.05) as r:
        sid = await _open(r)
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.SUCCEEDED
        # in the files at once (written, perhaps not yet synced)
        (entry,) = _turn_entries(tmp_path, sid, "exec")
        assert (entry["status"], entry["turn_id"], entry["verdict"]) == (
            "succeeded",
            turn.turn_id,
            "SUCCEED",
        )
        assert len(_turn_entries(tmp_path, sid, "evidence")) == 1
        ids = [f"{sid}/exec", f"{sid}/evidence"]
        for _ in range(500):  # a sync round every 50 ms; give it up to 10 s
            if not await r.store.ledger_lines(ids):
                break
            await anyio.sleep(0.02)
        assert await r.store.ledger_lines(ids) == []
        session = r.runtime.sessions[sid]
        assert session.ledgers.exec.durable_seq == session.ledgers.exec.head[0] == 2
        assert session.ledgers.evidence.durable_seq == 2
        # idle rounds write nothing to the store (only ledgers that moved are trimmed)
        writes = r.store.statistics().operations
        await anyio.sleep(0.3)
        assert r.store.statistics().operations == writes


async def test_restart_writes_back_lines_the_files_lost(tmp_path: Path) -> None:
    """Files put back to before the turn (a power loss before their sync): the restart writes
    the turn's two lines back from the store, the chain verifies, nothing runs twice."""
    async with rig(tmp_path, ledger_sync_interval_s=3600) as r:
        sid = await _open(r)
        ledger_dir = _ledger_dir(tmp_path, sid)
        heads_dir = tmp_path / "state" / "ledger-heads"
        shutil.copytree(ledger_dir, tmp_path / "before-ledger")
        shutil.copytree(heads_dir, tmp_path / "before-heads")
        turn = await _run(r, _instruction(sid))
        assert turn.state is TurnState.SUCCEEDED
        expected = (ledger_dir / "exec.jsonl").read_bytes()
    for name in ("exec.jsonl", "evidence.jsonl"):
        shutil.copy(tmp_path / "before-ledger" / name, ledger_dir / name)
    shutil.rmtree(heads_dir)
    shutil.copytree(tmp_path / "before-heads", heads_dir)
    assert _turn_entries(tmp_path, sid, "exec") == []
    hub = FakeHub()
    async with rig(tmp_path, hub) as r2:
        assert (ledger_dir / "exec.jsonl").read_bytes() == expected
        assert len(_turn_entries(tmp_path, sid, "evidence")) == 1
        assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]
        assert await r2.store.ledger_lines([f"{sid}/exec", f"{sid}/evidence"]) == []
        assert (await r2.store.get_turn(turn.turn_id)).state is TurnState.SUCCEEDED
    assert hub.envelopes == []


@pytest.mark.parametrize("start_written", [True, False])
async def test_restart_ends_a_turn_from_its_ledger_entry(
    tmp_path: Path, start_written: bool
) -> None:
    """The turn's final entry reached the file but the daemon died before the store's commit:
    the restart ends the turn from the entry; it is not run again and has one final pair.
    Whether the attempt's start was written (`running`) or still rode with the outcome
    (`accepted`), the ending records the attempt."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        r.turn_core._deps.starts.delay_s = 0.0 if start_written else 60.0
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await hub.started.wait()
        if start_written:
            await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
        stored = await r.store.get_turn(turn.turn_id)
        expected = TurnState.RUNNING if start_written else TurnState.ACCEPTED
        assert stored.state is expected
        # What a crash between the file write and the commit leaves: the entries in the files.
        session = r.runtime.sessions[sid]
        session.ledgers.record_turn(
            turn_number=turn.turn_number,
            query_hash="0" * 64,
            result_hash="1" * 64,
            status="failed",
            exec_extra={"verdict": "TERMINATE", "reason_code": "EXECUTOR_FAILURE"},
        )
    rerun = FakeHub()
    async with rig(tmp_path, rerun) as r2:
        done = await r2.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.FAILED
        assert (done.verdict, done.reason_code, done.reason) == (
            "TERMINATE",
            "EXECUTOR_FAILURE",
            ROLLED_FORWARD,
        )
        assert [a.attempt for a in done.attempts] == [1]
    assert rerun.envelopes == []
    assert len(_turn_entries(tmp_path, sid, "exec")) == 1
    assert len(_turn_entries(tmp_path, sid, "evidence")) == 1
    assert [rep.entries for rep in _verify(tmp_path, sid)] == [2, 2]


def test_endings_in_ledger_reads_final_entries_only(tmp_path: Path) -> None:
    """Only final statuses count, the last one wins, other turns and junk lines are ignored."""
    path = tmp_path / "exec.jsonl"
    lines = [
        {"kind": "session_opened", "session_id": "S"},
        {"kind": "turn", "turn_number": 1, "status": "escalated"},
        {"kind": "turn", "turn_number": 2, "status": "succeeded", "verdict": "SUCCEED"},
        {"kind": "turn", "turn_number": 1, "status": "terminated", "reason_code": "OPERATOR"},
        {"kind": "turn", "turn_number": 3, "status": "escalated"},
        {"kind": "turn", "turn_number": 4, "status": "no-such-state"},
    ]
    path.write_bytes(
        b"".join(orjson.dumps(x) + b"\n" for x in lines) + b'{"turn_number": 5, junk\n'
    )
    found = endings_in_ledger(path, [1, 2, 3, 4, 5, 6])
    assert sorted(found) == [1, 2]
    assert (found[1].state, found[1].reason_code) == (TurnState.TERMINATED, "OPERATOR")
    assert found[2].to_ending().verdict == "SUCCEED"
    assert endings_in_ledger(tmp_path / "missing.jsonl", [1]) == {}
    assert endings_in_ledger(path, []) == {}


# -- endings_in_ledger on files the real ledger writer wrote ----------------------------------


def _no_sync(fd: int) -> None:
    """Skip fdatasync: these tests are about the files' content."""


#: what the daemon's `record_end` lists in an instruction turn's evidence entry
CALLS: list[dict[str, object]] = [
    {
        "executor_id": "chaos-1",
        "instruction_id": "INS-7-1",
        "attempt": 1,
        "outcome": "FAULT",
        "fault_type": "CRASH",
        "decision": "RETRY",
        "reason_code": "CRASH_RETRY",
        "duration_ms": 12,
    },
    {
        "executor_id": "chaos-2",
        "instruction_id": "INS-7-2",
        "attempt": 2,
        "outcome": "FAILURE",
        "fault_type": None,
        "decision": "TERMINATE",
        "reason_code": "EXECUTOR_FAILURE",
        "duration_ms": 30,
    },
]


def _exec_extra(turn_id: int, verdict: str, reason_code: str) -> dict[str, object]:
    return {"turn_id": turn_id, "verdict": verdict, "reason_code": reason_code, "fault_type": None}


def _pair(
    ledgers: SessionLedgers,
    number: int,
    status: str,
    calls: list[dict[str, object]],
    *,
    verdict: str = "TERMINATE",
    reason_code: str = "EXECUTOR_FAILURE",
    turn_id: int | None = None,
) -> LedgerEntry:
    """Write a turn's exec and evidence entries as the daemon does; the exec entry."""
    exec_entry, _ = ledgers.record_turn(
        turn_number=number,
        query_hash=f"{number:064x}",
        result_hash="1" * 64,
        status=status,
        external_calls=calls,
        exec_extra=_exec_extra(turn_id or number, verdict, reason_code),
    )
    return exec_entry


def _exec_only(
    ledgers: SessionLedgers,
    number: int,
    status: str,
    *,
    turn_id: int | None = None,
    decided_by: dict[str, object] | None = None,
) -> LedgerEntry:
    """A turn's final exec entry without its evidence entry (what a SIGKILL between the two
    files' writes left before the lines were held for the store's commit); *decided_by*: the
    person's decision the entry records (a cancel, an operator's terminate)."""
    decided = {} if decided_by is None else {"decided_by": decided_by}
    return ledgers.exec.append(
        {
            "kind": "turn",
            "session_id": ledgers.session_id,
            "turn_number": number,
            "query_hash": f"{number:064x}",
            "result_hash": "1" * 64,
            "status": status,
            **_exec_extra(turn_id or number, "TERMINATE", "EXECUTOR_FAILURE"),
            **decided,
        }
    )


#: A person's decision as the daemon records it (`supervisor.turns.decisions`).
DECIDED: dict[str, object] = {
    "action": "cancel",
    "operator": "ann",
    "reason": "submitted against the wrong workspace",
    "uid": 1000,
    "pid": 4242,
    "at_us": 1_700_000_000_000_000,
}


def _written_session(tmp_path: Path) -> SessionLedgers:
    return SessionLedgers.create(
        root=tmp_path, tier="default", session_id="S", syncer=InlineSyncer(sync=_no_sync)
    )


def test_endings_in_ledger_on_real_files_pairs_exec_and_evidence(tmp_path: Path) -> None:
    """On files the ledger writer wrote: a final pair gives its ending with evidence_found and
    the evidence entry's external_calls; an exec-only final entry gives evidence_found False;
    an escalated pair before the final one is counted as a pair, not as the ending."""
    with _written_session(tmp_path) as ledgers:
        paired = _pair(ledgers, 1, "failed", CALLS)
        lone = _exec_only(ledgers, 2, "failed")
        _pair(ledgers, 3, "escalated", CALLS[:1], verdict="ESCALATE", reason_code="OPERATOR_REVIEW")
        resolved = _pair(
            ledgers, 3, "terminated", CALLS, verdict="TERMINATE", reason_code="OPERATOR"
        )
        _pair(ledgers, 4, "escalated", CALLS[:1], verdict="ESCALATE", reason_code="OPERATOR_REVIEW")
        unpaired = _exec_only(ledgers, 4, "terminated")
        _pair(ledgers, 5, "escalated", CALLS[:1], verdict="ESCALATE", reason_code="OPERATOR_REVIEW")
        exec_path = ledgers.exec_path
    found = endings_in_ledger(exec_path, [1, 2, 3, 4, 5, 6])
    assert sorted(found) == [1, 2, 3, 4]  # 5 only escalated, 6 has no entry
    one = found[1]
    assert (one.state, one.verdict, one.reason_code, one.process) == (
        TurnState.FAILED,
        "TERMINATE",
        "EXECUTOR_FAILURE",
        False,
    )
    assert one.evidence_found
    assert list(one.attempts) == CALLS
    assert one.exec_entry == LedgerEntryRef(paired.seq, paired.entry_hash)
    assert (one.sealed_us, one.query_hash, one.result_hash) == (paired.ts_us, f"{1:064x}", "1" * 64)
    two = found[2]
    assert (two.state, two.evidence_found, two.attempts) == (TurnState.FAILED, False, ())
    assert two.exec_entry == LedgerEntryRef(lone.seq, lone.entry_hash)
    three = found[3]
    assert (three.state, three.reason_code, three.evidence_found) == (
        TurnState.TERMINATED,
        "OPERATOR",
        True,
    )
    assert list(three.attempts) == CALLS  # the final pair's, not the escalation's
    assert three.exec_entry == LedgerEntryRef(resolved.seq, resolved.entry_hash)
    four = found[4]  # two exec entries, one evidence entry: the ending's is missing
    assert (four.state, four.evidence_found, four.attempts) == (TurnState.TERMINATED, False, ())
    assert four.exec_entry == LedgerEntryRef(unpaired.seq, unpaired.entry_hash)


def test_endings_in_ledger_takes_a_process_turns_attempts_from_its_exec_entry(
    tmp_path: Path,
) -> None:
    """A process turn's exec entry lists its attempts (``attempts``): they are the ones used,
    with or without the evidence entry."""
    runs = [
        {"attempt_number": 1, "outcome": "FAILURE", "verdict": "RETRY", "reason_code": "EXIT"},
        {"attempt_number": 2, "outcome": "SUCCESS", "verdict": "SUCCEED", "reason_code": "OK"},
    ]
    with _written_session(tmp_path) as ledgers:
        ledgers.record_turn(
            turn_number=1,
            query_hash="q",
            result_hash="r",
            status="succeeded",
            exec_extra={"verdict": "SUCCEED", "reason_code": "OK", "attempts": runs},
        )
        exec_path = ledgers.exec_path
    (ending,) = endings_in_ledger(exec_path, [1]).values()
    assert (ending.process, ending.evidence_found, list(ending.attempts)) == (True, True, runs)
    records = ending.attempt_records(first=5, started_us=1)
    assert [(a.attempt, a.outcome, a.decision, a.reason_code) for a in records] == [
        (5, "FAILURE", "RETRY", "EXIT"),
        (6, "SUCCESS", "SUCCEED", "OK"),
    ]
    assert all(a.finished_us == ending.sealed_us and a.finished for a in records)


def test_attempt_records_are_finished_attempts(tmp_path: Path) -> None:
    """`LedgerEnding.attempt_records`: one finished record per external call (number, executor,
    outcome, decision, reason code, a finish time, the restored detail), or, where the entries
    list none, one attempt holding the ending's decision; the rebuilt evidence record names
    the exec entry."""
    with _written_session(tmp_path) as ledgers:
        _pair(ledgers, 1, "failed", CALLS)
        lone = _exec_only(ledgers, 2, "failed")
        exec_path = ledgers.exec_path
    found = endings_in_ledger(exec_path, [1, 2])
    sealed = found[1].sealed_us
    records = found[1].attempt_records(first=1, started_us=sealed - 10_000_000)
    assert [
        (a.attempt, a.executor_id, a.instruction_id, a.outcome, a.fault_type, a.decision)
        for a in records
    ] == [
        (1, "chaos-1", "INS-7-1", "FAULT", "CRASH", "RETRY"),
        (2, "chaos-2", "INS-7-2", "FAILURE", None, "TERMINATE"),
    ]
    assert [a.reason_code for a in records] == ["CRASH_RETRY", "EXECUTOR_FAILURE"]
    assert [(a.finished_us, a.duration_ms, a.detail) for a in records] == [
        (sealed, 12, RESTORED),
        (sealed, 30, RESTORED),
    ]
    assert [a.started_us for a in records] == [sealed - 12_000, sealed - 30_000]
    assert all(a.finished for a in records)
    (only,) = found[2].attempt_records(first=3, started_us=100)
    assert (only.attempt, only.started_us, only.finished_us, only.outcome) == (
        3,
        100,
        found[2].sealed_us,
        "FAILURE",
    )
    assert (only.decision, only.reason_code, only.reason, only.detail) == (
        "TERMINATE",
        "EXECUTOR_FAILURE",
        ROLLED_FORWARD,
        RESTORED,
    )
    rebuilt = found[2].evidence_record("S")
    assert rebuilt["rebuilt_from_exec_entry"] == {
        "seq": lone.seq,
        "entry_hash": lone.entry_hash,
        "reason": "the crash came after the exec entry reached its file and before the"
        " evidence entry did",
    }
    assert (rebuilt["turn_number"], rebuilt["external_calls"]) == (2, [])


def test_a_rebuilt_evidence_entry_keeps_who_decided(tmp_path: Path) -> None:
    """An exec entry that records who decided the ending (a cancel): the evidence entry rebuilt
    from it, and the ending rolled forward, keep that ``decided_by``; one without keeps none."""
    with _written_session(tmp_path) as ledgers:
        _exec_only(ledgers, 1, "cancelled", decided_by=DECIDED)
        _exec_only(ledgers, 2, "failed")
        exec_path = ledgers.exec_path
    found = endings_in_ledger(exec_path, [1, 2])
    assert found[1].decided_by == DECIDED
    assert found[1].evidence_record("S")["decided_by"] == DECIDED
    assert found[1].to_ending().result["decided_by"] == DECIDED
    assert found[2].decided_by is None
    assert "decided_by" not in found[2].evidence_record("S")
    assert "decided_by" not in found[2].to_ending().result


# -- a real daemon, SIGKILLed with a turn in flight --------------------------------------------


@pytest.fixture
def daemon_root() -> Iterator[Path]:
    """A fresh root with a short path (the control socket lives under it), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="hh-roll-"))
    path.chmod(0o711)
    try:
        yield path / "r"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def crash_stack(daemon_root: Path) -> AsyncIterator[DemoStack]:
    """A real daemon's stack on a fresh root with the crash storm's config (not started);
    every process it started is stopped afterwards."""
    stack = DemoStack(
        root=daemon_root,
        config_path=prepare_root(daemon_root, fresh=True, config_text=CRASH_CONFIG),
    )
    try:
        yield stack
    finally:
        await stack.aclose()


async def _chaos(stack: DemoStack, executor_id: str, behaviour: str) -> None:
    await stack.start_executor(
        executor_id,
        [
            "supervisor.examples.chaos_executor",
            "--commands",
            "READ",
            "--behaviour",
            behaviour,
            "--no-reconnect",
        ],
    )


@dataclass(frozen=True)
class Crashed:
    """A turn whose daemon was SIGKILLed while its attempt was in flight."""

    turn_id: int
    turn_number: int
    session_id: str
    tier: str

    def ledgers(self, root: Path) -> SessionLedgers:
        """The session's ledgers, opened as the next daemon will (the dead one's lock is gone)."""
        return SessionLedgers.open(root=root, tier=self.tier, session_id=self.session_id)

    def entries(self, root: Path, which: str) -> list[dict[str, Any]]:
        """This turn's ``turn`` entries in the session's ``exec`` or ``evidence`` ledger."""
        path = session_dir_for(root, self.tier, self.session_id) / "ledger" / f"{which}.jsonl"
        entries = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        return [e for e in entries if e["kind"] == "turn" and e["turn_number"] == self.turn_number]

    def verify(self, root: Path) -> list[int]:
        """Verify both ledgers; their entry counts."""
        session_dir = session_dir_for(root, self.tier, self.session_id)
        return [report.entries for report in verify_session_dir(session_dir)]


async def _crash_mid_turn(stack: DemoStack) -> Crashed:
    """Start the daemon, run a turn until its attempt is in flight on a hanging executor, then
    SIGKILL the daemon."""
    await stack.start_daemon()
    await _chaos(stack, "hang", "hang")
    async with ControlClient(stack.control_socket) as client:
        session = await client.call("session.open", package_id="demo")
        submitted = await client.call(
            "turn.submit",
            session_id=session["session_id"],
            kind="instruction",
            command_type="READ",
            target_selector="#main",
            timeout_ms=60_000,
            declared_outputs=[],
        )
        turn = submitted["turn"]
        await client.call("turn.wait", turn_id=turn["turn_id"], until=["running"], timeout_s=30)
    assert await stack.stop_daemon(signal.SIGKILL) == -signal.SIGKILL
    await stack.stop_executor("hang")
    return Crashed(
        turn_id=int(turn["turn_id"]),
        turn_number=int(turn["turn_number"]),
        session_id=str(session["session_id"]),
        tier=str(session["tier"]),
    )


async def _restart_and_wait(stack: DemoStack, turn_id: int) -> dict[str, Any]:
    """Restart the daemon with a working executor connected (a turn run again would succeed on
    it); the turn once final. The stack is stopped again (SIGTERM) so its files are final."""
    await stack.start_daemon()
    await _chaos(stack, "ok", "ok")
    async with ControlClient(stack.control_socket) as client:
        done = dict((await client.call("turn.wait", turn_id=turn_id, timeout_s=30))["turn"])
    await stack.aclose()
    return done


def _assert_rolled_forward(done: Mapping[str, Any]) -> None:
    """Final with the exec entry's state and decision, the roll-forward's reason, and
    attempts that ended (as `hunter turn show` reads them)."""
    assert (done["state"], done["verdict"], done["reason_code"], done["reason"]) == (
        "failed",
        "TERMINATE",
        "EXECUTOR_FAILURE",
        ROLLED_FORWARD,
    )
    assert done["attempt"] >= 1
    assert done["attempts"]
    for attempt in done["attempts"]:
        for key in ("outcome", "decision", "reason_code", "finished_us"):
            assert attempt[key], f"attempt {attempt['attempt']} has no {key}: {attempt}"
    assert check_rolled_forward([done]) == []


@pytest.mark.slow
async def test_real_daemon_rolls_forward_a_turn_whose_evidence_entry_was_lost(
    crash_stack: DemoStack,
) -> None:
    """A real daemon SIGKILLed with a turn in flight; its final exec entry is in the file, its
    evidence entry and ending are not: the restart ends the turn from the entry with finished
    attempts, rebuilds the evidence entry naming the exec entry, never runs the turn again,
    and both ledgers verify."""
    root = crash_stack.root
    crashed = await _crash_mid_turn(crash_stack)
    with crashed.ledgers(root) as ledgers:
        written = _exec_only(ledgers, crashed.turn_number, "failed", turn_id=crashed.turn_id)
    done = await _restart_and_wait(crash_stack, crashed.turn_id)
    _assert_rolled_forward(done)
    assert [a["detail"] for a in done["attempts"]] == [RESTORED]
    (final,) = crashed.entries(root, "exec")
    assert (final["seq"], final["entry_hash"]) == (written.seq, written.entry_hash)
    (evidence,) = crashed.entries(root, "evidence")
    rebuilt = evidence["rebuilt_from_exec_entry"]
    assert (rebuilt["seq"], rebuilt["entry_hash"]) == (written.seq, written.entry_hash)
    assert crashed.verify(root) == [2, 2]
    log = crash_stack.daemon_log
    assert count_log_events(log, "evidence_entry_rebuilt") == 1
    assert count_log_events(log, "turn_rolled_forward") == 1
    assert check_daemon_log(log, tolerated=("evidence_entry_rebuilt",)) == []


@pytest.mark.slow
async def test_real_daemon_keeps_who_decided_when_it_rebuilds_an_evidence_entry(
    crash_stack: DemoStack,
) -> None:
    """A real daemon SIGKILLed with a turn in flight, whose final exec entry (a cancel, with who
    decided it) reached the file and whose evidence entry did not: the restart rebuilds the
    evidence entry with the exec entry's ``decided_by``, and the turn's result keeps it."""
    root = crash_stack.root
    crashed = await _crash_mid_turn(crash_stack)
    with crashed.ledgers(root) as ledgers:
        _exec_only(
            ledgers, crashed.turn_number, "cancelled", turn_id=crashed.turn_id, decided_by=DECIDED
        )
    done = await _restart_and_wait(crash_stack, crashed.turn_id)
    assert (done["state"], done["reason"]) == ("cancelled", ROLLED_FORWARD)
    assert done["result"]["decided_by"] == DECIDED
    (evidence,) = crashed.entries(root, "evidence")
    assert "rebuilt_from_exec_entry" in evidence
    assert evidence["decided_by"] == DECIDED
    assert crashed.verify(root) == [2, 2]


@pytest.mark.slow
async def test_real_daemon_rolls_forward_a_turn_whose_pair_was_written(
    crash_stack: DemoStack,
) -> None:
    """A real daemon SIGKILLed after both of a turn's entries reached the files but before
    the store's commit: the restart ends the turn with its attempts restored from the evidence
    entry's ``external_calls``, rebuilds nothing and runs nothing again."""
    root = crash_stack.root
    crashed = await _crash_mid_turn(crash_stack)
    with crashed.ledgers(root) as ledgers:
        written = _pair(ledgers, crashed.turn_number, "failed", CALLS, turn_id=crashed.turn_id)
    done = await _restart_and_wait(crash_stack, crashed.turn_id)
    _assert_rolled_forward(done)
    fields = ("attempt", "executor_id", "instruction_id", "outcome", "decision", "reason_code")
    assert [[a[k] for k in fields] for a in done["attempts"]] == [
        [c[k] for k in fields] for c in CALLS
    ]
    assert done["attempt"] == len(CALLS)
    (final,) = crashed.entries(root, "exec")
    assert (final["seq"], final["entry_hash"]) == (written.seq, written.entry_hash)
    (evidence,) = crashed.entries(root, "evidence")
    assert "rebuilt_from_exec_entry" not in evidence
    assert evidence["external_calls"] == CALLS
    assert crashed.verify(root) == [2, 2]
    log = crash_stack.daemon_log
    assert count_log_events(log, "evidence_entry_rebuilt") == 0
    assert count_log_events(log, "turn_rolled_forward") == 1
    assert check_daemon_log(log) == []
