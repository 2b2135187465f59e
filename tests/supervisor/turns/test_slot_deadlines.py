"""A parked turn waits for a slot at most its own timeout (`slot_deadlines`, `runner`)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sandbox.policy.lifecycle import TurnState
from supervisor.turns.slot_deadlines import SlotDeadlines
from tests.supervisor.turns.test_core import FakeHub, _instruction, _open, rig
from tests.turn_requests import submitted


def test_turns_fall_due_in_order_of_their_own_bound() -> None:
    """A later turn with a shorter bound falls due before an earlier one with a longer bound."""
    due = SlotDeadlines()
    due.add(1, 60.0)
    due.add(2, 1.5)
    due.add(3, float("inf"))
    assert due.due(1.0) == []
    assert due.due(2.0) == [2]
    assert due.due(1e9) == [1]
    assert len(due) == 0


@given(st.lists(st.tuples(st.integers(0, 1000), st.floats(0, 1e6)), max_size=50), st.floats(0, 1e6))
def test_due_takes_exactly_the_entries_at_or_before_now(
    entries: list[tuple[int, float]], now: float
) -> None:
    """`due(now)` gives every entry due by *now*, earliest first, and keeps the rest."""
    deadlines = SlotDeadlines()
    for turn_id, at in entries:
        deadlines.add(turn_id, at)
    taken = deadlines.due(now)
    expected = sorted((at, t) for t, at in entries if at <= now)
    assert taken == [t for _, t in expected]
    assert len(deadlines) == len(entries) - len(taken)


async def test_a_parked_turn_starts_after_its_timeout_not_the_queue_wait(tmp_path: Path) -> None:
    """No executor slot, a 60 s queue wait, a 200 ms instruction: the turn leaves the parked
    queue after about 200 ms and the hub is asked to wait no longer (nothing of 60 s)."""
    hub = FakeHub(slots=0, queue_wait_s=60.0)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid, timeout_ms=200)))
        done = await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        (wait,) = hub.queue_waits
        assert wait is not None
        assert 0.0 <= wait < 0.2
