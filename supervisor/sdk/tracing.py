"""Continuing the daemon's trace in an executor (optional: needs ``opentelemetry-api``).

The daemon may send an attempt's W3C ``traceparent`` beside the instruction (``[tracing]``
on). The SDK then runs the handler inside a span ``hunter.executor.<command>`` whose parent is
the daemon's attempt span, through the OpenTelemetry API: the executor's own tracer provider
(the global one, or `use_tracer_provider`) decides whether and where spans go. Without
OpenTelemetry installed, or without a ``traceparent``, handlers run exactly as before. A
handler can read the trace context with `current_traceparent`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["current_traceparent", "executor_span", "use_tracer_provider"]

_provider: Any = None
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "hunter_traceparent", default=None
)


def use_tracer_provider(provider: object) -> None:
    """Use *provider* (an OpenTelemetry `TracerProvider`) instead of the global one."""
    global _provider
    _provider = provider


def current_traceparent() -> str | None:
    """The ``traceparent`` the daemon sent with the instruction being handled, if any."""
    return _current.get()


@contextmanager
def executor_span(traceparent: str | None, name: str, attributes: dict[str, str]) -> Iterator[None]:
    """Run the block in a span continuing *traceparent* (a no-op without one, or without
    OpenTelemetry)."""
    token = _current.set(traceparent)
    try:
        if traceparent is None:
            yield
            return
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            yield
            return
        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        tracer = trace.get_tracer("hunter.sdk", tracer_provider=_provider)
        with tracer.start_as_current_span(name, context=parent, attributes=attributes):
            yield
    finally:
        _current.reset(token)
