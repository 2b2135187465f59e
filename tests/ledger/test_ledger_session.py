"""Tests of ledger.session: both ledgers per session (FR-RT-006/007/011/017/018)."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import orjson
import pytest

from ledger import (
    GroupSyncer,
    InlineSyncer,
    IntegrityError,
    LedgerRecordError,
    SessionLedgers,
    both_ledgers_exist,
    verify_root,
    verify_session_dir,
)


def _entries(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_create_writes_session_opened_to_both(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """Both ledgers exist at session start with a session_opened entry (FR-RT-018)."""
    with SessionLedgers.create(
        root=tmp_path, tier="default", session_id="SES-1", syncer=quick_syncer, work_order_id="WO"
    ) as ledgers:
        assert ledgers.exists_both()
        assert ledgers.exec_path == tmp_path / "planes/default/sessions/SES-1/ledger/exec.jsonl"
        assert ledgers.evidence_path.name == "evidence.jsonl"
    for path, ledger_id in (
        (ledgers.exec_path, "SES-1/exec"),
        (ledgers.evidence_path, "SES-1/evidence"),
    ):
        (entry,) = _entries(path)
        assert entry["kind"] == "session_opened"
        assert entry["ledger_id"] == ledger_id
        assert entry["work_order_id"] == "WO"
    assert both_ledgers_exist(ledgers.session_dir)
    assert (tmp_path / "state/ledger-heads/planes/default/sessions/SES-1/ledger").is_dir()


def test_create_refuses_existing_session(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A second create of the same session fails."""
    SessionLedgers.create(root=tmp_path, tier="t", session_id="S", syncer=quick_syncer).close()
    with pytest.raises(FileExistsError, match=r"session ledger already exists$"):
        SessionLedgers.create(root=tmp_path, tier="t", session_id="S", syncer=quick_syncer)


def test_bad_names_refused(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """Session ids and tiers cannot escape the planes directory."""
    for tier, session in (("..", "S"), ("t", "a/b"), ("t", "")):
        with pytest.raises(LedgerRecordError, match=r"cannot name a directory$"):
            SessionLedgers.create(root=tmp_path, tier=tier, session_id=session, syncer=quick_syncer)


def test_record_turn_writes_both(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A turn writes the exec fields and the evidence fields (FR-RT-006/007/017)."""
    violation = {
        "operation": "write",
        "target": "/x",
        "capability": "write",
        "detail": "undeclared",
        "timestamp_us": 7,
    }
    with SessionLedgers.create(
        root=tmp_path, tier="t", session_id="S", syncer=quick_syncer, work_order_id="WO-9"
    ) as ledgers:
        exec_entry, evidence_entry = ledgers.record_turn(
            turn_number=1,
            query_hash="qh",
            result_hash="rh",
            status="violation",
            declared_reads=["/in"],
            declared_writes=[{"path": "/out", "role": "result"}],
            external_calls=[{"url": "https://example.org"}],
            capability_violations=[violation],
            exec_extra={"exit_code": 1},
            evidence_extra={"enforcement": {"landlock": "full"}},
        )
    assert exec_entry.seq == evidence_entry.seq == 2
    exec_fields = _entries(ledgers.exec_path)[1]
    assert {
        "session_id": "S",
        "turn_number": 1,
        "query_hash": "qh",
        "result_hash": "rh",
        "status": "violation",
        "exit_code": 1,
    }.items() <= exec_fields.items()
    evidence_fields = _entries(ledgers.evidence_path)[1]
    assert {
        "session_id": "S",
        "turn_number": 1,
        "work_order_id": "WO-9",
        "declared_reads": ["/in"],
        "declared_writes": [{"path": "/out", "role": "result"}],
        "external_calls": [{"url": "https://example.org"}],
        "capability_violations": [violation],
        "enforcement": {"landlock": "full"},
    }.items() <= evidence_fields.items()
    assert [report.entries for report in verify_session_dir(ledgers.session_dir)] == [2, 2]


def test_extra_cannot_override_fields(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """exec_extra/evidence_extra may add fields, never replace the required ones."""
    with (
        SessionLedgers.create(
            root=tmp_path, tier="t", session_id="S", syncer=quick_syncer
        ) as ledgers,
        pytest.raises(LedgerRecordError, match=r"^status: conflicts with a field"),
    ):
        ledgers.record_turn(
            turn_number=1, query_hash="q", result_hash="r", status="ok", exec_extra={"status": "x"}
        )


def test_record_violation(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A violation is written to evidence immediately with all its fields (FR-RT-011)."""
    with SessionLedgers.create(
        root=tmp_path, tier="t", session_id="S", syncer=quick_syncer, clock=lambda: 123
    ) as ledgers:
        entry = ledgers.record_violation(
            turn_number=2, operation="read", target="/secret", capability="read", detail="denied"
        )
    assert entry.kind == "capability_violation"
    assert entry.get("capability_violations") == [
        {
            "operation": "read",
            "target": "/secret",
            "capability": "read",
            "detail": "denied",
            "timestamp_us": 123,
        }
    ]
    assert entry.get("turn_number") == 2


def test_open_resumes_and_requires_both(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """open() continues both chains; a session missing a ledger is refused."""
    SessionLedgers.create(root=tmp_path, tier="t", session_id="S", syncer=quick_syncer).close()
    with SessionLedgers.open(root=tmp_path, tier="t", session_id="S", syncer=quick_syncer) as again:
        exec_entry, _evidence = again.record_turn(
            turn_number=1, query_hash="q", result_hash="r", status="ok"
        )
    assert exec_entry.seq == 2
    again.evidence_path.unlink()
    with pytest.raises(IntegrityError, match=r"ledger missing: a session needs both ledgers$"):
        SessionLedgers.open(root=tmp_path, tier="t", session_id="S", syncer=quick_syncer)


def test_many_threads_and_tasks_many_sessions(tmp_path: Path) -> None:
    """Threads and anyio tasks appending to many sessions: every seq contiguous, all durable."""
    sessions = 12
    with GroupSyncer() as syncer:
        ledgers = [
            SessionLedgers.create(root=tmp_path, tier="t", session_id=f"S{i}", syncer=syncer)
            for i in range(sessions)
        ]

        def threaded(index: int) -> None:
            for turn in range(1, 6):
                ledgers[index % sessions].record_turn(
                    turn_number=turn, query_hash="q", result_hash="r", status="ok"
                )

        async def tasks() -> None:
            async with anyio.create_task_group() as group:
                for index in range(2 * sessions):
                    for turn in range(1, 4):
                        group.start_soon(_one_turn, ledgers[index % sessions], turn)

        async def _one_turn(session: SessionLedgers, turn: int) -> None:
            await session.arecord_turn(
                turn_number=turn, query_hash="q", result_hash="r", status="ok"
            )
            await session.arecord_violation(
                turn_number=turn, operation="exec", target="/bin/sh", capability="execute"
            )

        threads = [threading.Thread(target=threaded, args=(i,)) for i in range(2 * sessions)]
        for thread in threads:
            thread.start()
        anyio.run(tasks)
        for thread in threads:
            thread.join()
        for session in ledgers:
            session.checkpoint()
            session.close()
    batch = verify_root(tmp_path, workers=1)
    assert batch.ok
    # per session: 1 opened + 2 threads x 5 turns + 2 x 3 task turns + checkpoint
    exec_counts = {report.entries for report in batch.reports if report.path.name == "exec.jsonl"}
    assert exec_counts == {1 + 10 + 6 + 1}
    evidence_counts = {
        report.entries for report in batch.reports if report.path.name == "evidence.jsonl"
    }
    assert evidence_counts == {1 + 10 + 6 + 6 + 1}


async def test_async_wrappers(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """The async wrappers record, checkpoint and close."""
    ledgers = SessionLedgers.create(root=tmp_path, tier="t", session_id="S", syncer=quick_syncer)
    exec_entry, evidence_entry = await ledgers.arecord_turn(
        turn_number=1, query_hash="q", result_hash="r", status="ok", declared_reads=iter(["/a"])
    )
    assert evidence_entry.get("declared_reads") == ["/a"]
    violation = await ledgers.arecord_violation(
        turn_number=1, operation="o", target="t", capability="c"
    )
    assert violation.seq == 3
    checkpoints = await ledgers.acheckpoint()
    assert [entry.kind for entry in checkpoints] == ["checkpoint", "checkpoint"]
    await ledgers.aclose()
    assert exec_entry.seq == 2


def test_bad_evidence_writes_neither(tmp_path: Path, quick_syncer: InlineSyncer) -> None:
    """A turn whose evidence record is invalid is written to neither ledger."""
    with SessionLedgers.create(
        root=tmp_path, tier="t", session_id="S", syncer=quick_syncer
    ) as ledgers:
        with pytest.raises(LedgerRecordError, match=r"^capability_violations\[0\]\.operation"):
            ledgers.record_turn(
                turn_number=1,
                query_hash="q",
                result_hash="r",
                status="violation",
                capability_violations=[{"target": "/x"}],
            )
        assert ledgers.exec.head[0] == ledgers.evidence.head[0] == 1


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_violation_lets_held_turn_lines_out_exec_first(
    tmp_path: Path, quick_syncer: InlineSyncer, asynchronous: bool
) -> None:
    """A violation recorded while a turn's lines wait for their commit lets both out, and the
    turn's exec entry is durable before the evidence ledger gets anything past it: a crash can
    leave the exec entry without the evidence entry (recovery rebuilds it), never the reverse."""
    with SessionLedgers.create(
        root=tmp_path, tier="t", session_id="S", syncer=quick_syncer
    ) as ledgers:
        exec_line, evidence_line = ledgers.seal_turn(
            turn_number=1, query_hash="a" * 64, result_hash="b" * 64, status="succeeded"
        )
        ledgers.flush()
        assert exec_line.line not in ledgers.exec_path.read_bytes()  # held for its commit
        if asynchronous:
            anyio.run(
                lambda: ledgers.arecord_violation(
                    turn_number=2, operation="write", target="/etc/x", capability="w"
                )
            )
        else:
            ledgers.record_violation(
                turn_number=2, operation="write", target="/etc/x", capability="w"
            )
        assert ledgers.exec.durable_seq >= exec_line.seq
        assert ledgers.exec_path.read_bytes().endswith(exec_line.line)
        assert evidence_line.line in ledgers.evidence_path.read_bytes()
    assert [r.entries for r in verify_session_dir(ledgers.session_dir)] == [2, 3]
