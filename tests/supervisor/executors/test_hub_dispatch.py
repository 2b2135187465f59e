"""`ExecutorHub.dispatch`: attempts taken without a task (the turn core's hot path), against a
real hub and real SDK executors over a real Unix socket.

What a caller relies on: the report arrives through the callback, once; a deadline passed
ends the attempt TIMEOUT and the executor gets the ``cancel``; an abandoned attempt is
cancelled at the executor and never reported; nothing is sent (None) when the attempt cannot
go at once, so the caller can take the slower way; no task is started per attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorInstructionEnvelope, ExecutorStatus
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import instruction_to_wire
from supervisor.executors.hub import ExecutorHub
from supervisor.executors.reports import AttemptReport
from supervisor.sdk import Executor, Instruction, Result, run_executor
from tests.supervisor.executors.harness import instruction, running_hub


class Gated(Executor):
    """READ waits for ``gate`` (or a cancel), then succeeds; counts starts and cancels."""

    def __init__(self, *, slots: int = 8) -> None:
        super().__init__(executor_id="gated", slots=slots)
        self.gate = anyio.Event()
        self.started = 0
        self.cancelled = 0
        self.all_started = anyio.Event()
        self.expect = slots
        self.cancel_seen = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        self.started += 1
        if self.started >= self.expect:
            self.all_started.set()
        try:
            await self.gate.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            self.cancel_seen.set()
            raise
        return Result.success(b"page", output={"id": instruction.instruction_id})


class Reports:
    """The callback side: every report by instruction id, and an event per expected count."""

    def __init__(self, expect: int) -> None:
        self.by_id: dict[str, list[AttemptReport]] = {}
        self.expect = expect
        self.all_in = anyio.Event()

    def done_for(self, iid: str) -> Any:
        def done(report: AttemptReport) -> None:
            self.by_id.setdefault(iid, []).append(report)
            if sum(len(v) for v in self.by_id.values()) >= self.expect:
                self.all_in.set()

        return done


async def _ready(hub: ExecutorHub) -> None:
    """The executor is connected and its connection's tasks run (a connection takes an
    attempt without a task only once its writer runs)."""
    await hub.wait_for_executor("gated")
    await anyio.wait_all_tasks_blocked()


def _dispatch(hub: ExecutorHub, envelope: ExecutorInstructionEnvelope, reports: Reports) -> object:
    return hub.dispatch(
        envelope,
        instruction_to_wire(envelope),
        traceparent=None,
        labels={"turn_id": 1},
        done=reports.done_for(envelope.instruction_id),
    )


async def test_attempts_run_without_a_task_each_and_report_once(socket_dir: Path) -> None:
    """Eight attempts in flight start no task; each is reported once, SUCCESS."""
    executor = Gated(slots=8)
    reports = Reports(expect=8)
    async with running_hub(socket_dir) as harness, anyio.create_task_group() as tg:
        hub, socket_path = harness.hub, harness.socket
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await _ready(hub)
        before = len(anyio.get_running_tasks())
        handles = [_dispatch(hub, instruction(), reports) for _ in range(8)]
        assert all(h is not None for h in handles)
        with anyio.fail_after(10):
            await executor.all_started.wait()
        # eight attempts in flight and no task more: the hub started none for them (the SDK
        # runs its handlers on the workers it started when it connected)
        assert len(anyio.get_running_tasks()) == before
        executor.gate.set()
        with anyio.fail_after(10):
            await reports.all_in.wait()
        stats = hub.statistics()
        tg.cancel_scope.cancel()
    assert len(reports.by_id) == 8
    assert all(len(v) == 1 for v in reports.by_id.values())
    assert {v[0].outcome.kind for v in reports.by_id.values()} == {OutcomeKind.SUCCESS}
    assert {v[0].executor_id for v in reports.by_id.values()} == {"gated"}
    assert (stats.attempts_started, stats.attempts_finished) == (8, 8)


async def test_a_deadline_ends_the_attempt_timeout_and_cancels_it(socket_dir: Path) -> None:
    """An attempt past its timeout_ms is reported TIMEOUT from the connection's timer, and the
    executor's handler is cancelled by the daemon's cancel frame."""
    executor = Gated(slots=1)
    reports = Reports(expect=1)
    async with (
        running_hub(socket_dir, cancel_grace_s=5.0) as harness,
        anyio.create_task_group() as tg,
    ):
        hub, socket_path = harness.hub, harness.socket
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await _ready(hub)
        envelope = instruction(timeout_ms=150)
        assert _dispatch(hub, envelope, reports) is not None
        with anyio.fail_after(10):
            await reports.all_in.wait()
            await executor.cancel_seen.wait()
        with anyio.fail_after(10):  # the executor answers the cancel: its slot is free again
            await hub.wait_for_executor("gated", status=ExecutorStatus.READY)
        late = hub.statistics().late_responses
        tg.cancel_scope.cancel()
    (report,) = reports.by_id[envelope.instruction_id]
    assert report.outcome.fault_type is ExecutionFaultType.TIMEOUT
    assert 100 <= report.duration_ms < 3_000
    assert executor.cancelled == 1
    assert late == 1  # the TIMEOUT answer to the cancel, dropped as late


async def test_an_abandoned_attempt_is_cancelled_and_never_reported(socket_dir: Path) -> None:
    """Abandoning an attempt in flight (its turn was cancelled) sends the cancel; no report."""
    executor = Gated(slots=1)
    executor.expect = 1
    reports = Reports(expect=1)
    async with (
        running_hub(socket_dir, cancel_grace_s=5.0) as harness,
        anyio.create_task_group() as tg,
    ):
        hub, socket_path = harness.hub, harness.socket
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await _ready(hub)
        envelope = instruction()
        handle = _dispatch(hub, envelope, reports)
        assert handle is not None
        with anyio.fail_after(10):
            await executor.all_started.wait()
        hub.abandon(handle)
        hub.abandon(handle)  # twice is harmless
        with anyio.fail_after(10):
            await executor.cancel_seen.wait()
        with anyio.fail_after(10):  # the slot comes back with the cancel's answer
            await hub.wait_for_executor("gated", status=ExecutorStatus.READY)
        tg.cancel_scope.cancel()
    assert reports.by_id == {}


async def test_nothing_is_sent_when_the_attempt_cannot_go_at_once(socket_dir: Path) -> None:
    """No executor, or every slot taken: dispatch returns None and sends nothing (the caller
    queues the attempt the slower way)."""
    executor = Gated(slots=1)
    executor.expect = 1
    reports = Reports(expect=99)
    async with running_hub(socket_dir) as harness, anyio.create_task_group() as tg:
        hub, socket_path = harness.hub, harness.socket
        assert _dispatch(hub, instruction(), reports) is None  # nobody connected
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await _ready(hub)
        assert _dispatch(hub, instruction(), reports) is not None
        assert _dispatch(hub, instruction(), reports) is None  # its one slot is taken
        with anyio.fail_after(10):
            await executor.all_started.wait()
        stats = hub.statistics()
        executor.gate.set()
        tg.cancel_scope.cancel()
    assert executor.started == 1
    assert stats.attempts_started == 1
