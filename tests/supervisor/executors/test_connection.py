"""One executor connection (``supervisor.executors.connection``): cancels the executor
hangs on or ignores, and responses it cannot attribute, through real executor processes.

Deadlines, bad frames and heartbeat loss are in test_hub.py (named there by
``docs/requirements-coverage.md``)."""

from __future__ import annotations

from pathlib import Path

import anyio

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorStatus
from sandbox.policy.faults import ExecutionFaultType
from supervisor.executors.hub import AttemptReport, HubReason
from tests.supervisor.executors.harness import fault_type_of, instruction, running_hub


async def test_hanging_handler_is_cancelled_by_the_sdk(socket_dir: Path) -> None:
    """A hang that honours cancel: TIMEOUT, the executor answers the cancel and stays READY."""
    async with running_hub(socket_dir) as h:
        await h.spawn("hang-1", "hang,ok")
        report = await h.hub.run_attempt(instruction(timeout_ms=150))
        follow_up = await h.hub.run_attempt(instruction())
    assert fault_type_of(report) is ExecutionFaultType.TIMEOUT
    assert report.duration_ms < 2000  # the cancel was answered well within cancel_grace_s
    assert follow_up.outcome.kind is OutcomeKind.SUCCESS


async def test_executor_ignoring_cancel_is_marked_error(socket_dir: Path) -> None:
    """An executor that does not answer a cancel within cancel_grace_s becomes ERROR."""
    async with running_hub(socket_dir, cancel_grace_s=0.3, queue_wait_s=0.3) as h:
        await h.spawn("deaf-1", "hang-ignore-cancel")
        report = await h.hub.run_attempt(instruction(timeout_ms=150))
        info = h.hub.executor("deaf-1")
        next_report = await h.hub.run_attempt(instruction())
    assert fault_type_of(report) is ExecutionFaultType.TIMEOUT
    assert info is not None
    assert info.status is ExecutorStatus.ERROR
    assert "did not answer the cancel" in info.detail
    assert fault_type_of(next_report) is ExecutionFaultType.TIMEOUT
    assert next_report.safety_reason_code == HubReason.QUEUE_WAIT_EXPIRED
    assert next_report.executor_id is None


async def test_unattributable_response_with_several_in_flight(socket_dir: Path) -> None:
    """A wrong id while two instructions are in flight ends both INVALID_RESPONSE and closes."""
    async with running_hub(socket_dir) as h:
        await h.spawn("multi-1", "hang,wrong-id", slots=2)
        reports: list[AttemptReport] = []

        async def one() -> None:
            reports.append(await h.hub.run_attempt(instruction()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(one)
    assert [fault_type_of(r) for r in reports] == [ExecutionFaultType.INVALID_RESPONSE] * 2
    assert {r.safety_reason_code for r in reports} == {HubReason.UNATTRIBUTABLE_RESPONSE}
