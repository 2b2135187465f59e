"""The executor hub: registry of connected executors, dispatch, deadlines, response judging.

External executor processes connect to ``executors.sock`` and speak the protocol of
``docs/protocol.md``. ``ExecutorHub.run_attempt(envelope)`` runs ONE attempt of an instruction:
it waits (bounded) in the per-command queue until a READY executor that supports the command has
a free slot, sends the instruction, waits for the response until ``envelope.timeout_ms`` after
sending, judges the response with the Phase-20 safety rules and maps it to an ``AttemptOutcome``
(DESIGN.md "Executor responses"). Retrying is the scheduler's job.

Design notes (hot path):

* One reader task per connection resolves waiting attempts (an ``anyio.Event`` per attempt);
  the attempt's own task (the caller of ``run_attempt``) sends the frame and waits. No task is
  spawned per instruction.
* A frame goes out with one ``send`` under a per-connection lock; frames are read with a
  buffered ``FrameReader``.
* Per-frame events are logged at debug level; state transitions at info/warning.

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
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
import structlog

from sandbox.policy.attempts import AttemptOutcome, outcome_from_response
from sandbox.policy.envelopes import (
    ExecutorCommandType,
    ExecutorInstructionEnvelope,
    ExecutorResponseEnvelope,
    ExecutorStatus,
)
from sandbox.policy.faults import ExecutionFaultType
from sandbox.policy.safety import instruction_to_wire, validate_executor_response
from supervisor.errors import QueueFullError
from supervisor.executors.peercred import PeerCredentials, stream_peer_credentials
from supervisor.wire.executor import (
    PROTOCOL_VERSION,
    Cancel,
    Heartbeat,
    MessageError,
    MessageType,
    ProtocolError,
    Reject,
    RejectReason,
    ResponseMessage,
    Status,
    Welcome,
    decode_executor_message,
    decode_hello,
    instruction_message,
)
from supervisor.wire.frames import (
    FrameDecodeError,
    FrameError,
    FrameReader,
    FrameTooLarge,
    FrameTruncated,
    FrameWriter,
    decode_body,
    encode_frame,
)

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

_RECENT_IDS: Final = 64  # finished instruction ids remembered per connection (late answers)
_MAX_OFFLINE_RECORDS: Final = 4096
_REJECT_DRAIN_S: Final = 1.0


class HubReason:
    """``AttemptReport.safety_reason_code`` values for outcomes the hub decides itself.

    When the executor answered, the report carries the Phase-20 reason code of
    ``validate_executor_response`` instead (``RESPONSE_ACCEPTED``, ``SUCCESS_WITHOUT_EVIDENCE``...).
    """

    DEADLINE_EXCEEDED: Final = "DEADLINE_EXCEEDED"  # no answer by timeout_ms: TIMEOUT
    QUEUE_WAIT_EXPIRED: Final = "QUEUE_WAIT_EXPIRED"  # no executor free within queue_wait_s
    EXECUTOR_DISCONNECTED: Final = "EXECUTOR_DISCONNECTED"  # connection lost mid-instruction
    HEARTBEAT_LOST: Final = "HEARTBEAT_LOST"  # executor went silent: OFFLINE, CRASH
    FRAME_ERROR: Final = "FRAME_ERROR"  # oversized/undecodable frame instead of a response
    PROTOCOL_ERROR: Final = "PROTOCOL_ERROR"  # a well-framed message that breaks the protocol
    UNATTRIBUTABLE_RESPONSE: Final = "UNATTRIBUTABLE_RESPONSE"  # unknown id, several in flight
    EXECUTOR_QUARANTINED: Final = "EXECUTOR_QUARANTINED"  # another answer breached security
    HUB_CLOSED: Final = "HUB_CLOSED"  # the hub shut down while the attempt waited or ran


@dataclass(frozen=True, slots=True, kw_only=True)
class HubSettings:
    """Limits of the executor hub (the ``[executors]`` config section feeds these).

    ``allowed_uids``: peers (SO_PEERCRED) allowed to connect; ``None`` allows the daemon's own
    uid and root. ``queue_capacity`` bounds each command type's queue at admission.
    ``queue_wait_s`` bounds how long an attempt waits for a free executor (then TIMEOUT).
    ``cancel_grace_s``: how long an executor has to answer a ``cancel`` before it is marked
    ERROR. ``hello_timeout_s``: how long a new connection has to send ``hello``.
    """

    allowed_uids: frozenset[int] | None = None
    max_frame_bytes: int = 1_048_576
    heartbeat_interval_s: float = 5.0
    heartbeat_misses: int = 3
    queue_capacity: int = 1024
    queue_wait_s: float = 60.0
    quarantine_s: float = 300.0
    cancel_grace_s: float = 2.0
    hello_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        checks = {
            "max_frame_bytes": self.max_frame_bytes >= 1024,
            "heartbeat_interval_s": self.heartbeat_interval_s > 0,
            "heartbeat_misses": self.heartbeat_misses >= 1,
            "queue_capacity": self.queue_capacity >= 1,
            "queue_wait_s": self.queue_wait_s > 0,
            "quarantine_s": self.quarantine_s >= 0,
            "cancel_grace_s": self.cancel_grace_s > 0,
            "hello_timeout_s": self.hello_timeout_s > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"HubSettings.{name} is out of range: {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What one attempt came to. ``outcome`` follows DESIGN.md "Executor responses".

    ``executor_id`` is the executor the instruction was sent to (``None`` if it never left the
    queue); ``response`` the accepted response envelope (``None`` when denied or absent);
    ``safety_reason_code`` the Phase-20 reason code or a ``HubReason``; ``duration_ms`` runs from
    ``run_attempt`` being called to the outcome; ``queued_ms`` is the part spent in the queue.
    """

    outcome: AttemptOutcome
    executor_id: str | None
    response: ExecutorResponseEnvelope | None
    safety_reason_code: str
    duration_ms: int
    detail: str
    queued_ms: int = 0


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """A snapshot of one executor (connected, or recently disconnected: OFFLINE)."""

    executor_id: str
    status: ExecutorStatus
    commands: tuple[ExecutorCommandType, ...]
    slots: int
    in_flight: int
    uid: int | None
    pid: int | None
    connected_at_us: int
    quarantined_until_us: int | None
    software: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class HubStatistics:
    """Counters and gauges of the hub (``hunter status`` and logs use them)."""

    executors_connected: int
    executors_by_status: Mapping[str, int]
    queued_by_command: Mapping[str, int]
    in_flight: int
    attempts_started: int
    attempts_finished: int
    outcomes: Mapping[str, int]
    connections_rejected: int
    frame_errors: int
    late_responses: int
    quarantined: int


class _Pending:
    """One attempt in flight on a connection; resolved by the connection's reader."""

    __slots__ = (
        "cancelled",
        "conn",
        "detail",
        "envelope",
        "event",
        "outcome",
        "reason_code",
        "response",
    )

    def __init__(self, envelope: ExecutorInstructionEnvelope, conn: _Conn) -> None:
        self.envelope = envelope
        self.conn = conn
        self.event = anyio.Event()
        self.outcome: AttemptOutcome | None = None
        self.response: ExecutorResponseEnvelope | None = None
        self.reason_code = ""
        self.detail = ""
        self.cancelled = False

    def resolve(
        self,
        outcome: AttemptOutcome,
        reason_code: str,
        detail: str,
        response: ExecutorResponseEnvelope | None = None,
    ) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.reason_code = reason_code
            self.detail = detail
            self.response = response
        self.event.set()


class _Waiter:
    """An attempt waiting in a command queue for a free executor slot."""

    __slots__ = ("conn", "enqueued_at", "event", "instruction_id")

    def __init__(self, instruction_id: str, enqueued_at: float) -> None:
        self.instruction_id = instruction_id
        self.enqueued_at = enqueued_at
        self.event = anyio.Event()
        self.conn: _Conn | None = None


class _Conn:
    """A connected executor."""

    __slots__ = (
        "close_detail",
        "close_reason",
        "closed",
        "commands",
        "connected_at_us",
        "creds",
        "error_detail",
        "executor_id",
        "in_flight",
        "last_rx",
        "recent",
        "reserved",
        "scope",
        "self_status",
        "slots",
        "software",
        "stream",
        "unacked",
        "writer",
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
    ) -> None:
        self.executor_id = executor_id
        self.commands = commands
        self.slots = slots
        self.software = software
        self.creds = creds
        self.stream = stream
        self.writer = FrameWriter(stream)
        self.in_flight: dict[str, _Pending] = {}
        self.unacked: dict[str, _Pending] = {}  # cancelled, answer (ack) not yet received
        self.recent: collections.deque[str] = collections.deque(maxlen=_RECENT_IDS)
        self.reserved = 0
        self.self_status = ExecutorStatus.READY
        self.error_detail = ""
        self.closed = False
        self.close_reason = ""
        self.close_detail = ""
        self.last_rx = time.monotonic()
        self.connected_at_us = time.time_ns() // 1000
        self.scope: anyio.CancelScope | None = None

    @property
    def load(self) -> int:
        return len(self.in_flight) + len(self.unacked) + self.reserved

    @property
    def status(self) -> ExecutorStatus:
        if self.closed:
            return ExecutorStatus.OFFLINE
        if self.error_detail or self.self_status is ExecutorStatus.ERROR:
            return ExecutorStatus.ERROR
        if self.self_status is not ExecutorStatus.READY or self.load >= self.slots:
            return ExecutorStatus.BUSY
        return ExecutorStatus.READY

    def accepts(self, instruction_id: str) -> bool:
        """READY with a free slot, and not still holding this instruction id."""
        return (
            not self.closed
            and not self.error_detail
            and self.self_status is ExecutorStatus.READY
            and self.load < self.slots
            and instruction_id not in self.in_flight
            and instruction_id not in self.unacked
        )

    async def send(self, data: bytes, *, cork: bool | None = None) -> None:
        await self.writer.send(data, cork=cork)


def _now_us() -> int:
    return time.time_ns() // 1000


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


async def open_executor_listener(
    path: str | os.PathLike[str], *, mode: int = 0o660
) -> anyio.abc.SocketListener:
    """Create the Unix listener for ``executors.sock`` with ``mode`` (0660 by default).

    A stale socket file (nobody accepting on it) is removed first; a live one raises
    ``OSError`` (another daemon owns it).
    """
    target = os.fspath(path)
    if os.path.exists(target):  # noqa: ASYNC240 - one stat at startup, not on a hot path
        try:
            probe = await anyio.connect_unix(target)
        except OSError:
            os.unlink(target)
        else:
            await probe.aclose()
            raise OSError(f"{target} is in use by a running daemon")
    return await anyio.create_unix_listener(target, mode=mode)


class ExecutorHub:
    """Registry of connected executors plus per-command queues; see the module docstring."""

    def __init__(self, *, settings: HubSettings, log: Any = None) -> None:
        self._log = log if log is not None else structlog.get_logger("supervisor.executors.hub")
        self.settings = settings
        self._conns: dict[str, _Conn] = {}
        self._by_command: dict[ExecutorCommandType, list[_Conn]] = {
            c: [] for c in ExecutorCommandType
        }
        self._queues: dict[ExecutorCommandType, collections.deque[_Waiter]] = {
            c: collections.deque() for c in ExecutorCommandType
        }
        self._offline: collections.OrderedDict[str, ExecutorInfo] = collections.OrderedDict()
        self._quarantine: dict[str, float] = {}  # executor id -> monotonic deadline
        self._quarantine_peers: dict[tuple[int, int], float] = {}  # (uid, pid) -> deadline
        self._changed = anyio.Event()
        self._idle = anyio.Event()
        self._closing = False
        self._serve_scope: anyio.CancelScope | None = None
        self._avg_attempt_s: dict[ExecutorCommandType, float] = {}
        # counters
        self._attempts_started = 0
        self._attempts_finished = 0
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._rejected = 0
        self._frame_errors = 0
        self._late = 0
        self._quarantined_total = 0
        self._active_attempts = 0

    # ------------------------------------------------------------------ public surface
    @property
    def settings(self) -> HubSettings:
        """The limits in force; assigning new settings (SIGHUP reload) applies them to new
        connections and attempts (frame limits of open connections stay as welcomed)."""
        return self._settings

    @settings.setter
    def settings(self, settings: HubSettings) -> None:
        self._settings = settings
        self._allowed_uids = (
            settings.allowed_uids
            if settings.allowed_uids is not None
            else frozenset({os.getuid(), 0})
        )
        self._frame_max = settings.max_frame_bytes
        # Per-frame debug events cost a processor chain each; emit them only when the
        # configured level (mirrored on the stdlib root logger) lets them through.
        self._trace = logging.getLogger().isEnabledFor(logging.DEBUG)

    async def serve(
        self,
        listener: anyio.abc.Listener[anyio.abc.SocketStream],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept executor connections until ``aclose()`` (or cancellation); one task each."""
        async with anyio.create_task_group() as tg:
            self._serve_scope = tg.cancel_scope
            task_status.started()
            await listener.serve(self._handle_connection, task_group=tg)

    def admit(self, command_type: ExecutorCommandType) -> None:
        """Raise ``QueueFullError`` if ``command_type``'s queue is at capacity (backpressure).

        Intake calls this before accepting a turn; ``run_attempt`` itself never drops work.
        """
        queued = len(self._queues[command_type])
        capacity = self.settings.queue_capacity
        if queued >= capacity:
            slots = sum(c.slots for c in self._by_command[command_type] if not c.closed)
            per_attempt = self._avg_attempt_s.get(command_type, 1.0)
            retry_s = per_attempt * (queued - capacity + 1) / max(1, slots)
            retry_after_ms = min(60_000, max(100, _ms(retry_s)))
            raise QueueFullError(command_type, capacity, retry_after_ms)

    async def run_attempt(self, envelope: ExecutorInstructionEnvelope) -> AttemptReport:
        """Run one attempt of ``envelope`` on some executor and report its outcome.

        Never raises for executor misbehaviour: every such case is an outcome. Returns after the
        response, or after the deadline once the executor answered the ``cancel`` (or
        ``cancel_grace_s`` passed, in which case the executor is marked ERROR).
        """
        started = time.monotonic()
        self._attempts_started += 1
        self._active_attempts += 1
        try:
            report = await self._run_attempt(envelope, started)
        finally:
            self._active_attempts -= 1
            if self._active_attempts == 0:
                self._idle.set()
        self._attempts_finished += 1
        outcome = report.outcome
        key = outcome.fault_type.value if outcome.fault_type is not None else outcome.kind.value
        self._outcomes[key] += 1
        return report

    def statistics(self) -> HubStatistics:
        """A snapshot of the hub's counters and gauges."""
        by_status: collections.Counter[str] = collections.Counter(
            c.status.value for c in self._conns.values()
        )
        if self._offline:
            by_status[ExecutorStatus.OFFLINE.value] += len(self._offline)
        now = time.monotonic()
        return HubStatistics(
            executors_connected=len(self._conns),
            executors_by_status=dict(by_status),
            queued_by_command={c.value: len(q) for c, q in self._queues.items() if q},
            in_flight=sum(len(c.in_flight) for c in self._conns.values()),
            attempts_started=self._attempts_started,
            attempts_finished=self._attempts_finished,
            outcomes=dict(self._outcomes),
            connections_rejected=self._rejected,
            frame_errors=self._frame_errors,
            late_responses=self._late,
            quarantined=sum(1 for until in self._quarantine.values() if until > now),
        )

    def list_executors(self) -> list[ExecutorInfo]:
        """Connected executors (READY/BUSY/ERROR) then recently disconnected ones (OFFLINE)."""
        infos = [self._info(c) for c in self._conns.values()]
        infos.extend(i for i in self._offline.values() if i.executor_id not in self._conns)
        return infos

    def executor(self, executor_id: str) -> ExecutorInfo | None:
        """The snapshot of one executor, or ``None`` if the hub never saw it."""
        conn = self._conns.get(executor_id)
        if conn is not None:
            return self._info(conn)
        return self._offline.get(executor_id)

    async def wait_for_executor(
        self, executor_id: str, *, status: ExecutorStatus | None = ExecutorStatus.READY
    ) -> ExecutorInfo:
        """Wait until ``executor_id`` is known with ``status`` (any status if ``None``)."""
        while True:
            info = self.executor(executor_id)
            if info is not None and (status is None or info.status is status):
                return info
            await self._changed.wait()

    async def drain(self) -> None:
        """Wait until no attempt is running (the caller stops submitting first).

        Executors stay connected and queued attempts are still dispatched; bound the wait with
        a cancel scope (the daemon's drain grace) and then call ``aclose()``.
        """
        while self._active_attempts:
            self._idle = anyio.Event()
            await self._idle.wait()

    async def aclose(self) -> None:
        """Close every connection (in-flight attempts end CRASH) and stop serving."""
        self._closing = True
        for conn in list(self._conns.values()):
            self._disconnect(conn, HubReason.HUB_CLOSED, "the hub is shutting down")
        for queue in self._queues.values():
            for waiter in queue:
                waiter.event.set()
            queue.clear()
        if self._serve_scope is not None:
            self._serve_scope.cancel()
        await anyio.lowlevel.checkpoint()

    # ------------------------------------------------------------------ attempts
    async def _run_attempt(
        self, envelope: ExecutorInstructionEnvelope, started: float
    ) -> AttemptReport:
        command = envelope.command_type
        iid = envelope.instruction_id
        conn = None if self._closing else self._pick(command, iid)
        queued_s = 0.0
        if conn is None and not self._closing:
            conn = await self._wait_in_queue(command, iid)
            queued_s = time.monotonic() - started
        if conn is None:
            if self._is_closing():
                detail = "the executor hub closed before the instruction was sent"
                outcome = AttemptOutcome.fault(ExecutionFaultType.CRASH, detail)
                reason = HubReason.HUB_CLOSED
                event = "attempt_dropped"
            else:
                detail = self._queue_timeout_detail(command)
                outcome = AttemptOutcome.fault(ExecutionFaultType.TIMEOUT, detail)
                reason = HubReason.QUEUE_WAIT_EXPIRED
                event = "attempt_timed_out"
            self._log.warning(
                event,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                executor_id=None,
                command_type=command.value,
                queued_ms=_ms(queued_s),
                reason_code=reason,
                detail=detail,
            )
            return self._report(
                outcome, None, reason, started=started, detail=detail, queued_s=queued_s
            )
        report = await self._attempt_on(conn, envelope, started, queued_s)
        duration = time.monotonic() - started
        previous = self._avg_attempt_s.get(command, duration)
        self._avg_attempt_s[command] = previous * 0.9 + duration * 0.1
        return report

    def _is_closing(self) -> bool:
        return self._closing

    def _pick(self, command: ExecutorCommandType, instruction_id: str) -> _Conn | None:
        """Least-loaded READY executor with a free slot for ``command`` (in-flight ÷ slots;
        ties go to the first registered). Inlined ``_Conn.accepts``: this is the hot path."""
        best: _Conn | None = None
        best_ratio = 2.0
        ready = ExecutorStatus.READY
        for conn in self._by_command[command]:
            if conn.closed or conn.error_detail or conn.self_status is not ready:
                continue
            in_flight, unacked = conn.in_flight, conn.unacked
            load = len(in_flight) + len(unacked) + conn.reserved
            if load >= conn.slots or instruction_id in in_flight or instruction_id in unacked:
                continue
            ratio = load / conn.slots
            if ratio < best_ratio:
                best, best_ratio = conn, ratio
                if load == 0:
                    break
        return best

    async def _wait_in_queue(self, command: ExecutorCommandType, iid: str) -> _Conn | None:
        """Wait (bounded by ``queue_wait_s``) until a slot is handed over; ``None`` if not."""
        queue = self._queues[command]
        deadline = anyio.current_time() + self.settings.queue_wait_s
        while True:
            waiter = _Waiter(iid, time.monotonic())
            queue.append(waiter)
            try:
                with anyio.CancelScope(deadline=deadline):
                    await waiter.event.wait()
            except BaseException:
                self._abandon(queue, waiter)
                raise
            conn = waiter.conn
            if conn is None:
                self._abandon(queue, waiter)
                return None
            conn.reserved -= 1
            if not conn.closed:
                return conn
            # The executor went away between the hand-over and now: look again.
            conn = self._pick(command, iid)
            if conn is not None:
                return conn

    def _abandon(self, queue: collections.deque[_Waiter], waiter: _Waiter) -> None:
        if waiter.conn is None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
        else:  # a slot was handed over but will not be used: pass it on
            conn, waiter.conn = waiter.conn, None
            conn.reserved -= 1
            self._slot_freed(conn)

    def _queue_timeout_detail(self, command: ExecutorCommandType) -> str:
        conns = [c for c in self._by_command[command] if not c.closed]
        limit = self.settings.queue_wait_s
        if not conns:
            return (
                f"no executor supporting {command.value} was connected within "
                f"queue_wait_s={limit:g}s"
            )
        return (
            f"no {command.value} executor had a free slot within queue_wait_s={limit:g}s "
            f"({len(conns)} connected, statuses: "
            f"{', '.join(sorted({c.status.value for c in conns}))})"
        )

    async def _attempt_on(
        self,
        conn: _Conn,
        envelope: ExecutorInstructionEnvelope,
        started: float,
        queued_s: float,
    ) -> AttemptReport:
        iid = envelope.instruction_id
        pending = _Pending(envelope, conn)
        conn.in_flight[iid] = pending
        if conn.load >= conn.slots:
            self._notify()  # READY -> BUSY (wait_for_executor watchers)
        frame = encode_frame(instruction_message(instruction_to_wire(envelope)))
        sent_at = time.monotonic()
        deadline = anyio.current_time() + envelope.timeout_ms / 1000
        if self._trace:
            self._log.debug(
                "instruction_sent",
                executor_id=conn.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                command_type=envelope.command_type.value,
                queued_ms=_ms(queued_s),
            )
        try:
            with anyio.CancelScope(deadline=deadline):
                try:
                    # Several in flight: more frames follow this loop pass, batch them.
                    await conn.send(frame, cork=len(conn.in_flight) > 1)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self._disconnect(conn, HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
                await pending.event.wait()
        except BaseException:
            # Cancelled from outside (shutdown, turn cancelled): tell the executor, so its slot
            # is freed by its answer like after a deadline; the answer is dropped as late.
            if conn.in_flight.pop(iid, None) is pending:
                pending.cancelled = True
                if not conn.closed:
                    conn.unacked[iid] = pending
                    with anyio.move_on_after(self.settings.cancel_grace_s, shield=True):
                        await self._send_cancel(conn, envelope, reason="cancelled")
            raise
        if pending.outcome is None:
            await self._time_out(conn, pending, sent_at)
        if pending.outcome is None:  # pragma: no cover - _time_out always resolves
            raise AssertionError("attempt left unresolved")
        return self._report(
            pending.outcome,
            conn.executor_id,
            pending.reason_code,
            started=started,
            detail=pending.detail,
            queued_s=queued_s,
            response=pending.response,
        )

    async def _time_out(self, conn: _Conn, pending: _Pending, sent_at: float) -> None:
        envelope = pending.envelope
        iid = envelope.instruction_id
        detail = f"no response within timeout_ms={envelope.timeout_ms}"
        pending.resolve(
            AttemptOutcome.fault(ExecutionFaultType.TIMEOUT, detail),
            HubReason.DEADLINE_EXCEEDED,
            detail,
        )
        pending.event = anyio.Event()  # now waits for the answer to the cancel
        pending.cancelled = True
        conn.in_flight.pop(iid, None)
        self._log.warning(
            "attempt_timed_out",
            executor_id=conn.executor_id,
            instruction_id=iid,
            execution_id=envelope.execution_id,
            timeout_ms=envelope.timeout_ms,
            waited_ms=_ms(time.monotonic() - sent_at),
            reason_code=HubReason.DEADLINE_EXCEEDED,
        )
        if conn.closed:
            return
        conn.unacked[iid] = pending
        grace = self.settings.cancel_grace_s
        with anyio.move_on_after(grace):
            await self._send_cancel(conn, envelope, reason="deadline")
            await pending.event.wait()
        if conn.unacked.get(iid) is pending and not conn.closed:
            conn.error_detail = (
                f"did not answer the cancel of {iid} within cancel_grace_s={grace:g}s"
            )
            self._log.warning(
                "executor_error",
                executor_id=conn.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                detail=conn.error_detail,
            )
            self._notify()

    async def _send_cancel(
        self, conn: _Conn, envelope: ExecutorInstructionEnvelope, *, reason: str
    ) -> None:
        iid = envelope.instruction_id
        try:
            await conn.send(encode_frame(Cancel(instruction_id=iid, reason=reason).to_wire()))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._disconnect(conn, HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
        else:
            self._log.info(
                "cancel_sent",
                executor_id=conn.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                reason=reason,
            )

    def _report(
        self,
        outcome: AttemptOutcome,
        executor_id: str | None,
        reason_code: str,
        *,
        started: float,
        detail: str,
        queued_s: float = 0.0,
        response: ExecutorResponseEnvelope | None = None,
    ) -> AttemptReport:
        return AttemptReport(
            outcome=outcome,
            executor_id=executor_id,
            response=response,
            safety_reason_code=reason_code,
            duration_ms=_ms(time.monotonic() - started),
            detail=detail,
            queued_ms=_ms(queued_s),
        )

    # ------------------------------------------------------------------ slots and dispatch
    def _slot_freed(self, conn: _Conn) -> None:
        """Hand free slots of ``conn`` to the oldest waiters of the commands it supports."""
        if conn.load == conn.slots - 1:
            self._notify()  # BUSY -> READY (wait_for_executor watchers)
        while not conn.closed and conn.load < conn.slots:
            best: _Waiter | None = None
            best_queue: collections.deque[_Waiter] | None = None
            for command in conn.commands:
                queue = self._queues[command]
                for waiter in queue:
                    if conn.accepts(waiter.instruction_id):
                        if best is None or waiter.enqueued_at < best.enqueued_at:
                            best, best_queue = waiter, queue
                        break
            if best is None or best_queue is None:
                return
            best_queue.remove(best)
            best.conn = conn
            conn.reserved += 1
            best.event.set()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # ------------------------------------------------------------------ connections
    async def _handle_connection(self, stream: anyio.abc.SocketStream) -> None:
        try:
            async with stream:
                await self._connection(stream)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._log.info("connection_lost", detail=repr(exc))
        except Exception:  # one broken connection must never take the hub down
            self._log.exception("connection_failed")

    async def _reject(
        self,
        stream: anyio.abc.SocketStream,
        reject: Reject,
        *,
        executor_id: str | None,
        creds: PeerCredentials | None,
    ) -> None:
        self._rejected += 1
        self._log.warning(
            "executor_rejected",
            executor_id=executor_id,
            reason_code=reject.reason_code,
            reason=reject.reason,
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
        )
        try:
            await stream.send(encode_frame(reject.to_wire()))
            await stream.send_eof()
            # Read until the peer closes so it sees the reject (no RST), but not for long.
            with anyio.move_on_after(_REJECT_DRAIN_S):
                while True:
                    await stream.receive(65_536)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        creds = stream_peer_credentials(stream)
        if creds is not None and creds.uid not in self._allowed_uids:
            await self._reject(
                stream,
                Reject(
                    RejectReason.UID_NOT_ALLOWED,
                    f"uid {creds.uid} is not allowed to connect as an executor",
                ),
                executor_id=None,
                creds=creds,
            )
            return
        if self._closing:
            await self._reject(
                stream,
                Reject(RejectReason.HUB_CLOSING, "the daemon is shutting down", 1000),
                executor_id=None,
                creds=creds,
            )
            return
        reader = FrameReader(stream, max_bytes=self._frame_max)
        try:
            with anyio.fail_after(self.settings.hello_timeout_s):
                body = await reader.read_body()
            hello = decode_hello(body)  # one step: a hello that decodes is valid
        except TimeoutError:
            await self._reject(
                stream,
                Reject(
                    RejectReason.HELLO_TIMEOUT,
                    f"no hello within {self.settings.hello_timeout_s:g}s",
                ),
                executor_id=None,
                creds=creds,
            )
            return
        except anyio.EndOfStream:
            return
        except FrameError as exc:
            self._frame_error(None, exc, creds)
            # docs/protocol.md: a first frame that is not a hello is answered with a reject.
            await self._reject(
                stream,
                Reject(RejectReason.BAD_MESSAGE, f"the first frame must be a hello: {exc}"),
                executor_id=None,
                creds=creds,
            )
            return
        except ProtocolError as exc:
            executor_id = decode_body(body).get("executor_id")  # a JSON object: it got this far
            await self._reject(
                stream,
                Reject(exc.reason_code, exc.reason),
                executor_id=executor_id if isinstance(executor_id, str) else None,
                creds=creds,
            )
            return
        now = time.monotonic()
        until = self._quarantine.get(hello.executor_id, 0.0)
        if creds is not None:
            until = max(until, self._quarantine_peers.get((creds.uid, creds.pid), 0.0))
        if until > now:
            await self._reject(
                stream,
                Reject(
                    RejectReason.QUARANTINED,
                    f"executor {hello.executor_id} is quarantined for a security violation",
                    _ms(until - now),
                ),
                executor_id=hello.executor_id,
                creds=creds,
            )
            return
        if hello.executor_id in self._conns:
            await self._reject(
                stream,
                Reject(
                    RejectReason.DUPLICATE_EXECUTOR_ID,
                    f"an executor with id {hello.executor_id} is already connected",
                    _ms(self.settings.heartbeat_interval_s * self.settings.heartbeat_misses),
                ),
                executor_id=hello.executor_id,
                creds=creds,
            )
            return
        conn = _Conn(
            executor_id=hello.executor_id,
            commands=hello.commands,
            slots=hello.slots,
            software=hello.software,
            creds=creds,
            stream=stream,
        )
        welcome = Welcome(
            executor_id=hello.executor_id,
            protocol_version=PROTOCOL_VERSION,
            heartbeat_interval_ms=_ms(self.settings.heartbeat_interval_s),
            heartbeat_misses=self.settings.heartbeat_misses,
            max_frame_bytes=self._frame_max,
        )
        await stream.send(encode_frame(welcome.to_wire()))
        self._register(conn)
        reason, detail = HubReason.EXECUTOR_DISCONNECTED, "the executor closed the connection"
        try:
            async with anyio.create_task_group() as tg:
                conn.scope = tg.cancel_scope
                tg.start_soon(conn.writer.run)
                tg.start_soon(self._heartbeats, conn)
                reason, detail = await self._read_loop(conn, reader)
                tg.cancel_scope.cancel()
        finally:
            self._disconnect(conn, reason, detail)
            self._unregister(conn, conn.close_reason, conn.close_detail)

    def _register(self, conn: _Conn) -> None:
        self._conns[conn.executor_id] = conn
        self._offline.pop(conn.executor_id, None)
        for command in conn.commands:
            self._by_command[command].append(conn)
        self._log.info(
            "executor_connected",
            executor_id=conn.executor_id,
            commands=[c.value for c in conn.commands],
            slots=conn.slots,
            uid=conn.creds.uid if conn.creds else None,
            pid=conn.creds.pid if conn.creds else None,
            software=conn.software,
        )
        self._notify()
        self._slot_freed(conn)

    def _unregister(self, conn: _Conn, reason: str, detail: str) -> None:
        if self._conns.get(conn.executor_id) is conn:
            del self._conns[conn.executor_id]
        for command in conn.commands:
            members = self._by_command[command]
            if conn in members:
                members.remove(conn)
        self._offline[conn.executor_id] = self._info(conn, detail=detail)
        while len(self._offline) > _MAX_OFFLINE_RECORDS:
            self._offline.popitem(last=False)
        self._log.info(
            "executor_disconnected",
            executor_id=conn.executor_id,
            reason_code=reason,
            detail=detail,
            connected_ms=(_now_us() - conn.connected_at_us) // 1000,
        )
        self._notify()

    def _disconnect(self, conn: _Conn, reason: str, detail: str) -> None:
        """Mark ``conn`` OFFLINE, end its in-flight attempts CRASH and stop its tasks."""
        if conn.closed:
            return
        conn.closed = True
        conn.close_reason, conn.close_detail = reason, detail
        message = f"executor {conn.executor_id} disconnected mid-instruction: {detail}"
        for pending in list(conn.in_flight.values()):
            pending.resolve(
                AttemptOutcome.fault(ExecutionFaultType.CRASH, message), reason, message
            )
        for pending in list(conn.unacked.values()):
            pending.event.set()
        conn.in_flight.clear()
        conn.unacked.clear()
        if conn.scope is not None:
            conn.scope.cancel()
        self._notify()

    def _fail_in_flight(
        self, conn: _Conn, fault: ExecutionFaultType, reason: str, detail: str
    ) -> None:
        for pending in list(conn.in_flight.values()):
            pending.resolve(AttemptOutcome.fault(fault, detail), reason, detail)
        conn.in_flight.clear()

    async def _heartbeats(self, conn: _Conn) -> None:
        interval = self.settings.heartbeat_interval_s
        limit = interval * self.settings.heartbeat_misses
        while True:
            await anyio.sleep(interval)
            silent = time.monotonic() - conn.last_rx
            if silent > limit:
                self._log.warning(
                    "heartbeat_missed",
                    executor_id=conn.executor_id,
                    silent_ms=_ms(silent),
                    limit_ms=_ms(limit),
                    in_flight=len(conn.in_flight),
                )
                self._disconnect(
                    conn,
                    HubReason.HEARTBEAT_LOST,
                    f"no frame for {silent:.1f}s (limit {limit:g}s): executor OFFLINE",
                )
                return
            try:
                with anyio.move_on_after(limit):
                    await conn.send(encode_frame(Heartbeat(ts_us=_now_us()).to_wire()))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._disconnect(conn, HubReason.EXECUTOR_DISCONNECTED, f"send failed: {exc!r}")
                return

    async def _read_loop(self, conn: _Conn, reader: FrameReader) -> tuple[str, str]:
        """Read frames until the connection ends; returns (reason code, detail)."""
        try:
            while True:
                body = await reader.read_body()
                conn.last_rx = time.monotonic()
                try:
                    message = decode_executor_message(body)  # one step: typed and checked
                except MessageError as exc:
                    if exc.message_type == MessageType.HEARTBEAT:
                        continue  # a heartbeat only proves liveness, whatever it carries
                    if exc.message_type == MessageType.STATUS:
                        self._log.warning(
                            "status_rejected", executor_id=conn.executor_id, reason=exc.reason
                        )
                        continue
                    detail = exc.reason
                    self._protocol_breach(conn, detail)
                    return HubReason.PROTOCOL_ERROR, detail
                if isinstance(message, ResponseMessage):
                    self._on_response(conn, message.response)
                elif isinstance(message, Status):
                    self._on_status(conn, message)
                if conn.closed:
                    return HubReason.EXECUTOR_QUARANTINED, "closed by the hub"
        except anyio.EndOfStream:
            return HubReason.EXECUTOR_DISCONNECTED, "the executor closed the connection"
        except FrameTruncated as exc:
            self._frame_error(conn, exc, conn.creds)
            return HubReason.EXECUTOR_DISCONNECTED, exc.reason
        except (FrameTooLarge, FrameDecodeError) as exc:
            self._frame_error(conn, exc, conn.creds)
            detail = f"bad frame instead of a response: {exc.reason}"
            self._fail_in_flight(
                conn, ExecutionFaultType.INVALID_RESPONSE, HubReason.FRAME_ERROR, detail
            )
            return HubReason.FRAME_ERROR, exc.reason
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            return HubReason.EXECUTOR_DISCONNECTED, f"connection lost: {exc!r}"

    def _frame_error(
        self, conn: _Conn | None, exc: FrameError, creds: PeerCredentials | None
    ) -> None:
        self._frame_errors += 1
        self._log.warning(
            "frame_error",
            executor_id=conn.executor_id if conn else None,
            error=type(exc).__name__,
            reason=exc.reason,
            in_flight=[p.envelope.instruction_id for p in conn.in_flight.values()] if conn else [],
            uid=creds.uid if creds else None,
            pid=creds.pid if creds else None,
        )

    def _protocol_breach(self, conn: _Conn, detail: str) -> None:
        self._log.warning(
            "response_rejected",
            executor_id=conn.executor_id,
            detail=detail,
            reason_code=HubReason.PROTOCOL_ERROR,
        )
        self._fail_in_flight(
            conn, ExecutionFaultType.INVALID_RESPONSE, HubReason.PROTOCOL_ERROR, detail
        )

    def _on_status(self, conn: _Conn, status: Status) -> None:
        previous = conn.status
        conn.self_status = status.status
        if conn.status is not previous:
            self._log.info(
                "executor_status_changed",
                executor_id=conn.executor_id,
                status=conn.status.value,
                previous=previous.value,
                detail=status.detail,
            )
            self._notify()
        self._slot_freed(conn)

    def _on_response(self, conn: _Conn, body: object) -> None:
        iid = body.get("instruction_id") if isinstance(body, dict) else None
        pending = conn.in_flight.get(iid) if isinstance(iid, str) else None
        if pending is None:
            if isinstance(iid, str) and iid in conn.unacked:
                self._late_response(conn, conn.unacked.pop(iid), after_cancel=True)
                return
            if isinstance(iid, str) and iid in conn.recent:
                self._late += 1
                self._log.warning(
                    "late_response_dropped",
                    executor_id=conn.executor_id,
                    instruction_id=iid,
                    after_cancel=False,
                    detail="a second answer to an instruction that already ended",
                )
                return
            count = len(conn.in_flight)
            if count == 0:
                self._log.warning(
                    "response_rejected",
                    executor_id=conn.executor_id,
                    instruction_id=str(iid)[:128] if iid is not None else None,
                    reason_code=HubReason.UNATTRIBUTABLE_RESPONSE,
                    detail="response while no instruction is in flight",
                )
                return
            if count > 1:
                detail = (
                    f"response names instruction {str(iid)[:128]!r}, which is not one of the "
                    f"{count} in flight on this executor"
                )
                self._log.warning(
                    "response_rejected",
                    executor_id=conn.executor_id,
                    reason_code=HubReason.UNATTRIBUTABLE_RESPONSE,
                    detail=detail,
                )
                self._fail_in_flight(
                    conn,
                    ExecutionFaultType.INVALID_RESPONSE,
                    HubReason.UNATTRIBUTABLE_RESPONSE,
                    detail,
                )
                self._disconnect(conn, HubReason.UNATTRIBUTABLE_RESPONSE, detail)
                return
            pending = next(iter(conn.in_flight.values()))
        self._judge(conn, pending, body)

    def _late_response(self, conn: _Conn, pending: _Pending, *, after_cancel: bool) -> None:
        self._late += 1
        iid = pending.envelope.instruction_id
        conn.recent.append(iid)
        self._log.warning(
            "late_response_dropped",
            executor_id=conn.executor_id,
            instruction_id=iid,
            execution_id=pending.envelope.execution_id,
            after_cancel=after_cancel,
        )
        pending.event.set()
        if conn.error_detail and not conn.unacked:
            conn.error_detail = ""
            self._log.info("executor_recovered", executor_id=conn.executor_id)
            self._notify()
        self._slot_freed(conn)

    def _judge(self, conn: _Conn, pending: _Pending, body: object) -> None:
        envelope = pending.envelope
        iid = envelope.instruction_id
        result = validate_executor_response(envelope, body)
        outcome = outcome_from_response(result)
        del conn.in_flight[iid]
        conn.recent.append(iid)
        if result.allowed:
            if self._trace:
                self._log.debug(
                    "response_received",
                    executor_id=conn.executor_id,
                    instruction_id=iid,
                    execution_id=envelope.execution_id,
                    response_type=result.response.response_type.value if result.response else None,
                )
        else:
            self._log.warning(
                "response_rejected",
                executor_id=conn.executor_id,
                instruction_id=iid,
                execution_id=envelope.execution_id,
                reason_code=result.reason_code,
                detail=result.reason_description,
            )
        pending.resolve(outcome, result.reason_code, result.reason_description, result.response)
        if outcome.fault_type is ExecutionFaultType.SECURITY_VIOLATION:
            self._quarantine_conn(conn, iid, result.reason_description)
        else:
            self._slot_freed(conn)

    def _quarantine_conn(self, conn: _Conn, iid: str, detail: str) -> None:
        now = time.monotonic()
        self._quarantine = {k: t for k, t in self._quarantine.items() if t > now}
        self._quarantine_peers = {k: t for k, t in self._quarantine_peers.items() if t > now}
        until = now + self.settings.quarantine_s
        self._quarantine[conn.executor_id] = until
        if conn.creds is not None:
            self._quarantine_peers[(conn.creds.uid, conn.creds.pid)] = until
        self._quarantined_total += 1
        self._log.warning(
            "executor_quarantined",
            executor_id=conn.executor_id,
            instruction_id=iid,
            quarantine_s=self.settings.quarantine_s,
            uid=conn.creds.uid if conn.creds else None,
            pid=conn.creds.pid if conn.creds else None,
            detail=detail,
        )
        self._disconnect(
            conn,
            HubReason.EXECUTOR_QUARANTINED,
            f"quarantined after a security violation on {iid}",
        )

    def _info(self, conn: _Conn, *, detail: str = "") -> ExecutorInfo:
        until = self._quarantine.get(conn.executor_id)
        now = time.monotonic()
        quarantined_until_us = (
            _now_us() + round((until - now) * 1e6) if until is not None and until > now else None
        )
        return ExecutorInfo(
            executor_id=conn.executor_id,
            status=conn.status,
            commands=conn.commands,
            slots=conn.slots,
            in_flight=len(conn.in_flight),
            uid=conn.creds.uid if conn.creds else None,
            pid=conn.creds.pid if conn.creds else None,
            connected_at_us=conn.connected_at_us,
            quarantined_until_us=quarantined_until_us,
            software=conn.software,
            detail=detail or conn.error_detail,
        )
