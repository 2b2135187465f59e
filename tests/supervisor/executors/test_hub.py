"""The executor hub, end to end through its front (``ExecutorHub``) and real executor processes.

Here: attempts from success to crash and retry, the hub's lifecycle (restart, drain, close) and
statistics, and the cases ``docs/requirements-coverage.md`` names by this file's path (bad
frames, hello rejects, heartbeats, deadlines, quarantine, backpressure; move them only together
with that document). The rest, module by module: test_connection, test_judge, test_dispatch,
test_reception, test_quarantine; the shared harness is harness.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorStatus
from sandbox.policy.faults import ExecutionFaultType
from supervisor.executors.hub import (
    AttemptReport,
    ExecutorHub,
    HubReason,
    QueueFullError,
    open_executor_listener,
)
from supervisor.sdk import sha256_hex
from supervisor.wire.executor import RejectReason
from tests.supervisor.executors.harness import (
    SPAWN_TIMEOUT_S,
    RecordingLog,
    fault_type_of,
    hello_answer,
    hello_frame,
    hub_settings,
    instruction,
    running_hub,
)


async def test_success_through_a_real_executor_process(socket_dir: Path) -> None:
    """A SUCCESS answer passes the safety rules and carries the executor's evidence hash."""
    async with running_hub(socket_dir) as h:
        await h.spawn("ok-1", "ok")
        env = instruction()
        report = await h.hub.run_attempt(env)
    assert report.outcome.kind is OutcomeKind.SUCCESS
    assert report.executor_id == "ok-1"
    assert report.safety_reason_code == rc.RESPONSE_ACCEPTED
    assert report.response is not None
    assert report.response.evidence_hash == sha256_hex(f"chaos:{env.instruction_id}")
    assert h.log.find("executor_connected", executor_id="ok-1")


async def test_fail_twice_then_succeed_on_the_same_executor(socket_dir: Path) -> None:
    """A behaviour sequence error,error,ok gives CRASH, CRASH, SUCCESS (retry tests)."""
    async with running_hub(socket_dir) as h:
        await h.spawn("flaky-1", "error,error,ok")
        reports = [await h.hub.run_attempt(instruction(instruction_id="same-1")) for _ in range(3)]
    assert [fault_type_of(r) for r in reports[:2]] == [ExecutionFaultType.CRASH] * 2
    assert reports[2].outcome.kind is OutcomeKind.SUCCESS


async def test_crash_mid_instruction_then_retry_goes_to_another_executor(socket_dir: Path) -> None:
    """An executor that exits mid-instruction is a CRASH; the next attempt runs elsewhere."""
    async with running_hub(socket_dir) as h:
        await h.spawn("crashy", "crash")
        first = await h.hub.run_attempt(instruction(instruction_id="retry-me"))
        await h.spawn("steady", "ok")
        second = await h.hub.run_attempt(instruction(instruction_id="retry-me"))
        info = h.hub.executor("crashy")
    assert fault_type_of(first) is ExecutionFaultType.CRASH
    assert first.safety_reason_code == HubReason.EXECUTOR_DISCONNECTED
    assert first.executor_id == "crashy"
    assert second.outcome.kind is OutcomeKind.SUCCESS
    assert second.executor_id == "steady"
    assert info is not None
    assert info.status is ExecutorStatus.OFFLINE


async def test_timeout_sends_cancel_and_drops_the_late_response(socket_dir: Path) -> None:
    """No answer by timeout_ms: TIMEOUT, a cancel is sent, the late answer is dropped and logged."""
    async with running_hub(socket_dir) as h:
        await h.spawn("slow-1", "slow", extra=("--delay-ms", "700"))
        env = instruction(timeout_ms=200)
        report = await h.hub.run_attempt(env)
        late = h.log.find("late_response_dropped", instruction_id=env.instruction_id)
        status = h.hub.executor("slow-1")
    assert fault_type_of(report) is ExecutionFaultType.TIMEOUT
    assert report.safety_reason_code == HubReason.DEADLINE_EXCEEDED
    assert report.response is None
    assert report.duration_ms >= 200
    assert h.log.find("attempt_timed_out", instruction_id=env.instruction_id)
    assert h.log.find("cancel_sent", instruction_id=env.instruction_id, executor_id="slow-1")
    assert late == [
        {
            "executor_id": "slow-1",
            "instruction_id": env.instruction_id,
            "execution_id": env.execution_id,
            "after_cancel": True,
        }
    ]
    assert status is not None
    assert status.status is ExecutorStatus.READY


@pytest.mark.parametrize(
    ("behaviour", "fault", "reason"),
    [
        ("garbage", ExecutionFaultType.INVALID_RESPONSE, HubReason.FRAME_ERROR),
        ("oversized", ExecutionFaultType.INVALID_RESPONSE, HubReason.FRAME_ERROR),
        ("truncated", ExecutionFaultType.CRASH, HubReason.EXECUTOR_DISCONNECTED),
    ],
)
async def test_bad_frame_closes_only_that_connection(
    socket_dir: Path, behaviour: str, fault: ExecutionFaultType, reason: str
) -> None:
    """A garbage/oversized/truncated frame closes that connection with a logged reason only."""
    async with running_hub(socket_dir, max_frame_bytes=64 * 1024) as h:
        await h.spawn("bad-1", behaviour, commands="READ")
        await h.spawn("good-1", "ok", commands="NAVIGATE")
        bad = await h.hub.run_attempt(instruction("READ"))
        good = await h.hub.run_attempt(instruction("NAVIGATE"))
        frame_errors = h.log.find("frame_error", executor_id="bad-1")
        gone = await h.hub.wait_for_executor("bad-1", status=ExecutorStatus.OFFLINE)
    assert fault_type_of(bad) is fault
    assert bad.safety_reason_code == reason
    assert len(frame_errors) == 1
    assert frame_errors[0]["reason"]
    assert gone.status is ExecutorStatus.OFFLINE
    assert good.outcome.kind is OutcomeKind.SUCCESS


async def test_oversized_frame_error_names_the_limit(socket_dir: Path) -> None:
    """The frame_error event of an oversized frame says which limit was exceeded."""
    async with running_hub(socket_dir, max_frame_bytes=4096) as h:
        await h.spawn("big-1", "oversized")
        await h.hub.run_attempt(instruction())
        event = await h.log.wait_for("frame_error", executor_id="big-1")
    assert event["error"] == "FrameTooLarge"
    assert event["reason"] == "frame of 4097 bytes exceeds the 4096-byte limit"


async def test_authority_claim_quarantines_the_executor(socket_dir: Path) -> None:
    """A response claiming authority → SECURITY_VIOLATION, disconnect, refused on reconnect."""
    async with running_hub(socket_dir, quarantine_s=60.0) as h:
        await h.spawn("liar-1", "authority")
        env = instruction()
        report = await h.hub.run_attempt(env)
        quarantined = await h.log.wait_for("executor_quarantined", executor_id="liar-1")
        # The SDK reconnects on its own; the hub refuses it for the cool-down.
        refused = await h.log.wait_for(
            "executor_rejected", executor_id="liar-1", reason_code=RejectReason.QUARANTINED
        )
        info = h.hub.executor("liar-1")
        answer = await hello_answer(h.socket, hello_frame("liar-1"))
        stats = h.hub.statistics()
    assert fault_type_of(report) is ExecutionFaultType.SECURITY_VIOLATION
    assert report.safety_reason_code == rc.RESPONSE_CLAIMS_AUTHORITY
    assert quarantined["instruction_id"] == env.instruction_id
    assert "quarantined" in refused["reason"]
    assert info is not None
    assert info.status is ExecutorStatus.OFFLINE
    assert info.quarantined_until_us is not None
    assert answer["type"] == "reject"
    assert answer["reason_code"] == "QUARANTINED"
    assert 0 < answer["retry_after_ms"] <= 60_000
    assert stats.quarantined == 1


async def test_wrong_uid_is_refused(socket_dir: Path) -> None:
    """A peer whose SO_PEERCRED uid is not allowed is rejected before its hello is read."""
    if os.getuid() != 0:
        pytest.skip("needs root to run the executor as another uid")
    await anyio.Path(socket_dir).chmod(0o755)
    async with running_hub(socket_dir, mode=0o666, allowed_uids=frozenset({0})) as h:
        process = await h.spawn("nobody-1", "ok", user=65534, wait=False)
        with anyio.fail_after(SPAWN_TIMEOUT_S):
            code = await process.wait()
        event = await h.log.wait_for("executor_rejected", reason_code="UID_NOT_ALLOWED")
        err = (socket_dir / "nobody-1.stderr").read_text()
        listed = h.hub.list_executors()
    assert code == 3  # the SDK treats UID_NOT_ALLOWED as permanent
    assert event["uid"] == 65534
    assert "UID_NOT_ALLOWED: uid 65534 is not allowed" in err
    assert listed == []


async def test_unknown_protocol_version_is_rejected(socket_dir: Path) -> None:
    """hello with an unknown protocol version → reject UNSUPPORTED_VERSION naming it."""
    async with running_hub(socket_dir) as h:
        answer = await hello_answer(h.socket, hello_frame("v99", protocol_version=99))
    assert answer["type"] == "reject"
    assert answer["reason_code"] == "UNSUPPORTED_VERSION"
    assert answer["reason"] == "protocol version 99 is not supported (supported: 1)"
    assert answer["supported_versions"] == [1]


async def test_duplicate_executor_id_is_rejected(socket_dir: Path) -> None:
    """A second connection with a connected executor's id → reject DUPLICATE_EXECUTOR_ID."""
    async with running_hub(socket_dir) as h:
        await h.spawn("dup-1", "ok")
        answer = await hello_answer(h.socket, hello_frame("dup-1"))
        still = h.hub.executor("dup-1")
    assert answer["reason_code"] == "DUPLICATE_EXECUTOR_ID"
    assert answer["reason"] == "an executor with id dup-1 is already connected"
    assert still is not None
    assert still.status is ExecutorStatus.READY


async def test_heartbeat_loss_marks_offline_and_in_flight_crash(socket_dir: Path) -> None:
    """A frozen executor (SIGSTOP) misses heartbeats: OFFLINE, its in-flight attempt CRASH."""
    async with running_hub(socket_dir, heartbeat_interval_s=0.2, heartbeat_misses=3) as h:
        process = await h.spawn("frozen-1", "hang")
        reports: list[AttemptReport] = []

        async def one() -> None:
            reports.append(await h.hub.run_attempt(instruction(timeout_ms=30_000)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            await h.hub.wait_for_executor("frozen-1", status=ExecutorStatus.BUSY)
            process.send_signal(signal.SIGSTOP)
        missed = h.log.find("heartbeat_missed", executor_id="frozen-1")
        info = h.hub.executor("frozen-1")
    assert fault_type_of(reports[0]) is ExecutionFaultType.CRASH
    assert reports[0].safety_reason_code == HubReason.HEARTBEAT_LOST
    assert reports[0].duration_ms < 5000
    assert len(missed) == 1
    assert info is not None
    assert info.status is ExecutorStatus.OFFLINE


async def test_sdk_reconnects_after_the_daemon_restarts(socket_dir: Path) -> None:
    """After the hub and its socket go away and come back, the executor reconnects by itself."""
    path = socket_dir / "ex.sock"
    log = RecordingLog()
    err = (socket_dir / "phoenix.stderr").open("wb")
    argv = [sys.executable, "-m", "supervisor.examples.chaos_executor"]
    argv += ["--socket", str(path), "--id", "phoenix", "--behaviour", "ok"]
    process = None
    try:
        for _ in range(2):
            hub = ExecutorHub(settings=hub_settings(), log=log)
            listener = await open_executor_listener(path)
            async with anyio.create_task_group() as tg:
                await tg.start(hub.serve, listener)
                if process is None:
                    process = await anyio.open_process(
                        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
                    )
                with anyio.fail_after(SPAWN_TIMEOUT_S):
                    await hub.wait_for_executor("phoenix")
                report = await hub.run_attempt(instruction())
                assert report.outcome.kind is OutcomeKind.SUCCESS
                await hub.aclose()
                await listener.aclose()
            path.unlink()
        assert len(log.find("executor_connected", executor_id="phoenix")) == 2
    finally:
        if process is not None:
            process.kill()
            await process.wait()
            await process.aclose()
        err.close()


async def test_admit_raises_queue_full_with_retry_hint(socket_dir: Path) -> None:
    """When a command's queue is at capacity, admit raises QueueFullError with retry_after_ms."""
    async with running_hub(socket_dir, queue_capacity=2, queue_wait_s=30.0) as h:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(h.hub.run_attempt, instruction("SCROLL"))
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(
                QueueFullError, match=r"^the SCROLL queue is full \(2 waiting\)"
            ) as info:
                h.hub.admit(ExecutorCommandType.SCROLL)
            h.hub.admit(ExecutorCommandType.READ)  # other command types are unaffected
            stats = h.hub.statistics()
            tg.cancel_scope.cancel()
        after = h.hub.statistics()
    assert info.value.capacity == 2
    assert info.value.command_type is ExecutorCommandType.SCROLL
    assert info.value.retry_after_ms >= 100
    assert stats.queued_by_command == {"SCROLL": 2}
    assert after.queued_by_command == {}


async def test_statistics_count_outcomes(socket_dir: Path) -> None:
    """statistics() counts attempts and outcomes by kind or fault type."""
    async with running_hub(socket_dir) as h:
        await h.spawn("stats-1", "ok,failure")
        await h.hub.run_attempt(instruction())
        await h.hub.run_attempt(instruction())
        stats = h.hub.statistics()
        listed = h.hub.list_executors()
    assert stats.attempts_started == stats.attempts_finished == 2
    assert stats.outcomes == {"SUCCESS": 1, "FAILURE": 1}
    assert stats.executors_by_status == {"READY": 1}
    assert [i.executor_id for i in listed] == ["stats-1"]
    assert listed[0].commands[0] is ExecutorCommandType.NAVIGATE
    assert listed[0].pid is not None


async def test_drain_waits_for_running_attempts(socket_dir: Path) -> None:
    """drain() returns once the attempts that were running have finished."""
    async with running_hub(socket_dir) as h:
        await h.spawn("drain-1", "slow", extra=("--delay-ms", "200"))
        reports: list[AttemptReport] = []

        async def one() -> None:
            reports.append(await h.hub.run_attempt(instruction()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            await h.hub.wait_for_executor("drain-1", status=ExecutorStatus.BUSY)
            await h.hub.drain()
            assert len(reports) == 1
    assert reports[0].outcome.kind is OutcomeKind.SUCCESS


async def test_closed_hub_ends_waiting_attempts_as_crash(socket_dir: Path) -> None:
    """aclose() ends queued attempts (HUB_CLOSED, CRASH) and refuses new ones."""
    async with running_hub(socket_dir) as h:
        reports: list[AttemptReport] = []

        async def one() -> None:
            reports.append(await h.hub.run_attempt(instruction("SCREENSHOT")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            await anyio.wait_all_tasks_blocked()
            await h.hub.aclose()
        after = await h.hub.run_attempt(instruction("SCREENSHOT"))
    assert [fault_type_of(r) for r in (*reports, after)] == [ExecutionFaultType.CRASH] * 2
    assert {r.safety_reason_code for r in (*reports, after)} == {HubReason.HUB_CLOSED}


@pytest.mark.parametrize("behaviour", ["oversized", "garbage"])
async def test_an_attempt_never_goes_to_a_connection_that_is_ending(
    socket_dir: Path, behaviour: str
) -> None:
    """The next attempt, started the moment a bad answer ended the one before, is not sent to
    the connection that bad answer is closing (it would end CRASH when the connection closes):
    it waits for an executor that can take it, and gets that executor's answer."""
    async with running_hub(socket_dir, max_frame_bytes=64 * 1024) as h:
        await h.spawn("bad-1", behaviour, commands="READ")

        async def replacement() -> None:
            await h.log.wait_for("executor_disconnected", executor_id="bad-1")
            await h.spawn("good-1", "ok", commands="READ", wait=False)

        async with anyio.create_task_group() as tg:
            tg.start_soon(replacement)
            first = await h.hub.run_attempt(instruction("READ", timeout_ms=20_000))
            second = await h.hub.run_attempt(instruction("READ", timeout_ms=20_000))
    assert (fault_type_of(first), first.safety_reason_code) == (
        ExecutionFaultType.INVALID_RESPONSE,
        HubReason.FRAME_ERROR,
    )
    # Sent to a connection that can answer it: bad-1 again (its SDK reconnected; it breaks the
    # frame again: its own INVALID_RESPONSE) or good-1; never CRASH for a connection it never
    # got an answer from.
    answered = (fault_type_of(second), second.safety_reason_code)
    assert answered in {
        (ExecutionFaultType.INVALID_RESPONSE, HubReason.FRAME_ERROR),
        (None, rc.RESPONSE_ACCEPTED),
    }, (answered, second.executor_id)
