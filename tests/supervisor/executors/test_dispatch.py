"""Dispatch (``supervisor.executors.dispatch``): least-loaded choice, bounded queue waits,
hand-over to an arriving executor, and the queues alone (no sockets).

Admission backpressure through the hub is in test_hub.py (named there by
``docs/requirements-coverage.md``)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from sandbox.policy.faults import ExecutionFaultType
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.hub import AttemptReport, HubReason, QueueFullError
from tests.supervisor.executors.harness import fault_type_of, instruction, running_hub


async def test_least_loaded_executor_gets_the_next_instruction(socket_dir: Path) -> None:
    """Concurrent attempts spread over executors with free slots."""
    async with running_hub(socket_dir) as h:
        await h.spawn("lb-1", "slow", extra=("--delay-ms", "300"))
        await h.spawn("lb-2", "slow", extra=("--delay-ms", "300"))
        reports: list[AttemptReport] = []

        async def one() -> None:
            reports.append(await h.hub.run_attempt(instruction()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
    assert sorted(r.executor_id or "" for r in reports) == ["lb-1", "lb-2"]
    assert all(r.outcome.kind is OutcomeKind.SUCCESS for r in reports)


async def test_queue_wait_is_bounded_without_executors(socket_dir: Path) -> None:
    """With no executor for the command, the attempt waits queue_wait_s, then ends NO_EXECUTOR
    (reason NO_CAPABLE_EXECUTOR), not as an executor TIMEOUT."""
    async with running_hub(socket_dir, queue_wait_s=0.2) as h:
        report = await h.hub.run_attempt(instruction("SCROLL"))
    assert report.outcome.kind is OutcomeKind.NO_EXECUTOR
    assert fault_type_of(report) is None
    assert report.safety_reason_code == "NO_CAPABLE_EXECUTOR"
    assert report.detail == (
        "no executor supporting SCROLL was connected; the attempt waited"
        f" queued_ms={report.queued_ms} (limit executors.queue_wait_s=0.2s)"
    )
    assert report.queued_ms >= 200


async def test_queue_wait_is_bounded_by_the_instructions_timeout(socket_dir: Path) -> None:
    """A 100 ms instruction waits for a slot 100 ms, not the configured 30 s."""
    async with running_hub(socket_dir, queue_wait_s=30.0) as h:
        with anyio.fail_after(10):
            report = await h.hub.run_attempt(instruction("SCROLL", timeout_ms=100))
    assert report.outcome.kind is OutcomeKind.NO_EXECUTOR
    assert report.detail == (
        "no executor supporting SCROLL was connected; the attempt waited"
        f" queued_ms={report.queued_ms} (limit 0.1s: the instruction's timeout_ms, below"
        " executors.queue_wait_s=30s)"
    )
    assert 100 <= report.queued_ms < 10_000


async def test_busy_executor_wait_is_bounded_by_the_timeout(socket_dir: Path) -> None:
    """With a capable executor whose slot is taken, a 200 ms instruction waits 200 ms for it and
    ends TIMEOUT (QUEUE_WAIT_EXPIRED): someone serves it, it was only busy."""
    async with running_hub(socket_dir, queue_wait_s=30.0) as h:
        await h.spawn("busy-1", "hang")
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.hub.run_attempt, instruction(timeout_ms=20_000))
            await h.hub.wait_for_executor("busy-1", status=ExecutorStatus.BUSY)
            with anyio.fail_after(10):
                report = await h.hub.run_attempt(instruction(timeout_ms=200))
            tg.cancel_scope.cancel()
    assert fault_type_of(report) is ExecutionFaultType.TIMEOUT
    assert report.safety_reason_code == HubReason.QUEUE_WAIT_EXPIRED
    assert f"waited queued_ms={report.queued_ms} (limit 0.2s: the instruction's" in report.detail


async def test_a_shorter_queue_wait_for_one_attempt(socket_dir: Path) -> None:
    """A caller that already waited (a parked turn) asks for the rest of the queue wait only,
    and says how long it waited: the report's queued_ms (and its detail) is the whole wait,
    and the report still names the configured limit."""
    async with running_hub(socket_dir, queue_wait_s=5.0) as h:
        with anyio.fail_after(2):
            report = await h.hub.run_attempt(
                instruction("SCROLL"), queue_wait_s=0.05, queued_before_ms=4_000
            )
    assert report.outcome.kind is OutcomeKind.NO_EXECUTOR
    assert report.detail == (
        "no executor supporting SCROLL was connected; the attempt waited"
        f" queued_ms={report.queued_ms} (limit executors.queue_wait_s=5s)"
    )
    assert 4_050 <= report.queued_ms < 6_000
    assert report.duration_ms >= report.queued_ms


async def test_queued_attempt_runs_when_an_executor_arrives(socket_dir: Path) -> None:
    """An attempt waiting in the queue is dispatched as soon as a capable executor connects."""
    async with running_hub(socket_dir) as h:
        reports: list[AttemptReport] = []

        async def waiting() -> None:
            reports.append(await h.hub.run_attempt(instruction("EXTRACT")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            await anyio.wait_all_tasks_blocked()
            assert h.hub.statistics().queued_by_command == {"EXTRACT": 1}
            await h.spawn("late-1", "ok", wait=False)
    assert reports[0].outcome.kind is OutcomeKind.SUCCESS
    assert reports[0].queued_ms > 0


# --------------------------------------------------------------------------- queues alone


async def test_wait_without_executors_gives_up_after_wait_s() -> None:
    """With no executor for the command, ``wait`` returns ``None`` and leaves the queue empty."""
    dispatcher = Dispatcher(notify=lambda: None)
    assert dispatcher.pick(ExecutorCommandType.READ, "ins-1") is None
    with anyio.fail_after(5):
        assert await dispatcher.wait(ExecutorCommandType.READ, "ins-1", 0.05) is None
    assert dispatcher.queued_by_command() == {}
    detail = dispatcher.timeout_detail(
        ExecutorCommandType.READ, queued_ms=51, limit_s=0.05, configured_s=0.05
    )
    assert detail == (
        "no executor supporting READ was connected; the attempt waited queued_ms=51"
        " (limit executors.queue_wait_s=0.05s)"
    )


async def test_admit_hint_follows_attempt_durations_and_close_empties_queues() -> None:
    """The retry hint is the attempt time per waiter over capacity; close() ends the waits."""
    dispatcher = Dispatcher(notify=lambda: None)
    results: list[object] = []

    async def one(n: int) -> None:
        results.append(await dispatcher.wait(ExecutorCommandType.SCROLL, f"ins-{n}", 30.0))

    async with anyio.create_task_group() as tg:
        for n in range(2):
            tg.start_soon(one, n)
        await anyio.wait_all_tasks_blocked()
        assert dispatcher.queued_by_command() == {"SCROLL": 2}
        with pytest.raises(QueueFullError) as first:
            dispatcher.admit(ExecutorCommandType.SCROLL, 2, per_attempt_s=1.0)
        with pytest.raises(QueueFullError) as second:
            dispatcher.admit(ExecutorCommandType.SCROLL, 1, per_attempt_s=0.6)
        with pytest.raises(QueueFullError) as third:
            dispatcher.admit(ExecutorCommandType.SCROLL, 2, per_attempt_s=0.01)
        dispatcher.admit(ExecutorCommandType.SCROLL, 3, per_attempt_s=1.0)
        dispatcher.admit(ExecutorCommandType.READ, 1, per_attempt_s=1.0)
        dispatcher.close()
    assert first.value.retry_after_ms == 1000  # one waiter over capacity, no executor
    assert second.value.retry_after_ms == 1200  # 0.6 s x 2 waiters over capacity
    assert third.value.retry_after_ms == 100  # never below 100 ms
    assert results == [None, None]
    assert dispatcher.queued_by_command() == {}
