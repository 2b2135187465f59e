"""Instruction turns (`supervisor.turns.instruction`): each attempt one fresh envelope through
the executor hub, the daemon-wide retry budget, and the result a turn ends with.

The parts are real, as in `test_runner.py` (whose daemon rig this reuses): the SQLite store,
the sandbox runtime of ``conftest.sandbox_runtime``, the executor hub on a Unix socket and SDK
executors. Turns taken back after a restart run their attempts in a task of their own
(`run_instruction_turn`); fresh ones go on the record path, which shares the budget gate and
the result's shape.
"""

from __future__ import annotations

import hashlib

import anyio
import pytest
import structlog.testing

from ledger import session_dir_for
from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.budget import BudgetLimits
from sandbox.policy.envelopes import ExecutorCommandType
from sandbox.policy.lifecycle import TurnState
from sandbox.policy.retry_protocol import RetryOptions
from sandbox.runtime import Runtime
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.settings import HubSettings
from supervisor.turns.instruction import build_envelope, slot_wait_s
from supervisor.wire.turn_spec import InstructionSpec
from tests.supervisor.turns.test_runner import (
    WAIT_S,
    Crashing,
    Gated,
    Reader,
    Sleeper,
    World,
    accepted_before_restart,
    events,
    exec_entries,
    open_session,
    result_of,
    running,
    sql,
    world_of,
)

#: No retry beyond the budget's floor: ratio 0 in a minute's window.
NO_RETRIES = BudgetLimits(ratio=0.0, window_ms=60_000, min_retries=0)


@pytest.fixture
def world(sandbox_runtime: Runtime) -> World:
    """A daemon's files beside the sandbox runtime's root (removed with it)."""
    return world_of(sandbox_runtime)


# -- the envelope and its wait for a slot --------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout_ms", "bound_s"),
    [(1_000, 1.0), (10_000, 10.0), (60_000, 10.0)],
)
def test_an_attempt_waits_for_a_slot_no_longer_than_its_own_timeout(
    timeout_ms: int, bound_s: float
) -> None:
    """The wait for an executor slot is the hub's queue wait, cut to the instruction's own
    ``timeout_ms``: a one-second instruction is not queued for ten."""
    hub = ExecutorHub(settings=HubSettings(queue_wait_s=10.0))
    spec = InstructionSpec(timeout_ms=timeout_ms, command_type=ExecutorCommandType.READ)
    assert slot_wait_s(hub, spec) == bound_s


def test_without_an_instruction_the_slot_wait_is_the_hubs() -> None:
    """With no instruction to bound it, the wait is the hub's own queue wait."""
    hub = ExecutorHub(settings=HubSettings(queue_wait_s=7.5))
    assert slot_wait_s(hub, None) == 7.5


def test_the_envelope_carries_the_turns_instruction_under_the_attempts_ids() -> None:
    """An attempt's envelope is the spec's instruction under the attempt's instruction id and
    the turn's execution id; an attempt not yet named gets one from both."""
    spec = InstructionSpec(
        timeout_ms=2_500,
        command_type=ExecutorCommandType.READ,
        target_selector="#title",
        parameters={"limit": 3},
    )
    named = AttemptRecord(attempt=2, started_us=1, instruction_id="INS-7-2")
    envelope = build_envelope(spec, named, "EXE-7")
    assert (envelope.instruction_id, envelope.execution_id) == ("INS-7-2", "EXE-7")
    assert (envelope.command_type, envelope.target_selector) == (
        ExecutorCommandType.READ,
        "#title",
    )
    assert (envelope.timeout_ms, dict(envelope.parameters)) == (2_500, {"limit": 3})
    assert envelope.timestamp.endswith("Z")
    unnamed = build_envelope(spec, AttemptRecord(attempt=3, started_us=1), "EXE-7")
    assert unnamed.instruction_id == "INS-EXE-7-3"


async def test_a_retry_goes_out_as_a_fresh_envelope_under_the_next_instruction_id(
    world: World,
) -> None:
    """A turn run in a task (taken back after a restart) retries a crash with a new envelope:
    the next instruction id, the same execution id and instruction."""
    _, turn_id = await accepted_before_restart(world)
    executor = Crashing()
    async with running(world, executor) as stack:
        done = await stack.settled(turn_id)
    assert done.state is TurnState.SUCCEEDED
    assert [a.decision for a in done.attempts] == ["RETRY", "SUCCEED"]
    first, second = executor.seen
    assert (first.instruction_id, second.instruction_id) == (
        f"INS-{turn_id}-1",
        f"INS-{turn_id}-2",
    )
    assert first.execution_id == second.execution_id == f"EXE-{turn_id}"
    assert (second.command_type, second.target_selector) == (
        first.command_type,
        first.target_selector,
    )


async def test_a_turn_no_connected_executor_serves_ends_no_capable_executor(
    world: World,
) -> None:
    """A turn whose command no executor serves waits its own timeout for a slot, then its
    attempt meets the hub's answer: ``terminated`` NO_CAPABLE_EXECUTOR, never retried."""
    async with running(world) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=200)
        done = await stack.settled(turn.turn_id)
    assert (done.state, done.reason_code) == (TurnState.TERMINATED, "NO_CAPABLE_EXECUTOR")
    (attempt,) = done.attempts
    assert (attempt.outcome, attempt.executor_id) == ("NO_EXECUTOR", None)
    assert result_of(done)["executor_id"] is None


# -- the retry budget ----------------------------------------------------------------------------


async def test_a_retry_past_the_daemons_retry_budget_ends_the_turn_instead(
    world: World,
) -> None:
    """With the daemon-wide retry budget spent, a crash that would be retried ends the turn
    ``terminated`` at once; the refusal is logged with the retry it stopped."""
    executor = Crashing()
    async with running(world, executor, budget=NO_RETRIES) as stack:
        sid = await open_session(stack)
        with structlog.testing.capture_logs() as logs:
            done = await stack.settled((await stack.submit(sid)).turn_id)
        budget = stack.core.retry_budget()
    assert (done.state, done.reason_code) == (
        TurnState.TERMINATED,
        "DAEMON_RETRY_BUDGET_EXHAUSTED",
    )
    (attempt,) = done.attempts
    assert (attempt.fault_type, attempt.decision) == ("CRASH", "TERMINATE")
    (refused,) = events(logs, "retry_refused")
    assert (refused["would_be"], refused["retries"], refused["allowance"]) == (
        "RETRY_AFTER_CRASH",
        0,
        0,
    )
    assert (budget.first_attempts, budget.retries) == (1, 0)
    assert len(executor.seen) == 1


async def test_the_budgets_floor_grants_a_retry_then_refuses_the_next(world: World) -> None:
    """A budget allowing one retry in its window: a resumed turn's first crash is retried,
    its second ends the turn over budget (no third envelope is sent)."""
    _, turn_id = await accepted_before_restart(world)
    executor = Crashing(crashes=2)
    floor = BudgetLimits(ratio=0.0, window_ms=60_000, min_retries=1)
    async with running(world, executor, budget=floor) as stack:
        done = await stack.settled(turn_id)
        budget = stack.core.retry_budget()
    assert done.reason_code == "DAEMON_RETRY_BUDGET_EXHAUSTED"
    assert [(a.fault_type, a.decision) for a in done.attempts] == [
        ("CRASH", "RETRY"),
        ("CRASH", "TERMINATE"),
    ]
    assert budget.retries == 1
    assert len(executor.seen) == 2


# -- resumed turns -------------------------------------------------------------------------------


async def test_an_attempt_cut_short_on_the_last_allowed_attempt_ends_the_turn_after_restart(
    world: World,
) -> None:
    """The daemon stops during a turn's last allowed attempt: the next start decides that
    attempt as a CRASH and ends the turn, sending nothing; its result names the interruption
    (no executor answered) and its ledger entry is written."""
    gated = Gated()
    async with running(world, gated) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        await stack.reached(turn.turn_id, TurnState.RUNNING)  # its start is in the store
    reader = Reader()
    once = RetryOptions(max_attempts=1, base_delay_ms=1, backoff_multiplier=2, max_delay_ms=5)
    async with running(world, reader, retry=once) as stack:
        done = await stack.settled(turn.turn_id)
        statuses = [e["status"] for e in await exec_entries(stack, sid)]
    assert done.state is TurnState.TERMINATED
    (attempt,) = done.attempts
    assert (attempt.attempt, attempt.fault_type, attempt.decision) == (1, "CRASH", "TERMINATE")
    assert result_of(done) == {
        "detail": "interrupted by a restart of this daemon: it stopped while the attempt ran"
    }
    assert reader.seen == []
    assert statuses == ["terminated"]


async def test_a_turn_waiting_for_its_retry_at_a_stop_sends_its_next_attempt_after_restart(
    world: World,
) -> None:
    """A turn stopped during its retry's backoff is taken back waiting: once the backoff is
    over (the daemon was down longer than it) its next attempt goes, numbered on."""
    crashing = Crashing()
    slow = RetryOptions(max_attempts=3, base_delay_ms=60_000, backoff_multiplier=2)
    async with running(world, crashing, retry=slow) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid)
        await stack.reached(turn.turn_id, TurnState.WAITING_RETRY)
    # the daemon stayed down past the backoff
    await sql(world, "UPDATE turns SET next_attempt_us = 0 WHERE turn_id = ?", turn.turn_id)
    reader = Reader()
    async with running(world, reader) as stack:
        done = await stack.settled(turn.turn_id)
        statuses = [e["status"] for e in await exec_entries(stack, sid)]
    assert done.state is TurnState.SUCCEEDED
    assert [(a.attempt, a.fault_type, a.decision) for a in done.attempts] == [
        (1, "CRASH", "RETRY"),
        (2, None, "SUCCEED"),
    ]
    assert [i.instruction_id for i in crashing.seen] == [f"INS-{turn.turn_id}-1"]
    assert reader.seen == [f"INS-{turn.turn_id}-2"]
    assert statuses == ["succeeded"]


async def test_a_retry_that_waits_in_the_hubs_queue_records_that_wait(world: World) -> None:
    """A turn taken back waiting for its retry runs in a task: with no executor connected its
    next attempt waits in the hub's own queue, inside the attempt's start and end. That wait
    is still its queue wait: at least the time the test let pass before connecting one, and
    not part of how long it ran."""
    pause_s = 0.3
    slow = RetryOptions(max_attempts=3, base_delay_ms=60_000, backoff_multiplier=2)
    async with running(world, Crashing(), retry=slow) as stack:
        sid = await open_session(stack)
        turn = await stack.submit(sid, timeout_ms=30_000)
        await stack.reached(turn.turn_id, TurnState.WAITING_RETRY)
    await sql(world, "UPDATE turns SET next_attempt_us = 0 WHERE turn_id = ?", turn.turn_id)
    with structlog.testing.capture_logs() as logs:
        async with running(world) as stack:
            # running: its envelope went to the hub, where no executor serves READ yet
            await stack.reached(turn.turn_id, TurnState.RUNNING)
            assert stack.hub.statistics().queued_by_command == {"READ": 1}
            await anyio.sleep(pause_s)
            await stack.connect(Reader())
            done = await stack.settled(turn.turn_id)
    assert done.state is TurnState.SUCCEEDED
    first, second = done.attempts
    assert first.queued_ms is not None
    assert second.queued_ms is not None
    assert second.queued_ms >= pause_s * 1000
    assert second.duration_ms is not None
    assert second.finished_us is not None
    # the attempt's times span the wait and the run; its duration is the run only (the wait
    # and the run each rounded to whole milliseconds)
    span_ms = (second.finished_us - second.started_us) / 1000
    assert second.queued_ms + second.duration_ms <= span_ms + 2
    # logged when the envelope went to the hub: what it waited before that (nothing)
    (started,) = [e for e in events(logs, "attempt_started") if e["attempt"] == 2]
    assert started["queued_ms"] == 0


async def test_a_draining_daemon_sends_no_attempt_of_a_turn_it_takes_back(world: World) -> None:
    """A daemon that begins to drain before it takes back its unfinished turns sends none of
    them to an executor: the turn stays ``accepted`` for the next start, which runs it."""
    _, turn_id = await accepted_before_restart(world)
    idle = Reader()
    async with running(world, idle, start=False) as stack:
        assert await stack.core.drain(grace_s=WAIT_S)
        await stack.start_core()
        left = await stack.settled(turn_id)
        active = stack.core.statistics().turns.turns_active
    assert left.state is TurnState.ACCEPTED
    assert active == 0
    assert idle.seen == []
    reader = Reader()
    async with running(world, reader) as stack:
        done = await stack.settled(turn_id)
    assert done.state is TurnState.SUCCEEDED
    assert reader.seen == [f"INS-{turn_id}-1"]


async def test_a_cancel_of_a_resumed_turn_mid_attempt_ends_it_cancelled(world: World) -> None:
    """A turn taken back after a restart, cancelled while its attempt runs: the executor's
    handler is stopped and the turn ends ``cancelled``, its ledger entry written."""
    sid, turn_id = await accepted_before_restart(world)
    sleeper = Sleeper()
    async with running(world, sleeper) as stack:
        with anyio.fail_after(WAIT_S):
            await sleeper.started.wait()
            cancelled = await stack.core.cancel_turn(turn_id)
            await sleeper.cancelled.wait()
        statuses = [e["status"] for e in await exec_entries(stack, sid)]
    assert (cancelled.state, cancelled.reason_code) == (
        TurnState.CANCELLED,
        "CANCELLED_BY_CLIENT",
    )
    assert statuses == ["cancelled"]


# -- the result ----------------------------------------------------------------------------------


async def test_evidence_bytes_sent_with_an_answer_are_kept_with_the_session(
    world: World,
) -> None:
    """Evidence bytes attached to an answer are stored under the session, content-addressed,
    and the turn's result names them beside the executor's answer and the envelope sent."""
    sid, turn_id = await accepted_before_restart(world)
    reader = Reader(attach=True, output={"title": "Example"})
    async with running(world, reader) as stack:
        done = await stack.settled(turn_id)
        statuses = [e["status"] for e in await exec_entries(stack, sid)]
    digest = hashlib.sha256(b"page").hexdigest()
    result = result_of(done)
    assert done.state is TurnState.SUCCEEDED
    assert (result["executor_id"], result["response_type"]) == ("reader", "SUCCESS")
    assert (result["evidence_hash"], result["output"], result["partial"]) == (
        digest,
        {"title": "Example"},
        False,
    )
    evidence = result["evidence"]
    assert isinstance(evidence, dict)
    assert (evidence["sha256"], evidence["size"]) == (digest, 4)
    stored = anyio.Path(session_dir_for(world.root, "default", sid)) / str(evidence["path"])
    assert await stored.read_bytes() == b"page"
    last = result["last_instruction"]
    assert isinstance(last, dict)
    assert (last["instruction_id"], last["execution_id"]) == (
        f"INS-{turn_id}-1",
        f"EXE-{turn_id}",
    )
    assert statuses == ["succeeded"]


async def test_an_answer_without_evidence_bytes_keeps_only_their_hash(world: World) -> None:
    """An answer that sends only its evidence hash: the result has the hash and the answer,
    and no stored evidence."""
    _, turn_id = await accepted_before_restart(world)
    async with running(world, Reader()) as stack:
        done = await stack.settled(turn_id)
    result = result_of(done)
    assert result["evidence_hash"] == hashlib.sha256(b"page").hexdigest()
    assert result["response_type"] == "SUCCESS"
    assert "evidence" not in result
