"""The executor hub: registry of connected executors, dispatch, deadlines, response judging.

External executor processes connect to ``executors.sock`` and speak the protocol of
``docs/protocol.md``. ``ExecutorHub.run_attempt(envelope)`` runs ONE attempt of an instruction:
it waits (bounded) in the per-command queue until a READY executor that supports the command has
a free slot, sends the instruction, waits for the response until ``envelope.timeout_ms`` after
sending, judges the response with the Phase-20 safety rules and maps it to an ``AttemptOutcome``
(docs/policy.md, "How the seeds combine", item 4). Retrying is the turn core's job.

``ExecutorHub`` is the front; the work is done by the package's small modules:

* ``lifecycle`` — each connection's life in the hub: accepted, greeted, refused or
  registered, served, unregistered (its error boundary); ``aclose`` closes them all;
* ``reception`` — the listener, the uid check, ``hello``, ``reject``/``welcome``;
* ``connection`` — one executor connection: its state and slots, its attempts in flight and
  the judging of their answers; it composes ``link`` (frames in and out, heartbeats),
  ``deadlines`` (the timer heap, time-outs) and ``cancels`` (unanswered cancels, late and
  stray answers), with ``pending`` the one attempt they all hold;
* ``queued`` — an attempt that found no free slot: its wait in the queue, and its end;
* ``judge`` — what came back (a response, or nothing) mapped to an outcome; pure;
* ``dispatch`` — the bounded per-command queues and picking a READY executor;
* ``roster`` — connected and recently disconnected executors, the change signal;
* ``quarantine`` — executors refused for a while after a security breach;
* ``host`` — the ``ConnectionHost`` seam (what a connection asks of the hub), and
  ``hub_host`` — the hub's side of it;
* ``settings``, ``reports``, ``log``, ``clock``, ``peercred`` — values and helpers.

Design notes (hot path):

* One reader task per connection resolves waiting attempts (an ``anyio.Event`` per attempt);
  the attempt's own task (the caller of ``run_attempt``) sends the frame and waits. No task is
  spawned per instruction.
* A frame goes out with one ``send`` under a per-connection lock; frames are read with a
  buffered ``FrameReader``.
* Per-frame events are logged at debug level; state transitions at info/warning.

`ExecutorHub` itself is the front the turn core calls (admit, run an attempt with a task or
dispatch one without, slots, status, drain and close); the two ways of an attempt share the
circuit breakers' and counters' bookkeeping, so they stay in it. What it hands to a neighbour
on an attempt's path (the queued attempt's ``run``, the host's callbacks) is bound once in the
constructor: no step of a turn costs an extra hop for the split.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Mapping

import anyio
import anyio.abc
import structlog

from sandbox.policy import reason_codes as rc
from sandbox.policy.attempts import AttemptOutcome
from sandbox.policy.breaker import CircuitState
from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorStatus,
)
from supervisor.errors import QueueFullError
from supervisor.executors.circuits import Circuits
from supervisor.executors.clock import ms
from supervisor.executors.connection import Connection
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.hub_host import HubHost
from supervisor.executors.judge import Verdict
from supervisor.executors.lifecycle import ConnectionLifecycle
from supervisor.executors.log import EventLog
from supervisor.executors.pending import Pending
from supervisor.executors.quarantine import Quarantine
from supervisor.executors.queued import QueuedAttempts
from supervisor.executors.reception import open_executor_listener
from supervisor.executors.reports import AttemptReport, ExecutorInfo, HubReason, HubStatistics
from supervisor.executors.roster import Roster
from supervisor.executors.settings import HubSettings
from supervisor.feed import Feed

__all__ = [
    "AttemptReport",
    "ExecutorHub",
    "ExecutorInfo",
    "HubReason",
    "HubSettings",
    "HubStatistics",
    "QueueFullError",
    "open_executor_listener",
]


class _Dispatched:
    """An attempt taken by `ExecutorHub.dispatch` (no task): where it went, and its caller."""

    __slots__ = ("command", "conn", "done", "ended", "hub", "pending", "probe", "started")

    def __init__(
        self,
        hub: ExecutorHub,
        command: ExecutorCommandType,
        probe: bool,
        done: Callable[[AttemptReport], None],
    ) -> None:
        self.hub = hub
        self.command = command
        self.probe = probe
        self.done = done
        self.conn: Connection | None = None
        self.pending: Pending | None = None
        self.started = time.monotonic()
        self.ended = False

    def answered(self, verdict: Verdict) -> None:
        if not self.ended:
            self.ended = True
            self.hub._dispatched_answer(self, verdict)


class ExecutorHub:
    """Registry of connected executors plus per-command queues; see the module docstring."""

    def __init__(
        self, *, settings: HubSettings, log: EventLog | None = None, feed: Feed | None = None
    ) -> None:
        self._log: EventLog = (
            log if log is not None else structlog.get_logger("supervisor.executors.hub")
        )
        self._roster = Roster()
        self._dispatcher = Dispatcher(notify=self._roster.notify)
        self._quarantine = Quarantine()
        self._host = HubHost(
            settings=settings,
            roster=self._roster,
            dispatcher=self._dispatcher,
            quarantine=self._quarantine,
            log=self._log,
            feed=feed,
        )
        self._lifecycle = ConnectionLifecycle(
            roster=self._roster,
            dispatcher=self._dispatcher,
            quarantine=self._quarantine,
            host=self._host,
            log=self._log,
        )
        self._circuits = Circuits(limits=lambda: self.settings.breaker, log=self._log)
        # Bound once: a queued attempt reaches its piece with no extra hop.
        self._queued_attempt = QueuedAttempts(
            dispatcher=self._dispatcher,
            log=self._log,
            settings=lambda: self.settings,
            closing=self._is_closing,
            report=self._report,
        ).run
        self.settings = settings
        self._idle = anyio.Event()
        self._closing = False
        self._avg_attempt_s: dict[ExecutorCommandType, float] = {}  # moving average per command
        # counters
        self._attempts_started = 0
        self._attempts_finished = 0
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._active_attempts = 0

    # ------------------------------------------------------------------ public surface
    @property
    def settings(self) -> HubSettings:
        """The limits in force; assigning new settings (SIGHUP reload) applies them to new
        connections and attempts (frame limits of open connections stay as welcomed)."""
        return self._host.settings

    @settings.setter
    def settings(self, settings: HubSettings) -> None:
        self._host.settings = settings
        self._lifecycle.configure(settings)
        # Per-frame debug events cost a processor chain each; emit them only when the
        # configured level (mirrored on the stdlib root logger) lets them through.
        self._host.trace = logging.getLogger().isEnabledFor(logging.DEBUG)

    async def serve(
        self,
        listener: anyio.abc.Listener[anyio.abc.SocketStream],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept executor connections until ``aclose()`` (or cancellation); one task each
        (`lifecycle.ConnectionLifecycle`)."""
        await self._lifecycle.serve(listener, task_status=task_status)

    def admit(self, command_type: ExecutorCommandType, *, waiting: int = 0) -> None:
        """Raise ``QueueFullError`` if ``command_type``'s queue is at capacity (backpressure),
        counting ``waiting`` turns the caller parks before they reach the hub.

        Intake calls this before accepting a turn; ``run_attempt`` itself never drops work.
        """
        self._dispatcher.admit(
            command_type,
            self.settings.queue_capacity,
            per_attempt_s=self._avg_attempt_s.get(command_type, 1.0),
            waiting=waiting,
        )

    def serving(self, command_type: ExecutorCommandType) -> int:
        """Connected executors that serve ``command_type`` (whatever their status)."""
        return self._dispatcher.connected(command_type)

    def free_slots(self, command_type: ExecutorCommandType) -> int:
        """Free slots of READY executors serving ``command_type``, less the attempts waiting
        for one: the turn core parks turns while this is not positive."""
        return self._dispatcher.free_slots(command_type)

    @property
    def queue_wait_s(self) -> float:
        """How long an attempt waits for a free slot before it times out."""
        return self.settings.queue_wait_s

    async def run_attempt(
        self,
        envelope: ExecutorInstructionEnvelope,
        *,
        queue_wait_s: float | None = None,
        queued_before_ms: int = 0,
        traceparent: str | None = None,
    ) -> AttemptReport:
        """Run one attempt of ``envelope`` on some executor and report its outcome.

        Never raises for executor misbehaviour: every such case is an outcome. Returns after the
        response, or after the deadline once the executor answered the ``cancel`` (or
        ``cancel_grace_s`` passed, in which case the executor is marked ERROR).
        ``queue_wait_s``: how long it may wait for a slot (default ``settings.queue_wait_s``;
        less for a turn that already waited parked in the turn core). The wait never exceeds
        the instruction's own ``timeout_ms``: a one-second instruction is not queued for a
        minute. When it ends with no connected executor serving the command type at all, the
        outcome is NO_EXECUTOR (reason ``NO_CAPABLE_EXECUTOR``), not a TIMEOUT.
        ``queued_before_ms``: how long the attempt already waited for a slot before this call
        (parked in the turn core); the report's ``queued_ms`` (and ``duration_ms``), the hub's
        events and the report's detail all give the attempt's whole wait, this part included:
        one figure, ``queued_ms``, wherever the attempt's wait for an executor is shown.
        ``traceparent``: the attempt's W3C trace context, sent beside the envelope.
        """
        started = time.monotonic()
        before_s = queued_before_ms / 1000
        self._attempts_started += 1
        self._active_attempts += 1
        command, iid = envelope.command_type, envelope.instruction_id
        admission = self._circuits.admit(command)
        ended = False
        try:
            conn = None
            if admission.allowed and not self._closing:
                conn = self._dispatcher.pick(command, iid)
            if not admission.allowed:  # the pool keeps failing: fail fast
                report = self._circuit_open(envelope, started, before_s)
            elif conn is not None:  # the hot path: an executor has a free slot now
                verdict = await conn.attempt(envelope, 0.0, traceparent=traceparent)
                report = self._report(
                    verdict,
                    conn.executor_id,
                    started=started,
                    before_s=before_s,
                    queued_s=before_s,
                    ran=command,
                )
            else:
                wait_s = self.settings.queue_wait_s if queue_wait_s is None else queue_wait_s
                wait_s = min(wait_s, envelope.timeout_ms / 1000)
                report = await self._queued_attempt(
                    envelope, started, before_s, max(0.0, wait_s), traceparent
                )
            if admission.allowed:
                self._circuits.record(
                    command,
                    report.outcome,
                    reached_executor=report.executor_id is not None,
                    probe=admission.probe,
                )
            ended = True
        finally:
            if not ended:  # cancelled: a probe is given back
                self._circuits.abandon(command, probe=admission.probe)
            self._active_attempts -= 1
            if self._active_attempts == 0:
                self._idle.set()
        self._attempts_finished += 1
        outcome = report.outcome
        key = outcome.fault_type.value if outcome.fault_type is not None else outcome.kind.value
        self._outcomes[key] += 1
        return report

    def dispatch(
        self,
        envelope: ExecutorInstructionEnvelope,
        wire: Mapping[str, object],
        *,
        traceparent: str | None,
        labels: Mapping[str, object],
        done: Callable[[AttemptReport], None],
    ) -> _Dispatched | None:
        """`run_attempt` without a task, for an executor with a free slot now: sends the
        envelope (*wire*: its wire form, built once by the caller) and calls *done* with the
        report from the connection's reader (or its deadline). None, with nothing sent, when
        the attempt cannot go at once (no free slot, the circuit not closed, the hub closing):
        the caller runs it with `run_attempt` instead. Returns the handle for `abandon`."""
        if self._closing:
            return None
        command = envelope.command_type
        admission = self._circuits.admit(command)
        if not admission.allowed:
            return None
        conn = self._dispatcher.pick(command, envelope.instruction_id)
        attempt = _Dispatched(self, command, admission.probe, done)
        pending = None
        if conn is not None:
            attempt.conn = conn
            pending = conn.send_attempt(
                envelope, wire, traceparent=traceparent, on_done=attempt.answered, labels=labels
            )
        if pending is None:
            self._circuits.abandon(command, probe=admission.probe)
            return None
        attempt.pending = pending
        self._attempts_started += 1
        self._active_attempts += 1
        return attempt

    def abandon(self, attempt: object) -> None:
        """A dispatched attempt is no longer wanted (its turn was cancelled or lost): the
        executor is told (`Connection.abandon`); its *done* is not called."""
        if not isinstance(attempt, _Dispatched) or attempt.ended:
            return
        attempt.ended = True
        if attempt.conn is not None and attempt.pending is not None:
            attempt.conn.abandon(attempt.pending)
        self._circuits.abandon(attempt.command, probe=attempt.probe)
        self._attempt_over()

    def _attempt_over(self) -> None:
        self._active_attempts -= 1
        if self._active_attempts == 0:
            self._idle.set()

    def _dispatched_answer(self, attempt: _Dispatched, verdict: Verdict) -> None:
        conn = attempt.conn
        assert conn is not None
        command = attempt.command
        report = self._report(
            verdict, conn.executor_id, started=attempt.started, queued_s=0.0, ran=command
        )
        self._circuits.record(command, report.outcome, reached_executor=True, probe=attempt.probe)
        self._attempt_over()
        self._attempts_finished += 1
        outcome = report.outcome
        key = outcome.fault_type.value if outcome.fault_type is not None else outcome.kind.value
        self._outcomes[key] += 1
        attempt.done(report)

    def statistics(self) -> HubStatistics:
        """A snapshot of the hub's counters and gauges."""
        connected = self._roster.connected()
        by_status: collections.Counter[str] = collections.Counter(c.status.value for c in connected)
        offline = self._roster.offline_count()
        if offline:
            by_status[ExecutorStatus.OFFLINE.value] += offline
        return HubStatistics(
            executors_connected=len(connected),
            executors_by_status=dict(by_status),
            queued_by_command=self._dispatcher.queued_by_command(),
            in_flight=sum(c.in_flight_count for c in connected),
            attempts_started=self._attempts_started,
            attempts_finished=self._attempts_finished,
            outcomes=dict(self._outcomes),
            connections_rejected=self._lifecycle.rejected,
            frame_errors=self._host.frame_errors,
            late_responses=self._host.late_responses,
            quarantined=self._quarantine.active(),
            circuits=self._circuits.snapshot(),
        )

    def list_executors(self) -> list[ExecutorInfo]:
        """Connected executors (READY/BUSY/ERROR) then recently disconnected ones (OFFLINE)."""
        roster, info = self._roster, self._lifecycle.info
        infos = [info(c) for c in roster.connected()]
        infos.extend(i for i in roster.offline_records() if i.executor_id not in roster)
        return infos

    def executor(self, executor_id: str) -> ExecutorInfo | None:
        """The snapshot of one executor, or ``None`` if the hub never saw it."""
        conn = self._roster.get(executor_id)
        if conn is not None:
            return self._lifecycle.info(conn)
        return self._roster.offline(executor_id)

    async def wait_for_executor(
        self, executor_id: str, *, status: ExecutorStatus | None = ExecutorStatus.READY
    ) -> ExecutorInfo:
        """Wait until ``executor_id`` is known with ``status`` (any status if ``None``)."""
        while True:
            info = self.executor(executor_id)
            if info is not None and (status is None or info.status is status):
                return info
            await self._roster.wait_changed()

    async def drain(self) -> None:
        """Wait until no attempt is running (the caller stops submitting first).

        Executors stay connected and queued attempts are still dispatched; bound the wait with
        a cancel scope (the daemon's drain grace) and then call ``aclose()``.
        """
        while self._active_attempts:
            self._idle = anyio.Event()
            await self._idle.wait()

    async def aclose(self) -> None:
        """Close every connection (in-flight attempts end CRASH) and stop serving. When `serve`
        runs, returns once it has: every connection's task has ended, each disconnect logged
        (``executor_disconnected``, reason ``HUB_CLOSED``). Call it from outside `serve`'s
        task group."""
        self._closing = True
        self._lifecycle.close()
        self._dispatcher.close()
        await self._lifecycle.stopped()

    # ------------------------------------------------------------------ attempts
    def _circuit_open(
        self, envelope: ExecutorInstructionEnvelope, started: float, before_s: float = 0.0
    ) -> AttemptReport:
        """The command's circuit breaker is open: the attempt fails fast (CIRCUIT_OPEN)."""
        command = envelope.command_type
        detail = f"the circuit breaker of {command.value} is open (its executors keep failing)"
        verdict = Verdict(AttemptOutcome.circuit_open(detail), rc.CIRCUIT_OPEN, detail)
        self._log.warning(
            "attempt_circuit_open",
            instruction_id=envelope.instruction_id,
            execution_id=envelope.execution_id,
            command_type=command.value,
            reason_code=rc.CIRCUIT_OPEN,
        )
        return self._report(verdict, None, started=started, before_s=before_s, queued_s=before_s)

    def circuits(self) -> dict[str, dict[str, object]]:
        """The circuit breakers that are not closed-and-quiet, by command type (``hunter
        status``): state, faults in the window, milliseconds until the next probe."""
        return self._circuits.snapshot()

    def circuit_state(self, command_type: ExecutorCommandType) -> CircuitState:
        """The state of ``command_type``'s circuit breaker."""
        return self._circuits.state(command_type)

    def _is_closing(self) -> bool:
        """Whether the hub is closing (`QueuedAttempts` asks it afresh after its wait)."""
        return self._closing

    def _report(
        self,
        verdict: Verdict,
        executor_id: str | None,
        *,
        started: float,
        queued_s: float,
        before_s: float = 0.0,
        ran: ExecutorCommandType | None = None,
    ) -> AttemptReport:
        """The attempt's report (*queued_s*: its whole wait for a slot, *before_s* of it before
        `run_attempt` was called); if it ``ran`` on an executor, its duration feeds the moving
        average per command that ``admit`` bases its retry hint on."""
        report = AttemptReport(
            outcome=verdict.outcome,
            executor_id=executor_id,
            response=verdict.response,
            safety_reason_code=verdict.reason_code,
            duration_ms=ms(time.monotonic() - started + before_s),
            detail=verdict.detail,
            queued_ms=ms(queued_s),
            evidence=verdict.evidence,
        )
        if ran is not None:
            duration = time.monotonic() - started
            previous = self._avg_attempt_s.get(ran, duration)
            self._avg_attempt_s[ran] = previous * 0.9 + duration * 0.1
        return report
