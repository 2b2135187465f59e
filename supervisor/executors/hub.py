"""The executor hub: registry of connected executors, dispatch, deadlines, response judging.

External executor processes connect to ``executors.sock`` and speak the protocol of
``docs/protocol.md``. ``ExecutorHub.run_attempt(envelope)`` runs ONE attempt of an instruction:
it waits (bounded) in the per-command queue until a READY executor that supports the command has
a free slot, sends the instruction, waits for the response until ``envelope.timeout_ms`` after
sending, judges the response with the Phase-20 safety rules and maps it to an ``AttemptOutcome``
(docs/policy.md, "How the seeds combine", item 4). Retrying is the turn core's job.

``ExecutorHub`` is the front; the work is done by the package's small modules:

* ``reception`` — the listener, the uid check, ``hello``, ``reject``/``welcome``;
* ``connection`` — one executor connection: its state, frames in and out, heartbeats, its
  attempts in flight with their deadlines and cancels, attribution of responses;
* ``judge`` — what came back (a response, or nothing) mapped to an outcome; pure;
* ``dispatch`` — the bounded per-command queues and picking a READY executor;
* ``roster`` — connected and recently disconnected executors, the change signal;
* ``quarantine`` — executors refused for a while after a security breach;
* ``host`` — the ``ConnectionHost`` seam (what a connection asks of the hub);
* ``settings``, ``reports``, ``log``, ``clock``, ``peercred`` — values and helpers.

Design notes (hot path):

* One reader task per connection resolves waiting attempts (an ``anyio.Event`` per attempt);
  the attempt's own task (the caller of ``run_attempt``) sends the frame and waits. No task is
  spawned per instruction.
* A frame goes out with one ``send`` under a per-connection lock; frames are read with a
  buffered ``FrameReader``.
* Per-frame events are logged at debug level; state transitions at info/warning.

`ExecutorHub` is about 520 lines (the module about 710): it is the front the turn core calls
(admit, run an attempt with a task or dispatch one without, slots, status); each method
delegates to its neighbours (dispatch, roster, judge, quarantine, circuits), and the two ways of
an attempt share the circuit breakers' and counters' bookkeeping, so they stay in one class.
"""

from __future__ import annotations

import collections
import logging
import os
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
from supervisor.executors.clock import ms, now_us
from supervisor.executors.connection import Connection, Pending
from supervisor.executors.dispatch import Dispatcher
from supervisor.executors.judge import Verdict, hub_closed, queue_wait_expired
from supervisor.executors.log import EventLog
from supervisor.executors.peercred import PeerCredentials, stream_peer_credentials
from supervisor.executors.quarantine import Quarantine
from supervisor.executors.reception import Reception, open_executor_listener
from supervisor.executors.reports import AttemptReport, ExecutorInfo, HubReason, HubStatistics
from supervisor.executors.roster import Roster
from supervisor.executors.settings import HubSettings
from supervisor.feed import Feed
from supervisor.logging import describe_error
from supervisor.wire.executor import Reject, RejectReason
from supervisor.wire.frames import FrameError

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


def _no_capable_executor(detail: str) -> Verdict:
    """No connected executor serves the command: the attempt reached none (NO_EXECUTOR)."""
    return Verdict(AttemptOutcome.no_executor(detail), rc.NO_CAPABLE_EXECUTOR, detail)


class _Host:
    """The hub as its connections see it (``host.ConnectionHost``): the limits in force, and
    where their reports go (roster, dispatcher, quarantine, the hub's frame/late counters)."""

    __slots__ = (
        "_log",
        "_quarantine",
        "changed",
        "feed",
        "frame_errors",
        "late_responses",
        "recount",
        "settings",
        "slot_freed",
        "trace",
    )

    def __init__(
        self,
        *,
        settings: HubSettings,
        roster: Roster,
        dispatcher: Dispatcher,
        quarantine: Quarantine,
        log: EventLog,
        feed: Feed | None = None,
    ) -> None:
        self.settings = settings
        self.trace = False
        self.feed = feed
        self._quarantine = quarantine
        self._log = log
        self.frame_errors = 0
        self.late_responses = 0
        # Bound once: these are called on every response (no extra hop on the hot path).
        self.changed: Callable[[], None] = roster.notify
        self.slot_freed: Callable[[Connection], None] = dispatcher.slot_freed
        self.recount: Callable[[Connection], None] = dispatcher.recount

    def frame_error(
        self,
        exc: FrameError,
        *,
        executor_id: str | None,
        in_flight: list[str],
        creds: PeerCredentials | None,
    ) -> None:
        self.frame_errors += 1
        self._log.warning(
            "frame_error",
            executor_id=executor_id,
            error=type(exc).__name__,
            reason=exc.reason,
            in_flight=in_flight,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
        )

    def late_response(self) -> None:
        self.late_responses += 1

    def quarantine(self, executor_id: str, creds: PeerCredentials | None) -> None:
        self._quarantine.impose(executor_id, creds, self.settings.quarantine_s)
        if self.feed is not None:
            self.feed.publish(
                "executor.quarantined",
                executor_id=executor_id,
                detail=f"refused for {self.settings.quarantine_s:g} s",
            )


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
        self._host = _Host(
            settings=settings,
            roster=self._roster,
            dispatcher=self._dispatcher,
            quarantine=self._quarantine,
            log=self._log,
            feed=feed,
        )
        self._reception = Reception(host=self._host, log=self._log)
        self._circuits = Circuits(limits=lambda: self.settings.breaker, log=self._log)
        self.settings = settings
        self._idle = anyio.Event()
        self._closing = False
        self._serve_scope: anyio.CancelScope | None = None
        #: set once `serve` has returned (every connection's task ended), while it runs
        self._served: anyio.Event | None = None
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
        self._allowed_uids = (
            settings.allowed_uids
            if settings.allowed_uids is not None
            else frozenset({os.getuid(), 0})
        )
        # Per-frame debug events cost a processor chain each; emit them only when the
        # configured level (mirrored on the stdlib root logger) lets them through.
        self._host.trace = logging.getLogger().isEnabledFor(logging.DEBUG)

    async def serve(
        self,
        listener: anyio.abc.Listener[anyio.abc.SocketStream],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept executor connections until ``aclose()`` (or cancellation); one task each."""
        self._served = served = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._serve_scope = tg.cancel_scope
                task_status.started()
                await listener.serve(self._handle_connection, task_group=tg)
        finally:
            served.set()

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
            connections_rejected=self._reception.rejected,
            frame_errors=self._host.frame_errors,
            late_responses=self._host.late_responses,
            quarantined=self._quarantine.active(),
            circuits=self._circuits.snapshot(),
        )

    def list_executors(self) -> list[ExecutorInfo]:
        """Connected executors (READY/BUSY/ERROR) then recently disconnected ones (OFFLINE)."""
        roster = self._roster
        infos = [self._info(c) for c in roster.connected()]
        infos.extend(i for i in roster.offline_records() if i.executor_id not in roster)
        return infos

    def executor(self, executor_id: str) -> ExecutorInfo | None:
        """The snapshot of one executor, or ``None`` if the hub never saw it."""
        conn = self._roster.get(executor_id)
        if conn is not None:
            return self._info(conn)
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
        for conn in self._roster.connected():
            conn.disconnect(HubReason.HUB_CLOSED, "the hub is shutting down")
        self._dispatcher.close()
        if self._serve_scope is not None:
            self._serve_scope.cancel()
        if self._served is not None:
            await self._served.wait()
        else:
            await anyio.lowlevel.checkpoint()

    # ------------------------------------------------------------------ attempts
    async def _queued_attempt(
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
        if not self._closing:
            conn = await self._dispatcher.wait(command, iid, wait_s)
            queued_s += time.monotonic() - started
        if conn is None:
            if self._is_closing():
                verdict = hub_closed()
                event = "attempt_dropped"
            else:  # the wait as bounded (a parked turn waited its first part in the core)
                detail = self._dispatcher.timeout_detail(
                    command,
                    queued_ms=ms(queued_s),
                    limit_s=min(self.settings.queue_wait_s, envelope.timeout_ms / 1000),
                    configured_s=self.settings.queue_wait_s,
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
        """``_closing`` read afresh after an await (mypy would keep an earlier test's answer)."""
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

    # ------------------------------------------------------------------ connections
    async def _handle_connection(self, stream: anyio.abc.SocketStream) -> None:
        """One executor connection, and its error boundary: whatever happens on it costs this
        connection only (closed, logged with the peer's uid and pid), never the hub."""
        creds: PeerCredentials | None = None
        try:
            async with stream:
                creds = stream_peer_credentials(stream)
                await self._connection(stream, creds)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._log.info(
                "connection_lost",
                detail=repr(exc),
                uid=creds.uid if creds else None,
                pid=creds.pid if creds else None,
            )
        except Exception as exc:  # one broken connection must never take the hub down
            self._log.exception(
                "connection_failed",
                uid=creds.uid if creds else None,
                pid=creds.pid if creds else None,
                error=describe_error(exc),
            )

    async def _connection(
        self, stream: anyio.abc.SocketStream, creds: PeerCredentials | None
    ) -> None:
        reception = self._reception
        greeted = await reception.greet(
            stream, creds, allowed_uids=self._allowed_uids, closing=self._closing
        )
        if greeted is None:
            return
        hello, reader = greeted
        refusal = self._refusal(hello.executor_id, creds)
        if refusal is not None:
            await reception.reject(stream, refusal, executor_id=hello.executor_id, creds=creds)
            return
        conn = Connection(
            executor_id=hello.executor_id,
            commands=hello.commands,
            slots=hello.slots,
            software=hello.software,
            creds=creds,
            stream=stream,
            host=self._host,
            log=self._log,
        )
        await reception.welcome(stream, hello.executor_id)
        self._register(conn)
        try:
            await conn.serve(reader)
        finally:
            self._unregister(conn)

    def _refusal(self, executor_id: str, creds: PeerCredentials | None) -> Reject | None:
        """The reject of a valid hello from ``executor_id``: quarantined or a duplicate id."""
        remaining = self._quarantine.remaining_s(executor_id, creds)
        if remaining > 0:
            return Reject(
                RejectReason.QUARANTINED,
                f"executor {executor_id} is quarantined for a security violation",
                ms(remaining),
            )
        if executor_id in self._roster:
            settings = self.settings
            return Reject(
                RejectReason.DUPLICATE_EXECUTOR_ID,
                f"an executor with id {executor_id} is already connected",
                ms(settings.heartbeat_interval_s * settings.heartbeat_misses),
            )
        return None

    def _register(self, conn: Connection) -> None:
        self._roster.add(conn)
        self._dispatcher.add(conn)
        creds = conn.creds
        self._log.info(
            "executor_connected",
            executor_id=conn.executor_id,
            commands=[c.value for c in conn.commands],
            slots=conn.slots,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
            software=conn.software,
        )
        self._roster.notify()
        self._dispatcher.slot_freed(conn)
        if (feed := self._host.feed) is not None:
            feed.publish(
                "executor.connected",
                executor_id=conn.executor_id,
                command_types=tuple(c.value for c in conn.commands),
            )

    def _unregister(self, conn: Connection) -> None:
        reason, detail = conn.close_reason, conn.close_detail
        self._dispatcher.remove(conn)
        self._roster.remove(conn, self._info(conn, detail=detail))
        self._log.info(
            "executor_disconnected",
            executor_id=conn.executor_id,
            reason_code=reason,
            detail=detail,
            connected_ms=(now_us() - conn.connected_at_us) // 1000,
        )
        self._roster.notify()
        if (feed := self._host.feed) is not None:
            feed.publish(
                "executor.gone",
                executor_id=conn.executor_id,
                command_types=tuple(c.value for c in conn.commands),
                reason_code=reason,
                detail=detail or None,
            )

    def _info(self, conn: Connection, *, detail: str = "") -> ExecutorInfo:
        return conn.info(
            quarantined_until_us=self._quarantine.until_us(conn.executor_id), detail=detail
        )
