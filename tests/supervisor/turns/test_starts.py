"""Attempt starts written only when the attempt outlives a short delay (`starts`)."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest
import structlog.testing

from sandbox.policy.lifecycle import TurnState
from supervisor.turns.starts import DeferredStarts
from tests.supervisor.turns.test_core import FakeHub, _instruction, _open, _run, rig
from tests.turn_requests import submitted


async def test_a_quick_attempt_writes_its_start_with_its_outcome(tmp_path: Path) -> None:
    """An answer within the delay: the turn costs two store writes (accept, finish), and its
    attempt is recorded whole."""
    async with rig(tmp_path) as r:
        sid = await _open(r)
        await _run(r, _instruction(sid))  # warm-up
        before = r.store.statistics().operations
        with structlog.testing.capture_logs() as logs:
            turn = await _run(r, _instruction(sid))
        started = [e for e in logs if e["event"] == "attempt_started"]
        assert [(e["attempt"], e["instruction_id"]) for e in started] == [
            (1, f"INS-{turn.turn_id}-1")
        ]
        assert turn.state is TurnState.SUCCEEDED
        assert r.store.statistics().operations - before == 2
        (attempt,) = turn.attempts
        assert (attempt.attempt, attempt.decision, attempt.instruction_id) == (
            1,
            "SUCCEED",
            f"INS-{turn.turn_id}-1",
        )
        assert r.turn_core.statistics().turns.attempts_running == 0


async def test_a_slow_attempt_writes_its_start_while_it_runs(tmp_path: Path) -> None:
    """An attempt that outlives the delay is `running` in the store before it answers."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await r.turn_core.wait_turn(turn.turn_id, until=frozenset({TurnState.RUNNING}))
        stored = await r.store.get_turn(turn.turn_id)
        assert (stored.state, stored.attempt) == (TurnState.RUNNING, 1)
        assert hub.gate is not None
        hub.gate.set()
        done = await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        assert [a.decision for a in done.attempts] == ["SUCCEED"]


async def test_cancel_before_the_start_was_written(tmp_path: Path) -> None:
    """A turn cancelled while its start is only noted never writes it: `cancelled`."""
    hub = FakeHub(gate=anyio.Event())
    async with rig(tmp_path, hub) as r:
        r.turn_core._deps.starts.delay_s = 60.0
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await hub.started.wait()
        cancelled = await r.turn_core.cancel_turn(turn.turn_id)
        assert cancelled.state is TurnState.CANCELLED
        assert len(r.turn_core._deps.starts) == 0


async def test_deferred_starts_write_when_due_oldest_first() -> None:
    """Due starts are written oldest first; a start taken back is never written."""
    starts = DeferredStarts(delay_s=0.0)
    written: list[int] = []
    for turn_id in (1, 2, 3):
        starts.note(turn_id, functools.partial(written.append, turn_id))
    assert starts.take_back(2) is True
    assert starts.take_back(2) is False
    starts.write_due(now=float("inf"))
    assert written == [1, 3]
    assert (starts.written, starts.taken_back, len(starts)) == (2, 1, 0)
    later = DeferredStarts(delay_s=3600.0)
    later.note(9, lambda: written.append(9))
    later.write_due(now=0.0)
    assert written == [1, 3]
    async with anyio.create_task_group() as tg:
        quick = DeferredStarts(delay_s=0.001)
        tg.start_soon(quick.run)
        done = anyio.Event()
        quick.note(7, done.set)
        with anyio.fail_after(5):
            await done.wait()
        tg.cancel_scope.cancel()


def test_the_delay_follows_how_long_attempts_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick attempts keep the delay near its floor; when attempts outlive it (their starts
    are written) it climbs, up to max_delay_s, so a turn's start and outcome share one write
    again; it never goes below delay_s nor above max_delay_s."""
    clock = [100.0]
    monkeypatch.setattr("supervisor.turns.starts.time.monotonic", lambda: clock[0])
    starts = DeferredStarts(delay_s=0.002, max_delay_s=0.25)
    for turn_id in range(50):  # attempts of 0.5 ms, taken back
        starts.note(turn_id, lambda: None)
        clock[0] += 0.0005
        assert starts.take_back(turn_id)
    assert starts.delay == pytest.approx(0.002)
    written = 0
    for turn_id in range(100, 200):  # attempts of 40 ms: written while the delay is short
        starts.note(turn_id, lambda: None)
        clock[0] += 0.04
        before = starts.written
        starts.write_due(clock[0])
        written += starts.written - before
        starts.take_back(turn_id)
    assert 0 < written < 30
    assert 0.04 < starts.delay <= 0.25
    for turn_id in range(300, 400):  # attempts of 10 s: the delay stops at its ceiling
        starts.note(turn_id, lambda: None)
        clock[0] += 10.0
        starts.write_due(clock[0])
        starts.take_back(turn_id)
    assert starts.delay == pytest.approx(0.25)
