"""OpenTelemetry traces of turns: a span per turn and one per attempt (optional extra
``humanoid-hunter[otel]``).

Design notes
------------
* **Spans are written when a turn ends**, from its durable record: the turn span runs from
  acceptance to the ending, each attempt span from the attempt's start to its outcome, with the
  decision, reason code, fault type, executor and queue wait (``hunter.queue_wait_ms``) as
  attributes. Nothing is traced on the hot path while a turn runs, and a daemon restart loses
  no span of a turn that ends afterwards.
* **The ids are known in advance.** A turn's trace id and span ids are derived from the turn
  (its id and acceptance time) and the attempt's instruction id, so the W3C ``traceparent`` of an
  attempt can be put into the instruction envelope when it is sent, long before its span is
  written. An executor using the SDK continues that trace. The daemon's own tracer provider uses
  `PlannedIds`, which hands out the planned ids while the spans are written.
* A client that sends a ``traceparent`` with ``turn.submit`` gets the turn's span as a child of
  its own span, in its own trace.
* `TurnTraces` is a `TurnEvents` sink (the tracker reports endings to it); `FanOut` lets it sit
  beside the metrics. Without the extra installed, `open_traces` says so and returns None.
* Export runs in the daemon's task group (`SpanExport`): spans queue on the event loop and go
  out in batches from a worker thread once a second; the SDK's own batch processor, which
  starts a thread of its own, is not used.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from ledger.entries import SealedLine
from sandbox.policy.attempt_record import AttemptRecord
from supervisor.logging import get_logger
from supervisor.store.protocol import TurnRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from supervisor.turns.tracker import TurnEvents

__all__ = [
    "FanOut",
    "PlannedIds",
    "SpanExport",
    "TurnTraces",
    "attempt_traceparent",
    "open_traces",
    "parse_traceparent",
    "turn_trace",
]

_TRACEPARENT: Final = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
_planned: contextvars.ContextVar[tuple[int | None, int | None]] = contextvars.ContextVar(
    "hunter_planned_ids", default=(None, None)
)


def parse_traceparent(value: object) -> tuple[int, int] | None:
    """``(trace_id, span_id)`` of a W3C ``traceparent`` (version 00); None when it is not one
    (all-zero ids are invalid)."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id


def _derive(size: int, *parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:size], "big") or 1


def turn_trace(turn: TurnRecord) -> tuple[int, int, tuple[int, int] | None]:
    """``(trace_id, turn span id, the client's (trace, span) or None)`` of *turn*."""
    client = parse_traceparent(turn.spec.traceparent)
    trace_id = client[0] if client else _derive(16, "trace", turn.turn_id, turn.accepted_us)
    return trace_id, _derive(8, "turn", turn.turn_id, turn.accepted_us), client


def _attempt_span_id(turn: TurnRecord, attempt: AttemptRecord) -> int:
    key = attempt.instruction_id or f"{attempt.attempt}@{attempt.started_us}"
    return _derive(8, "attempt", turn.turn_id, turn.accepted_us, key)


def attempt_traceparent(turn: TurnRecord, attempt: AttemptRecord) -> str:
    """The ``traceparent`` an attempt's envelope carries: its own span, in the turn's trace."""
    trace_id, _, _ = turn_trace(turn)
    return f"00-{trace_id:032x}-{_attempt_span_id(turn, attempt):016x}-01"


@contextmanager
def _ids(trace_id: int | None, span_id: int) -> Iterator[None]:
    token = _planned.set((trace_id, span_id))
    try:
        yield
    finally:
        _planned.reset(token)


def _make_planned_ids() -> type:
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

    class _PlannedIds(IdGenerator):
        """Hands out the ids planned for the span being written (random otherwise)."""

        def __init__(self) -> None:
            self._random = RandomIdGenerator()

        def generate_span_id(self) -> int:
            span_id = _planned.get()[1]
            return span_id if span_id is not None else self._random.generate_span_id()

        def generate_trace_id(self) -> int:
            trace_id = _planned.get()[0]
            return trace_id if trace_id is not None else self._random.generate_trace_id()

    return _PlannedIds


def PlannedIds() -> object:
    """An `IdGenerator` for the daemon's tracer provider (see the module docstring)."""
    return _make_planned_ids()()


def _attributes(values: Mapping[str, object]) -> dict[str, str | int]:
    return {k: v for k, v in values.items() if isinstance(v, str | int) and v != ""}


class TurnTraces:
    """Writes the spans of each turn that reaches a final state (a `TurnEvents` sink)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def attempt_decided(self, attempt: AttemptRecord) -> None:
        """Attempt spans are written with their turn's."""

    def attempt_queued(self, command_type: str, seconds: float) -> None:
        """On the attempt's span, from its record (``hunter.queue_wait_ms``)."""

    def intake_refused(self, capability: str) -> None:
        """Not traced."""

    def ledgers_verified(self, *, ledgers: int, failures: int) -> None:
        """Not traced."""

    def turn_ended(self, turn: TurnRecord, ledger_lines: Sequence[SealedLine]) -> None:
        if turn.final:
            self.write(turn)

    def write(self, turn: TurnRecord) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        trace_id, turn_span_id, client = turn_trace(turn)
        sampled = TraceFlags(TraceFlags.SAMPLED)
        parent = None
        if client is not None:
            remote = SpanContext(client[0], client[1], is_remote=True, trace_flags=sampled)
            parent = trace.set_span_in_context(NonRecordingSpan(remote))
        end_us = turn.finished_us or turn.updated_us
        with _ids(trace_id, turn_span_id):
            span = self._tracer.start_span(
                "hunter.turn",
                context=parent,
                start_time=turn.accepted_us * 1000,
                attributes=_attributes(
                    {
                        "hunter.turn_id": turn.turn_id,
                        "hunter.session_id": turn.session_id,
                        "hunter.turn_number": turn.turn_number,
                        "hunter.kind": turn.kind.value,
                        "hunter.state": turn.state.value,
                        "hunter.decision": turn.verdict or "",
                        "hunter.reason_code": turn.reason_code or "",
                        "hunter.fault_type": turn.fault_type or "",
                        "hunter.attempts": len(turn.attempts),
                    }
                ),
            )
        mine = SpanContext(trace_id, turn_span_id, is_remote=False, trace_flags=sampled)
        inside = trace.set_span_in_context(NonRecordingSpan(mine))
        for attempt in turn.attempts:
            with _ids(None, _attempt_span_id(turn, attempt)):
                child = self._tracer.start_span(
                    "hunter.attempt",
                    context=inside,
                    start_time=attempt.started_us * 1000,
                    attributes=_attributes(
                        {
                            "hunter.turn_id": turn.turn_id,
                            "hunter.attempt": attempt.attempt,
                            "hunter.instruction_id": attempt.instruction_id or "",
                            "hunter.executor_id": attempt.executor_id or "",
                            "hunter.outcome": attempt.outcome or "",
                            "hunter.fault_type": attempt.fault_type or "",
                            "hunter.decision": attempt.decision or "",
                            "hunter.reason_code": attempt.reason_code or "",
                            "hunter.delay_ms": attempt.delay_ms or 0,
                            # how long it waited for a slot (the attribute absent: unknown)
                            "hunter.queue_wait_ms": (
                                "" if attempt.queued_ms is None else attempt.queued_ms
                            ),
                        }
                    ),
                )
            child.end(end_time=(attempt.finished_us or end_us) * 1000)
        span.end(end_time=end_us * 1000)


class FanOut:
    """Several `TurnEvents` sinks as one (the metrics and the traces)."""

    def __init__(self, *sinks: TurnEvents) -> None:
        self._sinks = sinks

    def attempt_decided(self, attempt: AttemptRecord) -> None:
        for sink in self._sinks:
            sink.attempt_decided(attempt)

    def attempt_queued(self, command_type: str, seconds: float) -> None:
        for sink in self._sinks:
            sink.attempt_queued(command_type, seconds)

    def turn_ended(self, turn: TurnRecord, ledger_lines: Sequence[SealedLine]) -> None:
        for sink in self._sinks:
            sink.turn_ended(turn, ledger_lines)

    def intake_refused(self, capability: str) -> None:
        for sink in self._sinks:
            sink.intake_refused(capability)

    def ledgers_verified(self, *, ledgers: int, failures: int) -> None:
        for sink in self._sinks:
            sink.ledgers_verified(ledgers=ledgers, failures=failures)


def tracer_provider(service_name: str) -> TracerProvider:
    """The daemon's own provider (planned ids), exporting nothing yet."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(
        id_generator=PlannedIds(),  # type: ignore[arg-type]
        resource=Resource.create({"service.name": service_name}),
    )


class SpanExport:
    """Finished spans queued on the event loop and exported in batches from a worker thread
    (`anyio.to_thread`), once a second: the SDK's own batch processor would start a thread of
    its own. At most *limit* spans wait; older ones are dropped (and counted) when the
    collector is slow or down."""

    def __init__(self, exporter: object, *, limit: int = 20_000) -> None:
        self._exporter = exporter
        self._queue: collections.deque[object] = collections.deque(maxlen=limit)
        self.dropped = 0
        self.exported = 0

    def processor(self) -> object:
        from opentelemetry.sdk.trace import SpanProcessor

        export = self

        class _Queue(SpanProcessor):
            def on_end(self, span: object) -> None:
                if len(export._queue) == export._queue.maxlen:
                    export.dropped += 1
                export._queue.append(span)

        return _Queue()

    async def run(self) -> None:
        """Export what is queued every second until cancelled (then once more)."""
        try:
            while True:
                await anyio.sleep(1.0)
                await self.flush()
        finally:
            with anyio.move_on_after(5, shield=True):
                await self.flush()

    async def flush(self) -> None:
        batch = list(self._queue)
        self._queue.clear()
        if not batch:
            return
        export = getattr(self._exporter, "export")  # noqa: B009  (typed by the SDK, optional)
        try:
            await anyio.to_thread.run_sync(export, batch)
        except Exception as exc:  # the collector is down: these spans are lost, not the daemon
            get_logger("supervisor.traces").warning(
                "trace_export_failed", spans=len(batch), error=str(exc)
            )
            return
        self.exported += len(batch)


def open_traces(
    endpoint: str, *, service_name: str = "hunter"
) -> tuple[TurnTraces, SpanExport] | None:
    """`TurnTraces` and the `SpanExport` (to run in the daemon's task group) sending spans over
    OTLP/HTTP to *endpoint*; None (logged) when the ``otel`` extra is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        get_logger("supervisor.traces").warning(
            "tracing_unavailable",
            reason=f"install humanoid-hunter[otel] to export traces ({exc.name} missing)",
        )
        return None
    provider = tracer_provider(service_name)
    export = SpanExport(OTLPSpanExporter(endpoint=endpoint))
    provider.add_span_processor(export.processor())  # type: ignore[arg-type]
    return TurnTraces(provider.get_tracer("hunter")), export
