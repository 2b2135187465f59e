"""Instruction turns that wait for an executor slot are parked without a task (`parking`)."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.errors import RequestError
from supervisor.store.protocol import Claim, TurnRecord
from supervisor.turns.fairness import Share
from supervisor.turns.parking import ParkedTurns
from tests.supervisor.turns.test_core import FakeHub, Rig, _instruction, _open, _verify, rig
from tests.supervisor.turns.test_recovery import _turn_entries
from tests.turn_requests import READ_SPEC, submitted

READ = ExecutorCommandType.READ


async def _submit(r: Rig, sid: str) -> TurnRecord:
    return (await r.turn_core.submit(submitted(_instruction(sid))))[0]


async def test_turns_wait_parked_and_start_in_order(tmp_path: Path) -> None:
    """One executor slot: the first turn runs, the others stay `accepted` (no envelope sent)
    and start one by one, oldest first, as the slot frees."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turns = [(await r.turn_core.submit(submitted(_instruction(sid))))[0] for _ in range(3)]
        await hub.started.wait()
        assert len(hub.envelopes) == 1
        for turn in turns[1:]:
            assert (await r.store.get_turn(turn.turn_id)).state is TurnState.ACCEPTED
            assert (await r.turn_core.get_turn(turn.turn_id)).state is TurnState.ACCEPTED
        assert r.turn_core.statistics().turns.turns_active == 3
        assert hub.gate is not None
        hub.gate.set()
        for turn in turns:
            done = await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)
            assert done.state is TurnState.SUCCEEDED
        assert [e.instruction_id for e in hub.envelopes] == [f"INS-{t.turn_id}-1" for t in turns]


async def test_cancel_a_parked_turn(tmp_path: Path) -> None:
    """A parked turn is cancelled at once: `cancelled`, one pair of ledger entries, no envelope."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        first, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        parked, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await hub.started.wait()
        cancelled = await r.turn_core.cancel_turn(parked.turn_id)
        assert cancelled.state is TurnState.CANCELLED
        assert cancelled.reason_code == "CANCELLED_BY_CLIENT"
        assert [e.instruction_id for e in hub.envelopes] == [f"INS-{first.turn_id}-1"]
        entries = _turn_entries(tmp_path, sid, "exec")
        assert [(e["turn_number"], e["status"]) for e in entries] == [
            (parked.turn_number, "cancelled")
        ]
        assert hub.gate is not None
        hub.gate.set()
        assert (await r.turn_core.wait_turn(first.turn_id)).state is TurnState.SUCCEEDED
        assert r.turn_core.statistics().turns.turns_active == 0
    assert [rep.entries for rep in _verify(tmp_path, sid)] == [3, 3]


async def test_parked_turns_count_against_the_queue(tmp_path: Path) -> None:
    """Admission sees the parked turns: a full queue refuses with queue_full."""
    hub = FakeHub(gate=anyio.Event(), slots=1, capacity=2)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        for _ in range(3):  # one runs, two parked
            await r.turn_core.submit(submitted(_instruction(sid)))
        with pytest.raises(RequestError) as err:
            await r.turn_core.submit(submitted(_instruction(sid)))
        assert err.value.code == "queue_full"
        assert hub.gate is not None
        hub.gate.set()


async def test_a_turn_parked_too_long_meets_the_hub_timeout(tmp_path: Path) -> None:
    """No executor slot at all: after the hub's queue wait the turn starts anyway (the hub then
    decides its attempt, here at once)."""
    hub = FakeHub(slots=0, queue_wait_s=0.2)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turn, _ = await r.turn_core.submit(submitted(_instruction(sid)))
        await anyio.sleep(0.05)
        assert hub.envelopes == []
        started = time.monotonic()
        done = await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)
        assert done.state is TurnState.SUCCEEDED
        assert time.monotonic() - started < 5
        # the hub is asked to wait only what is left of its queue wait, not all of it again
        (wait,) = hub.queue_waits
        assert wait is not None
        assert 0.0 <= wait < 0.2


async def test_parked_turns_run_after_a_restart(tmp_path: Path) -> None:
    """Parked turns are `accepted` in the store: the next start runs them."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turns = [(await r.turn_core.submit(submitted(_instruction(sid))))[0] for _ in range(3)]
        await r.turn_core.wait_turn(turns[0].turn_id, until=frozenset({TurnState.RUNNING}))
    async with rig(tmp_path) as r2:
        for turn in turns:
            done = await r2.turn_core.wait_turn(turn.turn_id, timeout_s=10)
            assert done.state is TurnState.SUCCEEDED
        stored = [await r2.store.get_turn(t.turn_id) for t in turns]
        # the running one was interrupted (a CRASH, retried); the parked ones never started
        assert [[a.fault_type for a in t.attempts] for t in stored] == [
            ["CRASH", None],
            [None],
            [None],
        ]


def _turn(turn_id: int) -> TurnRecord:
    return TurnRecord(
        turn_id=turn_id,
        session_id="S",
        turn_number=turn_id,
        kind=TurnKind.INSTRUCTION,
        spec=READ_SPEC,
        idempotency_key=None,
        state=TurnState.ACCEPTED,
        attempt=0,
        accepted_us=0,
        updated_us=0,
    )


def test_parked_turns_bookkeeping() -> None:
    """FIFO per command type; pop takes at most the limit; overdue takes by age; remove."""
    parked = ParkedTurns()
    for turn_id, (command, at) in enumerate(
        [(READ, 0.0), (READ, 1.0), (ExecutorCommandType.CLICK, 0.5), (READ, 2.0)], start=1
    ):
        turn = _turn(turn_id)
        parked.park(command, turn, Claim(turn=turn, owner="A", token=1, lease_until_us=0), at)
    assert (len(parked), parked.count(READ), parked.count(ExecutorCommandType.CLICK)) == (4, 3, 1)
    assert [p.turn.turn_id for p in parked.pop(READ, 2)] == [1, 2]
    assert parked.pop(READ, 0) == []
    assert parked.remove(99) is None
    assert [p.turn.turn_id for p in parked.overdue(now=2.6, max_wait_s=0.5)] == [4, 3]
    assert len(parked) == 0
    assert parked.commands() == []


async def test_in_flight_lists_the_oldest_first_up_to_a_limit(tmp_path: Path) -> None:
    """`status` shows a bounded list of active turns (parked ones included), oldest first."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        sid = await _open(r)
        turns = [await _submit(r, sid) for _ in range(5)]
        shown = r.turn_core.in_flight(limit=3)
        assert [t["turn_id"] for t in shown] == [t.turn_id for t in turns[:3]]
        assert [t["state"] for t in shown] == ["running", "accepted", "accepted"] or [
            t["state"] for t in shown
        ] == ["accepted", "accepted", "accepted"]
        assert len(r.turn_core.in_flight()) == 5
        assert hub.gate is not None
        hub.gate.set()


async def _start_order(r: Rig, hub: FakeHub, submits: list[str]) -> list[str]:
    """Submit one turn per entry (a session id) behind a closed gate with one slot; the order
    in which their envelopes reached the hub, as session ids."""
    turns = [await _submit(r, sid) for sid in submits]
    await hub.started.wait()
    assert hub.gate is not None
    hub.gate.set()
    for turn in turns:
        assert (await r.turn_core.wait_turn(turn.turn_id, timeout_s=10)).state is (
            TurnState.SUCCEEDED
        )
    by_instruction = {f"INS-{t.turn_id}-1": t.session_id for t in turns}
    return [by_instruction[e.instruction_id] for e in hub.envelopes]


async def test_a_flood_does_not_starve_another_tenant(tmp_path: Path) -> None:
    """Tenant A queues five turns, then tenant B one: B's starts second after A's running one,
    not after all of A's (round robin across tenants, oldest first within one)."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        a = (await r.turn_core.open_session(package_id="demo", tenant="a")).session_id
        b = (await r.turn_core.open_session(package_id="demo", tenant="b")).session_id
        order = await _start_order(r, hub, [a] * 5 + [b])
    assert order == [a, a, b, a, a, a]


async def test_sessions_of_one_tenant_share_its_turn(tmp_path: Path) -> None:
    """Two sessions with one tenant label queue as one (oldest first between them), and a
    session without a tenant is its own: it is not stuck behind them."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        a1 = (await r.turn_core.open_session(package_id="demo", tenant="a")).session_id
        a2 = (await r.turn_core.open_session(package_id="demo", tenant="a")).session_id
        solo = await _open(r)
        order = await _start_order(r, hub, [a1, a1, a2, a2, a1, solo])
    assert order == [a1, a1, solo, a2, a2, a1]


async def test_priority_weights_a_tenant(tmp_path: Path) -> None:
    """A session of priority 3 gets three starts in each round that a priority-1 one gets one."""
    hub = FakeHub(gate=anyio.Event(), slots=1)
    async with rig(tmp_path, hub) as r:
        low = (await r.turn_core.open_session(package_id="demo")).session_id
        high = (await r.turn_core.open_session(package_id="demo", priority=3)).session_id
        order = await _start_order(r, hub, [low] * 4 + [high] * 6)
    names = {low: "L", high: "H"}
    assert "".join(names[s] for s in order) == "LLHHHLHHHL"


def test_parked_turns_start_in_fair_order_at_scale() -> None:
    """100,000 parked turns of one tenant and one of another: the other's starts next, the
    overdue check still finds the oldest, and a removal is direct (`ParkedTurns` alone)."""
    parked = ParkedTurns()
    claim = Claim(turn=_turn(0), owner="A", token=1, lease_until_us=0)
    for i in range(1, 100_001):
        parked.park(READ, _turn(i), claim, float(i), Share("tenant:a"))
    parked.park(READ, _turn(100_001), claim, 100_001.0, Share("tenant:b"))
    assert len(parked) == 100_001
    assert [p.turn.turn_id for p in parked.pop(READ, 3)] == [1, 100_001, 2]
    assert parked.remove(50_000) is not None
    assert parked.remove(50_000) is None
    assert [p.turn.turn_id for p in parked.overdue(now=5.0, max_wait_s=1.0)] == [3, 4]
    assert parked.count(READ) == len(parked) == 99_995
