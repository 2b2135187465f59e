"""What the `hunter` commands need of the client library, against a real daemon: each typed
value's ``to_dict()`` is the daemon's answer as it was sent (so the commands' ``--json`` prints
what it printed when it read the raw answers), attributed decisions (``cancel`` and ``drain``
with ``reason`` and ``operator``), compact reads, the final states, and a missing daemon
raised as `DaemonNotRunning` itself."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from sandbox.policy.lifecycle import FINAL_STATES as LIFECYCLE_FINAL_STATES
from sandbox.policy.lifecycle import TurnState
from supervisor.client import (
    Client,
    ConnectionLost,
    DaemonNotRunning,
    DecidedBy,
    Draining,
    Executor,
    connect,
)
from supervisor.client.models import FINAL_STATES, SETTLED_STATES
from tests.live_daemon import WAIT_S, Gated, demo_root, serving


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-ans-")


def test_the_final_states_are_the_daemons() -> None:
    """A wait stops at every state the daemon never leaves (timeout, violation, ... too)."""
    assert {s.value for s in LIFECYCLE_FINAL_STATES} == FINAL_STATES
    assert FINAL_STATES | {TurnState.ESCALATED.value} == SETTLED_STATES


async def test_no_daemon_is_daemon_not_running_itself(tmp_path: Path) -> None:
    """Not an exception group of the client's task group: `hunter` maps it to exit 10."""
    with pytest.raises(DaemonNotRunning) as missing:
        async with Client(tmp_path / "control.sock", reconnect_s=0):
            pass  # pragma: no cover - the connection fails first
    assert missing.value.socket_path == tmp_path / "control.sock"


async def test_each_value_gives_back_the_answer_it_was_read_from(root: Path) -> None:
    """``to_dict()`` of sessions, executors, turns (whole and compact), decision records and
    ledger checks equals the raw answer of the same read."""
    executor = Gated(slots=4, expected=1)
    async with serving(root, executor) as (_, sid), connect(root=root) as client:
        handle = await client.submit_instruction(
            sid, "READ", selector="h1", phase="GREEN", declared_inputs=["in.txt"]
        )
        with anyio.fail_after(WAIT_S):
            await executor.all_started.wait()
        executor.gate.set()
        turn = await handle.result(timeout_s=WAIT_S)
        assert turn.succeeded
        assert turn.spec is not None
        assert (turn.spec["phase"], turn.spec["declared_inputs"]) == ("GREEN", ["in.txt"])
        assert [a.queued_ms is not None for a in turn.attempts] == [True]

        raw = await client.call("turn.get", turn_id=turn.turn_id)
        assert (await client.get_turn(turn.turn_id)).to_dict() == raw["turn"]
        assert (await client.decision_record(turn.turn_id)).to_dict() == raw

        compact = await client.get_turn(turn.turn_id, compact=True)
        raw_compact = await client.call(
            "turn.wait", turn_id=turn.turn_id, timeout_s=0, answer="compact"
        )
        assert compact.compact
        assert not turn.compact
        assert compact.to_dict() == raw_compact["turn"]

        sessions = (await client.call("session.list"))["sessions"]
        assert [s.to_dict() for s in await client.sessions()] == sessions
        # one read: an executor's heartbeat_age_ms changes from one read to the next
        executors = (await client.call("executors.list"))["executors"]
        assert [msgspec.convert(e, Executor).to_dict() for e in executors] == executors
        assert [e.executor_id async for e in client.executors()] == ["gated"]
        check = await client.call("ledger.verify", session_id=sid)
        assert (await client.verify_ledgers(session_id=sid)).to_dict() == check
        escalated = (await client.call("escalations.list"))["escalations"]
        assert [t.to_dict() for t in await client.escalations()] == escalated

        unserved = await client.submit_instruction(sid, "CLICK", selector="#go", compact=True)
        answer = unserved.to_dict()
        assert answer["created"] is True
        assert answer["warnings"] == list(unserved.warnings)
        assert unserved.warnings  # no executor serves CLICK
        assert answer["turn"] == unserved.turn.to_dict()
        assert set(unserved.turn.to_dict()) == set(raw_compact["turn"])


async def test_a_cancel_is_attributed_and_recorded(root: Path) -> None:
    """``cancel(reason=, operator=)``: the turn's ``decided_by`` (typed) and its evidence
    entry's, with the caller's uid."""
    executor = Gated(slots=4, expected=1)
    async with serving(root, executor) as (_, sid), connect(root=root) as client:
        handle = await client.submit_instruction(sid, "READ", selector="h1")
        with anyio.fail_after(WAIT_S):
            await executor.all_started.wait()
        turn = await handle.cancel(reason="wrong page", operator="ops-anna")
        executor.gate.set()
        assert turn.state == "cancelled"
        assert turn.final
        decided = turn.decided_by
        assert isinstance(decided, DecidedBy)
        assert (decided.action, decided.operator, decided.reason) == (
            "cancel",
            "ops-anna",
            "wrong page",
        )
        assert decided.uid == os.getuid()
        record = await client.decision_record(turn.turn_id)
        assert [e.decided_by for e in record.evidence if e.decided_by] == [decided]
        raw = await client.call("turn.get", turn_id=turn.turn_id)
        assert record.to_dict() == raw
        again = await client.cancel(turn.turn_id)  # final: comes back as it is
        assert again.decided_by == decided


async def test_drain_is_attributed_and_stops_new_work(root: Path) -> None:
    executor = Gated(slots=4, expected=1)
    executor.gate.set()
    async with serving(root, executor), connect(root=root) as client:
        decided = await client.drain(reason="maintenance window", operator="ops-anna")
        assert (decided.action, decided.operator, decided.reason) == (
            "drain",
            "ops-anna",
            "maintenance window",
        )
        assert decided.uid == os.getuid()
        assert decided.pid == os.getpid()
        with pytest.raises((Draining, ConnectionLost)):
            await client.open_session("demo")


async def test_pages_a_session_and_evidence(root: Path) -> None:
    """What the console reads: a page of turns (of a session) and of executors, a session
    with its package, a turn's evidence bytes in slices (and `NoEvidence` without them)."""
    from supervisor.client import NoEvidence
    from supervisor.sdk import Executor as SdkExecutor
    from supervisor.sdk import Instruction, Result

    class Pages(SdkExecutor):
        def __init__(self) -> None:
            super().__init__(executor_id="pages", slots=4)

        async def read(self, instruction: Instruction) -> Result:
            keep = instruction.target_selector != "#hash"
            return Result.success(b"0123456789" * 10, attach_evidence=keep)

    async with serving(root, Pages()) as (_, sid), connect(root=root) as client:
        ids = []
        for selector in ("#a", "#b", "#c", "#hash"):
            handle = await client.submit_instruction(sid, "READ", selector=selector, wait_s=WAIT_S)
            ids.append(handle.turn_id)
        first = await client.turn_page(limit=2, session_id=sid)
        assert [t.turn_id for t in first.turns] == ids[:2]
        assert first.next_after == ids[1]
        rest = await client.turn_page(after=ids[1], limit=2, session_id=sid)
        assert [t.turn_id for t in rest.turns] == ids[2:]
        assert (await client.turn_page(after=ids[3], session_id=sid)).next_after is None
        executors = await client.executor_page(limit=1)
        assert [e.executor_id for e in executors.executors] == ["pages"]
        info = await client.session(sid)
        assert info.session.session_id == sid
        assert info.package is not None
        assert info.package_problem is None
        got = b""
        while True:
            part = await client.evidence(ids[0], offset=len(got), length=30)
            got += part.data
            if not part.more:
                break
        assert got == b"0123456789" * 10
        assert part.size == 100
        with pytest.raises(NoEvidence):
            await client.evidence(ids[3])


async def test_escalations_come_a_page_at_a_time(root: Path) -> None:
    """``escalations.list`` pages by turn id (``after_turn_id``, ``limit``, ``next_after``);
    `Client.escalations` reads every page."""
    hog = ["python3", "-c", "b = bytearray(512 << 20)"]  # over the demo package's memory limit
    async with serving(root, Gated(slots=1, expected=1)) as (_, sid), connect(root=root) as client:
        parked = []
        for _ in range(3):
            handle = await client.submit_process(sid, hog, wait_s=30)
            turn = await handle.result()
            assert turn.state == "escalated", turn
            parked.append(turn.turn_id)
        first = await client.escalation_page(limit=2)
        assert [t.turn_id for t in first.turns] == parked[:2]
        assert first.next_after == parked[1]
        last = await client.escalation_page(after=parked[1], limit=2)
        assert [t.turn_id for t in last.turns] == parked[2:]
        assert last.next_after is None
        assert [t.turn_id for t in await client.escalations()] == parked
