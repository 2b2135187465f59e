"""Tests of ledger.checkpoints: HO2 checkpoints replay to the same state as a full replay."""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import replace
from pathlib import Path

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import (
    InlineSyncer,
    SessionLedgers,
    SessionState,
    checkpoint_record,
    open_ledger,
    replay,
    state_at,
)
from ledger.verify import verify_scan


def _no_sync(fd: int) -> None:
    """Content tests do not need fdatasync."""


def _full_replay(path: Path, t_us: int | None) -> SessionState:
    _report, scan = verify_scan(path, ledger_id=None, head_store=None, collect=True)
    entries = [
        entry
        for entry in scan.parsed
        if t_us is None or (isinstance(entry["ts_us"], int) and entry["ts_us"] <= t_us)
    ]
    return replay(SessionState.initial(scan.ledger_id or ""), entries)


_item = st.one_of(
    st.text(max_size=8),
    st.fixed_dictionaries({"path": st.text(max_size=5), "role": st.sampled_from(["out", "log"])}),
)
_turn = st.tuples(
    st.just("turn"),
    st.sampled_from(["succeeded", "failed", "timeout", "violation"]),
    st.lists(_item, max_size=3),
    st.lists(_item, max_size=3),
    st.lists(st.text(max_size=5), max_size=2),
)
_op = st.one_of(
    _turn,
    st.tuples(st.just("violation")),
    st.tuples(st.just("checkpoint")),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=25), cut=st.integers(min_value=0, max_value=400))
def test_checkpoint_replay_equals_full_replay(ops: list[tuple[object, ...]], cut: int) -> None:
    """For any history and any time, checkpoint + replay == full replay, on both ledgers."""
    ticks = itertools.count(start=10, step=10)
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        with SessionLedgers.create(
            root=root,
            tier="t",
            session_id="SES-h",
            syncer=InlineSyncer(sync=_no_sync),
            clock=lambda: next(ticks),
        ) as ledgers:
            turn = 0
            for op in ops:
                if op[0] == "turn":
                    turn += 1
                    _kind, status, reads, writes, calls = op
                    ledgers.record_turn(
                        turn_number=turn,
                        query_hash="q",
                        result_hash="r",
                        status=str(status),
                        declared_reads=list(reads),  # type: ignore[call-overload]
                        declared_writes=list(writes),  # type: ignore[call-overload]
                        external_calls=list(calls),  # type: ignore[call-overload]
                    )
                elif op[0] == "violation":
                    ledgers.record_violation(
                        turn_number=max(turn, 1),
                        operation="write",
                        target="/x",
                        capability="write",
                    )
                else:
                    ledgers.checkpoint()
        for path in (ledgers.exec_path, ledgers.evidence_path):
            for t_us in (cut * 10, None):
                accelerated = state_at(path, t_us)
                assert accelerated.fallback is None
                assert accelerated == _full_replay(path, t_us)


def test_checkpoint_replays_only_entries_since(tmp_path: Path) -> None:
    """state_at starts from the latest checkpoint before t and replays only what follows."""
    ticks = itertools.count(start=100, step=100)
    with open_ledger(
        tmp_path / "l.jsonl",
        ledger_id="S/evidence",
        syncer=InlineSyncer(sync=_no_sync),
        clock=lambda: next(ticks),
    ) as writer:
        for turn in range(1, 5):
            writer.append(
                {
                    "kind": "turn",
                    "session_id": "S",
                    "turn_number": turn,
                    "declared_reads": [f"/r{turn}"],
                    "declared_writes": [],
                    "external_calls": [],
                    "capability_violations": [],
                }
            )
        checkpoint = writer.checkpoint()  # seq 5, ts 500
        writer.append({"kind": "note"})  # seq 6, ts 600
    assert checkpoint.get("covers_seq") == 4
    latest = state_at(tmp_path / "l.jsonl")
    assert (latest.checkpoint_seq, latest.replayed) == (5, 2)
    assert (latest.turns, latest.reads, latest.entries, latest.last_seq) == (4, 4, 5, 6)
    before = state_at(tmp_path / "l.jsonl", 450)  # before the checkpoint: full replay
    assert (before.checkpoint_seq, before.turns, before.last_seq) == (None, 4, 4)


def test_bad_checkpoint_falls_back_to_full_replay(tmp_path: Path) -> None:
    """A checkpoint whose covered hash is wrong is ignored, with a warning and a reason."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=InlineSyncer(sync=_no_sync)) as writer:
        writer.append({"kind": "turn", "status": "ok"})
        state = state_at(path)
        forged = checkpoint_record(replace(state, last_hash="0" * 64))
        forged["covers_hash"] = "0" * 64
        writer.append(forged)
        writer.append({"kind": "turn", "status": "ok"})
    with structlog.testing.capture_logs() as logs:
        result = state_at(path)
    assert result.fallback is not None
    assert result.fallback.startswith("checkpoint at seq 2 rejected: covers_hash does not match")
    assert result.checkpoint_seq is None
    assert result == _full_replay(path, None)
    assert logs[0]["event"] == "ledger_checkpoint_rejected"


def test_audit_catches_wrong_folded_state(tmp_path: Path) -> None:
    """A checkpoint with the right link but a wrong state is caught by audit=True."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, ledger_id="L", syncer=InlineSyncer(sync=_no_sync)) as writer:
        writer.append({"kind": "turn", "status": "ok"})
        state = state_at(path)
        writer.append(checkpoint_record(replace(state, turns=99)))
    trusting = state_at(path)
    assert (trusting.turns, trusting.fallback) == (99, None)
    audited = state_at(path, audit=True)
    assert audited.turns == 1
    assert audited.fallback is not None
    assert "differs from a re-fold" in audited.fallback


def test_state_round_trip() -> None:
    """SessionState survives to_dict/from_dict."""
    state = replace(
        SessionState.initial("L"), turns=3, statuses=(("failed", 1), ("ok", 2)), reads=4
    )
    assert SessionState.from_dict(state.to_dict()) == state
