"""How long a turn waited before its attempt ran (issue 21: a READ turn that waited 30 s for an
executor showed ``queued_ms: 0`` and ``MS 0``).

A real in-process daemon with no executor at first: a READ turn is parked until the test
connects an SDK executor, a known time after it saw the turn parked. The wait then shows, at
least that long, in the attempt of ``turn.get``, in ``hunter turn show``, in the
``attempt_started`` log event, in ``hunter_attempt_queue_wait_seconds`` and on the attempt's
span; a turn that finds a free slot shows less. A process turn waits the same way for
its session's lock, held by an earlier process turn until the test cancels it.

The only bounds on time are lower bounds that follow from what the test does: the turn was
accepted before the test starts its pause, and cannot run before the pause ends.
"""

from __future__ import annotations

import functools
import io
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli import main
from supervisor.config import Config, load_config
from supervisor.control.client import ControlClient
from supervisor.logging import configure_logging, reset_logging
from supervisor.sdk import Executor, Instruction, Result, run_executor
from supervisor.server import Daemon
from supervisor.traces import TurnTraces, tracer_provider
from tests.live_daemon import WAIT_S, demo_root

#: How long the test keeps the turn waiting once it saw it wait (a lower bound of its wait).
PAUSE_S = 0.5
PAUSE_MS = int(PAUSE_S * 1000)


@pytest.fixture
def root() -> Iterator[Path]:
    yield from demo_root("hh-queue-")


class Reader(Executor):
    """READ succeeds at once."""

    def __init__(self) -> None:
        super().__init__(executor_id="reader", slots=4)

    async def read(self, instruction: Instruction) -> Result:
        return Result.success("page")


@dataclass
class Running:
    config: Config
    log: io.StringIO
    spans: InMemorySpanExporter
    metrics_socket: Path

    def events(self, event: str, turn_id: int) -> list[dict[str, Any]]:
        """The JSON log lines of *event* for *turn_id*, in order."""
        lines = [orjson.loads(x) for x in self.log.getvalue().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("event") == event and x.get("turn_id") == turn_id]

    def attempt_span(self, turn_id: int) -> ReadableSpan:
        (span,) = [
            s
            for s in self.spans.get_finished_spans()
            if s.name == "hunter.attempt"
            and s.attributes is not None
            and s.attributes.get("hunter.turn_id") == turn_id
        ]
        return span

    async def queue_wait_metric(self) -> dict[tuple[str, str, str], float]:
        """``hunter_attempt_queue_wait_seconds`` as scraped: (sample, command_type, le) ->
        value."""
        async with await anyio.connect_unix(self.metrics_socket) as stream:
            await stream.send(b"GET /metrics HTTP/1.0\r\n\r\n")
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except anyio.EndOfStream:
                pass
        body = data.partition(b"\r\n\r\n")[2].decode()
        (family,) = [
            f
            for f in text_string_to_metric_families(body)
            if f.name == "hunter_attempt_queue_wait_seconds"
        ]
        assert family.type == "histogram"
        return {
            (s.name, s.labels["command_type"], s.labels.get("le", "")): s.value
            for s in family.samples
        }


@asynccontextmanager
async def serving(root: Path) -> AsyncIterator[Running]:
    """An in-process daemon on *root* with no executor (a parked turn waits up to an hour:
    `executors.queue_wait_s`), its log in memory, metrics on a socket, traces in memory."""
    log = io.StringIO()
    configure_logging(fmt="json", stream=log)
    metrics_socket = root.parent / "metrics.sock"
    overrides = {
        "root": root,
        "executors.queue_wait_s": 3600,
        "metrics.listen": str(metrics_socket),
    }
    config = load_config(None, env={}, overrides=overrides)
    spans = InMemorySpanExporter()
    provider = tracer_provider("hunter-test")
    provider.add_span_processor(SimpleSpanProcessor(spans))
    daemon = Daemon(config, handle_signals=False, traces=TurnTraces(provider.get_tracer("t")))
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            try:
                yield Running(config, log, spans, metrics_socket)
            finally:
                daemon.request_drain()
    finally:
        reset_logging()


def read(sid: str, **extra: object) -> dict[str, object]:
    return {
        "session_id": sid,
        "kind": "instruction",
        "command_type": "READ",
        "target_selector": "#main",
        "declared_outputs": [],
        **extra,
    }


async def turn_show(config: Config, turn_id: int, capsys: pytest.CaptureFixture[str]) -> str:
    """What `hunter turn show TURN_ID` prints (in a worker thread: it runs its own loop)."""
    argv = ["turn", "show", str(turn_id), "--socket", str(config.control_socket)]
    capsys.readouterr()
    assert await anyio.to_thread.run_sync(functools.partial(main, argv)) == 0
    return capsys.readouterr().out


async def test_a_turn_parked_for_an_executor_shows_its_wait(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A READ turn submitted with no executor connected is parked; the test waits PAUSE_S
    more, then connects one. The attempt's queue wait is at least PAUSE_S everywhere it is
    shown (its run time, `MS`, is apart from it); a second turn, with a free slot, waits for
    less than the first."""
    async with serving(root) as d, ControlClient(d.config.control_socket) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        turn_id = (await client.call("turn.submit", **read(sid)))["turn"]["turn_id"]
        status = await client.call("status")
        assert status["turn_core"]["parked_by_command"] == {"READ": 1}  # waiting, parked
        await anyio.sleep(PAUSE_S)
        async with anyio.create_task_group() as executors:
            executors.start_soon(
                functools.partial(
                    run_executor, Reader(), socket_path=d.config.executor_socket, reconnect=False
                )
            )
            waited = (await client.call("turn.wait", turn_id=turn_id, timeout_s=WAIT_S))["turn"]
            quick = (await client.call("turn.submit", **read(sid, wait_s=WAIT_S)))["turn"]
            shown = await turn_show(d.config, turn_id, capsys)
            metric = await d.queue_wait_metric()
            executors.cancel_scope.cancel()
        got = (await client.call("turn.get", turn_id=turn_id))["turn"]

    assert (waited["state"], quick["state"]) == ("succeeded", "succeeded")
    (attempt,) = got["attempts"]
    queued = attempt["queued_ms"]
    assert queued >= PAUSE_MS  # turn.get
    assert attempt["extra"]["queued_ms"] == queued  # as the daemon recorded it
    (quick_attempt,) = quick["attempts"]
    assert 0 <= quick_attempt["queued_ms"] < queued  # a free slot: it went at once

    # hunter turn show: the attempt's QUEUED_MS column (before MS) and the "waited:" line
    (row,) = [line.split() for line in shown.splitlines() if line.startswith("1 ")]
    header = next(line.split() for line in shown.splitlines() if line.startswith("ATTEMPT"))
    assert header[4:6] == ["QUEUED_MS", "MS"]
    assert row[4] == str(queued)
    assert row[5] == str(attempt["duration_ms"])
    assert f"waited:  {queued} ms for an executor slot before attempt 1 ran" in shown

    # the attempt_started event of each turn
    (started,) = d.events("attempt_started", turn_id)
    assert started["queued_ms"] == queued
    (quick_started,) = d.events("attempt_started", quick["turn_id"])
    assert quick_started["queued_ms"] == quick_attempt["queued_ms"]

    # the metric: both attempts observed, the parked one with at least PAUSE_S
    assert metric["hunter_attempt_queue_wait_seconds_count", "READ", ""] == 2
    assert metric["hunter_attempt_queue_wait_seconds_sum", "READ", ""] >= PAUSE_S
    assert metric["hunter_attempt_queue_wait_seconds_bucket", "READ", str(PAUSE_S / 2)] <= 1

    # the trace: the attempt's span
    span = d.attempt_span(turn_id)
    assert span.attributes is not None
    assert span.attributes["hunter.queue_wait_ms"] == queued


async def test_a_process_turn_waits_for_its_sessions_lock(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session's process turns run one at a time: a second one waits until the first is
    cancelled, PAUSE_S after the test saw both; its queue wait (for the session's lock and a
    process slot) is at least that, the first one's is not."""
    async with serving(root) as d, ControlClient(d.config.control_socket) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        process = {"session_id": sid, "kind": "process", "declared_outputs": []}
        first = (await client.call("turn.submit", **process, argv=["sleep", "30"]))["turn"]
        running = await client.call(
            "turn.wait", turn_id=first["turn_id"], until=["running"], timeout_s=WAIT_S
        )
        assert running["turn"]["state"] == "running"
        second = (await client.call("turn.submit", **process, argv=["sh", "-c", "true"]))["turn"]
        await anyio.sleep(PAUSE_S)
        await client.call("turn.cancel", turn_id=first["turn_id"])
        done = (await client.call("turn.wait", turn_id=second["turn_id"], timeout_s=WAIT_S))["turn"]
        cancelled = (await client.call("turn.get", turn_id=first["turn_id"]))["turn"]
        shown = await turn_show(d.config, second["turn_id"], capsys)
        metric = await d.queue_wait_metric()

    assert (cancelled["state"], done["state"]) == ("cancelled", "succeeded")
    queued = done["attempts"][0]["queued_ms"]
    assert queued >= PAUSE_MS
    (first_attempt,) = cancelled["attempts"]
    assert first_attempt["queued_ms"] < queued  # the lock was free: it waited for nothing
    assert (
        f"waited:  {queued} ms for the session's lock and a process slot before attempt 1 ran"
        in shown
    )
    (started,) = d.events("attempt_started", second["turn_id"])
    assert started["queued_ms"] == queued
    assert metric["hunter_attempt_queue_wait_seconds_count", "process", ""] == 2
    assert metric["hunter_attempt_queue_wait_seconds_sum", "process", ""] >= PAUSE_S


async def test_a_turn_no_executor_serves_reports_one_wait_everywhere(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A READ turn that no executor serves, with a 300 ms timeout (below the configured
    hour): the submit warning names the limit it will reach, and once it ends
    NO_CAPABLE_EXECUTOR its wait is one figure, ``queued_ms``, the same in the attempt's
    record and its detail, the ``attempt_no_executor`` log line and `turn show`'s QUEUED_MS;
    the limit is named the same way in the warning and the detail."""
    limit = "limit 0.3s: the instruction's timeout_ms, below executors.queue_wait_s=3600s"
    async with serving(root) as d, ControlClient(d.config.control_socket) as client:
        sid = (await client.call("session.open", package_id="demo"))["session_id"]
        submitted = await client.call("turn.submit", **read(sid, timeout_ms=300))
        turn_id = submitted["turn"]["turn_id"]
        done = (await client.call("turn.wait", turn_id=turn_id, timeout_s=WAIT_S))["turn"]
        shown = await turn_show(d.config, turn_id, capsys)

    (warning,) = submitted["warnings"]
    assert warning == (
        f"no connected executor serves READ: the turn waits for one ({limit}), then ends"
        " NO_CAPABLE_EXECUTOR; its attempt's queued_ms says how long it waited"
    )
    assert done["reason_code"] == "NO_CAPABLE_EXECUTOR"
    (attempt,) = done["attempts"]
    queued = attempt["queued_ms"]
    assert queued >= 300  # it waited the limit, parked and then in the hub's queue
    assert attempt["extra"]["queued_ms"] == queued
    detail = (
        f"no executor supporting READ was connected; the attempt waited queued_ms={queued}"
        f" ({limit})"
    )
    assert detail in attempt["detail"]
    lines = [orjson.loads(x) for x in d.log.getvalue().splitlines() if x.startswith("{")]
    (logged,) = [x for x in lines if x.get("event") == "attempt_no_executor"]
    assert logged["instruction_id"] == f"INS-{turn_id}-1"
    assert logged["queued_ms"] == queued
    assert logged["detail"] == detail
    (row,) = [line.split() for line in shown.splitlines() if line.startswith("1 ")]
    header = next(line.split() for line in shown.splitlines() if line.startswith("ATTEMPT"))
    assert header[4] == "QUEUED_MS"
    assert row[4] == str(queued)
