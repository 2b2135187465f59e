"""Tests of the executor SDK (supervisor.sdk) against a real hub over a real Unix socket."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from sandbox.policy.attempts import OutcomeKind
from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorResponseType,
    ExecutorStatus,
)
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import build_executor_instruction
from supervisor.executors.hub import ExecutorHub, HubSettings, open_executor_listener
from supervisor.sdk import (
    Backoff,
    Executor,
    ExecutorRejected,
    Instruction,
    NotSupported,
    Result,
    run_executor,
    sha256_hex,
)
from supervisor.wire.executor import PROTOCOL_VERSION, Status, Welcome
from supervisor.wire.frames import FrameReader, encode_frame


@pytest.fixture
def socket_path() -> Iterator[Path]:
    """A short socket path (AF_UNIX paths are limited to 108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="hh-sdk-"))
    try:
        yield directory / "ex.sock"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def hub_at(path: Path, **changes: Any) -> AsyncIterator[ExecutorHub]:
    hub = ExecutorHub(settings=HubSettings(**changes))
    listener = await open_executor_listener(path)
    async with anyio.create_task_group() as tg:
        await tg.start(hub.serve, listener)
        try:
            yield hub
        finally:
            with anyio.CancelScope(shield=True):
                await hub.aclose()
                await listener.aclose()
            tg.cancel_scope.cancel()


_ids = iter(range(1, 1_000_000))


def read_instruction(*, timeout_ms: int = 5000) -> ExecutorInstructionEnvelope:
    n = next(_ids)
    return build_executor_instruction(
        instruction_id=f"sdk-{n}",
        execution_id="exe-sdk",
        command_type="READ",
        target_selector="#x",
        timestamp="2026-01-01T00:00:00Z",
        timeout_ms=timeout_ms,
    )


class Reader(Executor):
    """READ answers SUCCESS; NAVIGATE is overridden but refuses."""

    def __init__(self, executor_id: str = "reader", **kw: Any) -> None:
        super().__init__(executor_id=executor_id, **kw)
        self.connected = anyio.Event()

    async def on_connected(self, welcome: Welcome) -> None:
        self.connected.set()

    async def read(self, instruction: Instruction) -> Result:
        return Result.success(f"read {instruction.target_selector}", output={"text": "hi"})

    async def navigate(self, instruction: Instruction) -> Result:
        raise NotSupported("no network here")


def test_commands_are_the_overridden_handlers() -> None:
    """hello advertises exactly the handlers a subclass overrides."""
    assert Reader().commands() == (ExecutorCommandType.NAVIGATE, ExecutorCommandType.READ)
    assert Executor(executor_id="bare").commands() == ()


def test_result_success_hashes_the_evidence() -> None:
    """Result.success puts sha256(evidence) in evidence_hash; to_wire has every field."""
    result = Result.success(b"page bytes", output={"n": 1})
    assert result.evidence_hash == sha256_hex(b"page bytes")
    wire = result.to_wire("i-1")
    assert wire["instruction_id"] == "i-1"
    assert wire["response_type"] == "SUCCESS"
    assert wire["output"] == {"n": 1}
    assert str(wire["timestamp"]).endswith("Z")
    assert Result.timeout("late").response_type is ExecutorResponseType.TIMEOUT


def test_backoff_grows_exponentially_and_caps() -> None:
    """Backoff doubles from initial_s up to max_s; jitter spreads by at most ±jitter."""
    backoff = Backoff(initial_s=0.1, multiplier=2, max_s=1.0, jitter=0.0)
    assert [backoff.delay(n) for n in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    jittered = Backoff(initial_s=1.0, max_s=1.0, jitter=0.5)
    assert jittered.delay(0, rand=lambda: 0.0) == 0.5
    assert jittered.delay(0, rand=lambda: 1.0) == 1.5


def test_backoff_rejects_nonsense() -> None:
    """A backoff whose cap is below its start is refused."""
    with pytest.raises(ValueError, match=r"^invalid backoff"):
        Backoff(initial_s=2.0, max_s=1.0)


async def test_success_and_not_supported(socket_path: Path) -> None:
    """A handler's Result reaches the hub; NotSupported becomes REFUSED."""
    executor = Reader()
    async with hub_at(socket_path) as hub, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await hub.wait_for_executor("reader")
        ok = await hub.run_attempt(read_instruction())
        refused = await hub.run_attempt(
            build_executor_instruction(
                instruction_id="nav-1",
                execution_id="exe",
                command_type="NAVIGATE",
                target_url="http://127.0.0.1/",
                timestamp="t",
                timeout_ms=1000,
            )
        )
        tg.cancel_scope.cancel()
    assert ok.outcome.kind is OutcomeKind.SUCCESS
    assert ok.response is not None
    assert ok.response.output == {"text": "hi"}
    assert refused.outcome.kind is OutcomeKind.REFUSED
    assert refused.outcome.message == "no network here"


class Broken(Executor):
    async def read(self, instruction: Instruction) -> Result:
        raise ValueError("boom")


async def test_handler_exception_is_an_error_answer(socket_path: Path) -> None:
    """A handler that raises answers ERROR (a CRASH fault) and the executor keeps serving."""
    async with hub_at(socket_path) as hub, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(Broken(executor_id="broken"), socket_path=socket_path))
        await hub.wait_for_executor("broken")
        first = await hub.run_attempt(read_instruction())
        second = await hub.run_attempt(read_instruction())
        tg.cancel_scope.cancel()
    assert first.outcome.fault_type is ExecutionFaultType.CRASH
    assert first.outcome.message == "ValueError: boom"
    assert second.outcome.fault_type is ExecutionFaultType.CRASH


class Sleeper(Executor):
    def __init__(self) -> None:
        super().__init__(executor_id="sleeper")
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def read(self, instruction: Instruction) -> Result:
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")  # pragma: no cover


async def test_cancel_frame_cancels_the_handler_scope(socket_path: Path) -> None:
    """The daemon's cancel cancels the running handler; the SDK answers TIMEOUT at once."""
    executor = Sleeper()
    async with hub_at(socket_path, cancel_grace_s=5.0) as hub, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await hub.wait_for_executor("sleeper")
        report = await hub.run_attempt(read_instruction(timeout_ms=100))
        stats = hub.statistics()
        info = hub.executor("sleeper")
        tg.cancel_scope.cancel()
    assert executor.started.is_set()
    assert executor.cancelled.is_set()
    assert report.outcome.fault_type is ExecutionFaultType.TIMEOUT
    assert report.duration_ms < 2000
    assert stats.late_responses == 1  # the TIMEOUT answer to the cancel
    assert info is not None
    assert info.status is ExecutorStatus.READY


async def test_permanent_reject_raises(socket_path: Path) -> None:
    """A reject that retrying cannot fix (uid not allowed) ends run_executor with the reason."""
    async with hub_at(socket_path, allowed_uids=frozenset({424242})):
        with pytest.raises(ExecutorRejected, match=r"^UID_NOT_ALLOWED: uid \d+ is not allowed"):
            await run_executor(Reader(), socket_path=socket_path)


async def test_no_reconnect_connect_failure_raises(socket_path: Path) -> None:
    """With reconnect=False a missing socket is an OSError."""
    with pytest.raises(FileNotFoundError):
        await run_executor(Reader(), socket_path=socket_path, reconnect=False)


class Stoppable(Reader):
    async def shutdown(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        return await super().shutdown(instruction)


async def test_shutdown_instruction_stops_the_executor(socket_path: Path) -> None:
    """SHUTDOWN answers SUCCESS with evidence, then run_executor returns."""
    executor = Stoppable(executor_id="stoppable")
    async with hub_at(socket_path) as hub, anyio.create_task_group() as tg:
        done = anyio.Event()

        async def run() -> None:
            await run_executor(executor, socket_path=socket_path)
            done.set()

        tg.start_soon(run)
        await hub.wait_for_executor("stoppable")
        report = await hub.run_attempt(
            build_executor_instruction(
                instruction_id="bye-1",
                execution_id="exe",
                command_type="SHUTDOWN",
                timestamp="t",
                timeout_ms=1000,
            )
        )
        with anyio.fail_after(5):
            await done.wait()
    assert report.outcome.kind is OutcomeKind.SUCCESS
    assert report.response is not None
    assert report.response.evidence_hash == sha256_hex("SHUTDOWN bye-1")


async def test_status_busy_pauses_dispatch(socket_path: Path) -> None:
    """An executor announcing BUSY gets no work until it announces READY again."""
    executor = Reader(executor_id="pausable")
    async with hub_at(socket_path, queue_wait_s=10.0) as hub, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await hub.wait_for_executor("pausable")
        await executor.connected.wait()
        assert executor.connection is not None
        await executor.connection.send_status(Status(ExecutorStatus.BUSY, "warming up"))
        await hub.wait_for_executor("pausable", status=ExecutorStatus.BUSY)
        reports = []

        async def attempt() -> None:
            reports.append(await hub.run_attempt(read_instruction()))

        async with anyio.create_task_group() as inner:
            inner.start_soon(attempt)
            await anyio.wait_all_tasks_blocked()
            assert hub.statistics().queued_by_command == {"READ": 1}
            await executor.connection.send_status(Status(ExecutorStatus.READY))
        tg.cancel_scope.cancel()
    assert reports[0].outcome.kind is OutcomeKind.SUCCESS


class Liar(Executor):
    async def read(self, instruction: Instruction) -> Mapping[str, Any]:
        return Result.success("x").to_wire("somebody-else")


async def test_mapping_results_are_sent_verbatim(socket_path: Path) -> None:
    """A handler may return a raw response mapping (test executors use it to lie)."""
    async with hub_at(socket_path) as hub, anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_executor(Liar(executor_id="liar"), socket_path=socket_path))
        await hub.wait_for_executor("liar")
        report = await hub.run_attempt(read_instruction())
        tg.cancel_scope.cancel()
    assert report.outcome.fault_type is ExecutionFaultType.INVALID_RESPONSE
    assert report.safety_reason_code == "RESPONSE_INSTRUCTION_ID_MISMATCH"


async def test_silent_daemon_is_detected_and_the_sdk_reconnects(socket_path: Path) -> None:
    """When the daemon stops sending frames, the SDK drops the connection and reconnects."""
    listener = await anyio.create_unix_listener(socket_path)
    connections = 0
    second = anyio.Event()

    async def handle(stream: anyio.abc.SocketStream) -> None:
        nonlocal connections
        async with stream:
            hello = await FrameReader(stream).read()
            connections += 1
            welcome = Welcome(
                executor_id=str(hello["executor_id"]),
                protocol_version=PROTOCOL_VERSION,
                heartbeat_interval_ms=50,
                heartbeat_misses=2,
                max_frame_bytes=65536,
            )
            await stream.send(encode_frame(welcome.to_wire()))
            if connections == 2:
                second.set()
            # say nothing more: the SDK must notice within ~100-150 ms and hang up
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    await stream.receive()

    executor = Reader(executor_id="watchful")
    backoff = Backoff(initial_s=0.01, max_s=0.05)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path, backoff=backoff))
        with anyio.fail_after(5):
            await second.wait()
        tg.cancel_scope.cancel()
    assert connections == 2


class Verbose(Executor):
    async def read(self, instruction: Instruction) -> Result:
        size = 10_000 if instruction.target_selector == "#big" else 10
        return Result.success("x", output={"text": "y" * size})


async def test_oversized_answer_becomes_a_failure(socket_path: Path) -> None:
    """A response larger than the daemon's frame limit is replaced by a FAILURE answer."""
    executor = Verbose(executor_id="verbose")
    async with (
        hub_at(socket_path, max_frame_bytes=4096) as hub,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: run_executor(executor, socket_path=socket_path))
        await hub.wait_for_executor("verbose")
        big = await hub.run_attempt(
            build_executor_instruction(
                instruction_id="big-1",
                execution_id="exe",
                command_type="READ",
                target_selector="#big",
                timestamp="t",
                timeout_ms=5000,
            )
        )
        small = await hub.run_attempt(read_instruction())
        tg.cancel_scope.cancel()
    assert big.outcome.kind is OutcomeKind.FAILURE
    assert big.outcome.message.endswith("exceeds max_frame_bytes=4096")
    assert small.outcome.kind is OutcomeKind.SUCCESS
