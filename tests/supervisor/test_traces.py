"""OpenTelemetry traces of turns, with the SDK's in-memory exporter: an in-process daemon, a
real executor process that fails once and then succeeds. The trace shows one turn span and one
span per attempt under it, with the decisions and reason codes, and the ids an executor would
continue from (`attempt_traceparent`)."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sandbox.policy.attempt_record import AttemptRecord
from sandbox.policy.lifecycle import TurnKind, TurnState
from supervisor.config import load_config
from supervisor.control.client import call_once
from supervisor.demo.stack import DEMO_CONFIG, DemoStack, prepare_root
from supervisor.errors import ControlClientError
from supervisor.sdk.client import run_executor
from supervisor.sdk.executor import Executor, Instruction, Result
from supervisor.sdk.tracing import current_traceparent, use_tracer_provider
from supervisor.server import Daemon
from supervisor.store.protocol import TurnRecord
from supervisor.traces import (
    TurnTraces,
    attempt_traceparent,
    parse_traceparent,
    tracer_provider,
    turn_trace,
)
from tests.turn_requests import READ_SPEC


def test_traceparent_parsing_follows_w3c() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(good) == (
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
    )
    for bad in (
        None,
        42,
        good.upper(),
        "01" + good[2:],
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
        good[:-1],
    ):
        assert parse_traceparent(bad) is None, bad


def test_a_clients_traceparent_puts_the_turn_in_its_trace() -> None:
    client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    turn = TurnRecord(
        turn_id=7,
        session_id="S",
        turn_number=1,
        kind=TurnKind.INSTRUCTION,
        spec=msgspec.structs.replace(READ_SPEC, traceparent=client),
        idempotency_key=None,
        state=TurnState.SUCCEEDED,
        attempt=1,
        accepted_us=1_000,
        updated_us=2_000,
        finished_us=2_000,
        attempts=(AttemptRecord(attempt=1, started_us=1_100, instruction_id="INS-7-1"),),
    )
    trace_id, _, parent = turn_trace(turn)
    assert trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert parent == (trace_id, 0x00F067AA0BA902B7)
    exporter = InMemorySpanExporter()
    provider = tracer_provider("hunter-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TurnTraces(provider.get_tracer("t")).write(turn)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["hunter.turn"].parent is not None
    assert spans["hunter.turn"].parent.span_id == 0x00F067AA0BA902B7
    assert spans["hunter.attempt"].context.trace_id == trace_id
    assert attempt_traceparent(turn, turn.attempts[0]).endswith(
        f"{spans['hunter.attempt'].context.span_id:016x}-01"
    )


def test_an_attempt_span_carries_its_queue_wait() -> None:
    """`hunter.queue_wait_ms` is the attempt's recorded wait for a slot (0 included); an
    attempt whose wait is unknown (restored from a ledger, recorded before queue waits were)
    has no such attribute rather than a made-up 0."""
    turn = TurnRecord(
        turn_id=8,
        session_id="S",
        turn_number=1,
        kind=TurnKind.INSTRUCTION,
        spec=READ_SPEC,
        idempotency_key=None,
        state=TurnState.SUCCEEDED,
        attempt=3,
        accepted_us=1_000,
        updated_us=90_000,
        finished_us=90_000,
        attempts=(
            AttemptRecord(attempt=1, started_us=31_000, instruction_id="INS-8-1"),
            AttemptRecord(attempt=2, started_us=41_000, instruction_id="INS-8-2").with_queued_ms(
                30_000
            ),
            AttemptRecord(attempt=3, started_us=51_000, instruction_id="INS-8-3").with_queued_ms(0),
        ),
    )
    exporter = InMemorySpanExporter()
    provider = tracer_provider("hunter-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TurnTraces(provider.get_tracer("t")).write(turn)
    waits = {
        s.attributes["hunter.attempt"]: s.attributes.get("hunter.queue_wait_ms")
        for s in exporter.get_finished_spans()
        if s.name == "hunter.attempt" and s.attributes is not None
    }
    assert waits == {1: None, 2: 30_000, 3: 0}


async def test_a_turn_and_its_attempts_are_spans(tmp_path: Path) -> None:
    root = tmp_path / "root"
    prepare_root(root, fresh=True, config_text=DEMO_CONFIG)
    exporter = InMemorySpanExporter()
    provider = tracer_provider("hunter-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = load_config(root / "hunter.toml", env={}, overrides={"root": root})
    daemon = Daemon(config, handle_signals=False, traces=TurnTraces(provider.get_tracer("t")))
    stack = DemoStack(root=root, config_path=root / "hunter.toml")
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            await stack.start_executor(
                "flaky",
                [
                    "supervisor.examples.chaos_executor",
                    "--commands",
                    "READ",
                    "--behaviour",
                    "error,ok",
                    "--no-reconnect",
                ],
            )
            sock = stack.control_socket
            sid = (await call_once(sock, "session.open", package_id="demo"))["session_id"]
            submitted = await call_once(
                sock,
                "turn.submit",
                session_id=sid,
                kind="instruction",
                command_type="READ",
                target_selector="h1",
                declared_outputs=[],
                wait_s=30,
            )
            turn = submitted["turn"]
            assert turn["state"] == "succeeded"
        finally:
            await stack.aclose()
            daemon.request_drain()
    spans = exporter.get_finished_spans()
    (turn_span,) = [s for s in spans if s.name == "hunter.turn"]
    attempts = sorted(
        (s for s in spans if s.name == "hunter.attempt"),
        key=lambda s: int(s.attributes["hunter.attempt"]),  # type: ignore[arg-type,index]
    )
    assert turn_span.attributes is not None
    assert turn_span.attributes["hunter.state"] == "succeeded"
    assert turn_span.attributes["hunter.decision"] == "SUCCEED"
    assert turn_span.attributes["hunter.turn_id"] == turn["turn_id"]
    assert [s.attributes["hunter.decision"] for s in attempts] == ["RETRY", "SUCCEED"]  # type: ignore[index]
    assert attempts[0].attributes["hunter.fault_type"]  # type: ignore[index]
    for span in attempts:
        assert span.parent is not None
        assert span.parent.span_id == turn_span.context.span_id
        assert span.context.trace_id == turn_span.context.trace_id
        assert span.start_time is not None
        assert turn_span.start_time is not None
        assert span.start_time >= turn_span.start_time


class _TracedReader(Executor):
    """An SDK executor that notes the trace context it ran in."""

    def __init__(self) -> None:
        super().__init__(executor_id="traced-reader", slots=2)
        self.seen: list[str | None] = []

    async def read(self, instruction: Instruction) -> Result:
        self.seen.append(current_traceparent())
        return Result.success(b"page", output={"text": "hi"})


async def test_an_sdk_executor_continues_the_trace(tmp_path: Path) -> None:
    """The envelope goes with the attempt's traceparent; an SDK executor's span is a child of
    the daemon's attempt span, in the client's trace when the client sent one."""
    root = tmp_path / "root"
    prepare_root(root, fresh=True, config_text=DEMO_CONFIG)
    daemon_spans, executor_spans = InMemorySpanExporter(), InMemorySpanExporter()
    provider = tracer_provider("hunter-test")
    provider.add_span_processor(SimpleSpanProcessor(daemon_spans))
    sdk_provider = SdkTracerProvider()
    sdk_provider.add_span_processor(SimpleSpanProcessor(executor_spans))
    use_tracer_provider(sdk_provider)
    config = load_config(root / "hunter.toml", env={}, overrides={"root": root})
    daemon = Daemon(config, handle_signals=False, traces=TurnTraces(provider.get_tracer("t")))
    reader = _TracedReader()
    client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            sock = root / "run" / "control.sock"
            tg.start_soon(
                lambda: run_executor(
                    reader, socket_path=root / "run" / "executors.sock", reconnect=False
                )
            )
            await call_once(sock, "executors.wait", executor_id="traced-reader", timeout_s=10)
            sid = (await call_once(sock, "session.open", package_id="demo"))["session_id"]
            done = await call_once(
                sock,
                "turn.submit",
                session_id=sid,
                kind="instruction",
                command_type="READ",
                target_selector="h1",
                declared_outputs=[],
                traceparent=client,
                wait_s=30,
            )
            assert done["turn"]["state"] == "succeeded", done["turn"]
            daemon.request_drain()
            tg.cancel_scope.cancel()
    finally:
        use_tracer_provider(None)
    (attempt,) = [s for s in daemon_spans.get_finished_spans() if s.name == "hunter.attempt"]
    (turn,) = [s for s in daemon_spans.get_finished_spans() if s.name == "hunter.turn"]
    (handled,) = executor_spans.get_finished_spans()
    assert handled.name == "hunter.executor.read"
    assert handled.parent is not None
    assert handled.parent.span_id == attempt.context.span_id
    assert handled.context.trace_id == turn.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert turn.parent is not None
    assert turn.parent.span_id == 0x00F067AA0BA902B7
    assert reader.seen == [f"00-{turn.context.trace_id:032x}-{attempt.context.span_id:016x}-01"]


async def test_a_bad_traceparent_is_refused_at_submit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    prepare_root(root, fresh=True, config_text=DEMO_CONFIG)
    config = load_config(root / "hunter.toml", env={}, overrides={"root": root})
    daemon = Daemon(config, handle_signals=False)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        sock = root / "run" / "control.sock"
        sid = (await call_once(sock, "session.open", package_id="demo"))["session_id"]
        with pytest.raises(ControlClientError) as refused:
            await call_once(
                sock,
                "turn.submit",
                session_id=sid,
                kind="instruction",
                command_type="READ",
                target_selector="h1",
                declared_outputs=[],
                traceparent="00-zz-not-a-trace-01",
            )
        assert "traceparent" in str(refused.value)
        daemon.request_drain()
