"""One attempt in flight on an executor connection: ``Pending``.

It is apart from ``connection`` because two pieces hold it: the connection's in-flight table
(until the answer is judged or the deadline passes) and ``cancels`` (once cancelled, until the
executor answers the cancel), and the hub keeps it as the handle of an attempt dispatched
without a task. It holds one attempt's state and nothing of the connection's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio
import structlog

from sandbox.policy.envelopes import ExecutorInstructionEnvelope
from supervisor.executors.judge import Verdict

__all__ = ["Pending"]


class Pending:
    """One attempt in flight on a connection; resolved by the connection's reader (or its
    deadline). An attempt with a task waits on ``event``; one without (``on_done``) is called
    back, once, with its verdict, and has an ``event`` only while a cancel of it is answered."""

    __slots__ = ("envelope", "event", "labels", "on_done", "sent_at", "timer", "verdict")

    def __init__(
        self,
        envelope: ExecutorInstructionEnvelope,
        on_done: Callable[[Verdict], None] | None = None,
        labels: Mapping[str, object] | None = None,
    ) -> None:
        self.envelope = envelope
        self.on_done = on_done
        self.event: anyio.Event | None = None if on_done is not None else anyio.Event()
        self.verdict: Verdict | None = None
        #: the turn's ids, bound to the events of a deadline handled without the turn's task
        self.labels = labels
        self.sent_at = 0.0
        #: its deadline's key on the connection's timers (0: an attempt with a task)
        self.timer = 0

    def resolve(self, verdict: Verdict) -> None:
        """Settle the attempt with ``verdict`` (the first one wins) and wake its task, or call
        its ``on_done`` (whose errors are its own: logged, never the reader's)."""
        if self.verdict is None:
            self.verdict = verdict
            done, self.on_done = self.on_done, None
            if done is not None:
                try:
                    done(verdict)
                except Exception:
                    _log_callback_failure(self.envelope.instruction_id)
        if self.event is not None:
            self.event.set()


def _log_callback_failure(instruction_id: str) -> None:
    structlog.get_logger("supervisor.executors").exception(
        "attempt_callback_failed", instruction_id=instruction_id
    )
