"""One connected executor: its state, its frames in and out, heartbeats, its attempts in flight.

A ``Connection`` owns everything about one executor connection: the socket (a buffered
``FrameReader`` in, a ``FrameWriter`` out), the attempts in flight on it, the ones cancelled but
not yet answered, the ids it finished recently, and its status. ``serve`` runs its three tasks
(writer, heartbeats, reader, deadlines) in one task group. An attempt goes one of two ways:
``attempt`` is run by the attempt's own task (it sends the instruction, waits for the reader to
resolve it, enforces the deadline and cancels); ``send_attempt`` takes it without a task (the
turn core's hot path): the reader calls the attempt's ``on_done``, its deadline waits in the
connection's timer heap, and only a deadline passed or an abandoned attempt starts a task (to
send the ``cancel`` and wait for its answer).
What the connection needs from the hub around it is ``host.ConnectionHost``. After every change
of its load (in flight, unanswered cancels, reserved slots) or of its status, a connection calls
``host.recount(self)``: the hub keeps running totals of free slots per command from these, so
nothing per turn has to look at every executor.

`Connection` is about 600 lines (the module about 730) on purpose: the in-flight table, the two
ways of an attempt (with a task, without), the deadline/cancel handling and the response
attribution below share one connection's state and are read together; splitting the in-flight
table into its own class costs an attribute hop on every response (the hot path).

Attribution of a response whose ``instruction_id`` is not one of the executor's in-flight
instructions: if it names an instruction that timed out or finished recently, it is a late
response (logged ``late_response_dropped``, ignored). Otherwise, if exactly one instruction is in
flight on that executor, the response is judged as that instruction's answer (so the safety rules
deny it: missing or mismatched id → INVALID_RESPONSE); with none in flight it is logged and
ignored; with several in flight it cannot be attributed, the connection is closed and every
in-flight attempt on it ends INVALID_RESPONSE.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Mapping
from typing import Final

import anyio
import anyio.abc
import structlog
import structlog.contextvars

from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorStatus,
)
from sandbox.policy.safety import instruction_to_wire
from supervisor.executors.clock import ms, now_us
from supervisor.executors.host import ConnectionHost
from supervisor.executors.judge import (
    Verdict,
    bad_frame,
    deadline_exceeded,
    disconnected,
    judge_response,
    protocol_breach,
    unattributable,
)
from supervisor.executors.log import EventLog
from supervisor.executors.peercred import PeerCredentials
from supervisor.executors.reports import ExecutorInfo, HubReason
from supervisor.stages import stage_costs
from supervisor.timers import Timers
from supervisor.wire.executor import (
    Cancel,
    Heartbeat,
    MessageError,
    MessageType,
    ResponseMessage,
    Status,
    decode_executor_message,
    instruction_message,
)
from supervisor.wire.frames import (
    FrameDecodeError,
    FrameError,
    FrameReader,
    FrameTooLarge,
    FrameTruncated,
    FrameWriter,
    encode_frame,
)

__all__ = ["RECENT_IDS", "Connection", "Pending"]

_COSTS: Final = stage_costs()
RECENT_IDS: Final = 64  # finished instruction ids remembered per connection (late answers)

_LOST: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
_READY: Final = ExecutorStatus.READY  # an enum member lookup costs a call: once, here


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


class Connection:
    """A connected executor. Only its own methods change its state; others read it."""

    __slots__ = (
        "_ending",
        "_error_detail",
        "_host",
        "_in_flight",
        "_last_rx",
        "_log",
        "_recent",
        "_reserved",
        "_scope",
        "_self_status",
        "_tg",
        "_timers",
        "_unacked",
        "_writer",
        "close_detail",
        "close_reason",
        "closed",
        "commands",
        "connected_at_us",
        "creds",
        "executor_id",
        "slots",
        "software",
    )

    def __init__(
        self,
        *,
        executor_id: str,
        commands: tuple[ExecutorCommandType, ...],
        slots: int,
        software: str,
        creds: PeerCredentials | None,
        stream: anyio.abc.SocketStream,
        host: ConnectionHost[Connection],
        log: EventLog,
    ) -> None:
        self.executor_id = executor_id
        self.commands = commands
        self.slots = slots
        self.software = software
        self.creds = creds
        self._writer = FrameWriter(stream)
        self._host = host
        self._log = log
        self._in_flight: dict[str, Pending] = {}
        self._unacked: dict[str, Pending] = {}  # cancelled, answer (ack) not yet received
        self._recent: collections.deque[str] = collections.deque(maxlen=RECENT_IDS)
        self._reserved = 0
        self._self_status = ExecutorStatus.READY
        self._error_detail = ""
        #: the connection is ending (its reader stopped, or it failed what was in flight): no
        #: instruction may be dispatched to it while its tasks wind down (it would end CRASH)
        self._ending = False
        self.closed = False
        self.close_reason = ""
        self.close_detail = ""
        self._last_rx = time.monotonic()
        self.connected_at_us = now_us()
        self._scope: anyio.CancelScope | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        #: (deadline, seq, instruction id) of attempts without a task; entries of attempts
        #: the deadlines of the attempts without a task (one timer heap, one task)
        self._timers = Timers()

    # ------------------------------------------------------------------ state
    @property
    def load(self) -> int:
        """Slots taken: in flight, cancelled but unanswered, and handed to a queued attempt."""
        return len(self._in_flight) + len(self._unacked) + self._reserved

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def status(self) -> ExecutorStatus:
        if self.closed:
            return ExecutorStatus.OFFLINE
        if self._error_detail or self._self_status is ExecutorStatus.ERROR:
            return ExecutorStatus.ERROR
        if self._self_status is not ExecutorStatus.READY or self.load >= self.slots:
            return ExecutorStatus.BUSY
        return ExecutorStatus.READY

    @property
    def free_slots(self) -> int:
        """Slots an attempt could take now (0 unless READY and open)."""
        if self.closed or self._ending or self._error_detail or self._self_status is not _READY:
            return 0
        return max(0, self.slots - self.load)

    def accepts(self, instruction_id: str) -> bool:
        """READY with a free slot, and not still holding this instruction id."""
        return self.load_if_accepting(instruction_id) is not None

    def load_if_accepting(self, instruction_id: str) -> int | None:
        """``load`` if ``accepts(instruction_id)``, else ``None`` (one call: the hot path)."""
        if self.closed or self._ending or self._error_detail or self._self_status is not _READY:
            return None
        in_flight, unacked = self._in_flight, self._unacked
        load = len(in_flight) + len(unacked) + self._reserved
        if load >= self.slots or instruction_id in in_flight or instruction_id in unacked:
            return None
        return load

    def reserve(self) -> None:
        """A slot is handed to a queued attempt (it is busy until the attempt takes it)."""
        self._reserved += 1
        self._host.recount(self)

    def unreserve(self) -> None:
        """The queued attempt took its slot, or gave it back."""
        self._reserved -= 1
        self._host.recount(self)

    def info(self, *, quarantined_until_us: int | None, detail: str = "") -> ExecutorInfo:
        """A snapshot of this executor."""
        creds = self.creds
        return ExecutorInfo(
            executor_id=self.executor_id,
            status=self.status,
            commands=self.commands,
            slots=self.slots,
            in_flight=len(self._in_flight),
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
            connected_at_us=self.connected_at_us,
            quarantined_until_us=quarantined_until_us,
            software=self.software,
            detail=detail or self._error_detail,
            heartbeat_age_ms=ms(time.monotonic() - self._last_rx),
        )

    # ------------------------------------------------------------------ lifetime
    async def serve(self, reader: FrameReader) -> None:
        """Run the writer, heartbeats and reader until the connection ends; it is then closed."""
        reason, detail = HubReason.EXECUTOR_DISCONNECTED, "the executor closed the connection"
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                self._tg = tg
                tg.start_soon(self._writer.run)
                tg.start_soon(self._heartbeats)
                tg.start_soon(self._timers.run)
                reason, detail = await self._read_loop(reader)
                self._ending = True  # nothing new is dispatched while the tasks stop
                tg.cancel_scope.cancel()
        finally:
            self.disconnect(reason, detail)

    def disconnect(self, reason: str, detail: str) -> None:
        """Mark the connection OFFLINE, end its in-flight attempts CRASH and stop its tasks."""
        if self.closed:
            return
        self.closed = True
        self.close_reason, self.close_detail = reason, detail
        if self._in_flight:
            verdict = disconnected(self.executor_id, reason, detail)
            for pending in list(self._in_flight.values()):
                pending.resolve(verdict)
        for pending in list(self._unacked.values()):
            if pending.event is not None:
                pending.event.set()
        self._in_flight.clear()
        self._unacked.clear()
        self._host.recount(self)
        if self._scope is not None:
            self._scope.cancel()
        self._host.changed()

    def _fail_in_flight(self, verdict: Verdict) -> None:
        """End what is in flight with *verdict*; the connection closes next (a bad frame, a
        protocol breach, an unattributable answer), so it takes nothing new meanwhile: else an
        instruction dispatched in between would end CRASH when it closes."""
        self._ending = True
        for pending in list(self._in_flight.values()):
            pending.resolve(verdict)
        self._in_flight.clear()
        self._host.recount(self)

    async def _heartbeats(self) -> None:
        settings = self._host.settings
        interval = settings.heartbeat_interval_s
        limit = interval * settings.heartbeat_misses
        while True:
            await anyio.sleep(interval)
            silent = time.monotonic() - self._last_rx
            if silent > limit:
                self._log.warning(
                    "heartbeat_missed",
                    executor_id=self.executor_id,
                    silent_ms=ms(silent),
                    limit_ms=ms(limit),
                    in_flight=len(self._in_flight),
                )
                self.disconnect(
                    HubReason.HEARTBEAT_LOST,
                    f"no frame for {silent:.1f}s (limit {limit:g}s): executor OFFLINE",
                )
                return
            try:
                with anyio.move_on_after(limit):
                    await self._writer.send(encode_frame(Heartbeat(ts_us=now_us()).to_wire()))
            except _LOST as exc:
                self.disconnect(HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
                return

    # ------------------------------------------------------------------ attempts
    async def attempt(
        self,
        envelope: ExecutorInstructionEnvelope,
        queued_s: float,
        *,
        traceparent: str | None = None,
    ) -> Verdict:
        """Send ``envelope``, wait for its answer until ``timeout_ms``, and return the verdict.

        After the deadline the executor gets a ``cancel`` and ``cancel_grace_s`` to answer it
        (then it is marked ERROR). Cancelled from outside (shutdown, turn cancelled), it tells
        the executor too, so its slot is freed by its answer; the answer is dropped as late.
        """
        iid = envelope.instruction_id
        in_flight = self._in_flight
        pending = Pending(envelope)
        in_flight[iid] = pending
        self._host.recount(self)
        if len(in_flight) + len(self._unacked) + self._reserved >= self.slots:  # self.load, inlined
            self._host.changed()  # READY -> BUSY (wait_for_executor watchers)
        frame = encode_frame(
            instruction_message(instruction_to_wire(envelope), traceparent=traceparent)
        )
        sent_at = time.monotonic()
        deadline = anyio.current_time() + envelope.timeout_ms / 1000
        if self._host.trace:
            self._log.debug(
                "instruction_sent",
                executor_id=self.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                command_type=envelope.command_type.value,
                queued_ms=ms(queued_s),
            )
        try:
            with anyio.CancelScope(deadline=deadline):
                try:
                    # Several in flight: more frames follow this loop pass, batch them.
                    await self._writer.send(frame, cork=len(in_flight) > 1)
                except _LOST as exc:
                    self.disconnect(HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
                event = pending.event
                assert event is not None  # an attempt with a task waits on it
                await event.wait()
        except BaseException:
            moved = in_flight.pop(iid, None) is pending and not self.closed
            if moved:  # in flight -> cancelled, unanswered: the slot stays taken
                self._unacked[iid] = pending
            self._host.recount(self)
            if moved:
                with anyio.move_on_after(self._host.settings.cancel_grace_s, shield=True):
                    await self._send_cancel(envelope, reason="cancelled")
            raise
        if pending.verdict is None:
            await self._time_out(pending, sent_at)
        verdict = pending.verdict
        if verdict is None:  # pragma: no cover - _time_out always resolves
            raise AssertionError("attempt left unresolved")
        return verdict

    def send_attempt(
        self,
        envelope: ExecutorInstructionEnvelope,
        wire: Mapping[str, object],
        *,
        traceparent: str | None,
        on_done: Callable[[Verdict], None],
        labels: Mapping[str, object] | None = None,
    ) -> Pending | None:
        """Send ``envelope`` (*wire*: its wire form) without a task: the reader calls
        *on_done* with the verdict, or the deadline does (then the executor gets a ``cancel``,
        as with `attempt`). None, with nothing sent, when the writer cannot take the frame now
        (the caller runs the attempt with a task). The caller checked `accepts` just before."""
        iid = envelope.instruction_id
        in_flight = self._in_flight
        frame = encode_frame(instruction_message(wire, traceparent=traceparent))
        if not self._writer.send_nowait(frame, cork=bool(in_flight)):
            return None
        pending = Pending(envelope, on_done, labels)
        pending.sent_at = time.monotonic()
        in_flight[iid] = pending
        self._host.recount(self)
        if len(in_flight) + len(self._unacked) + self._reserved >= self.slots:  # self.load
            self._host.changed()  # READY -> BUSY (wait_for_executor watchers)
        pending.timer = self._timers.call_at(
            pending.sent_at + envelope.timeout_ms / 1000, functools.partial(self._due, pending)
        )
        if self._host.trace:
            self._log.debug(
                "instruction_sent",
                executor_id=self.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                command_type=envelope.command_type.value,
                queued_ms=0,
            )
        return pending

    def abandon(self, pending: Pending) -> None:
        """An attempt without a task is no longer wanted (its turn was cancelled or lost):
        its slot stays taken until the executor answers the ``cancel`` sent now; its
        ``on_done`` is not called."""
        pending.on_done = None
        self._timers.cancel(pending.timer)
        iid = pending.envelope.instruction_id
        moved = self._in_flight.get(iid) is pending and not self.closed
        if moved:
            del self._in_flight[iid]
            self._unacked[iid] = pending
        self._host.recount(self)
        if moved and self._tg is not None:
            self._tg.start_soon(self._cancel_abandoned, pending)

    async def _cancel_abandoned(self, pending: Pending) -> None:
        with anyio.move_on_after(self._host.settings.cancel_grace_s, shield=True):
            await self._send_cancel(pending.envelope, reason="cancelled")

    def _due(self, pending: Pending) -> None:
        """An attempt's deadline passed: if it is still unanswered, time it out (a task: it
        sends the ``cancel`` and waits for its answer)."""
        in_flight = self._in_flight.get(pending.envelope.instruction_id) is pending
        if pending.verdict is None and in_flight and self._tg is not None:
            self._tg.start_soon(self._expire, pending)

    async def _expire(self, pending: Pending) -> None:
        # The answer may have been read between the timer's look and this task's start: then
        # the attempt is over and nothing is cancelled.
        if (
            pending.verdict is not None
            or self._in_flight.get(pending.envelope.instruction_id) is not pending
        ):
            return
        if pending.labels:  # the events of this deadline carry the turn's ids
            structlog.contextvars.bind_contextvars(**pending.labels)
        await self._time_out(pending, pending.sent_at)

    async def _time_out(self, pending: Pending, sent_at: float) -> None:
        envelope = pending.envelope
        iid = envelope.instruction_id
        pending.resolve(deadline_exceeded(envelope.timeout_ms))
        answered = pending.event = anyio.Event()  # now waits for the answer to the cancel
        self._in_flight.pop(iid, None)
        self._log.warning(
            "attempt_timed_out",
            executor_id=self.executor_id,
            instruction_id=iid,
            execution_id=envelope.execution_id,
            timeout_ms=envelope.timeout_ms,
            waited_ms=ms(time.monotonic() - sent_at),
            reason_code=HubReason.DEADLINE_EXCEEDED,
        )
        if self.closed:
            return
        self._unacked[iid] = pending  # its slot stays taken until the cancel is answered
        self._host.recount(self)
        grace = self._host.settings.cancel_grace_s
        with anyio.move_on_after(grace):
            await self._send_cancel(envelope, reason="deadline")
            await answered.wait()
        if self._unacked.get(iid) is pending and not self.closed:
            self._error_detail = (
                f"did not answer the cancel of {iid} within cancel_grace_s={grace:g}s"
            )
            self._log.warning(
                "executor_error",
                executor_id=self.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                detail=self._error_detail,
            )
            self._host.recount(self)
            self._host.changed()

    async def _send_cancel(self, envelope: ExecutorInstructionEnvelope, *, reason: str) -> None:
        iid = envelope.instruction_id
        try:
            await self._writer.send(
                encode_frame(Cancel(instruction_id=iid, reason=reason).to_wire())
            )
        except _LOST as exc:
            self.disconnect(HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
        else:
            self._log.info(
                "cancel_sent",
                executor_id=self.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                reason=reason,
            )

    # ------------------------------------------------------------------ frames in
    async def _read_loop(self, reader: FrameReader) -> tuple[str, str]:
        """Read frames until the connection ends; returns (reason code, detail)."""
        try:
            while True:
                body = await reader.read_body()
                self._last_rx = time.monotonic()
                try:
                    message = decode_executor_message(body)  # one step: typed and checked
                except MessageError as exc:
                    if exc.message_type == MessageType.HEARTBEAT:
                        continue  # a heartbeat only proves liveness, whatever it carries
                    if exc.message_type == MessageType.STATUS:
                        self._log.warning(
                            "status_rejected", executor_id=self.executor_id, reason=exc.reason
                        )
                        continue
                    detail = exc.reason
                    self._protocol_breach(detail)
                    return HubReason.PROTOCOL_ERROR, detail
                if isinstance(message, ResponseMessage):
                    self._on_response(message.response, message.evidence)
                elif isinstance(message, Status):
                    self._on_status(message)
                if self.closed:
                    return HubReason.EXECUTOR_QUARANTINED, "closed by the hub"
        except anyio.EndOfStream:
            return HubReason.EXECUTOR_DISCONNECTED, "the executor closed the connection"
        except FrameTruncated as exc:
            self._frame_error(exc)
            return HubReason.EXECUTOR_DISCONNECTED, exc.reason
        except (FrameTooLarge, FrameDecodeError) as exc:
            self._frame_error(exc)
            self._fail_in_flight(bad_frame(exc.reason))
            return HubReason.FRAME_ERROR, exc.reason
        except _LOST as exc:
            return HubReason.EXECUTOR_DISCONNECTED, f"connection lost: {exc!r}"

    def _frame_error(self, exc: FrameError) -> None:
        self._host.frame_error(
            exc,
            executor_id=self.executor_id,
            in_flight=[p.envelope.instruction_id for p in self._in_flight.values()],
            creds=self.creds,
        )

    def _protocol_breach(self, detail: str) -> None:
        self._log.warning(
            "response_rejected",
            executor_id=self.executor_id,
            detail=detail,
            reason_code=HubReason.PROTOCOL_ERROR,
        )
        self._fail_in_flight(protocol_breach(detail))

    def _on_status(self, status: Status) -> None:
        previous = self.status
        self._self_status = status.status
        self._host.recount(self)
        if self.status is not previous:
            self._log.info(
                "executor_status_changed",
                executor_id=self.executor_id,
                status=self.status.value,
                previous=previous.value,
                detail=status.detail,
            )
            self._host.changed()
        self._host.slot_freed(self)

    def _on_response(self, body: object, evidence: object = None) -> None:
        iid = body.get("instruction_id") if isinstance(body, dict) else None
        pending = self._in_flight.get(iid) if isinstance(iid, str) else None
        if pending is None:
            if isinstance(iid, str) and iid in self._unacked:
                self._late_response(self._unacked.pop(iid))
                return
            if isinstance(iid, str) and iid in self._recent:
                self._host.late_response()
                self._log.warning(
                    "late_response_dropped",
                    executor_id=self.executor_id,
                    instruction_id=iid,
                    after_cancel=False,
                    detail="a second answer to an instruction that already ended",
                )
                return
            count = len(self._in_flight)
            if count == 0:
                self._log.warning(
                    "response_rejected",
                    executor_id=self.executor_id,
                    instruction_id=str(iid)[:128] if iid is not None else None,
                    reason_code=HubReason.UNATTRIBUTABLE_RESPONSE,
                    detail="response while no instruction is in flight",
                )
                return
            if count > 1:
                verdict = unattributable(iid, count)
                self._log.warning(
                    "response_rejected",
                    executor_id=self.executor_id,
                    reason_code=HubReason.UNATTRIBUTABLE_RESPONSE,
                    detail=verdict.detail,
                )
                self._fail_in_flight(verdict)
                self.disconnect(HubReason.UNATTRIBUTABLE_RESPONSE, verdict.detail)
                return
            pending = next(iter(self._in_flight.values()))
        self._judge(pending, body, evidence)

    def _late_response(self, pending: Pending) -> None:
        """The answer to a cancelled attempt came: its slot is free again."""
        self._host.late_response()
        iid = pending.envelope.instruction_id
        self._recent.append(iid)
        self._log.warning(
            "late_response_dropped",
            executor_id=self.executor_id,
            instruction_id=iid,
            execution_id=pending.envelope.execution_id,
            after_cancel=True,
        )
        if pending.event is not None:
            pending.event.set()
        if self._error_detail and not self._unacked:
            self._error_detail = ""
            self._log.info("executor_recovered", executor_id=self.executor_id)
            self._host.changed()
        self._host.recount(self)
        self._host.slot_freed(self)

    def _judge(self, pending: Pending, body: object, evidence: object = None) -> None:
        envelope = pending.envelope
        iid = envelope.instruction_id
        started = _COSTS.clock()
        verdict = judge_response(envelope, body, evidence)
        _COSTS.add("judge", _COSTS.clock() - started)
        del self._in_flight[iid]
        self._timers.cancel(pending.timer)
        self._host.recount(self)
        self._recent.append(iid)
        if verdict.accepted:
            if self._host.trace:
                response = verdict.response
                self._log.debug(
                    "response_received",
                    executor_id=self.executor_id,
                    instruction_id=iid,
                    execution_id=envelope.execution_id,
                    response_type=response.response_type.value if response else None,
                )
        else:
            self._log.warning(
                "response_rejected",
                executor_id=self.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                reason_code=verdict.reason_code,
                detail=verdict.detail,
            )
        pending.resolve(verdict)
        if not verdict.accepted and verdict.breaches_security:  # allowed answers never breach
            self._quarantine(iid, verdict.detail)
        else:
            self._host.slot_freed(self)

    def _quarantine(self, iid: str, detail: str) -> None:
        self._host.quarantine(self.executor_id, self.creds)
        creds = self.creds
        self._log.warning(
            "executor_quarantined",
            executor_id=self.executor_id,
            instruction_id=iid,
            quarantine_s=self._host.settings.quarantine_s,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
            detail=detail,
        )
        self.disconnect(
            HubReason.EXECUTOR_QUARANTINED,
            f"quarantined after a security violation on {iid}",
        )
