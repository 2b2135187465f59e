"""The deadlines of a connection's attempts: ``Deadlines``.

An attempt without a task (``Connection.send_attempt``) has its deadline in one timer heap per
connection, run by one task: nothing per attempt until a deadline passes. Then ``due`` starts a
task (if the attempt is still unanswered) and ``time_out`` ends the attempt DEADLINE_EXCEEDED,
takes it out of the in-flight table and has the executor sent its ``cancel``
(``Cancels.after_deadline``). An attempt with a task enforces its deadline with a cancel scope
and calls ``time_out`` itself.

It is apart from ``connection`` because what happens when time runs out changes for other
reasons than sending and judging do, and runs off the hot path: a turn only arms and disarms
its timer (bound once by the connection, no extra hop). What it needs of its connection is
``DeadlinesOwner``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import anyio
import structlog.contextvars

from supervisor.executors.clock import ms
from supervisor.executors.judge import deadline_exceeded
from supervisor.executors.log import EventLog
from supervisor.executors.pending import Pending
from supervisor.executors.reports import HubReason
from supervisor.timers import Timers

__all__ = ["Deadlines", "DeadlinesOwner"]


class DeadlinesOwner(Protocol):
    """What ``Deadlines`` needs of the connection whose attempts it times."""

    @property
    def executor_id(self) -> str:
        """The executor's id (every event names it)."""

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (nothing is cancelled any more)."""

    def holds(self, pending: Pending) -> bool:
        """Whether *pending* is still in flight."""

    def drop(self, instruction_id: str) -> None:
        """Take *instruction_id* out of the in-flight table (its deadline passed)."""

    def spawn(self, task: Callable[[Pending], Coroutine[Any, Any, None]], pending: Pending) -> None:
        """Run ``task(pending)`` in the connection's task group (nothing once it stopped)."""


class Deadlines:
    """One connection's timer heap, and the time-out of its attempts."""

    __slots__ = ("_after", "_log", "_owner", "timers")

    def __init__(
        self,
        *,
        owner: DeadlinesOwner,
        after: Callable[[Pending, anyio.Event], Awaitable[None]],
        log: EventLog,
    ) -> None:
        """*after*: what follows a time-out on an open connection (the ``cancel`` sent and its
        answer awaited: ``Cancels.after_deadline``)."""
        self._owner = owner
        self._after = after
        self._log = log
        #: the deadlines of the attempts without a task (one timer heap, one task: ``run``)
        self.timers = Timers()

    def due(self, pending: Pending) -> None:
        """An attempt's deadline passed: if it is still unanswered, time it out (a task: it
        sends the ``cancel`` and waits for its answer)."""
        if pending.verdict is None and self._owner.holds(pending):
            self._owner.spawn(self._expire, pending)

    async def _expire(self, pending: Pending) -> None:
        # The answer may have been read between the timer's look and this task's start: then
        # the attempt is over and nothing is cancelled.
        if pending.verdict is not None or not self._owner.holds(pending):
            return
        if pending.labels:  # the events of this deadline carry the turn's ids
            structlog.contextvars.bind_contextvars(**pending.labels)
        await self.time_out(pending, pending.sent_at)

    async def time_out(self, pending: Pending, sent_at: float) -> None:
        """The deadline passed unanswered (*sent_at*: when the attempt was sent): the attempt
        ends DEADLINE_EXCEEDED and, on an open connection, the executor is sent its cancel."""
        owner = self._owner
        envelope = pending.envelope
        iid = envelope.instruction_id
        pending.resolve(deadline_exceeded(envelope.timeout_ms))
        answered = pending.event = anyio.Event()  # now waits for the answer to the cancel
        owner.drop(iid)
        self._log.warning(
            "attempt_timed_out",
            executor_id=owner.executor_id,
            instruction_id=iid,
            execution_id=envelope.execution_id,
            timeout_ms=envelope.timeout_ms,
            waited_ms=ms(time.monotonic() - sent_at),
            reason_code=HubReason.DEADLINE_EXCEEDED,
        )
        if owner.closed:
            return
        await self._after(pending, answered)
