"""End-to-end tests of the executor hub: real Unix sockets, real executor processes.

Executors are SDK-based processes (``python -m supervisor.examples.chaos_executor``) spawned
with ``anyio.open_process``; a few protocol cases use a raw socket client to send exactly the
bytes under test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import pytest

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorStatus,
)
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import build_executor_instruction
from supervisor.executors.hub import (
    AttemptReport,
    ExecutorHub,
    HubReason,
    HubSettings,
    QueueFullError,
    open_executor_listener,
)
from supervisor.sdk import sha256_hex
from supervisor.wire.executor import PROTOCOL_VERSION, RejectReason
from supervisor.wire.frames import FrameReader, decode_body, encode_frame

SPAWN_TIMEOUT_S = 20.0


class RecordingLog:
    """A structlog-shaped logger that records events and lets tests wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self._changed = anyio.Event()

    def _record(self, level: str, event: str, **kw: Any) -> None:
        self.events.append((level, event, kw))
        self._changed.set()
        self._changed = anyio.Event()

    def debug(self, event: str, **kw: Any) -> None:
        self._record("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._record("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._record("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)

    def find(self, event: str, **match: object) -> list[dict[str, Any]]:
        return [
            kw
            for _, name, kw in self.events
            if name == event and all(kw.get(k) == v for k, v in match.items())
        ]

    async def wait_for(self, event: str, **match: object) -> dict[str, Any]:
        with anyio.fail_after(SPAWN_TIMEOUT_S):
            while not (found := self.find(event, **match)):
                await self._changed.wait()
        return found[0]


@dataclass
class Harness:
    hub: ExecutorHub
    log: RecordingLog
    socket: Path
    tg: anyio.abc.TaskGroup
    processes: list[anyio.abc.Process] = field(default_factory=list)
    stderr: list[IO[bytes]] = field(default_factory=list)

    async def spawn(
        self,
        executor_id: str,
        *behaviours: str,
        slots: int = 1,
        commands: str | None = None,
        extra: tuple[str, ...] = (),
        user: int | None = None,
        wait: bool = True,
    ) -> anyio.abc.Process:
        """Start a chaos executor process and (by default) wait until it is READY."""
        argv = [
            sys.executable,
            "-m",
            "supervisor.examples.chaos_executor",
            "--socket",
            str(self.socket),
            "--id",
            executor_id,
            "--slots",
            str(slots),
            *(arg for b in behaviours for arg in ("--behaviour", b)),
            *extra,
        ]
        if commands is not None:
            argv += ["--commands", commands]
        err = (self.socket.parent / f"{executor_id}.stderr").open("wb")
        self.stderr.append(err)
        if user is not None:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("setpriv (util-linux) is needed to run as another uid")
            argv = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        process = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
        )
        self.processes.append(process)
        if wait:
            with anyio.fail_after(SPAWN_TIMEOUT_S):
                await self.hub.wait_for_executor(executor_id)
        return process

    async def stop_processes(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
            await process.wait()
            await process.aclose()
        for err in self.stderr:
            err.close()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for sockets (AF_UNIX paths are limited to 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hh-exec-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _settings(**changes: Any) -> HubSettings:
    base: dict[str, Any] = {
        "heartbeat_interval_s": 5.0,
        "heartbeat_misses": 3,
        "queue_wait_s": 10.0,
        "quarantine_s": 300.0,
        "cancel_grace_s": 2.0,
        "hello_timeout_s": 5.0,
    }
    base.update(changes)
    return HubSettings(**base)


@asynccontextmanager
async def running_hub(
    socket_dir: Path, *, mode: int = 0o660, **changes: Any
) -> AsyncIterator[Harness]:
    """A hub serving on socket_dir/ex.sock inside a task group; everything stopped on exit."""
    log = RecordingLog()
    hub = ExecutorHub(settings=_settings(**changes), log=log)
    path = socket_dir / "ex.sock"
    listener = await open_executor_listener(path, mode=mode)
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, listener)
        harness = Harness(hub=hub, log=log, socket=path, tg=tg)
        try:
            yield harness
        finally:
            with anyio.CancelScope(shield=True):
                await hub.aclose()
                await harness.stop_processes()
                await listener.aclose()
            tg.cancel_scope.cancel()


_counter = iter(range(1, 1_000_000))


def instruction(
    command: str = "READ", *, timeout_ms: int = 5000, instruction_id: str | None = None
) -> ExecutorInstructionEnvelope:
    n = next(_counter)
    kwargs: dict[str, Any] = {}
    if command == "NAVIGATE":
        kwargs["target_url"] = "http://127.0.0.1:9/"
    elif command in {"READ", "CLICK", "EXTRACT"}:
        kwargs["target_selector"] = "#title"
    return build_executor_instruction(
        instruction_id=instruction_id or f"ins-{n}",
        execution_id=f"exe-{n}",
        command_type=command,
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=timeout_ms,
        **kwargs,
    )


def _fault(report: AttemptReport) -> ExecutionFaultType | None:
    return report.outcome.fault_type


async def _raw_client(path: Path) -> tuple[anyio.abc.SocketStream, FrameReader]:
    stream = await anyio.connect_unix(path)
    return stream, FrameReader(stream)


def _hello(executor_id: str, **changes: object) -> dict[str, object]:
    hello: dict[str, object] = {
        "type": "hello",
        "executor_id": executor_id,
        "protocol_version": PROTOCOL_VERSION,
        "commands": ["READ"],
        "slots": 1,
    }
    hello.update(changes)
    return hello


async def _hello_answer(path: Path, hello: Mapping[str, object]) -> dict[str, Any]:
    stream, reader = await _raw_client(path)
    async with stream:
        await stream.send(encode_frame(hello))
        with anyio.fail_after(5):
            return await reader.read()


# --------------------------------------------------------------------------- success paths


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


async def test_failure_answer_is_a_failure_outcome(socket_dir: Path) -> None:
    """FAILURE maps to a failure outcome (no exit code) with the executor's message."""
    async with running_hub(socket_dir) as h:
        await h.spawn("fail-1", "failure")
        report = await h.hub.run_attempt(instruction())
    assert report.outcome.kind is OutcomeKind.FAILURE
    assert report.outcome.exit_code is None
    assert report.outcome.message.startswith("chaos failure of ins-")


async def test_fail_twice_then_succeed_on_the_same_executor(socket_dir: Path) -> None:
    """A behaviour sequence error,error,ok gives CRASH, CRASH, SUCCESS (retry tests)."""
    async with running_hub(socket_dir) as h:
        await h.spawn("flaky-1", "error,error,ok")
        reports = [await h.hub.run_attempt(instruction(instruction_id="same-1")) for _ in range(3)]
    assert [_fault(r) for r in reports[:2]] == [ExecutionFaultType.CRASH] * 2
    assert reports[2].outcome.kind is OutcomeKind.SUCCESS


async def test_crash_mid_instruction_then_retry_goes_to_another_executor(socket_dir: Path) -> None:
    """An executor that exits mid-instruction is a CRASH; the next attempt runs elsewhere."""
    async with running_hub(socket_dir) as h:
        await h.spawn("crashy", "crash")
        first = await h.hub.run_attempt(instruction(instruction_id="retry-me"))
        await h.spawn("steady", "ok")
        second = await h.hub.run_attempt(instruction(instruction_id="retry-me"))
        info = h.hub.executor("crashy")
    assert _fault(first) is ExecutionFaultType.CRASH
    assert first.safety_reason_code == HubReason.EXECUTOR_DISCONNECTED
    assert first.executor_id == "crashy"
    assert second.outcome.kind is OutcomeKind.SUCCESS
    assert second.executor_id == "steady"
    assert info is not None
    assert info.status is ExecutorStatus.OFFLINE


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


# --------------------------------------------------------------------------- timeouts


async def test_timeout_sends_cancel_and_drops_the_late_response(socket_dir: Path) -> None:
    """No answer by timeout_ms: TIMEOUT, a cancel is sent, the late answer is dropped and logged."""
    async with running_hub(socket_dir) as h:
        await h.spawn("slow-1", "slow", extra=("--delay-ms", "700"))
        env = instruction(timeout_ms=200)
        report = await h.hub.run_attempt(env)
        late = h.log.find("late_response_dropped", instruction_id=env.instruction_id)
        status = h.hub.executor("slow-1")
    assert _fault(report) is ExecutionFaultType.TIMEOUT
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


async def test_hanging_handler_is_cancelled_by_the_sdk(socket_dir: Path) -> None:
    """A hang that honours cancel: TIMEOUT, the executor answers the cancel and stays READY."""
    async with running_hub(socket_dir) as h:
        await h.spawn("hang-1", "hang,ok")
        report = await h.hub.run_attempt(instruction(timeout_ms=150))
        follow_up = await h.hub.run_attempt(instruction())
    assert _fault(report) is ExecutionFaultType.TIMEOUT
    assert report.duration_ms < 2000  # the cancel was answered well within cancel_grace_s
    assert follow_up.outcome.kind is OutcomeKind.SUCCESS


async def test_executor_ignoring_cancel_is_marked_error(socket_dir: Path) -> None:
    """An executor that does not answer a cancel within cancel_grace_s becomes ERROR."""
    async with running_hub(socket_dir, cancel_grace_s=0.3, queue_wait_s=0.3) as h:
        await h.spawn("deaf-1", "hang-ignore-cancel")
        report = await h.hub.run_attempt(instruction(timeout_ms=150))
        info = h.hub.executor("deaf-1")
        next_report = await h.hub.run_attempt(instruction())
    assert _fault(report) is ExecutionFaultType.TIMEOUT
    assert info is not None
    assert info.status is ExecutorStatus.ERROR
    assert "did not answer the cancel" in info.detail
    assert _fault(next_report) is ExecutionFaultType.TIMEOUT
    assert next_report.safety_reason_code == HubReason.QUEUE_WAIT_EXPIRED
    assert next_report.executor_id is None


async def test_queue_wait_is_bounded_without_executors(socket_dir: Path) -> None:
    """With no executor for the command, the attempt ends TIMEOUT after queue_wait_s."""
    async with running_hub(socket_dir, queue_wait_s=0.2) as h:
        report = await h.hub.run_attempt(instruction("SCROLL"))
    assert _fault(report) is ExecutionFaultType.TIMEOUT
    assert report.safety_reason_code == HubReason.QUEUE_WAIT_EXPIRED
    assert report.detail == "no executor supporting SCROLL was connected within queue_wait_s=0.2s"
    assert report.queued_ms >= 200


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


# --------------------------------------------------------------------------- bad frames


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
    assert _fault(bad) is fault
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


async def test_garbage_before_hello_is_rejected(socket_dir: Path) -> None:
    """Undecodable bytes instead of a hello get the promised reject, then the close."""
    async with running_hub(socket_dir) as h:
        stream, _ = await _raw_client(h.socket)
        async with stream:
            await stream.send(struct.pack(">I", 3) + b"abc")
            received = b""
            with anyio.fail_after(5), contextlib.suppress(anyio.EndOfStream):
                while True:
                    received += await stream.receive()
        event = await h.log.wait_for("frame_error")
    assert event["executor_id"] is None
    assert event["error"] == "FrameDecodeError"
    reject = decode_body(received[4:])
    assert reject["type"] == "reject"
    assert reject["reason_code"] == "BAD_MESSAGE"
    assert "first frame must be a hello" in str(reject["reason"])


# --------------------------------------------------------------------------- responses


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [
        ("wrong-id", rc.RESPONSE_INSTRUCTION_ID_MISMATCH),
        ("missing-id", rc.RESPONSE_MISSING_INSTRUCTION_ID),
        ("no-evidence", rc.SUCCESS_WITHOUT_EVIDENCE),
        ("unknown-type", rc.RESPONSE_TYPE_UNKNOWN),
        ("malformed", rc.RESPONSE_UNKNOWN_FIELD),
    ],
)
async def test_invalid_responses_are_invalid_response(
    socket_dir: Path, behaviour: str, code: str
) -> None:
    """Wrong/missing id, SUCCESS without evidence, unknown type → INVALID_RESPONSE."""
    async with running_hub(socket_dir) as h:
        await h.spawn(f"{behaviour}-1", behaviour)
        env = instruction()
        report = await h.hub.run_attempt(env)
        rejected = h.log.find("response_rejected", instruction_id=env.instruction_id)
        info = h.hub.executor(f"{behaviour}-1")
    assert _fault(report) is ExecutionFaultType.INVALID_RESPONSE
    assert report.safety_reason_code == code
    assert report.response is None
    assert rejected[0]["reason_code"] == code
    assert info is not None
    assert info.status is ExecutorStatus.READY  # lying once is not a security matter


async def test_partial_output_is_partial(socket_dir: Path) -> None:
    """SUCCESS with partial=true → PARTIAL fault, response kept for the evidence."""
    async with running_hub(socket_dir) as h:
        await h.spawn("partial-1", "partial")
        report = await h.hub.run_attempt(instruction())
    assert _fault(report) is ExecutionFaultType.PARTIAL
    assert report.safety_reason_code == rc.RESPONSE_ACCEPTED_PARTIAL
    assert report.response is not None
    assert report.response.partial


async def test_refused_is_a_refused_outcome(socket_dir: Path) -> None:
    """REFUSED → the refused outcome (the policy terminates without retry)."""
    async with running_hub(socket_dir) as h:
        await h.spawn("no-1", "refuse")
        report = await h.hub.run_attempt(instruction())
    assert report.outcome.kind is OutcomeKind.REFUSED
    assert report.outcome.message.startswith("chaos refuses ins-")


async def test_executor_timeout_answer_is_timeout(socket_dir: Path) -> None:
    """An executor answering TIMEOUT itself (here: to a cancel) is a TIMEOUT outcome."""
    async with running_hub(socket_dir) as h:
        await h.spawn("t-1", "hang")
        report = await h.hub.run_attempt(instruction(timeout_ms=100))
    assert _fault(report) is ExecutionFaultType.TIMEOUT


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
    assert [_fault(r) for r in reports] == [ExecutionFaultType.INVALID_RESPONSE] * 2
    assert {r.safety_reason_code for r in reports} == {HubReason.UNATTRIBUTABLE_RESPONSE}


# --------------------------------------------------------------------------- security


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
        answer = await _hello_answer(h.socket, _hello("liar-1"))
        stats = h.hub.statistics()
    assert _fault(report) is ExecutionFaultType.SECURITY_VIOLATION
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
        answer = await _hello_answer(h.socket, _hello("v99", protocol_version=99))
    assert answer["type"] == "reject"
    assert answer["reason_code"] == "UNSUPPORTED_VERSION"
    assert answer["reason"] == "protocol version 99 is not supported (supported: 1)"
    assert answer["supported_versions"] == [1]


async def test_duplicate_executor_id_is_rejected(socket_dir: Path) -> None:
    """A second connection with a connected executor's id → reject DUPLICATE_EXECUTOR_ID."""
    async with running_hub(socket_dir) as h:
        await h.spawn("dup-1", "ok")
        answer = await _hello_answer(h.socket, _hello("dup-1"))
        still = h.hub.executor("dup-1")
    assert answer["reason_code"] == "DUPLICATE_EXECUTOR_ID"
    assert answer["reason"] == "an executor with id dup-1 is already connected"
    assert still is not None
    assert still.status is ExecutorStatus.READY


async def test_bad_hello_is_rejected_naming_the_field(socket_dir: Path) -> None:
    """A hello with an unknown command type → reject BAD_HELLO naming the field."""
    async with running_hub(socket_dir) as h:
        answer = await _hello_answer(h.socket, _hello("odd-1", commands=["TELEPORT"]))
    assert answer["reason_code"] == "BAD_HELLO"
    assert answer["reason"] == "field 'commands' names an unknown command type 'TELEPORT'"


async def test_silent_connection_gets_hello_timeout(socket_dir: Path) -> None:
    """A connection that never says hello is rejected after hello_timeout_s."""
    async with running_hub(socket_dir, hello_timeout_s=0.2) as h:
        stream, reader = await _raw_client(h.socket)
        async with stream:
            with anyio.fail_after(5):
                answer = await reader.read()
    assert answer["reason_code"] == "HELLO_TIMEOUT"


# --------------------------------------------------------------------------- liveness


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
    assert _fault(reports[0]) is ExecutionFaultType.CRASH
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
            hub = ExecutorHub(settings=_settings(), log=log)
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


# --------------------------------------------------------------------------- backpressure


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


# --------------------------------------------------------------------------- listener, drain


async def test_listener_socket_mode_and_stale_file(socket_dir: Path) -> None:
    """The socket is created 0660; a stale socket file is replaced, a live one is refused."""
    path = socket_dir / "ex.sock"
    listener = await open_executor_listener(path)
    try:
        assert (await anyio.Path(path).stat()).st_mode & 0o777 == 0o660
        with pytest.raises(OSError, match=r"is in use by a running daemon$"):
            await open_executor_listener(path)
    finally:
        await listener.aclose()
    # aclose leaves the file behind: a stale socket nobody accepts on
    assert await anyio.Path(path).exists()
    again = await open_executor_listener(path)
    await again.aclose()


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
    assert [_fault(r) for r in (*reports, after)] == [ExecutionFaultType.CRASH] * 2
    assert {r.safety_reason_code for r in (*reports, after)} == {HubReason.HUB_CLOSED}
