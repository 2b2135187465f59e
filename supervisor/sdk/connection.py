"""One live connection of an executor to the daemon: hello, frames in, handlers, answers out.

``serve`` runs one task group: the frame writer, a heartbeat/watchdog task and the executor's
slots (``slots.Slots``: ``executor.slots`` long-lived workers, no task per instruction); the
daemon's frames are read by an event-loop callback (``inbox.Inbox``), or by the calling task
where that cannot attach (another backend or stream).

The hot path works in passes, as the daemon's does. The reader takes every frame a chunk from
the socket holds, decodes each in one typed step (``messages.decode_frame``) and queues its
instructions; a worker runs their handlers one after the other until one has to wait (then
another worker goes on with the rest); each answer is encoded into the connection's outbox, and
when the worker's stretch ends (``Slots``' ``paused``) the outbox goes to the ``FrameWriter``
as one write.

Every instruction taken is answered exactly once: by its handler's result, ERROR when the
handler raised, REFUSED for ``NotSupported`` or an instruction that broke a Phase-20 rule, and
TIMEOUT when the daemon cancelled it (its cancel scope cancelled while it runs; not run at all
when the cancel came first). An answer the socket no longer takes is logged
(``response_undeliverable``) and the connection ends.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import anyio.abc
import structlog

from supervisor.errors import ExecutorRejected
from supervisor.sdk.errors import WrongSocket, is_control_answer
from supervisor.sdk.executor import Executor, Instruction, NotSupported, Result
from supervisor.sdk.inbox import Inbox
from supervisor.sdk.messages import InstructionFrame, answer_frame, decode_frame
from supervisor.sdk.slots import Slots
from supervisor.sdk.tracing import executor_span
from supervisor.wire.executor import (
    PROTOCOL_VERSION,
    Cancel,
    Heartbeat,
    Hello,
    MessageType,
    ProtocolError,
    Status,
    Welcome,
    parse_cancel,
    parse_reject,
    parse_welcome,
)
from supervisor.wire.frames import FrameError, FrameReader, FrameWriter, encode_frame

__all__ = ["HANDSHAKE_TIMEOUT_S", "Connection"]

_log = structlog.get_logger("supervisor.sdk")
#: How long the daemon has to answer ``hello`` (and the last answers to be flushed on SHUTDOWN).
HANDSHAKE_TIMEOUT_S: Final = 10.0
_LOST: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class _Job:
    """One instruction taken: queued, then running in its cancel scope, then answered."""

    __slots__ = ("cancelled", "instruction", "scope", "traceparent")

    def __init__(self, instruction: Instruction, traceparent: str | None) -> None:
        self.instruction = instruction
        self.traceparent = traceparent
        #: its cancel scope while its handler runs (None while it is queued)
        self.scope: anyio.CancelScope | None = None
        #: cancelled while queued: answered at once, never run
        self.cancelled = False


class Connection:
    """One live connection to the daemon (``executor.connection`` while connected)."""

    def __init__(
        self,
        executor: Executor,
        stream: anyio.abc.SocketStream,
        *,
        max_frame_bytes: int,
        socket_path: str = "",
    ) -> None:
        self.executor = executor
        self.stream = stream
        #: the path connected to, as given (for messages; the peer's address otherwise)
        self.socket_path = socket_path
        self.reader = FrameReader(stream, max_bytes=max_frame_bytes)
        self.welcome: Welcome | None = None
        self._writer = FrameWriter(stream)
        #: instructions taken and not yet answered, by id
        self._jobs: dict[str, _Job] = {}
        self._slots: Slots[_Job] | None = None
        self._last_rx = time.monotonic()
        self._tg: anyio.abc.TaskGroup | None = None
        self._limit: int | None = None  # the daemon's max_frame_bytes, after welcome
        #: encoded answers of the current stretch, not yet handed to the writer
        self._outbox: list[bytes] = []
        self._outbox_ids: list[str] = []
        self._new_scope: type[anyio.CancelScope] = anyio.CancelScope
        self.closed_reason = ""

    async def send_message(self, message: Mapping[str, object]) -> None:
        """Send one protocol message as a frame."""
        await self.send_raw(encode_frame(message))

    async def send_raw(self, data: bytes, *, cork: bool | None = None) -> None:
        """Send raw bytes (test executors use it to send broken frames)."""
        await self._writer.send(data, cork=cork)

    async def send_status(self, status: Status) -> None:
        """Tell the daemon whether this executor takes new work."""
        await self.send_message(status.to_wire())

    @property
    def running(self) -> frozenset[str]:
        """Ids of the instructions taken and not yet answered (queued or running)."""
        return frozenset(self._jobs)

    async def handshake(self) -> Welcome:
        """Send hello, wait for welcome; raises ``ExecutorRejected`` on a reject and
        ``WrongSocket`` when the control API answered."""
        executor = self.executor
        hello = Hello(
            executor_id=executor.executor_id,
            protocol_version=PROTOCOL_VERSION,
            commands=executor.commands(),
            slots=executor.slots,
            software=executor.software,
        )
        await self.send_message(hello.to_wire())
        with anyio.fail_after(HANDSHAKE_TIMEOUT_S):
            frame = await self.reader.read()
        if frame.get("type") == MessageType.REJECT:
            reject = parse_reject(frame)
            raise ExecutorRejected(reject.reason_code, reject.reason, reject.retry_after_ms)
        if is_control_answer(frame):
            path = self.socket_path or self.stream.extra(
                anyio.abc.SocketAttribute.remote_address, ""
            )
            raise WrongSocket(path if isinstance(path, str) else "", frame)
        welcome = parse_welcome(frame)
        self.reader.max_bytes = max(self.reader.max_bytes, welcome.max_frame_bytes)
        self.welcome = welcome
        self._limit = welcome.max_frame_bytes
        return welcome

    async def serve(self) -> str:
        """Run the connection until it ends; returns why it ended."""
        welcome = self.welcome
        if welcome is None:
            raise RuntimeError("handshake() first")
        # The running backend's own cancel scope class: made directly, a scope skips anyio's
        # backend lookup (one scope per instruction).
        self._new_scope = type(anyio.CancelScope())
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._slots = Slots(tg, max(1, self.executor.slots), self._run, paused=self._flush)
            tg.start_soon(self._writer.run)
            tg.start_soon(self._heartbeats, welcome)
            self.closed_reason = await self._receive()
            tg.cancel_scope.cancel()
        return self.closed_reason

    def _close(self) -> None:
        """End this connection: cancel its tasks; run_executor then closes the socket."""
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _heartbeats(self, welcome: Welcome) -> None:
        interval = welcome.heartbeat_interval_ms / 1000
        limit = interval * welcome.heartbeat_misses
        while True:
            await anyio.sleep(interval)
            silent = time.monotonic() - self._last_rx
            if silent > limit:
                self.closed_reason = f"no frame from the daemon for {silent:.1f}s"
                _log.warning("daemon_silent", executor_id=self.executor.executor_id)
                self._close()
                return
            try:
                with anyio.move_on_after(limit):
                    await self.send_message(Heartbeat(ts_us=time.time_ns() // 1000).to_wire())
            except _LOST:
                return  # the reader sees the end of the connection

    async def _receive(self) -> str:
        """Take the daemon's frames until the connection ends; returns why it ended."""
        reader = self.reader
        try:
            while reader.buffered:  # what came with the welcome
                stop = self._on_body(await reader.read_body())
                if stop is not None:
                    return stop
        except Exception as exc:
            return self._ended_by(exc)
        ended = anyio.Event()
        reasons: list[str] = []

        def on_end(reason: str) -> None:
            reasons.append(reason)
            ended.set()

        inbox = Inbox(on_body=self._on_body, on_end=on_end, max_bytes=reader.max_bytes)
        if not inbox.attach(self.stream):
            return await self._read_loop()
        try:
            await ended.wait()
        finally:
            inbox.detach()
        reason = reasons[0]
        if reason.startswith(("the daemon closed", "connection lost")):
            return self.closed_reason or reason
        return reason

    async def _read_loop(self) -> str:
        """`_receive` with a task reading (where `Inbox` cannot attach)."""
        reader = self.reader
        try:
            while True:
                stop = self._on_body(await reader.read_body())
                if stop is not None:
                    return stop
        except Exception as exc:
            return self._ended_by(exc)

    def _ended_by(self, exc: Exception) -> str:
        if isinstance(exc, anyio.EndOfStream):
            return self.closed_reason or "the daemon closed the connection"
        if isinstance(exc, _LOST):
            return self.closed_reason or f"connection lost: {exc!r}"
        if isinstance(exc, FrameError | ProtocolError):
            return f"protocol error from the daemon: {exc}"
        raise exc

    def _on_body(self, body: bytes) -> str | None:
        """One frame from the daemon; returns why to stop (a ``reject``), else None."""
        message = decode_frame(body)
        self._last_rx = time.monotonic()
        if type(message) is InstructionFrame:
            self._take(message)
        elif type(message) is Cancel:
            self._cancel(message.instruction_id)
        elif type(message) is dict:
            kind = message.get("type")
            if kind == MessageType.CANCEL:
                self._cancel(parse_cancel(message).instruction_id)
            elif kind == MessageType.REJECT:
                reject = parse_reject(message)
                return f"rejected: {reject.reason_code}: {reject.reason}"
        # heartbeat and unknown (future) messages: liveness only
        return None

    def _take(self, message: InstructionFrame) -> None:
        instruction = message.envelope
        if instruction is None:  # it broke a Phase-20 rule: REFUSED, when it has an id
            reason = getattr(message.error, "reason", str(message.error))
            _log.warning("instruction_invalid", reason=reason)
            if message.instruction_id:
                refusal = Result.refused(f"invalid instruction: {message.error}")
                self._answer(message.instruction_id, refusal)
                self._flush()
            return
        job = _Job(instruction, message.traceparent)
        self._jobs[instruction.instruction_id] = job
        if self._slots is None:  # pragma: no cover - serve() sets it before reading
            raise RuntimeError("no slots")
        self._slots.put(job)

    def _cancel(self, instruction_id: str) -> None:
        job = self._jobs.get(instruction_id)
        if job is None:
            return  # answered already (or never taken): nothing to cancel
        if job.scope is not None:
            job.scope.cancel()  # its handler ends, and it is answered TIMEOUT
            return
        # Still queued: answered TIMEOUT now (the daemon waits for it), and never run.
        job.cancelled = True
        del self._jobs[instruction_id]
        self._answer(instruction_id, _CANCELLED)
        self._flush()

    async def _run(self, job: _Job) -> None:
        instruction = job.instruction
        iid = instruction.instruction_id
        if job.cancelled:  # cancelled while queued: answered then
            return
        result: Result | Mapping[str, Any] | None = None
        try:
            scope = job.scope = self._new_scope()
            with scope:
                if job.traceparent is None:
                    result = await self._handle(instruction)
                else:  # the daemon's trace of this attempt (tracing.py)
                    command = instruction.command_type.value.lower()
                    attributes = {
                        "hunter.instruction_id": iid,
                        "hunter.executor_id": self.executor.executor_id,
                    }
                    with executor_span(job.traceparent, f"hunter.executor.{command}", attributes):
                        result = await self._handle(instruction)
            if scope.cancelled_caught:
                result = None  # cancelled by the daemon: TIMEOUT
        finally:
            if self._jobs.get(iid) is job:
                del self._jobs[iid]
        self._answer(iid, result if result is not None else _CANCELLED)
        if self.executor.stop_requested:
            self._flush()
            with anyio.move_on_after(HANDSHAKE_TIMEOUT_S):
                await self._writer.flush()
            self.closed_reason = "shutdown requested"
            self._close()

    async def _handle(self, instruction: Instruction) -> Result | Mapping[str, Any]:
        try:
            return await self.executor.handle(instruction)
        except NotSupported as exc:
            return Result.refused(exc.reason)
        except Exception as exc:  # a handler bug is an ERROR answer, not a dead executor
            _log.exception("handler_failed", instruction_id=instruction.instruction_id)
            return Result.error(f"{type(exc).__name__}: {exc}")

    def _answer(self, iid: str, result: Result | Mapping[str, Any]) -> None:
        try:
            frame = answer_frame(iid, result, limit=self._limit)
        except (TypeError, ValueError) as exc:  # output JSON cannot hold: still an answer
            error = Result.error(f"the response could not be encoded: {exc}")
            frame = answer_frame(iid, error, limit=self._limit)
        self._outbox.append(frame)
        self._outbox_ids.append(iid)

    def _flush(self) -> None:
        """Hand the outbox to the writer: one write (the kernel takes it at once when nothing
        else is queued)."""
        outbox = self._outbox
        if not outbox:
            return
        data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
        ids, self._outbox_ids = self._outbox_ids, []
        outbox.clear()
        if not self._writer.send_nowait(data, cork=False) and self._tg is not None:
            # The writer is full (or broken): wait for it in a task of its own.
            self._tg.start_soon(self._send_later, data, ids)

    async def _send_later(self, data: bytes, ids: list[str]) -> None:
        try:
            await self._writer.send(data, cork=False)
        except _LOST:
            for iid in ids:
                _log.info("response_undeliverable", instruction_id=iid)

    async def flush(self) -> None:
        """Wait until every message sent so far has been handed to the kernel."""
        await self._writer.flush()


_CANCELLED: Final = Result.timeout("cancelled by the daemon")
