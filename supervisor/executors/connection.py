"""One connected executor: its state, its slots, its attempts in flight and their answers.

A ``Connection`` is the hub's handle on one executor connection. It owns the executor's state
(its status, its slots and what takes them), the attempts in flight on it and the judging of
their answers, and composes three pieces apart from it:

* ``link.Link`` — the frames: the writer out, the read loop in, heartbeats and liveness;
* ``deadlines.Deadlines`` — the timer heap of the attempts without a task, and time-outs;
* ``cancels.Cancels`` — the attempts it no longer waits for: cancels sent and not yet answered,
  the ids that ended recently, and the responses that name no attempt in flight;

with ``pending.Pending`` the one attempt all of them hold. ``serve`` runs the writer, the
heartbeats, the deadline timers and the read loop in one task group. An attempt goes one of two
ways: ``attempt`` is run by the attempt's own task (it sends the instruction, waits for the
reader to resolve it, enforces the deadline and cancels); ``send_attempt`` takes it without a
task (the turn core's hot path): the reader calls the attempt's ``on_done``, its deadline waits
in the connection's timer heap, and only a deadline passed or an abandoned attempt starts a
task (to send the ``cancel`` and wait for its answer).
What the connection needs from the hub around it is ``host.ConnectionHost``. After every change
of its load (in flight, unanswered cancels, reserved slots) or of its status, a connection calls
``host.recount(self)``: the hub keeps running totals of free slots per command from these, so
nothing per turn has to look at every executor.

The in-flight table stays here, beside the status it gates, because both are read on every
turn (``load_if_accepting``, ``send_attempt``, the judging of an answer); what the pieces own
and the turn's path reads (the unanswered cancels, the recent ids, the writer) is bound once in
the constructor, so no step of a turn costs an extra hop.

Attribution of a response whose ``instruction_id`` is not one of the executor's in-flight
instructions: if it names an instruction that timed out or finished recently, it is a late
response (logged ``late_response_dropped``, ignored). Otherwise, if exactly one instruction is in
flight on that executor, the response is judged as that instruction's answer (so the safety rules
deny it: missing or mismatched id → INVALID_RESPONSE); with none in flight it is logged and
ignored; with several in flight it cannot be attributed, the connection is closed and every
in-flight attempt on it ends INVALID_RESPONSE.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

import anyio
import anyio.abc

from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorStatus,
)
from sandbox.policy.safety import instruction_to_wire
from supervisor.executors.cancels import RECENT_IDS, Cancels
from supervisor.executors.clock import ms, now_us
from supervisor.executors.deadlines import Deadlines
from supervisor.executors.host import ConnectionHost
from supervisor.executors.judge import Verdict, disconnected, judge_response
from supervisor.executors.link import Link
from supervisor.executors.log import EventLog
from supervisor.executors.peercred import PeerCredentials
from supervisor.executors.pending import Pending
from supervisor.executors.reports import ExecutorInfo, HubReason
from supervisor.stages import stage_costs
from supervisor.wire.executor import Status, instruction_message
from supervisor.wire.frames import FrameError, FrameReader, encode_frame

__all__ = ["RECENT_IDS", "Connection", "Pending"]

_COSTS: Final = stage_costs()

_LOST: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
_READY: Final = ExecutorStatus.READY  # an enum member lookup costs a call: once, here


class Connection:
    """A connected executor. Only its own methods change its state; others read it."""

    __slots__ = (
        "_cancels",
        "_deadlines",
        "_due",
        "_ending",
        "_error_detail",
        "_host",
        "_in_flight",
        "_link",
        "_log",
        "_remember",
        "_reserved",
        "_self_status",
        "_tg",
        "_timers",
        "_unanswered",
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
        self._host = host
        self._log = log
        self._link = Link(stream, owner=self, host=host, log=log)
        self._writer = self._link.writer
        self._cancels = Cancels(owner=self, host=host, writer=self._writer, log=log)
        self._deadlines = Deadlines(owner=self, after=self._cancels.after_deadline, log=log)
        self._in_flight: dict[str, Pending] = {}
        # Bound once, read on every turn: the cancelled attempts still taking a slot (read
        # only: `Cancels` changes them), and where a judged attempt's id is remembered.
        self._unanswered = self._cancels.unanswered
        self._remember = self._cancels.recent.append
        self._reserved = 0
        self._self_status = ExecutorStatus.READY
        self._error_detail = ""
        #: the connection is ending (its reader stopped, or it failed what was in flight): no
        #: instruction may be dispatched to it while its tasks wind down (it would end CRASH)
        self._ending = False
        self.closed = False
        self.close_reason = ""
        self.close_detail = ""
        self.connected_at_us = now_us()
        self._tg: anyio.abc.TaskGroup | None = None
        #: the deadlines of the attempts without a task (armed here, handled by `Deadlines`)
        self._timers = self._deadlines.timers
        self._due = self._deadlines.due

    # ------------------------------------------------------------------ state
    @property
    def load(self) -> int:
        """Slots taken: in flight, cancelled but unanswered, and handed to a queued attempt."""
        return len(self._in_flight) + len(self._unanswered) + self._reserved

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
        in_flight, unanswered = self._in_flight, self._unanswered
        load = len(in_flight) + len(unanswered) + self._reserved
        if load >= self.slots or instruction_id in in_flight or instruction_id in unanswered:
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

    def fault(self, detail: str) -> None:
        """A cancel went unanswered (``Cancels``): ERROR, with *detail*, until it is answered."""
        self._error_detail = detail
        self._host.recount(self)
        self._host.changed()

    def recover(self) -> None:
        """Every cancel is answered (``Cancels``): no longer ERROR, if it was."""
        if self._error_detail:
            self._error_detail = ""
            self._log.info("executor_recovered", executor_id=self.executor_id)
            self._host.changed()

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
            heartbeat_age_ms=ms(time.monotonic() - self._link.last_rx),
        )

    # ------------------------------------------------------------------ lifetime
    async def serve(self, reader: FrameReader) -> None:
        """Run the writer, heartbeats and reader until the connection ends; it is then closed."""
        reason, detail = HubReason.EXECUTOR_DISCONNECTED, "the executor closed the connection"
        link = self._link
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._writer.run)
                tg.start_soon(link.heartbeats)
                tg.start_soon(self._timers.run)
                reason, detail = await link.read(reader)
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
        self._cancels.release()
        self._in_flight.clear()
        self._host.recount(self)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        self._host.changed()

    def fail_in_flight(self, verdict: Verdict) -> None:
        """End what is in flight with *verdict*; the connection closes next (a bad frame, a
        protocol breach, an unattributable answer), so it takes nothing new meanwhile: else an
        instruction dispatched in between would end CRASH when it closes."""
        self._ending = True
        for pending in list(self._in_flight.values()):
            pending.resolve(verdict)
        self._in_flight.clear()
        self._host.recount(self)

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
        if len(in_flight) + len(self._unanswered) + self._reserved >= self.slots:  # self.load
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
                self._cancels.hold(pending)
            self._host.recount(self)
            if moved:
                await self._cancels.cancel(pending, "cancelled")
            raise
        if pending.verdict is None:
            await self._deadlines.time_out(pending, sent_at)
        verdict = pending.verdict
        if verdict is None:  # pragma: no cover - time_out always resolves
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
        if len(in_flight) + len(self._unanswered) + self._reserved >= self.slots:  # self.load
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
            self._cancels.hold(pending)
        self._host.recount(self)
        if moved and self._tg is not None:
            self._tg.start_soon(self._cancels.cancel, pending, "cancelled")

    def holds(self, pending: Pending) -> bool:
        """Whether *pending* is still in flight (`Deadlines`)."""
        return self._in_flight.get(pending.envelope.instruction_id) is pending

    def drop(self, instruction_id: str) -> None:
        """Take *instruction_id* out of the in-flight table: its deadline passed (`Deadlines`)."""
        self._in_flight.pop(instruction_id, None)

    def spawn(self, task: Callable[[Pending], Coroutine[Any, Any, None]], pending: Pending) -> None:
        """Run ``task(pending)`` in the connection's task group, while it serves."""
        if self._tg is not None:
            self._tg.start_soon(task, pending)

    # ------------------------------------------------------------------ messages in
    def frame_failed(self, exc: FrameError) -> None:
        """A frame could not be read (`Link`): the hub counts and logs it."""
        ids = [p.envelope.instruction_id for p in self._in_flight.values()]
        self._host.frame_error(exc, executor_id=self.executor_id, in_flight=ids, creds=self.creds)

    def status_received(self, status: Status) -> None:
        """The executor's own ``status`` (`Link`)."""
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

    def response_received(self, body: object, evidence: object = None) -> None:
        """A ``response`` (`Link`): attribute it (see the module docstring) and judge it."""
        iid = body.get("instruction_id") if isinstance(body, dict) else None
        pending = self._in_flight.get(iid) if isinstance(iid, str) else None
        if pending is None:
            if self._cancels.stray(iid, len(self._in_flight)):
                return
            pending = next(iter(self._in_flight.values()))
        self._judge(pending, body, evidence)

    def _judge(self, pending: Pending, body: object, evidence: object = None) -> None:
        envelope = pending.envelope
        iid = envelope.instruction_id
        started = _COSTS.clock()
        verdict = judge_response(envelope, body, evidence)
        _COSTS.add("judge", _COSTS.clock() - started)
        del self._in_flight[iid]
        self._timers.cancel(pending.timer)
        self._host.recount(self)
        self._remember(iid)
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
            self._host.quarantine(
                self.executor_id, self.creds, instruction_id=iid, detail=verdict.detail
            )
            self.disconnect(
                HubReason.EXECUTOR_QUARANTINED, f"quarantined after a security violation on {iid}"
            )
        else:
            self._host.slot_freed(self)
