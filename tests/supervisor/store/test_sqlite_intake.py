"""Durable intake: sessions, turns, attempts, idempotency, recovery, group commit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from supervisor.store.sqlite.intake import (
    AttemptRow,
    Intake,
    IntakeClosedError,
    IntakeCommitter,
    IntakeError,
    SessionState,
    TurnKind,
    TurnState,
    UnknownSessionError,
    UnknownTurnError,
)

SPEC = {"kind": "instruction", "command_type": "READ", "declared_outputs": []}


def _open(tmp_path: Path) -> Intake:
    intake = Intake.open(tmp_path / "state" / "intake.sqlite3")
    intake.open_session(session_id="SES-1", package_id="demo", tier="default")
    return intake


def test_wal_and_full_sync(tmp_path: Path) -> None:
    """The database runs in WAL mode with synchronous=FULL (accepted means durable)."""
    with _open(tmp_path) as intake:
        conn = sqlite3.connect(intake.path)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            conn.close()
        assert intake._conn.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_accept_assigns_turn_numbers(tmp_path: Path) -> None:
    """Turns get consecutive per-session turn numbers and start in `accepted`."""
    with _open(tmp_path) as intake:
        t1, c1 = intake.accept_turn(session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC)
        t2, c2 = intake.accept_turn(session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC)
        assert (t1.turn_number, t2.turn_number) == (1, 2)
        assert c1
        assert c2
        assert t1.state is TurnState.ACCEPTED
        assert t1.spec == SPEC
        assert intake.get_session("SES-1").to_dict()["turns"] == 2


def test_idempotency_key_returns_same_turn(tmp_path: Path) -> None:
    """Resubmitting with the same idempotency key returns the first turn, not a new one."""
    with _open(tmp_path) as intake:
        first, created = intake.accept_turn(
            session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC, idempotency_key="k1"
        )
        again, created_again = intake.accept_turn(
            session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC, idempotency_key="k1"
        )
        assert created
        assert not created_again
        assert again.turn_id == first.turn_id
        assert len(intake.list_turns()) == 1


def test_accepted_turn_survives_reopen(tmp_path: Path) -> None:
    """A committed turn is there after the database is closed and opened again."""
    with _open(tmp_path) as intake:
        turn, _ = intake.accept_turn(session_id="SES-1", kind=TurnKind.PROCESS, spec=SPEC)
        path = intake.path
    with Intake.open(path) as again:
        assert again.get_turn(turn.turn_id).state is TurnState.ACCEPTED
        assert [t.turn_id for t in again.unfinished_turns()] == [turn.turn_id]


def test_attempt_lifecycle(tmp_path: Path) -> None:
    """start_attempt marks running; record_attempts stores the outcome and the final state."""
    with _open(tmp_path) as intake:
        turn, _ = intake.accept_turn(session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC)
        intake.start_attempt(turn.turn_id, attempt=1, instruction_id="INS-1-1")
        running = intake.get_turn(turn.turn_id)
        assert running.state is TurnState.RUNNING
        assert running.attempt == 1
        row = AttemptRow(
            turn_id=turn.turn_id,
            attempt=1,
            started_us=running.attempts[0].started_us,
            outcome="FAULT",
            fault_type="CRASH",
            decision="TERMINATE",
        )
        done = intake._one(
            lambda: intake.op_record_attempts(
                [row], turn.turn_id, TurnState.TERMINATED, reason_code="X", result={"a": 1}
            )
        )
        assert done.final
        assert done.finished_us is not None
        assert done.result == {"a": 1}
        assert done.attempts[0].fault_type == "CRASH"
        assert intake.counts() == {"terminated": 1}
        assert intake.unfinished_turns() == []


def test_running_turns_are_found_after_restart(tmp_path: Path) -> None:
    """A turn left `running` (an interrupted attempt) is listed as unfinished."""
    with _open(tmp_path) as intake:
        turn, _ = intake.accept_turn(session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC)
        intake.start_attempt(turn.turn_id, attempt=2)
        path = intake.path
    with Intake.open(path) as again:
        (found,) = again.unfinished_turns()
        assert (found.state, found.attempt) == (TurnState.RUNNING, 2)


def test_unknown_session_and_turn(tmp_path: Path) -> None:
    """Unknown ids raise errors naming them."""
    with _open(tmp_path) as intake:
        with pytest.raises(UnknownSessionError, match=r"^unknown session 'nope'$"):
            intake.accept_turn(session_id="nope", kind=TurnKind.PROCESS, spec=SPEC)
        with pytest.raises(UnknownTurnError, match=r"^unknown turn 99$"):
            intake.get_turn(99)


def test_closed_session_refuses_turns(tmp_path: Path) -> None:
    """A closed session accepts no new turns."""
    with _open(tmp_path) as intake:
        assert intake.close_session("SES-1").state is SessionState.CLOSED
        with pytest.raises(IntakeError, match=r"^session SES-1 is closed"):
            intake.accept_turn(session_id="SES-1", kind=TurnKind.PROCESS, spec=SPEC)


def test_failing_op_does_not_spoil_batch(tmp_path: Path) -> None:
    """Each op of a batch runs in its own savepoint: one failure leaves the others committed."""
    with _open(tmp_path) as intake:

        def bad() -> object:
            intake.op_accept_turn(session_id="SES-1", kind=TurnKind.PROCESS, spec=SPEC)
            raise ValueError("boom")

        def good() -> object:
            return intake.op_accept_turn(session_id="SES-1", kind=TurnKind.PROCESS, spec=SPEC)

        results = intake.run_batch([bad, good])
        assert results[0][0] is False
        assert isinstance(results[0][1], ValueError)
        assert results[1][0] is True
        assert [t.turn_number for t in intake.list_turns()] == [1]


async def test_committer_batches_concurrent_calls(tmp_path: Path) -> None:
    """Concurrent calls share commits and each gets its own result."""
    with _open(tmp_path) as intake:
        committer = IntakeCommitter(intake)
        numbers: list[int] = []

        async def submit() -> None:
            turn, _ = await committer.call(
                lambda: intake.op_accept_turn(
                    session_id="SES-1", kind=TurnKind.INSTRUCTION, spec=SPEC
                )
            )
            numbers.append(turn.turn_number)

        async with anyio.create_task_group() as tg:
            await tg.start(committer.run)
            async with anyio.create_task_group() as inner:
                for _ in range(50):
                    inner.start_soon(submit)
            with pytest.raises(UnknownTurnError):
                await committer.call(lambda: intake.op_get_turn(12345))
            tg.cancel_scope.cancel()
        assert sorted(numbers) == list(range(1, 51))
        stats = committer.statistics()
        assert stats.operations == 51
        assert stats.batches < 51
        with pytest.raises(IntakeClosedError, match=r"^intake committer is closed$"):
            await committer.call(lambda: None)
