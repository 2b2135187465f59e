"""An attempt that found no free executor slot: ``QueuedAttempts``.

When no READY executor serving its command has a free slot, ``ExecutorHub.run_attempt`` hands
the attempt here: it waits in its command's queue (bounded by the wait it was given), then runs
on the executor whose slot it was handed, or ends without one: HUB_CLOSED while the hub closes,
NO_EXECUTOR (``NO_CAPABLE_EXECUTOR``) when no connected executor serves the command at all, a
queue-wait TIMEOUT otherwise. Its report gives the attempt's whole wait, ``queued_ms``.

It is apart from ``hub`` because what a wait for a slot ends with (and how it is worded in
the report, the event and the detail) changes for other reasons than the front does, and it is
off the hot path: an attempt with a free slot at once never comes here. The hub binds ``run``
once, so a queued attempt reaches it with no extra hop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.envelopes import ExecutorCommandType, ExecutorInstructionEnvelope
from supervisor.executors.clock import ms
from supervisor.executors.connection import Connection
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.judge import Verdict, hub_closed, queue_wait_expired
from supervisor.executors.log import EventLog
from supervisor.executors.reports import AttemptReport
from supervisor.executors.settings import HubSettings

__all__ = ["QueuedAttempts", "Reporter"]


class Reporter(Protocol):
    """Builds an attempt's report (the hub's, which also keeps the durations per command)."""

    def __call__(
        self,
        verdict: Verdict,
        executor_id: str | None,
        *,
        started: float,
        queued_s: float,
        before_s: float = 0.0,
        ran: ExecutorCommandType | None = None,
    ) -> AttemptReport:
        """The report of an attempt that ended with *verdict* (see ``ExecutorHub``)."""


def _no_capable_executor(detail: str) -> Verdict:
    """No connected executor serves the command: the attempt reached none (NO_EXECUTOR)."""
    return Verdict(AttemptOutcome.no_executor(detail), rc.NO_CAPABLE_EXECUTOR, detail)


class QueuedAttempts:
    """Runs the attempts that wait in a command's queue for a free slot."""

    __slots__ = ("_closing", "_dispatcher", "_log", "_report", "_settings")

    def __init__(
        self,
        *,
        dispatcher: Dispatcher,
        log: EventLog,
        settings: Callable[[], HubSettings],
        closing: Callable[[], bool],
        report: Reporter,
    ) -> None:
        """*settings*: the limits in force now; *closing*: whether the hub is closing."""
        self._dispatcher = dispatcher
        self._log = log
        self._settings = settings
        self._closing = closing
        self._report = report

    async def run(
        self,
        envelope: ExecutorInstructionEnvelope,
        started: float,
        before_s: float,
        wait_s: float,
        traceparent: str | None,
    ) -> AttemptReport:
        """The attempt found no free slot: wait in its command's queue, then run it (or not).
        *before_s*: what it waited before (`run_attempt`'s ``queued_before_ms``)."""
        command = envelope.command_type
        iid = envelope.instruction_id
        conn: Connection | None = None
        queued_s = before_s  # its whole wait: before, then in the queue
        if not self._closing():
            conn = await self._dispatcher.wait(command, iid, wait_s)
            queued_s += time.monotonic() - started
        if conn is None:
            if self._closing():
                verdict = hub_closed()
                event = "attempt_dropped"
            else:  # the wait as bounded (a parked turn waited its first part in the core)
                configured_s = self._settings().queue_wait_s
                detail = self._dispatcher.timeout_detail(
                    command,
                    queued_ms=ms(queued_s),
                    limit_s=min(configured_s, envelope.timeout_ms / 1000),
                    configured_s=configured_s,
                )
                if self._dispatcher.connected(command):
                    verdict = queue_wait_expired(detail)
                    event = "attempt_timed_out"
                else:
                    verdict = _no_capable_executor(detail)
                    event = "attempt_no_executor"
            self._log.warning(
                event,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                executor_id=None,
                command_type=command.value,
                queued_ms=ms(queued_s),
                reason_code=verdict.reason_code,
                detail=verdict.detail,
            )
            return self._report(
                verdict, None, started=started, before_s=before_s, queued_s=queued_s
            )
        verdict = await conn.attempt(envelope, queued_s, traceparent=traceparent)
        return self._report(
            verdict,
            conn.executor_id,
            started=started,
            before_s=before_s,
            queued_s=queued_s,
            ran=command,
        )
